package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/e2e/kubelab"
)

// TestEgressValidation: the CRDs' schemas, on a real API server, refuse malformed egress IPs, egress
// ranges and EgressNetworkPolicy rules with a message that says what is wrong, and take the good ones.
// (What needs other objects to judge — an IP no node may hold, one claimed twice — is the controller's:
// controller/egress_test.go.)
func TestEgressValidation(t *testing.T) {
	c := kubelab.StartDeploy(t, kubelab.Options{}, "crds/")
	if out, err := c.Kubectl("create", "namespace", "tenant"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	apply := func(doc string) (string, error) {
		path := filepath.Join(t.TempDir(), "obj.yaml")
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return c.Kubectl("apply", "--server-side", "--force-conflicts", "-f", path)
	}
	netns := func(ips string) string {
		return "apiVersion: network.ofsdn.io/v1\nkind: NetNamespace\nmetadata: {name: tenant}\nnetname: tenant\nnetid: 10\negressIPs: " + ips + "\n"
	}
	hostSubnet := func(extra string) string {
		return "apiVersion: network.ofsdn.io/v1\nkind: HostSubnet\nmetadata: {name: n1}\nhost: n1\nhostIP: 198.51.100.11\nsubnet: 10.128.0.0/23\n" + extra + "\n"
	}
	policy := func(rules string) string {
		return "apiVersion: network.ofsdn.io/v1\nkind: EgressNetworkPolicy\nmetadata: {name: fw, namespace: tenant}\nspec:\n  egress: " + rules + "\n"
	}
	tests := []struct {
		name, doc string
		refusal   string // "" accepted
	}{
		{"egress IPs", netns(`["198.51.100.40", "198.51.100.41"]`), ""},
		{"an IPv6 egress IP", netns(`["2001:db8::1"]`), "must be an IPv4 address"},
		{"a non-canonical egress IP", netns(`["198.051.100.40"]`), "must be an IPv4 address"},
		{"a name as egress IP", netns(`["egress.example"]`), "must be an IPv4 address"},
		{"an egress IP twice", netns(`["198.51.100.40", "198.51.100.40"]`), "duplicate entries"},
		{"egress ranges and IPs", hostSubnet("egressCIDRs: [198.51.100.32/27]\negressIPs: [198.51.100.70]"), ""},
		{"an egress range with host bits", hostSubnet("egressCIDRs: [198.51.100.33/27]"), "must be an IPv4 CIDR with no host bits set"},
		{"a malformed egress range", hostSubnet("egressCIDRs: [198.51.100.0/33]"), "must be an IPv4 CIDR"},
		{"rules", policy(`[{type: Allow, to: {cidrSelector: 198.51.100.7/24}}, {type: Allow, to: {dnsName: www.example.com}}, {type: Deny, to: {cidrSelector: 0.0.0.0/0}}]`), ""},
		{"a malformed CIDR", policy(`[{type: Deny, to: {cidrSelector: 198.51.100.0/40}}]`), "must be an IPv4 CIDR"},
		{"an IPv6 CIDR", policy(`[{type: Deny, to: {cidrSelector: "2001:db8::/32"}}]`), "must be an IPv4 CIDR"},
		{"a malformed DNS name", policy(`[{type: Allow, to: {dnsName: "bad_name.example"}}]`), "spec.egress[0].to.dnsName"},
		{"an address as DNS name", policy(`[{type: Allow, to: {dnsName: "198.51.100.7"}}]`), "an address is a cidrSelector"},
		{"both destinations", policy(`[{type: Allow, to: {dnsName: a.example, cidrSelector: 198.51.100.0/24}}]`), "exactly one of cidrSelector and dnsName"},
		{"no destination", policy(`[{type: Allow, to: {}}]`), "exactly one of cidrSelector and dnsName"},
		{"an unknown type", policy(`[{type: Reject, to: {cidrSelector: 0.0.0.0/0}}]`), `supported values: "Allow", "Deny"`},
		{"51 rules", policy("[" + strings.Repeat("{type: Deny, to: {cidrSelector: 0.0.0.0/0}}, ", 50) + "{type: Deny, to: {cidrSelector: 0.0.0.0/0}}]"), "must have at most 50 items"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := apply(tc.doc)
			switch {
			case tc.refusal == "" && err != nil:
				t.Errorf("refused: %v\n%s", err, out)
			case tc.refusal != "" && err == nil:
				t.Errorf("accepted, want a refusal saying %q:\n%s", tc.refusal, out)
			case tc.refusal != "" && !strings.Contains(err.Error()+out, tc.refusal):
				t.Errorf("refused without saying %q: %v\n%s", tc.refusal, err, out)
			}
		})
	}
	// A refused change left the accepted object alone.
	out, err := c.Kubectl("get", "netnamespace", "tenant", "-o", "jsonpath={.egressIPs}")
	if err != nil || out != `["198.51.100.40","198.51.100.41"]` {
		t.Errorf("egressIPs after refused changes: %q %v", out, err)
	}
}
