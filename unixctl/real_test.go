package unixctl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/internal/ovstest"
)

// TestAgainstOVS runs the client against a real userspace ovs-vswitchd and checks every answer against
// ovs-appctl's (OVS's own client) for the same command.
func TestAgainstOVS(t *testing.T) {
	inst := ovstest.Start(t)
	inst.AddBridge("br0")
	ctx := context.Background()
	c := New(inst.Dir, "ovs-vswitchd")
	appctl := func(args ...string) string {
		t.Helper()
		ctl := filepath.Join(inst.Dir, fmt.Sprintf("ovs-vswitchd.%d.ctl", inst.VswitchdPID()))
		out, err := inst.Output("ovs-appctl", append([]string{"-t", ctl}, args...)...)
		if err != nil {
			t.Fatalf("ovs-appctl %v: %v", args, err)
		}
		return out
	}

	t.Run("version", func(t *testing.T) {
		got, err := c.Call(ctx, "version")
		if err != nil {
			t.Fatal(err)
		}
		if want := appctl("version"); got != want || !strings.Contains(got, "Open vSwitch") {
			t.Errorf("version = %q, ovs-appctl says %q", got, want)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		for _, tc := range []struct {
			method string
			args   []string
			want   string
		}{
			{"no/such/command", nil, "is not a valid command"},
			{"tnl/neigh/set", []string{"br0"}, "requires at least 3 arguments"},
			{"tnl/neigh/set", []string{"br0", "not-an-ip", "0a:58:c0:00:02:0c"}, "bad IP address"},
			{"tnl/neigh/set", []string{"br0", "192.0.2.12", "not-a-mac"}, "bad MAC address"},
		} {
			_, err := c.Call(ctx, tc.method, tc.args...)
			var refused *Error
			if !errors.As(err, &refused) || !strings.Contains(refused.Message, tc.want) {
				t.Errorf("%s %v: err = %v, want a refusal containing %q", tc.method, tc.args, err, tc.want)
			}
		}
	})

	t.Run("tunnel neighbours", func(t *testing.T) {
		if err := c.FlushTunnelNeighbors(ctx); err != nil {
			t.Fatal(err)
		}
		if got, err := c.TunnelNeighbors(ctx); err != nil || len(got) != 0 {
			t.Fatalf("after flush: %v, %v; want none", got, err)
		}
		macA, _ := net.ParseMAC("0a:58:c0:00:02:0c")
		macB, _ := net.ParseMAC("0a:58:c0:00:02:99")
		ip := netip.MustParseAddr("192.0.2.12")
		if err := c.SetTunnelNeighbor(ctx, "br0", ip, macA); err != nil {
			t.Fatal(err)
		}
		if err := c.SetTunnelNeighbor(ctx, "br0", netip.MustParseAddr("2001:db8::7"), macA); err != nil {
			t.Fatal(err)
		}
		// A second set replaces the MAC, as a snooped reply would.
		if err := c.SetTunnelNeighbor(ctx, "br0", ip, macB); err != nil {
			t.Fatal(err)
		}
		raw, err := c.Call(ctx, "tnl/neigh/show")
		if err != nil {
			t.Fatal(err)
		}
		if want := appctl("tnl/neigh/show"); raw != want {
			t.Errorf("tnl/neigh/show = %q, ovs-appctl says %q", raw, want)
		}
		got, err := ParseTunnelNeighbors(raw)
		if err != nil {
			t.Fatal(err)
		}
		want := map[netip.Addr]string{ip: macB.String(), netip.MustParseAddr("2001:db8::7"): macA.String()}
		if len(got) != len(want) {
			t.Fatalf("neighbours %+v, want %v", got, want)
		}
		for _, n := range got {
			if want[n.IP] != n.MAC.String() || n.Bridge != "br0" || n.Stale || n.Incomplete {
				t.Errorf("neighbour %+v, want MAC %s on br0", n, want[n.IP])
			}
		}
	})

	t.Run("ofproto/trace", func(t *testing.T) {
		got, err := c.Call(ctx, "ofproto/trace", "br0", "in_port=LOCAL,ip,nw_dst=192.0.2.1")
		if err != nil {
			t.Fatal(err)
		}
		if want := appctl("ofproto/trace", "br0", "in_port=LOCAL,ip,nw_dst=192.0.2.1"); got != want || !strings.Contains(got, "Datapath actions") {
			t.Errorf("trace = %q, ovs-appctl says %q", got, want)
		}
	})

	t.Run("follows a restarted daemon", func(t *testing.T) {
		before, err := c.SocketPath()
		if err != nil {
			t.Fatal(err)
		}
		inst.KillVswitchd()
		if _, err := c.Call(ctx, "version"); err == nil {
			t.Fatal("call succeeded with ovs-vswitchd killed")
		}
		if err := inst.StartVswitchd(); err != nil {
			t.Fatal(err)
		}
		after, err := c.SocketPath()
		if err != nil || after == before {
			t.Fatalf("socket after restart %q (%v), before %q", after, err, before)
		}
		if got, err := c.TunnelNeighbors(ctx); err != nil || len(got) != 0 {
			t.Errorf("restarted daemon's cache: %v, %v; want empty", got, err)
		}
	})
}
