package flowctl

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/atomicfile"
	"github.com/ofsdn/ofsdn/internal/ovstest"
	"github.com/ofsdn/ofsdn/ofswitch"
)

// TestDumpRealBridge: flows installed by a reconciler on a real bridge, dumped by `flowctl dump` over
// its own session, come out with table names and owner names from the reconciler's owner index.
func TestDumpRealBridge(t *testing.T) {
	if testing.Short() {
		t.Skip("real OVS: skipped under -short")
	}
	inst := ovstest.Start(t)
	inst.AddBridge("br0")
	ctx := context.Background()
	sess, err := ofswitch.Dial(ctx, ofswitch.Config{Socket: inst.MgmtSocket("br0"), Bridge: "br0"})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	r := reconcile.New(ofswitch.FlowsSwitch(sess), reconcile.Config{Round: 4, PipelineVersion: pipeline.PipelineVersion})
	res, err := r.Apply(ctx, map[reconcile.Owner]*reconcile.OwnerState{pipeline.PipelineOwner: {Flows: pipeline.RenderBase()}})
	if err != nil || len(res.Failed) > 0 {
		t.Fatal(err, res.Failed)
	}
	// The agent saves the owner index where flowctl looks for it.
	idx, err := json.Marshal(r.OwnerIndex())
	if err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.Write(filepath.Join(inst.Dir, "br0.owners.json"), idx, 0o644); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	if err := Main(ctx, []string{"dump", "--rundir", inst.Dir, "--table", "classifier"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"table 0 classifier:", "in_port=1", "owner=pipeline/base round=4"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dump lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := Main(ctx, []string{"dump", "--rundir", inst.Dir, "-o", "json", "--category", "pipeline"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	var d Dump
	if err := json.Unmarshal(out.Bytes(), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Flows) != len(pipeline.RenderBase()) {
		t.Errorf("json dump has %d flows, want %d", len(d.Flows), len(pipeline.RenderBase()))
	}
	if err := Main(ctx, []string{"dump", "--rundir", inst.Dir, "--bridge", "nosuch"}, &out, &out); err == nil ||
		!strings.Contains(err.Error(), "no OpenFlow management socket") {
		t.Errorf("missing bridge: %v", err)
	}
}
