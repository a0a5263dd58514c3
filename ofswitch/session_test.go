package ofswitch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/flows/openflow"

	"github.com/ofsdn/ofsdn/internal/ovstest"
)

func TestConnectFeaturesBarrier(t *testing.T) {
	b := newBridge(t)
	ctx := ctxTimeout(t, 20*time.Second)
	if !b.sess.Connected() {
		t.Fatal("not connected after Dial")
	}
	out, err := b.inst.Ofctl("show", "br0")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(out, "dpid:")
	if i < 0 {
		t.Fatalf("no dpid in ovs-ofctl show: %s", out)
	}
	want, err := strconv.ParseUint(strings.Fields(out[i+5:])[0], 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.sess.DatapathID(); got != want {
		t.Fatalf("DatapathID %016x, ovs-ofctl says %016x", got, want)
	}
	if err := b.sess.Barrier(ctx); err != nil {
		t.Fatalf("barrier: %v", err)
	}
	ports, err := b.sess.PortDesc(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 1 || ports[0].Name != "br0" || ports[0].No != 0xfffffffe {
		t.Fatalf("port description: %+v, want the bridge's LOCAL port br0", ports)
	}
}

// TestHelloWrongVersion: a bridge without OpenFlow 1.3 makes Dial fail at once, naming the problem.
func TestHelloWrongVersion(t *testing.T) {
	inst := ovstest.Start(t)
	inst.AddBridge("br0")
	if _, err := inst.Vsctl("set", "Bridge", "br0", "protocols=OpenFlow10,OpenFlow15"); err != nil {
		t.Fatal(err)
	}
	_, err := Dial(ctxTimeout(t, 20*time.Second), Config{Socket: inst.MgmtSocket("br0"), Bridge: "br0"})
	if !errors.Is(err, openflow.ErrVersion) {
		t.Fatalf("Dial to a 1.0/1.5 bridge: %v, want openflow.ErrVersion", err)
	}
	if !strings.Contains(err.Error(), "OpenFlow 1.3") {
		t.Fatalf("error does not say what is wrong: %v", err)
	}
}

func TestBundleInstallAndDump(t *testing.T) {
	b := newBridge(t)
	tests := []struct {
		name  string
		n     int
		multi bool // the dump needs more than one 64 KiB chunk
	}{
		{"one", 1, false},
		{"hundred", 100, false},
		{"5000 over many chunks", 5000, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b.clear(t)
			ctx := ctxTimeout(t, 60*time.Second)
			msgs := podFlows(t, tc.n, func(i int) uint64 { return 0x1000 + uint64(i) })
			if err := b.sess.Bundle(ctx, msgs); err != nil {
				t.Fatalf("bundle: %v", err)
			}
			entries, err := b.sess.DumpFlows(ctx, FlowFilter{TableID: openflow.AllTables})
			if err != nil {
				t.Fatalf("dump: %v", err)
			}
			if len(entries) != tc.n {
				t.Fatalf("dump returned %d flows, want %d", len(entries), tc.n)
			}
			total := 0
			seen := map[uint32]bool{}
			for _, fs := range parseFlows(t, entries) {
				total += int(fs.Length)
				port := inPortOf(t, fs)
				if fs.TableId != 20 || fs.Priority != 100 || fs.Cookie != 0x1000+uint64(port-1) {
					t.Fatalf("flow in_port=%d: table %d priority %d cookie %#x", port, fs.TableId, fs.Priority, fs.Cookie)
				}
				seen[port] = true
			}
			if len(seen) != tc.n {
				t.Fatalf("%d distinct flows, want %d", len(seen), tc.n)
			}
			if tc.multi && total <= openflow.MaxMessageLen {
				t.Fatalf("%d bytes of entries fit one chunk; the test proves nothing about chunks", total)
			}
			lines := b.ofctlFlows(t)
			if len(lines) != tc.n {
				t.Fatalf("ovs-ofctl sees %d flows, want %d", len(lines), tc.n)
			}
			want := fmt.Sprintf("cookie=%#x, table=20, priority=100,ip,in_port=1,nw_src=10.128.0.0 actions=load:0x2a->NXM_NX_REG0[],goto_table:30", 0x1000)
			if lines[0] != want {
				t.Fatalf("ovs-ofctl prints\n%s\nwant\n%s", lines[0], want)
			}
		})
	}
}

func TestDumpFilter(t *testing.T) {
	b := newBridge(t)
	ctx := ctxTimeout(t, 30*time.Second)
	// Cookies: owner in the low 32 bits, round in the top 16.
	cookie := func(i int) uint64 { return uint64(1+i%2)<<48 | uint64(i%5) }
	if err := b.sess.Bundle(ctx, podFlows(t, 100, cookie)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		filter FlowFilter
		want   func(i int) bool
	}{
		{"all", FlowFilter{TableID: openflow.AllTables}, func(int) bool { return true }},
		{"table 20", FlowFilter{TableID: 20}, func(int) bool { return true }},
		{"table 21", FlowFilter{TableID: 21}, func(int) bool { return false }},
		{"round 2", FlowFilter{TableID: openflow.AllTables, Cookie: 2 << 48, CookieMask: 0xffff << 48}, func(i int) bool { return i%2 == 1 }},
		{"owner 3", FlowFilter{TableID: openflow.AllTables, Cookie: 3, CookieMask: 0xffffffff}, func(i int) bool { return i%5 == 3 }},
		{"exact", FlowFilter{TableID: 20, Cookie: 1<<48 | 4, CookieMask: ^uint64(0)}, func(i int) bool { return i%2 == 0 && i%5 == 4 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			entries, err := b.sess.DumpFlows(ctx, tc.filter)
			if err != nil {
				t.Fatal(err)
			}
			want := map[uint32]bool{}
			for i := 0; i < 100; i++ {
				if tc.want(i) {
					want[uint32(i+1)] = true
				}
			}
			got := map[uint32]bool{}
			for _, fs := range parseFlows(t, entries) {
				got[inPortOf(t, fs)] = true
			}
			if len(got) != len(want) || len(entries) != len(want) {
				t.Fatalf("%d flows (%d distinct), want %d", len(entries), len(got), len(want))
			}
			for p := range want {
				if !got[p] {
					t.Fatalf("flow in_port=%d missing", p)
				}
			}
		})
	}
}

// TestBundleAtomic: a bundle the switch refuses names the offending message and installs none of its
// flows, whether OVS refuses the message when it decodes the bundle-add (bad prerequisite) or at
// commit (a group that does not exist).
func TestBundleAtomic(t *testing.T) {
	b := newBridge(t)
	tests := []struct {
		name     string
		bad      func(t testing.TB) []byte
		index    int
		msg      string
		typ      uint16
		alsoSays string
	}{
		{"missing group at commit", func(t testing.TB) []byte { return podFlow(t, 7, 0x99, 99) }, 7, "OFPBAC_BAD_OUT_GROUP", 2, "OFPBFC_MSG_FAILED"},
		{"bad prerequisite at add", func(t testing.TB) []byte { return badPrereqFlow(t, 3) }, 3, "OFPBMC_BAD_PREREQ", 4, ""},
		{"first message", func(t testing.TB) []byte { return podFlow(t, 0, 0x99, 99) }, 0, "OFPBAC_BAD_OUT_GROUP", 2, "OFPBFC_MSG_FAILED"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b.clear(t)
			ctx := ctxTimeout(t, 30*time.Second)
			msgs := podFlows(t, 20, func(int) uint64 { return 0x5 })
			msgs[tc.index] = tc.bad(t)
			err := b.sess.Bundle(ctx, msgs)
			var be *BundleError
			if !errors.As(err, &be) {
				t.Fatalf("bundle: %v, want *BundleError", err)
			}
			if be.Index != tc.index || be.Msg != tc.msg || be.Type != tc.typ || be.FailedMessage() != tc.index {
				t.Fatalf("BundleError %+v, want index %d, %s (type %d)", be, tc.index, tc.msg, tc.typ)
			}
			if tc.alsoSays != "" && !strings.Contains(be.Error(), tc.alsoSays) {
				t.Fatalf("%q does not mention %s", be.Error(), tc.alsoSays)
			}
			if lines := b.ofctlFlows(t); len(lines) != 0 {
				t.Fatalf("a refused bundle installed %d flows:\n%s", len(lines), strings.Join(lines, "\n"))
			}
			// The session stays usable and the bundle is gone: the same flows without the bad one go in.
			msgs[tc.index] = podFlow(t, tc.index, 0x5, 0)
			if err := b.sess.Bundle(ctx, msgs); err != nil {
				t.Fatalf("bundle after the refused one: %v", err)
			}
			if lines := b.ofctlFlows(t); len(lines) != len(msgs) {
				t.Fatalf("%d flows, want %d", len(lines), len(msgs))
			}
		})
	}
}

// TestBundleGroupAndFlow: OVS 3.1 accepts a group-mod in the same bundle as the flow that uses it.
func TestBundleGroupAndFlow(t *testing.T) {
	b := newBridge(t)
	ctx := ctxTimeout(t, 30*time.Second)
	if err := b.sess.Bundle(ctx, [][]byte{selectGroup(t, 99), podFlow(t, 1, 0x7, 99)}); err != nil {
		t.Fatalf("group and flow in one bundle: %v", err)
	}
	groups, err := b.sess.DumpGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 1 || binary.BigEndian.Uint32(groups[0][4:]) != 99 {
		t.Fatalf("groups: %x", groups)
	}
	stats, err := b.sess.DumpGroupStats(ctx)
	if err != nil || len(stats) != 1 || binary.BigEndian.Uint32(stats[0][4:]) != 99 {
		t.Fatalf("group stats: %x, %v", stats, err)
	}
	if lines := b.ofctlFlows(t); len(lines) != 1 || !strings.Contains(lines[0], "group:99") {
		t.Fatalf("flows: %q", lines)
	}
}

// TestMessageChecks: messages that cannot be right are refused before anything is sent.
func TestMessageChecks(t *testing.T) {
	b := newBridge(t)
	ctx := ctxTimeout(t, 30*time.Second)
	big := func(n int) []byte {
		m := make([]byte, n)
		openflow.PutHeader(m, 14, min(n, 0xffff), 0)
		return m
	}
	good := podFlow(t, 1, 1, 0)
	wrongLen := append([]byte(nil), good...)
	binary.BigEndian.PutUint16(wrongLen[2:], uint16(len(good)+8))
	v15 := append([]byte(nil), good...)
	v15[0] = 6
	tests := []struct {
		name string
		msg  []byte
		want string
	}{
		{"too big for a bundle-add", big(openflow.MaxBundledMessageLen + 1), "exceed"},
		{"over 64 KiB", big(70000), "exceed"},
		{"length field", wrongLen, "length field"},
		{"short", []byte{4, 14, 0}, "shorter"},
		{"version", v15, "version"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := b.sess.Bundle(ctx, [][]byte{good, tc.msg})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "message 1") {
				t.Fatalf("Bundle: %v, want an error about message 1 containing %q", err, tc.want)
			}
			if lines := b.ofctlFlows(t); len(lines) != 0 {
				t.Fatalf("flows installed: %q", lines)
			}
		})
	}
	if err := b.sess.Barrier(ctx); err != nil {
		t.Fatalf("session broken after refused messages: %v", err)
	}
}

// TestSend: outside a bundle, a refused message is named and the others still apply.
func TestSend(t *testing.T) {
	b := newBridge(t)
	ctx := ctxTimeout(t, 30*time.Second)
	msgs := podFlows(t, 10, func(int) uint64 { return 1 })
	msgs[4] = podFlow(t, 4, 1, 99)
	err := b.sess.Send(ctx, msgs)
	var be *BundleError
	if !errors.As(err, &be) || be.Index != 4 || be.Msg != "OFPBAC_BAD_OUT_GROUP" {
		t.Fatalf("Send: %v, want message 4 refused with OFPBAC_BAD_OUT_GROUP", err)
	}
	if lines := b.ofctlFlows(t); len(lines) != 9 {
		t.Fatalf("%d flows, want the 9 good ones", len(lines))
	}
}

// TestReconnect: ovs-vswitchd is killed and restarted; a request in flight fails with
// ErrDisconnected, one made while disconnected waits, the session reconnects by itself, and the
// OnReconnect hook reinstalls the flows before the test checks them.
func TestReconnect(t *testing.T) {
	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) {
			b := newBridge(t, func(c *Config) { c.HoldRequestsDuringReplay = hold })
			ctx := ctxTimeout(t, 60*time.Second)
			msgs := podFlows(t, 50, func(int) uint64 { return 3 })
			if err := b.sess.Bundle(ctx, msgs); err != nil {
				t.Fatal(err)
			}
			before := b.ofctlFlows(t)
			hookRuns := make(chan error, 8)
			b.sess.OnReconnect(func(ctx context.Context) error {
				err := b.sess.Bundle(ctx, podFlows(t, 50, func(int) uint64 { return 3 }))
				hookRuns <- err
				return err
			})

			// In flight: freeze vswitchd so the barrier's reply cannot come, then kill it.
			pid := b.inst.VswitchdPID()
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			inflight := make(chan error, 1)
			go func() { inflight <- b.sess.Barrier(ctx) }()
			waitUntil(t, "the barrier is waiting for its reply", func() bool { return pendingRequests(b.sess) > 0 })
			b.inst.KillVswitchd()
			if err := <-inflight; !errors.Is(err, ErrDisconnected) {
				t.Fatalf("barrier in flight when vswitchd died: %v, want ErrDisconnected", err)
			}
			waitUntil(t, "the session notices", func() bool { return !b.sess.Connected() })

			// While disconnected: a request waits for the connection.
			waiting := make(chan error, 1)
			go func() {
				_, err := b.sess.DumpFlows(ctx, FlowFilter{TableID: openflow.AllTables})
				waiting <- err
			}()
			if err := b.inst.StartVswitchd(); err != nil {
				t.Fatal(err)
			}
			if err := <-hookRuns; err != nil {
				t.Fatalf("OnReconnect hook: %v", err)
			}
			if err := <-waiting; err != nil {
				t.Fatalf("request made while disconnected: %v", err)
			}
			if !b.sess.Connected() || b.sess.Reconnects() != 1 {
				t.Fatalf("connected %v, reconnects %d", b.sess.Connected(), b.sess.Reconnects())
			}
			if after := b.ofctlFlows(t); strings.Join(after, "\n") != strings.Join(before, "\n") {
				t.Fatalf("flows after replay differ:\n%s\nbefore:\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
			}
			entries, err := b.sess.DumpFlows(ctx, FlowFilter{TableID: openflow.AllTables})
			if err != nil || len(entries) != 50 {
				t.Fatalf("dump after reconnect: %d flows, %v", len(entries), err)
			}
		})
	}
}

// TestReplayRetried: a failing hook is retried on the same connection until it succeeds.
func TestReplayRetried(t *testing.T) {
	b := newBridge(t, func(c *Config) { c.ReconnectMin = time.Millisecond })
	calls := make(chan int, 16)
	n := 0
	b.sess.OnReconnect(func(ctx context.Context) error {
		n++
		calls <- n
		if n < 3 {
			return errors.New("not yet")
		}
		return b.sess.Barrier(ctx)
	})
	b.inst.KillVswitchd()
	if err := b.inst.StartVswitchd(); err != nil {
		t.Fatal(err)
	}
	for want := 1; want <= 3; want++ {
		if got := <-calls; got != want {
			t.Fatalf("hook call %d, want %d", got, want)
		}
	}
	if err := b.sess.Barrier(ctxTimeout(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestContextCancel: a request whose context ends returns promptly, and the session stays usable.
func TestContextCancel(t *testing.T) {
	b := newBridge(t)
	pid := b.inst.VswitchdPID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.sess.Bundle(ctx, podFlows(t, 10, func(int) uint64 { return 1 })) }()
	waitUntil(t, "the bundle is waiting", func() bool { return pendingRequests(b.sess) > 0 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled bundle: %v", err)
	}
	_ = syscall.Kill(pid, syscall.SIGCONT)
	ctx2 := ctxTimeout(t, 30*time.Second)
	if err := b.sess.Barrier(ctx2); err != nil {
		t.Fatalf("barrier after a cancelled bundle: %v", err)
	}
	if b.sess.Reconnects() != 0 {
		t.Fatal("cancelling a request cost the connection")
	}
	if lines := b.ofctlFlows(t); len(lines) != 0 {
		t.Fatalf("the cancelled bundle was applied (it should have been discarded): %q", lines)
	}
	// A request waiting for a connection that does not come ends with its context.
	b.inst.KillVswitchd()
	waitUntil(t, "the session notices", func() bool { return !b.sess.Connected() })
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if err := b.sess.Barrier(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("barrier while disconnected: %v", err)
	}
}

// TestCloseStopsGoroutines: after Close no goroutine of the session is left, including while it
// was reconnecting, and requests fail with ErrClosed.
func TestCloseStopsGoroutines(t *testing.T) {
	for _, state := range []string{"connected", "reconnecting"} {
		t.Run(state, func(t *testing.T) {
			b := newBridge(t)
			b.sess.OnReconnect(func(ctx context.Context) error { return nil })
			if err := b.sess.Bundle(ctxTimeout(t, 30*time.Second), podFlows(t, 10, func(int) uint64 { return 1 })); err != nil {
				t.Fatal(err)
			}
			if state == "reconnecting" {
				b.inst.KillVswitchd()
				waitUntil(t, "the session notices", func() bool { return !b.sess.Connected() })
			}
			if n := sessionGoroutines(); n == 0 {
				t.Fatal("no session goroutine found before Close: the check would prove nothing")
			}
			if err := b.sess.Close(); err != nil {
				t.Fatal(err)
			}
			// Close waited for every goroutine; a goroutine may still be returning from its last frame.
			waitUntil(t, "session goroutines exit", func() bool { return sessionGoroutines() == 0 })
			if err := b.sess.Barrier(context.Background()); !errors.Is(err, ErrClosed) {
				t.Fatalf("barrier after Close: %v", err)
			}
			if err := b.sess.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
		})
	}
}

// pendingRequests counts the requests waiting for replies on the current connection.
func pendingRequests(s *Session) int {
	s.mu.Lock()
	c := s.conn
	s.mu.Unlock()
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters) + len(c.ranges)
}

// sessionGoroutines counts goroutines running the session's or a connection's code.
func sessionGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "ofswitch.(*Session)") || strings.Contains(g, "ofswitch.(*conn)") {
			n++
		}
	}
	return n
}

// waitUntil polls cond: a liveness bound for events driven by other processes, not a timing check.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestValidateAppliesNothing: Validate reports what the switch refuses at add time, naming the
// message, and leaves the tables as they were either way; the session goes on working.
func TestValidateAppliesNothing(t *testing.T) {
	b := newBridge(t)
	ctx := ctxTimeout(t, 30*time.Second)
	installed := podFlows(t, 3, func(int) uint64 { return 0x1 })
	if err := b.sess.Bundle(ctx, installed); err != nil {
		t.Fatal(err)
	}
	before := b.ofctlFlows(t)

	probe := podFlows(t, 10, func(int) uint64 { return 0x2 })
	if err := b.sess.Validate(ctx, probe); err != nil {
		t.Fatalf("valid flows: %v", err)
	}
	if after := b.ofctlFlows(t); !slices.Equal(after, before) {
		t.Fatalf("Validate changed the flows:\nbefore %q\nafter  %q", before, after)
	}

	probe[4] = badPrereqFlow(t, 4)
	err := b.sess.Validate(ctx, probe)
	var be *BundleError
	if !errors.As(err, &be) || be.Index != 4 || be.Msg != "OFPBMC_BAD_PREREQ" {
		t.Fatalf("Validate with a bad message 4: %v, want a BundleError on it", err)
	}
	// A missing group is checked only at commit, which Validate never does.
	probe[4] = podFlow(t, 4, 0x2, 99)
	if err := b.sess.Validate(ctx, probe); err != nil {
		t.Fatalf("a flow naming a missing group: %v (OVS checks groups at commit only)", err)
	}
	if after := b.ofctlFlows(t); !slices.Equal(after, before) {
		t.Fatalf("Validate changed the flows:\nbefore %q\nafter  %q", before, after)
	}
	if err := b.sess.Bundle(ctx, podFlows(t, 5, func(int) uint64 { return 0x3 })); err != nil {
		t.Fatalf("bundle after Validate: %v", err)
	}
}
