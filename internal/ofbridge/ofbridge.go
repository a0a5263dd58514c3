// Package ofbridge gives tests a real bridge with an OpenFlow 1.3 session to it: a private
// ovsdb-server and userspace ovs-vswitchd (internal/ovstest) holding br0, and an ofswitch.Session on
// its management socket. It is the one bootstrap the flow packages' real-OVS tests share.
package ofbridge

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/internal/ovstest"
	"github.com/ofsdn/ofsdn/ofswitch"
)

// Name is the bridge every test bridge is called.
const Name = "br0"

// Bridge is a real br0 and a session to it.
type Bridge struct {
	Inst *ovstest.Instance
	Sess *ofswitch.Session
	// Switch is the session as a reconciler's switch (cookie/mask dumps over every table).
	Switch ofswitch.SwitchAdapter
}

// New starts OVS with br0 and dials it; everything stops when the test ends. Under -short it skips
// the test: real OVS is for the integration tier.
func New(t testing.TB) *Bridge {
	t.Helper()
	if testing.Short() {
		t.Skip("real OVS: skipped under -short")
	}
	inst := ovstest.Start(t)
	inst.AddBridge(Name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := ofswitch.Dial(ctx, ofswitch.Config{Socket: inst.MgmtSocket(Name), Bridge: Name})
	if err != nil {
		t.Fatalf("dial %s: %v", Name, err)
	}
	t.Cleanup(func() { _ = sess.Close() })
	return &Bridge{Inst: inst, Sess: sess, Switch: ofswitch.FlowsSwitch(sess)}
}

// OfctlFlows returns `ovs-ofctl dump-flows --no-stats` as lines "cookie=0x.. table=N, ..." in the form
// openflow.Flow's String prints (table always shown), sorted: what a test compares rendered flows with.
func (b *Bridge) OfctlFlows(t testing.TB) []string {
	t.Helper()
	out, err := b.Inst.Ofctl("dump-flows", Name, "--no-stats")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "OFPST_FLOW") {
			continue
		}
		cookie := "0x0"
		if strings.HasPrefix(l, "cookie=") {
			c, rest, _ := strings.Cut(l, ", ")
			cookie, l = strings.TrimPrefix(c, "cookie="), rest
		}
		if !strings.HasPrefix(l, "table=") {
			l = "table=0, " + l
		}
		lines = append(lines, "cookie="+cookie+" "+l)
	}
	sort.Strings(lines)
	return lines
}

// WithoutCookies drops the cookie of OfctlFlows lines, sorted.
func WithoutCookies(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		_, rest, _ := strings.Cut(l, " ")
		out[i] = rest
	}
	sort.Strings(out)
	return out
}

// DiffLines returns the lines that are in a and not in b or the other way round (as multisets),
// sorted: what changed between two dumps.
func DiffLines(a, b []string) []string {
	in := map[string]int{}
	for _, l := range a {
		in[l]++
	}
	for _, l := range b {
		in[l]--
	}
	var out []string
	for l, n := range in {
		for ; n > 0; n-- {
			out = append(out, l)
		}
		for ; n < 0; n++ {
			out = append(out, l)
		}
	}
	sort.Strings(out)
	return out
}
