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
