package pipeline

import (
	"net/netip"
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
			owners := map[reconcile.Owner]reconcile.OwnerState{PipelineOwner: {Flows: []Flow{tc.flow}}}
			sampleDrops(owners)
			sampleDrops(owners) // idempotent
			f := owners[PipelineOwner].Flows[0]
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
		if len(got) != len(tc.want) || (len(got) > 0 && got[len(got)-1] != tc.want[len(tc.want)-1]) {
			t.Errorf("port %d ingress %v: %v, want %v", tc.port, tc.ingress, got, tc.want)
		}
	}
}
