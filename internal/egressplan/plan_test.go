package egressplan

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
)

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

func prefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, a := range s {
		out[i] = netip.MustParsePrefix(a)
	}
	return out
}

func TestBuild(t *testing.T) {
	nodes := []Node{
		{Name: "n1", IP: netip.MustParseAddr("198.51.100.11"), EgressCIDRs: prefixes("198.51.100.32/27")},
		{Name: "n2", IP: netip.MustParseAddr("198.51.100.12"), EgressCIDRs: prefixes("198.51.100.32/27"), EgressIPs: addrs("198.51.100.70")},
		{Name: "n3", IP: netip.MustParseAddr("198.51.100.13"), EgressIPs: addrs("198.51.100.70", "198.51.100.12")},
	}
	inside := prefixes("10.128.0.0/14", "172.30.0.0/16")
	type want struct {
		reason   string
		eligible string
	}
	tests := []struct {
		name       string
		namespaces []Namespace
		want       map[string]want // by IP
		usable     map[string]string
	}{
		{name: "automatic: every node whose range holds it",
			namespaces: []Namespace{{Name: "a", EgressIPs: addrs("198.51.100.40")}},
			want:       map[string]want{"198.51.100.40": {"", "n1,n2"}},
			usable:     map[string]string{"a": "198.51.100.40"}},
		{name: "manual on two HostSubnets fails over between them",
			namespaces: []Namespace{{Name: "a", EgressIPs: addrs("198.51.100.70")}},
			want:       map[string]want{"198.51.100.70": {"", "n2,n3"}}},
		{name: "outside every range and list",
			namespaces: []Namespace{{Name: "a", EgressIPs: addrs("198.51.100.99", "198.51.100.40")}},
			want:       map[string]want{"198.51.100.99": {networkv1.ReasonEgressIPNoEligibleNode, ""}, "198.51.100.40": {"", "n1,n2"}},
			usable:     map[string]string{"a": "198.51.100.40"}},
		{name: "two namespaces claim one IP: neither gets it; the other IPs stay",
			namespaces: []Namespace{{Name: "a", EgressIPs: addrs("198.51.100.40", "198.51.100.41")}, {Name: "b", EgressIPs: addrs("198.51.100.40")}},
			want:       map[string]want{"198.51.100.40": {networkv1.ReasonEgressIPConflict, "n1,n2"}, "198.51.100.41": {"", "n1,n2"}},
			usable:     map[string]string{"a": "198.51.100.41", "b": ""}},
		{name: "inside the cluster network, the service network, or a node's own address",
			namespaces: []Namespace{{Name: "a", EgressIPs: addrs("10.128.0.9", "172.30.0.1", "198.51.100.12")}},
			want: map[string]want{"10.128.0.9": {networkv1.ReasonEgressIPInsideCluster, ""}, "172.30.0.1": {networkv1.ReasonEgressIPInsideCluster, ""},
				// n3 lists n2's address by hand; n2 itself is excluded, and the address is a node's anyway.
				"198.51.100.12": {networkv1.ReasonEgressIPInsideCluster, "n3"}}},
		{name: "a namespace listing one IP twice claims it once",
			namespaces: []Namespace{{Name: "a", EgressIPs: addrs("198.51.100.40", "198.51.100.40")}},
			want:       map[string]want{"198.51.100.40": {"", "n1,n2"}},
			usable:     map[string]string{"a": "198.51.100.40"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := Build(tc.namespaces, nodes, inside)
			if len(p.IPs) != len(tc.want) {
				t.Errorf("%d IPs, want %d", len(p.IPs), len(tc.want))
			}
			for a, w := range tc.want {
				ip := p.IPs[netip.MustParseAddr(a)]
				if ip == nil {
					t.Errorf("%s missing", a)
					continue
				}
				if ip.Reason != w.reason || strings.Join(ip.Eligible, ",") != w.eligible {
					t.Errorf("%s: reason %q eligible %v, want %q %q", a, ip.Reason, ip.Eligible, w.reason, w.eligible)
				}
			}
			for ns, want := range tc.usable {
				var got []string
				for _, a := range p.Usable(ns) {
					got = append(got, a.String())
				}
				if strings.Join(got, ",") != want {
					t.Errorf("usable(%s) = %v, want %s", ns, got, want)
				}
			}
		})
	}
}

// TestRank checks the properties the agents rely on: every agent gets the same order whatever order it
// lists the nodes in, and removing a node changes nothing else in the order (so a failure moves only the
// failed node's IPs).
func TestRank(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	nodes := make([]string, 12)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node-%d", i)
	}
	firsts := map[string]int{}
	for i := range 2000 {
		ip := netip.AddrFrom4([4]byte{198, 51, 100, byte(i % 250)}).Next()
		if i >= 250 {
			ip = netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1})
		}
		order := Rank(ip, nodes)
		shuffled := slices.Clone(nodes)
		rng.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
		if got := Rank(ip, shuffled); !slices.Equal(got, order) {
			t.Fatalf("%s: order depends on input order: %v vs %v", ip, got, order)
		}
		gone := order[rng.IntN(len(order))]
		without := slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return n == gone })
		wantOrder := slices.DeleteFunc(slices.Clone(order), func(n string) bool { return n == gone })
		if got := Rank(ip, without); !slices.Equal(got, wantOrder) {
			t.Fatalf("%s: removing %s reordered the rest: %v, want %v", ip, gone, got, wantOrder)
		}
		firsts[order[0]]++
	}
	// Spread: every node is first for some IPs (an even share is 2000/12 ≈ 167).
	for _, n := range nodes {
		if firsts[n] < 80 {
			t.Errorf("%s first for only %d of 2000 IPs: %v", n, firsts[n], firsts)
		}
	}
}

func TestChoose(t *testing.T) {
	ip := netip.MustParseAddr("198.51.100.40")
	eligible := []string{"a", "b", "c"}
	order := Rank(ip, eligible)
	liveExcept := func(dead ...string) func(string) bool {
		return func(n string) bool { return !slices.Contains(dead, n) }
	}
	tests := []struct {
		name               string
		live               func(string) bool
		current, preferred string
		want               string
	}{
		{"no holder: the first of the ranking", liveExcept(), "", "", order[0]},
		{"the first is dead: the second", liveExcept(order[0]), "", "", order[1]},
		{"a live holder keeps it", liveExcept(), order[2], "", order[2]},
		{"a dead holder loses it", liveExcept(order[2]), order[2], "", order[0]},
		{"the controller's placement before the ranking", liveExcept(), "", order[1], order[1]},
		{"a holder before the controller's placement", liveExcept(), order[2], order[1], order[2]},
		{"an ineligible holder does not keep it", liveExcept(), "z", "", order[0]},
		{"nobody live", liveExcept("a", "b", "c"), "a", "b", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Choose(ip, eligible, tc.live, tc.current, tc.preferred); got != tc.want {
				t.Errorf("Choose = %q, want %q (ranking %v)", got, tc.want, order)
			}
		})
	}
}

func TestParsePolicy(t *testing.T) {
	rule := func(typ, cidr, dns string) networkv1.EgressNetworkPolicyRule {
		return networkv1.EgressNetworkPolicyRule{Type: networkv1.EgressNetworkPolicyRuleType(typ),
			To: networkv1.EgressNetworkPolicyPeer{CIDRSelector: cidr, DNSName: dns}}
	}
	tests := []struct {
		name  string
		rules []networkv1.EgressNetworkPolicyRule
		want  string // the rules' String()s, or the error's start
	}{
		{"cidr and names, host bits masked", []networkv1.EgressNetworkPolicyRule{rule("Allow", "198.51.100.7/24", ""),
			rule("Allow", "", "Example.COM."), rule("Deny", "0.0.0.0/0", "")}, "Allow 198.51.100.0/24|Allow example.com|Deny 0.0.0.0/0"},
		{"empty is valid", nil, ""},
		{"bad type", []networkv1.EgressNetworkPolicyRule{rule("Reject", "0.0.0.0/0", "")}, "error: rule 0: type"},
		{"both", []networkv1.EgressNetworkPolicyRule{rule("Allow", "0.0.0.0/0", ""), rule("Deny", "10.0.0.0/8", "x.example")}, "error: rule 1: both"},
		{"neither", []networkv1.EgressNetworkPolicyRule{rule("Deny", "", "")}, "error: rule 0: neither"},
		{"IPv6", []networkv1.EgressNetworkPolicyRule{rule("Deny", "2001:db8::/32", "")}, "error: rule 0: cidrSelector"},
		{"not a CIDR", []networkv1.EgressNetworkPolicyRule{rule("Deny", "198.51.100.300/24", "")}, "error: rule 0: cidrSelector"},
		{"address as a name", []networkv1.EgressNetworkPolicyRule{rule("Deny", "", "198.51.100.1")}, "error: rule 0: dnsName"},
		{"bad name", []networkv1.EgressNetworkPolicyRule{rule("Deny", "", "under_score.example")}, "error: rule 0: dnsName"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rules, err := ParsePolicy(networkv1.EgressNetworkPolicySpec{Egress: tc.rules})
			if err != nil {
				if !strings.HasPrefix("error: "+err.Error(), tc.want) || !strings.HasPrefix(tc.want, "error: ") {
					t.Fatalf("error %v, want %q", err, tc.want)
				}
				return
			}
			var got []string
			for _, r := range rules {
				got = append(got, r.String())
			}
			if strings.Join(got, "|") != tc.want {
				t.Errorf("got %q, want %q", strings.Join(got, "|"), tc.want)
			}
		})
	}
	many := make([]networkv1.EgressNetworkPolicyRule, networkv1.MaxEgressNetworkPolicyRules+1)
	for i := range many {
		many[i] = rule("Deny", "0.0.0.0/0", "")
	}
	if _, err := ParsePolicy(networkv1.EgressNetworkPolicySpec{Egress: many}); err == nil {
		t.Error("51 rules accepted")
	}
}
