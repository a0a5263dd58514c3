package agent

import (
	"context"
	"net"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/agent/attach"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/ovstest"
	"github.com/ofsdn/ofsdn/ofswitch"
	"github.com/ofsdn/ofsdn/ovsdb"
	"k8s.io/klog/v2"
)

func TestNextRound(t *testing.T) {
	for _, tc := range []struct {
		stored string
		want   uint16
	}{{"", 1}, {"garbage", 1}, {"1", 2}, {"41", 42}, {"65535", 1}} {
		if got := NextRound(tc.stored); got != tc.want {
			t.Errorf("NextRound(%q) = %d, want %d", tc.stored, got, tc.want)
		}
	}
}

// TestRestartRoundsOnOVS runs the agent's start-up sequence twice against one real bridge: read the
// stored round, install with the next, finish the round, persist it. The second run uses round+1,
// keeps forwarding throughout, and leaves exactly the first run's flows but for the round.
func TestRestartRoundsOnOVS(t *testing.T) {
	inst := ovstest.Start(t)
	ctx := context.Background()
	db, err := ovsdb.Connect(ctx, "unix:"+inst.DBSocket(), klog.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.EnsureBridge(ctx, ovsdb.BridgeConfig{Name: "br0", DatapathType: "netdev"}); err != nil {
		t.Fatal(err)
	}
	waitSocket(t, inst.MgmtSocket("br0"))
	a := inst.AddPod("br0", "a", netip.MustParsePrefix("10.128.0.2/23"), net.HardwareAddr{0x0a, 0x58, 10, 128, 0, 2}, 10)
	b := inst.AddPod("br0", "b", netip.MustParsePrefix("10.128.0.3/23"), net.HardwareAddr{0x0a, 0x58, 10, 128, 0, 3}, 11)
	view := testView()
	view.update(func(v *nodeView) {
		v.pods = map[string]attach.Pod{
			"a/web": {Namespace: "a", Name: "web", IP: netip.MustParseAddr("10.128.0.2"), MAC: a.MAC, OFPort: 10},
			"a/db":  {Namespace: "a", Name: "db", IP: netip.MustParseAddr("10.128.0.3"), MAC: b.MAC, OFPort: 11},
		}
	})
	start := func() (uint16, *ofswitch.Session) {
		t.Helper()
		round, err := beginRound(ctx, db, "br0")
		if err != nil {
			t.Fatal(err)
		}
		sess, err := ofswitch.Dial(ctx, ofswitch.Config{Socket: inst.MgmtSocket("br0"), Bridge: "br0"})
		if err != nil {
			t.Fatal(err)
		}
		r := reconcile.New(ofswitch.FlowsSwitch(sess), reconcile.Config{Round: round, PipelineVersion: pipeline.PipelineVersion, VersionOf: pipeline.VersionOf})
		if _, err := r.LoadInstalled(ctx); err != nil {
			t.Fatal(err)
		}
		fs := newFlowSync(view, r, flowSyncHooks{}, klog.Background())
		if _, err := fs.syncNow(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := r.FinishRound(ctx); err != nil {
			t.Fatal(err)
		}
		if err := commitRound(ctx, db, "br0", round); err != nil {
			t.Fatal(err)
		}
		return round, sess
	}
	r1, s1 := start()
	s1.Close()
	if n, _ := a.Ping(b.IP.Addr(), 2, 100*time.Millisecond); n != 2 {
		t.Fatal("no connectivity after the first start")
	}
	before := dumpWithoutCookies(t, inst)
	received := make(chan int, 1)
	go func() { n, _ := a.Ping(b.IP.Addr(), 20, 100*time.Millisecond); received <- n }()
	time.Sleep(500 * time.Millisecond)
	r2, s2 := start()
	defer s2.Close()
	if r2 != r1+1 {
		t.Fatalf("second run used round %d after %d", r2, r1)
	}
	if n := <-received; n != 20 {
		t.Fatalf("pings across the restart: %d/20", n)
	}
	if after := dumpWithoutCookies(t, inst); after != before {
		t.Fatalf("flows differ after the restart:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	ids, _ := db.BridgeExternalIDs(ctx, "br0")
	if ids[extRound] != "2" || ids[extPipelineVersion] == "" {
		t.Fatalf("bridge external_ids after two runs: %v", ids)
	}
}

func dumpWithoutCookies(t *testing.T, inst *ovstest.Instance) string {
	t.Helper()
	out, err := inst.Ofctl("dump-flows", "br0", "--no-stats")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(l, "OFPST") {
			continue
		}
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "cookie=") {
			_, l, _ = strings.Cut(l, ", ")
		}
		lines = append(lines, l)
	}
	sort.Strings(lines) // ovs-ofctl's order among equal priorities is not stable
	return strings.Join(lines, "\n")
}

func waitSocket(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := netDialUnix(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func netDialUnix(path string) (net.Conn, error) {
	c, err := net.Dial("unix", path)
	if err == nil {
		c.Close()
	}
	return c, err
}
