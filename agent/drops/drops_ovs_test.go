package drops

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/ovstest"
	"github.com/ofsdn/ofsdn/ofswitch"
)

// TestSamplesFromOVS sends a pod's packets into a real (userspace) br0 whose flows drop them through
// the drop sampling of flows/pipeline, and reads the packet-ins on an OpenFlow session: OVS must send
// them on its management socket once asked (OFPT_SET_ASYNC), with the flow's table and cookie and
// the registers, and the cause's meter must hold a flood to its rate.
func TestSamplesFromOVS(t *testing.T) {
	if testing.Short() {
		t.Skip("real OVS: skipped under -short")
	}
	inst := ovstest.Start(t)
	inst.AddBridge("br0")
	var got atomic.Int64
	pins := make(chan []byte, 100000)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sess, err := ofswitch.Dial(ctx, ofswitch.Config{Socket: inst.MgmtSocket("br0"), Bridge: "br0", OnPacketIn: func(m []byte) {
		got.Add(1)
		select {
		case pins <- m:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.SetMeters(ctx, pipeline.DropMeters()); err != nil {
		t.Fatal(err)
	}
	if err := sess.SetMeters(ctx, pipeline.DropMeters()); err != nil { // again: modified, not refused
		t.Fatalf("meters a second time: %v", err)
	}
	if out, err := inst.Ofctl("dump-meters", "br0"); err != nil || strings.Count(out, "type=drop rate=100 burst_size=100") != len(pipeline.DropCauses) {
		t.Fatalf("dump-meters: %v\n%s", err, out)
	}
	mac, _ := net.ParseMAC("0a:58:0a:80:00:03")
	pod := inst.AddPod("br0", "p3", netip.MustParsePrefix("10.128.0.3/24"), mac, 3)
	if _, err := pod.Exec("ip", "neigh", "replace", "10.128.0.4", "lladdr", "0a:58:0a:80:00:04", "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	owner := pipeline.PodOwner("red", "b")
	cookie := uint64(reconcile.MakeCookie(1, owner))
	owners := map[reconcile.Owner]reconcile.OwnerState{owner: {Flows: []openflow.Flow{
		openflow.F(pipeline.TableClassifier, 10, openflow.M(), openflow.LoadReg(pipeline.RegSrcVNID, 12), openflow.LoadReg(pipeline.RegOutPort, 4),
			openflow.Goto{Table: pipeline.TableIngressIsolation}),
		openflow.F(pipeline.TableIngressIsolation, 500, openflow.M(openflow.IP...)), // a pod's default deny
	}}, pipeline.PipelineOwner: {Flows: []openflow.Flow{
		openflow.F(pipeline.TableClassifier, 20, openflow.M(openflow.ARP...), openflow.Goto{Table: pipeline.TablePodIngress}),
		// A table's miss flow (priority 0, no match): OVS reports its controller action as OFPR_NO_MATCH.
		openflow.F(pipeline.TablePodIngress, 0, openflow.M()),
	}}}
	rendered := sampleForTest(owners)
	var msgs [][]byte
	for _, f := range rendered {
		f.Cookie = cookie
		if f.Table == pipeline.TablePodIngress || f.Priority == 20 {
			f.Cookie = uint64(reconcile.MakeCookie(1, pipeline.PipelineOwner))
		}
		m, err := openflow.EncodeFlowMod(f)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	if err := sess.Bundle(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	// One packet: one sample, decoded.
	if _, err := pod.Exec("ping", "-c", "1", "-W", "1", "10.128.0.4"); err == nil {
		t.Fatal("ping crossed a drop flow")
	}
	var first []byte
	select {
	case first = <-pins:
	case <-time.After(10 * time.Second):
		t.Fatal("no packet-in from OVS for a sampled drop")
	}
	pin, err := openflow.ParsePacketIn(first)
	if err != nil {
		t.Fatal(err)
	}
	if pin.Table != pipeline.TableIngressIsolation || pin.Cookie != cookie || pin.InPort != 3 || pin.Regs[0] != 12 || pin.Regs[2] != 4 {
		t.Fatalf("packet-in: table %d cookie %#x in_port %d regs %v", pin.Table, pin.Cookie, pin.InPort, pin.Regs)
	}
	snap := &Snapshot{Node: "n1", State: pipeline.NodeState{
		Pods:     []pipeline.PodState{{Namespace: "blue", Name: "a", IP: netip.MustParseAddr("10.128.0.3"), OFPort: 3}, {Namespace: "red", Name: "b", IP: netip.MustParseAddr("10.128.0.4"), OFPort: 4}},
		Policies: []pipeline.PolicyState{{Namespace: "red", Name: "deny-all", Ingress: true, Pods: []pipeline.PolicyPod{{OFPort: 4}}}}},
		Owners: func(c reconcile.Cookie) []reconcile.Owner { return []reconcile.Owner{owner} }}
	d, ok := Decode(pin, snap, time.Now())
	if !ok || d.Cause != string(pipeline.CausePolicyIngress) || d.Src != "blue/a" || d.Dst != "red/b" || d.Object != "NetworkPolicy red/deny-all" {
		t.Fatalf("decoded %+v", d)
	}
	t.Logf("sample: %s", d.Verdict)
	// A table's miss flow: ARP for an address nobody has goes to table 20's default (anti-spoofing).
	for len(pins) > 0 {
		<-pins
	}
	_, _ = pod.Exec("ping", "-c", "1", "-W", "1", "10.128.0.99")
	select {
	case m := <-pins:
		pin, err := openflow.ParsePacketIn(m)
		if err != nil {
			t.Fatal(err)
		}
		if pin.Table != pipeline.TablePodIngress || pin.InPort != 3 {
			t.Fatalf("miss flow's packet-in: table %d in_port %d reason %d", pin.Table, pin.InPort, pin.Reason)
		}
		t.Logf("a miss flow's sample: table %d reason %d (OFPR_NO_MATCH is 0)", pin.Table, pin.Reason)
	case <-time.After(10 * time.Second):
		t.Fatal("no packet-in for a table-miss flow's sample (OFPR_NO_MATCH not asked for?)")
	}
	// A flood: the meter passes about its rate.
	for len(pins) > 0 {
		<-pins
	}
	got.Store(0)
	const flood = 3000
	start := time.Now()
	err = pod.Do(func() error {
		c, err := net.Dial("udp4", "10.128.0.4:9")
		if err != nil {
			return err
		}
		defer c.Close()
		for i := 0; i < flood; i++ {
			if _, err := c.Write([]byte("drop me")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	time.Sleep(500 * time.Millisecond)
	n := got.Load()
	limit := int64(pipeline.DropSampleBurst) + int64(took.Seconds()+1)*pipeline.DropSampleRate
	t.Logf("flood: %d UDP datagrams in %v, %d samples (meter %d/s, burst %d: at most %d)", flood, took.Round(time.Millisecond), n,
		pipeline.DropSampleRate, pipeline.DropSampleBurst, limit)
	if n == 0 || n > limit {
		t.Errorf("%d samples of %d packets, want 1..%d", n, flood, limit)
	}
}

// sampleForTest runs the pipeline's pass over owners and returns their flows.
func sampleForTest(owners map[reconcile.Owner]reconcile.OwnerState) []openflow.Flow {
	pipeline.SampleDropsForTest(owners)
	var out []openflow.Flow
	for _, st := range owners {
		out = append(out, st.Flows...)
	}
	return out
}
