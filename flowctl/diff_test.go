package flowctl

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"github.com/ofsdn/ofsdn/debugapi"
)

// fakeAgent answers the debug API with fixed answers.
type fakeAgent struct{ diff *debugapi.Diff }

func (f fakeAgent) Node(context.Context) (*debugapi.NodeInfo, error) {
	return nil, debugapi.ErrUnavailable
}
func (f fakeAgent) Desired(context.Context) (*debugapi.Desired, error) {
	return nil, debugapi.ErrUnavailable
}
func (f fakeAgent) Diff(context.Context) (*debugapi.Diff, error) { return f.diff, nil }
func (f fakeAgent) Dump(context.Context) (*debugapi.Dump, error) { return nil, debugapi.ErrUnavailable }
func (f fakeAgent) Trace(context.Context, debugapi.TraceRequest) (*debugapi.TraceResponse, error) {
	return nil, debugapi.ErrUnavailable
}

// serveAgent serves a fake agent's debug API on a unix socket, as the agent does on a node.
func serveAgent(t *testing.T, b debugapi.Backend) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "br0.ofsdn.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: debugapi.Handler(b, logr.Discard())}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock
}

func sampleDiff() *debugapi.Diff {
	return &debugapi.Diff{Node: "n1", Bridge: "br0", Round: 3, DesiredFlows: 120, DesiredGroups: 2, InstalledFlows: 120, InstalledGroups: 1,
		Entries: []debugapi.DiffEntry{
			{Owner: "pod/blue/a", Kind: "flow", State: "missing", Desired: "table=70, priority=200,arp,arp_tpa=10.128.0.3 actions=output:3"},
			{Owner: "pod/blue/b", Kind: "flow", State: "different", Why: "actions",
				Desired:   "table=60, priority=200,ip,nw_dst=10.128.0.4 actions=load:0xc->NXM_NX_REG1[],load:0x4->NXM_NX_REG2[],goto_table:80",
				Installed: "table=60, priority=200,ip,nw_dst=10.128.0.4 actions=output:99"},
			{Owner: "svc/blue/web:http", Kind: "group", State: "missing", Desired: "group_id=7,type=select,bucket=actions=load:0xa800003->NXM_NX_REG4[],load:0x1f90->NXM_NX_REG5[],resubmit(,42)"},
			{Owner: "test/#dc199929", Kind: "flow", State: "unexpected", Installed: "table=100, priority=7,in_port=77 actions=output:1"},
		}}
}

// TestDiffGolden: flowctl diff asks the node's agent over its socket and prints the drift by owner,
// text and JSON; differences exit with ErrDifferences (status 1), none with success.
func TestDiffGolden(t *testing.T) {
	ctx := context.Background()
	sock := serveAgent(t, fakeAgent{diff: sampleDiff()})
	for _, format := range []string{"text", "json"} {
		var out, errOut bytes.Buffer
		err := RunDiff(ctx, []string{"--socket", sock, "-o", format}, &out, &errOut)
		if !errors.Is(err, ErrDifferences) {
			t.Fatalf("%s: err %v, want ErrDifferences (stderr %s)", format, err, errOut.String())
		}
		golden(t, "diff-"+format+".golden", out.Bytes())
	}
	clean := fakeAgent{diff: &debugapi.Diff{Node: "n1", Bridge: "br0", Round: 3, DesiredFlows: 120, InstalledFlows: 120, Entries: []debugapi.DiffEntry{}}}
	var out bytes.Buffer
	if err := RunDiff(ctx, []string{"--socket", serveAgent(t, clean)}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	golden(t, "diff-none.golden", out.Bytes())
	if err := RunDiff(ctx, []string{"--socket", filepath.Join(t.TempDir(), "none.sock")}, &out, &bytes.Buffer{}); err == nil {
		t.Error("diff without an agent succeeded")
	}
}
