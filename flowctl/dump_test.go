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

	"github.com/ofsdn/ofsdn/flows"
)

var update = flag.Bool("update", false, "rewrite golden files")

type fakeSource struct{ flows, groups [][]byte }

func (s fakeSource) DumpFlows(_ context.Context, cookie, mask uint64) ([][]byte, error) {
	var out [][]byte
	for _, b := range s.flows {
		f, err := flows.DecodeFlowStats(b)
		if err != nil || uint64(f.Cookie)&mask == cookie&mask {
			out = append(out, b)
		}
	}
	return out, nil
}
func (s fakeSource) DumpGroups(context.Context) ([][]byte, error) { return s.groups, nil }

func sampleSource(t *testing.T) (fakeSource, *flows.OwnerIndex) {
	t.Helper()
	pod := flows.PodOwner("tenant-a", "web-0")
	node := flows.NodeOwner("node-2")
	idx := flows.NewOwnerIndex()
	idx.Add(flows.PipelineOwner)
	idx.Add(pod)
	idx.Add(node)
	ip := netip.MustParseAddr("10.128.0.5")
	all := []flows.Flow{
		{Table: flows.TableClassifier, Priority: 0, Cookie: flows.MakeCookie(3, flows.PipelineOwner), Packets: 4, Bytes: 240},
		{Table: flows.TablePodIngress, Priority: 100, Cookie: flows.MakeCookie(3, pod), Packets: 17, Bytes: 1666,
			Match:   flows.M(append(flows.IP, flows.InPort(5), flows.IPSrc(ip))...),
			Actions: []flows.Action{flows.LoadReg(flows.RegSrcVNID, 12), flows.Goto{Table: flows.TableConntrack}}},
		{Table: flows.TableTunnelEgress, Priority: 100, Cookie: flows.MakeCookie(3, node),
			Match:   flows.M(append(flows.IP, flows.IPDstNet(netip.MustParsePrefix("10.129.2.0/23")))...),
			Actions: []flows.Action{flows.Move{Src: flows.Whole(flows.RegSrcVNID), Dst: flows.Bits(flows.FieldTunID, 0, 31)}, flows.SetTunDst(netip.MustParseAddr("192.0.2.12")), flows.Output{Port: 1}}},
		{Table: 200, Priority: 1, Cookie: 0},
	}
	var src fakeSource
	for _, f := range all {
		b, err := flows.EncodeFlowStats(f)
		if err != nil {
			t.Fatal(err)
		}
		src.flows = append(src.flows, b)
	}
	g, err := flows.EncodeGroupDesc(flows.GroupEntry{ID: 3, Type: flows.GroupSelect, Buckets: []flows.Bucket{{Weight: 1, Actions: []flows.Action{flows.Output{Port: 5}}}}})
	if err != nil {
		t.Fatal(err)
	}
	src.groups = [][]byte{g}
	return src, idx
}

func TestDumpGolden(t *testing.T) {
	src, idx := sampleSource(t)
	podCat := flows.CategoryPod
	tunnel := flows.TableTunnelEgress
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
	pod := flows.MakeCookie(3, flows.PodOwner("tenant-a", "web-0"))
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
