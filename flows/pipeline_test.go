package flows

import (
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
)

var updateGolden = flag.Bool("update", false, "rewrite golden files (the pipeline golden only after a PipelineVersion bump)")

const pipelineGolden = "testdata/pipeline.golden"

// TestPipelineGolden guards the pipeline's shape the way openshift-sdn did: the rendered base pipeline
// is pinned in a golden file headed by the version it belongs to. A change to rendering that keeps the
// same PipelineVersion fails here, because agents would diff an old bridge against flows of a
// different shape instead of rebuilding it.
func TestPipelineGolden(t *testing.T) {
	var b strings.Builder
	fmt.Fprintf(&b, "version %d\n", PipelineVersion)
	for _, mode := range []Mode{ModeMultitenant, ModeSubnet} {
		st := sampleNodeState()
		st.Mode = mode
		owners, err := Render(st)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "\n# mode %s\n", mode)
		for _, o := range SortedOwners(owners) {
			fmt.Fprintf(&b, "## %s\n", o)
			rendered := owners[o].Flows
			sort.SliceStable(rendered, func(i, j int) bool {
				if rendered[i].Table != rendered[j].Table {
					return rendered[i].Table < rendered[j].Table
				}
				return rendered[i].Priority > rendered[j].Priority
			})
			for _, f := range rendered {
				b.WriteString(f.String() + "\n")
			}
		}
	}
	got := b.String()
	want, err := os.ReadFile(pipelineGolden)
	if err != nil && !*updateGolden {
		t.Fatalf("%v (run go test ./flows -run TestPipelineGolden -update)", err)
	}
	goldenVersion := -1
	if first, _, ok := strings.Cut(string(want), "\n"); ok {
		if v, err := strconv.Atoi(strings.TrimPrefix(first, "version ")); err == nil {
			goldenVersion = v
		}
	}
	if got == string(want) {
		return
	}
	if goldenVersion == int(PipelineVersion) {
		t.Fatalf("rendered flows changed but PipelineVersion is still %d: bump it in flows/render_base.go, then run with -update.\ngot:\n%s", PipelineVersion, got)
	}
	if !*updateGolden {
		t.Fatalf("pipeline golden is for version %d, code is version %d: run with -update.\ngot:\n%s", goldenVersion, PipelineVersion, got)
	}
	if err := os.WriteFile(pipelineGolden, []byte(got), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestEveryTableHasOneDefault(t *testing.T) {
	defaults := map[TableID]int{}
	for _, f := range RenderBase() {
		if f.Priority == 0 && len(f.Match.Fields()) == 0 {
			defaults[f.Table]++
		}
	}
	for _, tbl := range Tables {
		if defaults[tbl.ID] != 1 {
			t.Errorf("table %d %s has %d default flows, want 1", tbl.ID, tbl.Name, defaults[tbl.ID])
		}
	}
}

// sampleNodeState is a node with pods in two tenants and the global VNID, and two remote nodes.
func sampleNodeState() NodeState {
	mac := func(last byte) net.HardwareAddr { return net.HardwareAddr{0x0a, 0x58, 10, 128, 0, last} }
	return NodeState{
		NodeName:        "node-1",
		NodeIP:          netip.MustParseAddr("192.0.2.11"),
		LocalSubnet:     netip.MustParsePrefix("10.128.0.0/23"),
		ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")},
		Pods: []PodState{
			{Namespace: "a", Name: "web", IP: netip.MustParseAddr("10.128.0.2"), MAC: mac(2), OFPort: 3, VNID: 11},
			{Namespace: "b", Name: "db", IP: netip.MustParseAddr("10.128.0.3"), MAC: mac(3), OFPort: 4, VNID: 12},
			{Namespace: "default", Name: "dns", IP: netip.MustParseAddr("10.128.0.4"), MAC: mac(4), OFPort: 5, VNID: 0},
		},
		RemoteNodes: []RemoteNode{
			{Name: "node-2", NodeIP: netip.MustParseAddr("192.0.2.12"), Subnet: netip.MustParsePrefix("10.128.2.0/23")},
			{Name: "node-3", NodeIP: netip.MustParseAddr("192.0.2.13"), Subnet: netip.MustParsePrefix("10.128.4.0/23")},
		},
	}
}

func TestRenderRejectsIncompleteNode(t *testing.T) {
	if _, err := Render(NodeState{NodeName: "n"}); err == nil {
		t.Fatal("a node without subnet must not render")
	}
}

func TestRenderCompiles(t *testing.T) {
	owners, err := Render(sampleNodeState())
	if err != nil {
		t.Fatal(err)
	}
	r := NewReconciler(newFakeSwitch(), ReconcilerConfig{Round: 1})
	if err := r.SetDesiredBatch(owners); err != nil {
		t.Fatalf("rendered flows do not compile or collide: %v", err)
	}
}
