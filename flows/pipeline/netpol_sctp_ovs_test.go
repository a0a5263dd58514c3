package pipeline

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
)

// TestSCTPPolicyOnOVS: SCTP ports of a policy on a real bridge. The lab's kernel has no SCTP, so pods
// cannot send it: packets are traced through ovs-vswitchd instead (ofproto/trace, a new connection at
// each conntrack pass). b admits a on sctp/80: that connection is allowed by the rule's conjunction and
// committed; sctp/81 from a, and sctp/80 from c, die at b's isolation.
func TestSCTPPolicyOnOVS(t *testing.T) {
	l := newSvcLab(t)
	l.state.Mode = ModeNetworkPolicy
	a := l.addPod(t, "a", 10, 0, nil, nil)
	b := l.addPod(t, "b", 11, 0, nil, nil)
	c := l.addPod(t, "c", 12, 0, nil, nil)
	l.state.Pods[1].IngressIsolated = true
	l.state.Policies = []PolicyState{{Namespace: "t", Name: "sctp", Ingress: true, Pods: []PolicyPod{{OFPort: uint32(b.OFPort)}},
		IngressRules: []PolicyRule{{Peers: []PolicyPeer{{Net: netip.PrefixFrom(a.IP.Addr(), 32)}}, Ports: []PolicyPort{{Protocol: IPProtoSCTP, Port: 80}}}}}}
	l.apply(t)
	for _, tc := range []struct {
		from  pod
		port  int
		allow bool
	}{{a, 80, true}, {a, 81, false}, {c, 80, false}} {
		out, err := l.b.Inst.Output("ovs-appctl", "ofproto/trace", "br0",
			fmt.Sprintf("in_port=%d,sctp,dl_src=%s,dl_dst=%s,nw_src=%s,nw_dst=%s,sctp_src=5000,sctp_dst=%d",
				tc.from.OFPort, tc.from.MAC, "0a:58:0a:80:00:01", tc.from.IP.Addr(), b.IP.Addr(), tc.port),
			"--ct-next", "trk,new", "--ct-next", "trk,new")
		if err != nil {
			t.Fatal(err, out)
		}
		actions := out[strings.LastIndex(out, "Datapath actions:"):]
		allowed := strings.Contains(out, "conj_id=") && strings.HasPrefix(actions, "Datapath actions: ct(commit,zone=65520),")
		// Denied: the isolation flow dropped it, sending its sample to the controller and nothing else.
		dp, _, _ := strings.Cut(strings.TrimPrefix(actions, "Datapath actions: "), "\n")
		sampleOnly := strings.HasPrefix(dp, "userspace(") && strings.Contains(dp, "controller(") && strings.Count(dp, "),") == 0
		denied := strings.Contains(out, fmt.Sprintf("ip,reg2=%#x, priority %d", b.OFPort, isolationPriority)) && (dp == "drop" || sampleOnly)
		if tc.allow && !allowed || !tc.allow && !denied {
			t.Errorf("%s → b sctp/%d: want allowed %v; trace:\n%s", tc.from.Name, tc.port, tc.allow, out)
		}
	}
}
