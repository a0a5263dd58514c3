package trace

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/flows/openflow"
)

// TestParseRecordedTraces parses answers real ovs-vswitchd gave (recorded by TestOfflineAgreesWithOFProtoTrace
// -update, and lab-* from the e2e lab's native VXLAN tunnels) into the paths recorded with them, and
// checks what flowctl reads from them.
func TestParseRecordedTraces(t *testing.T) {
	files, _ := filepath.Glob("testdata/ofproto-trace-*.txt")
	if len(files) < 6 {
		t.Fatalf("recorded traces missing: %v", files)
	}
	paths := map[string]*Path{}
	for _, f := range files {
		out, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		p, err := Parse(string(out))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		keyFile := strings.TrimSuffix(f, ".txt") + ".key"
		if *update {
			if err := os.WriteFile(keyFile, []byte(strings.Join(p.Key(), "\n")+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(keyFile)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(p.Key(), "\n") + "\n"; got != string(want) {
			t.Errorf("%s: parsed path\n%s\nwant\n%s", f, got, want)
		}
		paths[strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "ofproto-trace-"), ".txt")] = p
	}

	remote := paths["service-remote"]
	if len(remote.Passes) != 3 || remote.Passes[1].CtState != "trk,new" || remote.Passes[2].CtState != "trk,new,dnat" ||
		remote.Passes[2].ResumeTable != 45 || !strings.Contains(remote.Passes[1].Recirculates, "nat(dst=10.128.2.5:8080)") {
		t.Errorf("service to a remote endpoint: passes %+v", remote.Passes)
	}
	if s, id, ok := remote.GroupStep(); !ok || id == 0 || s.Bucket < 0 || s.Table != 42 {
		t.Errorf("group step %+v %d %v", s, id, ok)
	}
	if len(remote.Outputs) != 1 || remote.Outputs[0].Port != 1 {
		t.Fatalf("outputs %+v", remote.Outputs)
	}
	out := remote.Outputs[0].Fields
	if out.TunID != 0xc || out.TunDst != netip.MustParseAddr("198.51.100.12") || out.IPDst != netip.MustParseAddr("10.128.2.5") ||
		out.DstPort != 8080 || out.EthDst != "0a:58:0a:80:02:05" {
		t.Errorf("leaves as %+v", out)
	}
	for _, s := range remote.Passes[1].Steps {
		for _, a := range s.Actions {
			if a == "nat" || strings.HasPrefix(a, "nat(") {
				t.Errorf("ct's nested action listed as an action of its own: %v", s.Actions)
			}
		}
	}
	// A native tunnel: the underlay bridge's tables in the answer are not br0's path.
	tun := paths["lab-native-tunnel"]
	if last, _ := tun.Last(); len(tun.Outputs) != 1 || tun.Outputs[0].Port != 1 || last.Table != 90 ||
		tun.Outputs[0].Fields.TunID != 0x12 || tun.Outputs[0].Fields.TunDst != netip.MustParseAddr("203.0.113.12") {
		t.Errorf("native tunnel: outputs %+v, last step %+v", tun.Outputs, last)
	}
	// "Final flow: unchanged": the packet is the one that came in.
	if sp := paths["lab-spoofed"]; !sp.Dropped() || sp.Final.IPSrc != netip.MustParseAddr("10.9.9.9") || sp.Final.InPort == 0 {
		t.Errorf("spoofed: final %+v", sp.Final)
	}
	deny := paths["policy-deny"]
	if last, _ := deny.Last(); !deny.Dropped() || last.Table != 80 || last.Priority != 500 || deny.Final.Regs[2] != 3 {
		t.Errorf("policy deny: last %+v, final %+v", last, deny.Final)
	}
	if h := paths["hairpin"]; len(h.Outputs) != 1 || h.Outputs[0].Port != 3 || h.Outputs[0].Fields.IPSrc != netip.MustParseAddr("169.254.169.2") {
		t.Errorf("hairpin outputs %+v", h.Outputs)
	}
}

// TestParseRefusesWhatIsNoTrace: empty or foreign answers are errors, never an empty path.
func TestParseRefusesWhatIsNoTrace(t *testing.T) {
	for _, in := range []string{"", "\n\n", "ovs-vswitchd: no such bridge (Invalid argument)", "20. priority 5"} {
		if p, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = %+v, want an error", in, p)
		}
	}
	if _, err := Parse("Flow: in_port=1\n\nbridge(\"br0\")\n-------------\n20. ip, priority many\n"); err == nil {
		t.Error("a table line without a priority parsed")
	}
}

// TestNextCtFlags: each recirculating ct() gets trk,new and its NAT; a changed list asks for a retrace.
func TestNextCtFlags(t *testing.T) {
	p := &Path{Passes: []Pass{{Recirculates: "ct(table=40,zone=65520,nat)"}, {Recirculates: "ct(commit,table=45,zone=65520,nat(dst=10.128.0.3:8080))"},
		{Recirculates: "ct(commit,table=105,zone=65521,nat(src=169.254.169.2))"}, {}}}
	want := "trk,new|trk,new,dnat|trk,new,snat"
	flags, changed := p.NextCtFlags(nil)
	var got []string
	for _, f := range flags {
		got = append(got, f.String())
	}
	if strings.Join(got, "|") != want || !changed {
		t.Fatalf("flags %v changed=%v, want %s", got, changed, want)
	}
	if _, changed := p.NextCtFlags(flags); changed {
		t.Error("the same flags asked for a retrace")
	}
}

// TestSelectBucket: the dp_hash DPHashFor gives picks that bucket, for the group sizes ofsdn renders.
func TestSelectBucket(t *testing.T) {
	for _, n := range []int{1, 2, 3, 16, 17, 64, 512} {
		for b := 0; b < n; b++ {
			if got := SelectBucket(n, DPHashFor(b)); got != b {
				t.Fatalf("%d buckets: dp_hash %#x picks %d, want %d", n, DPHashFor(b), got, b)
			}
		}
	}
}

// TestEvaluateConjunctions: a conjunction completes only with every clause, at its own priority, and
// falls through to a lower priority otherwise (as OVS 3.1 does).
func TestEvaluateConjunctions(t *testing.T) {
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	flows := []openflow.Flow{
		openflow.F(80, 1000, openflow.M(append(openflow.IP, openflow.Reg(openflow.FieldReg2, 3))...), openflow.Conjunction{ID: 7, Clause: 1, NClauses: 2}),
		openflow.F(80, 1000, openflow.M(append(openflow.TCP, openflow.TCPDst(80))...), openflow.Conjunction{ID: 7, Clause: 2, NClauses: 2}),
		openflow.F(80, 1000, openflow.M(append(openflow.IP, openflow.ConjID(7))...), openflow.Goto{Table: 100}),
		openflow.F(80, 500, openflow.M(append(openflow.IP, openflow.Reg(openflow.FieldReg2, 3))...)),
		openflow.F(80, 0, openflow.M(), openflow.Goto{Table: 100}),
		openflow.F(100, 0, openflow.M(), openflow.OutputReg{Src: openflow.Whole(openflow.FieldReg2)}),
		openflow.F(0, 0, openflow.M(), openflow.LoadReg(openflow.FieldReg2, 3), openflow.Goto{Table: 80}),
	}
	b := NewBridge(flows, nil)
	pkt := func(port uint16) Packet {
		return Packet{InPort: 9, EthSrc: MAC{2, 0, 0, 0, 0, 1}, EthDst: MAC{2, 0, 0, 0, 0, 2}, Proto: "tcp", IPSrc: ip("10.0.0.1"),
			IPDst: ip("10.0.0.3"), SrcPort: 1000, DstPort: port}
	}
	allowed, err := b.Evaluate(pkt(80), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(allowed.Outputs) != 1 || allowed.Outputs[0].Port != 3 || allowed.Passes[0].Steps[1].Priority != 1000 {
		t.Errorf("tcp/80: %v", allowed.Key())
	}
	denied, err := b.Evaluate(pkt(81), nil)
	if err != nil {
		t.Fatal(err)
	}
	if last, _ := denied.Last(); !denied.Dropped() || last.Priority != 500 {
		t.Errorf("tcp/81: %v", denied.Key())
	}
}
