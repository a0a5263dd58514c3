package egressplan

import (
	"fmt"
	"net/netip"
	"strings"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Rule is one parsed EgressNetworkPolicy rule: exactly one of CIDR and DNSName.
type Rule struct {
	Allow   bool
	CIDR    netip.Prefix // masked
	DNSName string       // lower case, without the trailing dot
}

// String prints the rule as the API writes it ("Deny 0.0.0.0/0", "Allow example.com").
func (r Rule) String() string {
	verb := "Deny"
	if r.Allow {
		verb = "Allow"
	}
	if r.DNSName != "" {
		return verb + " " + r.DNSName
	}
	return verb + " " + r.CIDR.String()
}

// ParsePolicy parses an EgressNetworkPolicy's rules. The CRD's schema refuses what does not parse; this
// is the check for objects that got past it, and the error names the first bad rule.
func ParsePolicy(spec networkv1.EgressNetworkPolicySpec) ([]Rule, error) {
	if len(spec.Egress) > networkv1.MaxEgressNetworkPolicyRules {
		return nil, fmt.Errorf("%d rules, at most %d", len(spec.Egress), networkv1.MaxEgressNetworkPolicyRules)
	}
	out := make([]Rule, 0, len(spec.Egress))
	for i, r := range spec.Egress {
		var rule Rule
		switch r.Type {
		case networkv1.EgressNetworkPolicyRuleAllow:
			rule.Allow = true
		case networkv1.EgressNetworkPolicyRuleDeny:
		default:
			return nil, fmt.Errorf("rule %d: type %q, want Allow or Deny", i, r.Type)
		}
		switch cidr, name := r.To.CIDRSelector, r.To.DNSName; {
		case cidr != "" && name != "":
			return nil, fmt.Errorf("rule %d: both cidrSelector and dnsName", i)
		case cidr != "":
			p, err := netip.ParsePrefix(cidr)
			if err != nil || !p.Addr().Is4() {
				return nil, fmt.Errorf("rule %d: cidrSelector %q is not an IPv4 CIDR", i, cidr)
			}
			rule.CIDR = p.Masked()
		case name != "":
			n, err := ParseDNSName(name)
			if err != nil {
				return nil, fmt.Errorf("rule %d: %w", i, err)
			}
			rule.DNSName = n
		default:
			return nil, fmt.Errorf("rule %d: neither cidrSelector nor dnsName", i)
		}
		out = append(out, rule)
	}
	return out, nil
}

// ParseDNSName checks a rule's DNS name and returns it in canonical form (lower case, no trailing dot).
func ParseDNSName(name string) (string, error) {
	n := strings.TrimSuffix(strings.ToLower(name), ".")
	if _, err := netip.ParseAddr(n); err == nil {
		return "", fmt.Errorf("dnsName %q is an address: use cidrSelector", name)
	}
	if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
		return "", fmt.Errorf("dnsName %q: %s", name, strings.Join(errs, "; "))
	}
	return n, nil
}
