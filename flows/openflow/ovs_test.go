package openflow_test

// The codec against a real ovs-vswitchd: what we encode, ovs-ofctl prints as we do, and OVS echoes it
// back byte for byte.

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/internal/ofbridge"
)

func TestGoldenAgainstOVS(t *testing.T) {
	b := ofbridge.New(t)
	ctx := context.Background()
	var msgs [][]byte
	for _, tc := range goldenGroups {
		g := tc.group
		m, err := EncodeGroupMod(g)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	want := map[string]bool{}
	for i, tc := range goldenFlows {
		f := tc.flow
		f.Cookie = uint64(0x1000 + i)
		m, err := EncodeFlowMod(f)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
		want[fmt.Sprintf("cookie=%#x %s", 0x1000+i, f.String())] = true
	}
	if err := b.Switch.Bundle(ctx, msgs); err != nil {
		t.Fatalf("install golden flows: %v", err)
	}
	got := b.OfctlFlows(t)
	for _, l := range got {
		if !want[l] {
			t.Errorf("ovs-ofctl shows a flow we did not render:\n  %s", l)
		}
		delete(want, l)
	}
	for l := range want {
		t.Errorf("rendered flow not shown by ovs-ofctl as we print it:\n  %s", l)
	}
	// The same flows read back through our session and decoder print the same.
	raw, err := b.Switch.DumpFlows(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ours []string
	for _, e := range raw {
		f, err := DecodeFlowStats(e)
		if err != nil {
			t.Fatalf("decode a flow OVS returned: %v", err)
		}
		ours = append(ours, fmt.Sprintf("cookie=%#x %s", f.Cookie, f))
	}
	sort.Strings(ours)
	if strings.Join(ours, "\n") != strings.Join(got, "\n") {
		t.Errorf("decoded dump differs from ovs-ofctl:\nours:\n%s\novs-ofctl:\n%s", strings.Join(ours, "\n"), strings.Join(got, "\n"))
	}
	out, err := b.Inst.Ofctl("dump-groups", "br0")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range goldenGroups {
		g := tc.group
		if !strings.Contains(out, " "+g.String()+"\n") && !strings.HasSuffix(strings.TrimSpace(out), g.String()) {
			t.Errorf("dump-groups does not show %s:\n%s", g, out)
		}
	}
}

// TestWireOrderMatchesOVS: every golden flow comes back from ovs-vswitchd byte for byte as we encoded
// it (but tcp_flags, which OVS re-encodes as an ONF experimenter field), so resyncs take the fast path.
func TestWireOrderMatchesOVS(t *testing.T) {
	b := ofbridge.New(t)
	ctx := context.Background()
	var msgs [][]byte
	for _, tc := range goldenGroups {
		m, err := EncodeGroupMod(tc.group)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	sent := map[FlowKey]string{}
	for _, tc := range goldenFlows {
		c, err := Compile(tc.flow)
		if err != nil {
			t.Fatal(err)
		}
		sent[c.Key] = c.Instr
		msgs = append(msgs, AppendFlowMod(nil, &c, FlowAdd, 0, 0))
	}
	if err := b.Switch.Bundle(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	raw, err := b.Switch.DumpFlows(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range raw {
		raw, ok := RawFlowStats(e)
		f, _ := DecodeFlowStats(e)
		if _, hasFlags := f.Match.Get(FieldTCPFlags); hasFlags {
			continue
		}
		if want, found := sent[raw.Key]; !ok || !found || want != raw.Instr {
			t.Errorf("OVS re-encoded %s differently from us", f)
		}
	}
}
