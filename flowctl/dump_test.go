package flowctl

import (
	"bytes"
	"context"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

var update = flag.Bool("update", false, "rewrite golden files")

type fakeSource struct{ flows, groups [][]byte }

func (s fakeSource) DumpFlows(_ context.Context, cookie, mask uint64) ([][]byte, error) {
	var out [][]byte
	for _, b := range s.flows {
		f, err := openflow.DecodeFlowStats(b)
		if err != nil || uint64(f.Cookie)&mask == cookie&mask {
			out = append(out, b)
		}
	}
	return out, nil
}
func (s fakeSource) DumpGroups(context.Context) ([][]byte, error) { return s.groups, nil }

func sampleSource(t *testing.T) (fakeSource, *reconcile.OwnerIndex) {
	t.Helper()
	pod := pipeline.PodOwner("tenant-a", "web-0")
	node := pipeline.NodeOwner("node-2")
	idx := reconcile.NewOwnerIndex()
	idx.Add(pipeline.PipelineOwner)
	idx.Add(pod)
	idx.Add(node)
	ip := netip.MustParseAddr("10.128.0.5")
	all := []openflow.Flow{
		{Table: pipeline.TableClassifier, Priority: 0, Cookie: uint64(reconcile.MakeCookie(3, pipeline.PipelineOwner)), Packets: 4, Bytes: 240},
		{Table: pipeline.TablePodIngress, Priority: 100, Cookie: uint64(reconcile.MakeCookie(3, pod)), Packets: 17, Bytes: 1666,
			Match:   openflow.M(append(openflow.IP, openflow.InPort(5), openflow.IPSrc(ip))...),
			Actions: []openflow.Action{openflow.LoadReg(pipeline.RegSrcVNID, 12), openflow.Goto{Table: pipeline.TableConntrack}}},
		// Table 20's miss, sampled (anti-spoofing, meter 4), and its IPv6 drop, which is not.
		{Table: pipeline.TablePodIngress, Priority: 0, Cookie: uint64(reconcile.MakeCookie(3, pipeline.PipelineOwner)), Packets: 2, Bytes: 120,
			Actions: []openflow.Action{openflow.Controller{MaxLen: pipeline.DropSampleLen, MeterID: 4}}},
		{Table: pipeline.TablePodIngress, Priority: 1, Cookie: uint64(reconcile.MakeCookie(3, pipeline.PipelineOwner)), Packets: 9, Bytes: 630,
			Match: openflow.M(openflow.IPv6...)},
		{Table: pipeline.TableTunnelEgress, Priority: 100, Cookie: uint64(reconcile.MakeCookie(3, node)),
			Match:   openflow.M(append(openflow.IP, openflow.IPDstNet(netip.MustParsePrefix("10.129.2.0/23")))...),
			Actions: []openflow.Action{openflow.Move{Src: openflow.Whole(pipeline.RegSrcVNID), Dst: openflow.Bits(openflow.FieldTunID, 0, 31)}, openflow.SetTunDst(netip.MustParseAddr("192.0.2.12")), openflow.Output{Port: 1}}},
		{Table: 200, Priority: 1, Cookie: 0},
	}
	var src fakeSource
	for _, f := range all {
		b, err := openflow.EncodeFlowStats(f)
		if err != nil {
			t.Fatal(err)
		}
		src.flows = append(src.flows, b)
	}
	g, err := openflow.EncodeGroupDesc(openflow.GroupEntry{ID: 3, Type: openflow.GroupSelect, Buckets: []openflow.Bucket{{Weight: 1, Actions: []openflow.Action{openflow.Output{Port: 5}}}}})
	if err != nil {
		t.Fatal(err)
	}
	src.groups = [][]byte{g}
	return src, idx
}

func TestDumpGolden(t *testing.T) {
	src, idx := sampleSource(t)
	podCat := reconcile.CategoryPod
	tunnel := pipeline.TableTunnelEgress
	cases := []struct {
		name string
		opts DumpOptions
		json bool
	}{
		{"all", DumpOptions{Bridge: "br0", Owners: idx, ShowGroups: true}, false},
		{"no-owner-index", DumpOptions{Bridge: "br0", ShowGroups: true}, false},
		{"category-pod", DumpOptions{Bridge: "br0", Owners: idx, Category: &podCat, ShowGroups: true}, false},
		{"table-tunnel-egress", DumpOptions{Bridge: "br0", Owners: idx, Table: &tunnel, ShowGroups: true}, false},
		{"json", DumpOptions{Bridge: "br0", Owners: idx, ShowGroups: true}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := ReadDump(context.Background(), src, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if tc.json {
				err = d.WriteJSON(&buf)
			} else {
				err = d.WriteText(&buf)
			}
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "dump-"+tc.name+".golden")
			if *update {
				if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./flowctl -update to create it)", err)
			}
			if buf.String() != string(want) {
				t.Errorf("dump differs from %s:\n%s", golden, buf.String())
			}
		})
	}
}

func TestDumpCookieFilterAndErrors(t *testing.T) {
	src, idx := sampleSource(t)
	pod := reconcile.MakeCookie(3, pipeline.PodOwner("tenant-a", "web-0"))
	v, m, err := parseCookie(pod.String() + "/0xffffffff")
	if err != nil {
		t.Fatal(err)
	}
	d, err := ReadDump(context.Background(), src, DumpOptions{Bridge: "br0", Owners: idx, Cookie: v, CookieMask: m})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Flows) != 1 || d.Flows[0].Owner != "pod/tenant-a/web-0" {
		t.Fatalf("cookie filter: %+v", d.Flows)
	}
	for _, bad := range []string{"zz", "0x1/zz"} {
		if _, _, err := parseCookie(bad); err == nil {
			t.Errorf("parseCookie(%q): want an error", bad)
		}
	}
	var stderr bytes.Buffer
	err = RunDump(context.Background(), []string{"--rundir", t.TempDir()}, &bytes.Buffer{}, &stderr, nil)
	if err == nil || !strings.Contains(err.Error(), "no OpenFlow management socket") {
		t.Fatalf("missing socket: %v", err)
	}
	err = RunDump(context.Background(), []string{"--table", "nosuch"}, &bytes.Buffer{}, &stderr, nil)
	if err == nil || !strings.Contains(err.Error(), "unknown table") {
		t.Fatalf("bad table: %v", err)
	}
}

// TestDumpSampledDrops: a text dump shows a sampled drop flow (drops.go: the controller action with
// its cause's meter first) as the drop it is, with its cause and meter, not as a packet sent to the
// controller; a reject keeps its own actions; any other controller action is shown as it is.
func TestDumpSampledDrops(t *testing.T) {
	reject := openflow.CT{Commit: true, Table: pipeline.TableServiceL2, Zone: pipeline.ZoneService,
		NAT: &openflow.NAT{Kind: openflow.NATDst, AddrMin: netip.MustParseAddr("10.128.0.1"), PortMin: pipeline.RejectPortMin, PortMax: pipeline.RejectPortMax}}
	sample := func(meter uint32) openflow.Action {
		return openflow.Controller{MaxLen: pipeline.DropSampleLen, MeterID: meter}
	}
	for _, tc := range []struct {
		name    string
		flow    openflow.Flow
		cause   string // the JSON's sampled
		actions string // the text dump's
	}{
		{"anti-spoofing miss", openflow.F(pipeline.TablePodIngress, 0, openflow.M(), sample(4)),
			"anti-spoofing", "drop (sampled: anti-spoofing, meter 4)"},
		{"tenant isolation", openflow.F(pipeline.TableIngressIsolation, 0, openflow.M(), sample(1)),
			"tenant-isolation", "drop (sampled: tenant-isolation, meter 1)"},
		{"service reject", openflow.F(pipeline.TableServices, 100, openflow.M(append(openflow.TCP, openflow.TCPDst(80))...), sample(10), reject),
			"service-no-endpoints", "ct(commit,table=45,zone=65520,nat(dst=10.128.0.1:65400-65499)) (sampled: service-no-endpoints, meter 10)"},
		{"unsampled IPv6 drop", openflow.F(pipeline.TablePodIngress, 1, openflow.M(openflow.IPv6...)), "", "drop"},
		{"another meter", openflow.F(pipeline.TablePodIngress, 0, openflow.M(), sample(9)), "", "controller(max_len=128,meter_id=9)"},
		{"controller in a table of no cause", openflow.F(pipeline.TableOutput, 0, openflow.M(), sample(4)), "", "controller(max_len=128,meter_id=4)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := openflow.EncodeFlowStats(tc.flow)
			if err != nil {
				t.Fatal(err)
			}
			d, err := ReadDump(context.Background(), fakeSource{flows: [][]byte{b}}, DumpOptions{Bridge: "br0"})
			if err != nil || len(d.Flows) != 1 {
				t.Fatalf("dump: %v, %d flows", err, len(d.Flows))
			}
			if d.Flows[0].Sampled != tc.cause {
				t.Errorf("sampled %q, want %q", d.Flows[0].Sampled, tc.cause)
			}
			if want := tc.flow.String(); d.Flows[0].Flow != want {
				t.Errorf("JSON flow %q, want it as it is, %q", d.Flows[0].Flow, want)
			}
			var buf bytes.Buffer
			if err := d.WriteText(&buf); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(buf.String(), " actions="+tc.actions+"\n") {
				t.Errorf("text dump, want actions=%s:\n%s", tc.actions, buf.String())
			}
		})
	}
}
