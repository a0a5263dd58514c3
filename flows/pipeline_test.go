package flows

import (
	"flag"
	"fmt"
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
	rendered := RenderBase()
	sort.SliceStable(rendered, func(i, j int) bool {
		if rendered[i].Table != rendered[j].Table {
			return rendered[i].Table < rendered[j].Table
		}
		return rendered[i].Priority > rendered[j].Priority
	})
	for _, f := range rendered {
		b.WriteString(f.String() + "\n")
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
