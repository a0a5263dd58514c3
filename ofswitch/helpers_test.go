package ofswitch

import (
	"context"
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	of "antrea.io/libOpenflow/openflow13"

	"github.com/ofsdn/ofsdn/internal/ovstest"
)

// bridge is a private OVS with br0 and a session to it.
type bridge struct {
	inst *ovstest.Instance
	sess *Session
}

func newBridge(t testing.TB, mod ...func(*Config)) *bridge {
	t.Helper()
	inst := ovstest.Start(t)
	inst.AddBridge("br0")
	cfg := Config{Socket: inst.MgmtSocket("br0"), Bridge: "br0", ReconnectMax: 500 * time.Millisecond}
	for _, m := range mod {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sess, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = sess.Close() })
	return &bridge{inst: inst, sess: sess}
}

// ofctlFlows returns ovs-ofctl's dump of br0 without statistics, one flow a line, sorted.
func (b *bridge) ofctlFlows(t testing.TB) []string {
	t.Helper()
	out, err := b.inst.Ofctl("dump-flows", "br0", "--no-stats")
	if err != nil {
		t.Fatalf("ovs-ofctl dump-flows: %v", err)
	}
	var flows []string
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "OFPST_FLOW") {
			continue
		}
		flows = append(flows, l)
	}
	sort.Strings(flows)
	return flows
}

// clear deletes every flow and group through the session.
func (b *bridge) clear(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.sess.Send(ctx, [][]byte{deleteAllFlows(t), deleteAllGroups(t)}); err != nil {
		t.Fatalf("clear bridge: %v", err)
	}
}

func marshal(t testing.TB, m interface{ MarshalBinary() ([]byte, error) }) []byte {
	t.Helper()
	b, err := m.MarshalBinary()
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return b
}

const podVNID = 0x2a

// podFlow is the typical pod flow: table 20, priority 100, ip, in_port, nw_src; load the VNID into
// reg0, goto table 30. Options: a cookie and an output group.
func podFlow(t testing.TB, i int, cookie uint64, group uint32) []byte {
	t.Helper()
	fm := of.NewFlowMod()
	fm.TableId = 20
	fm.Priority = 100
	fm.Cookie = cookie
	fm.Match.AddField(*of.NewInPortField(uint32(i + 1)))
	fm.Match.AddField(*of.NewEthTypeField(0x0800))
	fm.Match.AddField(*of.NewIpv4SrcField(podIP(i), nil))
	reg0, err := of.FindFieldHeaderByName("NXM_NX_REG0", false)
	if err != nil {
		t.Fatal(err)
	}
	apply := of.NewInstrApplyActions()
	if err := apply.AddAction(of.NewNXActionRegLoad(of.NewNXRange(0, 31).ToOfsBits(), reg0, podVNID), false); err != nil {
		t.Fatal(err)
	}
	if group != 0 {
		if err := apply.AddAction(of.NewActionGroup(group), false); err != nil {
			t.Fatal(err)
		}
	}
	fm.AddInstruction(apply)
	fm.AddInstruction(of.NewInstrGotoTable(30))
	return marshal(t, fm)
}

func podIP(i int) net.IP { return net.IPv4(10, byte(128+i>>16), byte(i>>8), byte(i)).To4() }

func podFlows(t testing.TB, n int, cookie func(i int) uint64) [][]byte {
	msgs := make([][]byte, n)
	for i := range msgs {
		msgs[i] = podFlow(t, i, cookie(i), 0)
	}
	return msgs
}

func deleteAllFlows(t testing.TB) []byte {
	fm := of.NewFlowMod()
	fm.Command = of.FC_DELETE
	fm.TableId = of.OFPTT_ALL
	return marshal(t, fm)
}

func deleteAllGroups(t testing.TB) []byte {
	gm := of.NewGroupMod()
	gm.Command = of.OFPGC_DELETE
	gm.GroupId = of.OFPG_ALL
	return marshal(t, gm)
}

func selectGroup(t testing.TB, id uint32) []byte {
	gm := of.NewGroupMod()
	gm.GroupId = id
	gm.Type = of.OFPGT_SELECT
	bk := of.NewBucket()
	bk.Weight = 1
	bk.AddAction(of.NewActionOutput(of.P_NORMAL))
	gm.AddBucket(*bk)
	return marshal(t, gm)
}

// badPrereqFlow matches nw_src without eth_type=ip: OVS refuses it when it decodes the bundle-add.
func badPrereqFlow(t testing.TB, i int) []byte {
	fm := of.NewFlowMod()
	fm.TableId = 20
	fm.Match.AddField(*of.NewIpv4SrcField(podIP(i), nil))
	fm.AddInstruction(of.NewInstrGotoTable(30))
	return marshal(t, fm)
}

// parseFlows decodes dumped entries with libOpenflow, as a cross-check of the framing.
func parseFlows(t testing.TB, entries [][]byte) []*of.FlowStats {
	t.Helper()
	var out []*of.FlowStats
	for i, e := range entries {
		fs := new(of.FlowStats)
		if err := fs.UnmarshalBinary(e); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		if int(fs.Length) != len(e) {
			t.Fatalf("entry %d: length %d, slice %d", i, fs.Length, len(e))
		}
		out = append(out, fs)
	}
	return out
}

func inPortOf(t testing.TB, fs *of.FlowStats) uint32 {
	for _, f := range fs.Match.Fields {
		if p, ok := f.Value.(*of.InPortField); ok {
			return p.InPort
		}
	}
	t.Fatalf("flow without in_port: %+v", fs.Match)
	return 0
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
