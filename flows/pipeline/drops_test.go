package pipeline

import (
	"net/netip"
	"slices"
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

func TestDropRules(t *testing.T) {
	reject := CT{Commit: true, Table: TableServiceL2, Zone: ZoneService, NAT: &NAT{Kind: NATDst, AddrMin: netip.MustParseAddr("10.128.0.1"), PortMin: RejectPortMin, PortMax: RejectPortMax}}
	for _, tc := range []struct {
		name  string
		flow  Flow
		cause DropCause // "": not attributed
	}{
		{"anti-spoofing default", F(TablePodIngress, 0, M()), CauseAntiSpoofing},
		{"pod ingress allow", F(TablePodIngress, 100, M(InPort(3)), Goto{Table: TableConntrack}), ""},
		{"pod IPv6, unsampled", F(TablePodIngress, podIPv6DropPriority, M(IPv6...)), ""},
		{"tenant isolation default", F(TableIngressIsolation, 0, M()), CauseTenantIsolation},
		{"ingress default deny", F(TableIngressIsolation, isolationPriority, M(append(IP, Reg(RegOutPort, 3))...)), CausePolicyIngress},
		{"egress default deny", F(TableEgressPolicy, isolationPriority, M(append(IP, InPort(3))...)), CausePolicyEgress},
		{"tunnel guard", F(TableRouting, guardDefaultPriority, M(UDP...)), CauseTunnelGuard},
		{"tunnel guard gateway", F(TableRouting, guardGatewayPriority, M(UDP...)), CauseTunnelGuard},
		{"cluster address on no node", F(TableRouting, 50, M(IP...)), ""},
		{"tunnel source", F(TableTunnelIngress, 0, M()), CauseTunnelSource},
		{"network VNI", F(TableTunnelIngress, networkTunnelDropPriority, M()), CauseNetworkVNI},
		{"network isolation", F(TableNetCrossTalk, 0, M()), CauseNetworkIsolation},
		{"service reject", F(TableServices, 100, M(IP...), reject), CauseServiceNoEndpoints},
		{"service local without endpoint", F(TableServices, 100, M(IP...)), CauseServiceNoEndpoints},
		{"service forward", F(TableServices, 100, M(IP...), LoadReg(RegServiceLB, 7), Goto{Table: TableServiceLB}), ""},
		{"output default", F(TableOutput, 0, M()), ""},
		{"egress firewall deny", F(TableEgressFirewall, 199, M(IP...)), CauseEgressFirewall},
		{"cluster network policy deny", F(TableAdminIngress, 900, M(IP...), Note{Data: []byte(AdminRuleNote("p", AdminTierAdmin, true, 0, AdminDeny, "r"))}),
			CauseAdminPolicy},
		{"cluster network policy accept", F(TableAdminIngress, 900, M(IP...), Note{Data: []byte(AdminRuleNote("p", AdminTierAdmin, true, 0, AdminAccept, "r"))},
			Goto{Table: TableOutput}), ""},
		{"baseline deny", F(TableBaselineEgress, 900, M(IP...), Note{Data: []byte(AdminRuleNote("p", AdminTierBaseline, false, 1, AdminDeny, ""))}),
			CauseAdminPolicy},
		{"egress firewall allow", F(TableEgressFirewall, 200, M(IP...), Goto{Table: TableEgressIP}), ""},
		{"already sampled", F(TablePodIngress, 0, M(), Controller{MaxLen: DropSampleLen, MeterID: 4}), CauseAntiSpoofing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := DropRuleOf(tc.flow)
			if got := map[bool]DropCause{true: r.Cause}[ok]; got != tc.cause {
				t.Errorf("cause %q, want %q", got, tc.cause)
			}
			flows := []Flow{tc.flow}
			sampleDrops(flows)
			sampleDrops(flows) // idempotent
			f := flows[0]
			c, sampled := f.Actions, false
			if len(c) > 0 {
				_, sampled = c[0].(Controller)
			}
			if sampled != (tc.cause != "") {
				t.Fatalf("sampled %v: %s", sampled, f)
			}
			if !sampled {
				return
			}
			info, _ := LookupDropCause(tc.cause)
			if c[0] != (Controller{MaxLen: DropSampleLen, MeterID: info.Meter}) {
				t.Errorf("sample action %s, want meter %d", c[0], info.Meter)
			}
			if len(c) != len(tc.flow.Actions)+1 && tc.name != "already sampled" {
				t.Errorf("actions %s: the flow's own actions must follow the sample once", f)
			}
		})
	}
}

func TestDropCausesMetersUnique(t *testing.T) {
	seen := map[uint32]DropCause{}
	for _, c := range DropCauses {
		if c.Meter == 0 || seen[c.Meter] != "" {
			t.Errorf("cause %s: meter %d zero or taken by %s", c.Cause, c.Meter, seen[c.Meter])
		}
		seen[c.Meter] = c.Cause
	}
	for _, r := range DropRules {
		if _, ok := LookupDropCause(r.Cause); !ok {
			t.Errorf("rule for table %d names unknown cause %s", r.Table, r.Cause)
		}
	}
	if len(DropMeters()) != len(DropCauses) {
		t.Errorf("one meter per cause")
	}
}

func TestIsolatingPolicies(t *testing.T) {
	pols := []PolicyState{
		{Namespace: "blue", Name: "deny-all", Ingress: true, Pods: []PolicyPod{{OFPort: 3}, {OFPort: 4}}},
		{Namespace: "blue", Name: "egress", Egress: true, Pods: []PolicyPod{{OFPort: 3}}},
		{Namespace: "blue", Name: "web", Ingress: true, Egress: true, Pods: []PolicyPod{{OFPort: 4}}},
	}
	for _, tc := range []struct {
		port    uint32
		ingress bool
		want    []string
	}{
		{3, true, []string{"blue/deny-all"}},
		{3, false, []string{"blue/egress"}},
		{4, true, []string{"blue/deny-all", "blue/web"}},
		{5, true, nil},
	} {
		got := IsolatingPolicies(pols, tc.port, tc.ingress)
		if !slices.Equal(got, tc.want) {
			t.Errorf("port %d ingress %v: %v, want %v", tc.port, tc.ingress, got, tc.want)
		}
	}
}

// TestRendererSamplesFreshAndReused: every attributed flow leaves Render sampled, whether its owner was
// rendered afresh or reused from the last Render (the memo keeps the flows sampleDrops changed).
func TestRendererSamplesFreshAndReused(t *testing.T) {
	for _, mode := range []Mode{ModeNetworkPolicy, ModeMultitenant} {
		t.Run(string(mode), func(t *testing.T) {
			s := sampleNodeState()
			s.Mode = mode
			s.Egress = sampleEgressState()
			s.AdminPolicies = sampleAdminPolicies()
			s.Pods[0].IngressIsolated = true
			s.Pods[1].IngressIsolated, s.Pods[1].EgressIsolated = true, true
			var r Renderer
			var prev map[reconcile.Owner]reconcile.OwnerState
			for round := range 3 {
				owners, failed, err := r.Render(s)
				if err != nil || len(failed) > 0 {
					t.Fatal(err, failed)
				}
				var fresh, reused int // owners with attributed flows
				for o, st := range owners {
					attributed := 0
					for _, f := range st.Flows {
						if _, ok := DropRuleOf(f); !ok {
							continue
						}
						attributed++
						if len(f.Actions) == 0 {
							t.Errorf("round %d, %s: %s not sampled", round, o, f)
						} else if _, ok := f.Actions[0].(Controller); !ok {
							t.Errorf("round %d, %s: %s not sampled", round, o, f)
						}
					}
					if attributed == 0 {
						continue
					}
					if old, ok := prev[o]; ok && len(old.Flows) == len(st.Flows) && &old.Flows[0] == &st.Flows[0] {
						reused++
					} else {
						fresh++
					}
				}
				if fresh == 0 || (round > 0 && reused == 0) {
					t.Errorf("round %d: %d fresh and %d reused owners with drops: the test checks neither", round, fresh, reused)
				}
				prev = owners
				// The next round renders the first pod (isolated) afresh and reuses the second.
				s.Pods = append([]PodState(nil), s.Pods...)
				s.Pods[0].OFPort += 10
			}
		})
	}
}
