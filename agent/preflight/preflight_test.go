package preflight

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	of "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/internal/ovstest"
	"k8s.io/klog/v2"
)

func TestErrorIsOneLineWithTheFix(t *testing.T) {
	err := error(&Error{Missing: "X on bridge br0", Fix: "do Y", Err: errors.New("first\nsecond\tthird")})
	want := "node prerequisite missing: X on bridge br0 (first second third). Fix: do Y"
	if err.Error() != want {
		t.Errorf("%q, want %q", err.Error(), want)
	}
	var pe *Error
	if !errors.As(fmt.Errorf("wrapped: %w", err), &pe) || pe.Fix != "do Y" {
		t.Error("Error does not survive wrapping")
	}
}

func TestFeatureProbesEncode(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range featureProbes() {
		if seen[p.feature] || p.fix == "" {
			t.Errorf("probe %q: duplicate or without a fix", p.feature)
		}
		seen[p.feature] = true
		if _, err := of.EncodeFlowMod(p.flow); err != nil {
			t.Errorf("probe %q: %v", p.feature, err)
		}
	}
}

// A node whose Open vSwitch has everything passes, gets its bridge when it had none, and the probe
// flows never reach the bridge: its flows are what they were, before and after.
func TestPrerequisitesMetTouchNoFlow(t *testing.T) {
	inst := ovstest.Start(t)
	cfg := Config{Bridge: "br0", OVSRunDir: inst.Dir, OVSDBEndpoint: "unix:" + inst.DBSocket(), DatapathType: "netdev"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := Check(ctx, cfg, klog.Background()); err != nil {
		t.Fatalf("a fresh OVS: %v", err)
	}
	if out, err := inst.Vsctl("get", "Bridge", "br0", "protocols", "datapath_type"); err != nil || !strings.Contains(out, "OpenFlow13") || !strings.Contains(out, "netdev") {
		t.Fatalf("the bridge the check created: %q %v", out, err)
	}
	if flows := dumpFlows(t, inst); flows != "" {
		t.Fatalf("flows after the check:\n%s", flows)
	}
	if _, err := inst.Ofctl("add-flow", "br0", "table=0,priority=7,ip,nw_dst=10.128.0.5,actions=drop"); err != nil {
		t.Fatal(err)
	}
	before := dumpFlows(t, inst)
	if err := Check(ctx, cfg, klog.Background()); err != nil {
		t.Fatalf("again, with a flow on the bridge: %v", err)
	}
	if after := dumpFlows(t, inst); after != before || !strings.Contains(after, "nw_dst=10.128.0.5") {
		t.Fatalf("the check changed the bridge's flows:\nbefore %s\nafter  %s", before, after)
	}
}

func dumpFlows(t *testing.T, inst *ovstest.Instance) string {
	t.Helper()
	out, err := inst.Ofctl("dump-flows", "br0", "--no-stats")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "OFPST_FLOW") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// TestAgentStopsOnMissingPrerequisites runs the ofsdn-agent binary against nodes that lack something
// and wants it to exit non-zero, within the prerequisite wait, with a line that names what is missing
// and what to do. Nothing of the agent's own runs: no kubeconfig server is ever contacted.
func TestAgentStopsOnMissingPrerequisites(t *testing.T) {
	ovstest.Require(t)
	bin := filepath.Join(t.TempDir(), "ofsdn-agent")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/ofsdn/ofsdn/cmd/ofsdn-agent").CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, out)
	}
	_, kernelOVS := os.Stat("/sys/module/openvswitch")
	tests := []struct {
		name     string
		datapath string
		setup    func(t *testing.T) (rundir string, after func(t *testing.T))
		want     []string
	}{
		{
			name: "no Open vSwitch at all", datapath: "netdev",
			setup: func(t *testing.T) (string, func(*testing.T)) { return t.TempDir(), nil },
			want:  []string{"Open vSwitch's database at unix:", "db.sock", "systemctl enable --now openvswitch-switch", "--ovs-rundir"},
		},
		{
			name: "ovs-vswitchd not running", datapath: "netdev",
			setup: func(t *testing.T) (string, func(*testing.T)) {
				inst := ovstest.Start(t)
				inst.AddBridge("br0")
				inst.StopVswitchd()
				return inst.Dir, nil
			},
			want: []string{"ovs-vswitchd serving bridge br0 at", "br0.mgmt", "no such file or directory", "Fix: start ovs-vswitchd"},
		},
		{
			name: "bridge set up for other OpenFlow versions", datapath: "netdev",
			setup: func(t *testing.T) (string, func(*testing.T)) {
				inst := ovstest.Start(t)
				inst.AddBridge("br0")
				if _, err := inst.Vsctl("set", "Bridge", "br0", "protocols=OpenFlow10,OpenFlow15"); err != nil {
					t.Fatal(err)
				}
				return inst.Dir, func(t *testing.T) {
					// The agent stopped without taking the bridge over.
					if out, err := inst.Vsctl("get", "Bridge", "br0", "protocols"); err != nil || strings.Contains(out, "OpenFlow13") {
						t.Errorf("the bridge's protocols after the agent stopped: %q %v", out, err)
					}
				}
			},
			want: []string{"OpenFlow 1.3 on bridge br0, which allows only OpenFlow10, OpenFlow15", "ovs-vsctl set bridge br0 protocols=OpenFlow13"},
		},
		{
			name: "datapath type ovs-vswitchd lacks", datapath: "dpdkish",
			setup: func(t *testing.T) (string, func(*testing.T)) { return ovstest.Start(t).Dir, nil },
			want:  []string{`datapath type \"dpdkish\" in ovs-vswitchd, which offers`, "netdev", "--datapath-type"},
		},
		{
			name: "kernel datapath without the openvswitch module", datapath: "system",
			setup: func(t *testing.T) (string, func(*testing.T)) {
				if kernelOVS == nil {
					t.Skip("this kernel has the openvswitch module loaded: a system bridge would work here")
				}
				return ovstest.Start(t).Dir, nil
			},
			want: []string{"ovs-vswitchd serving bridge br0 at", "modprobe openvswitch"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rundir, after := tc.setup(t)
			state := t.TempDir()
			kubeconfig := filepath.Join(state, "kubeconfig")
			// Never contacted: the agent stops before it talks to the API server.
			kc := "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n" +
				"users: [{name: u, user: {token: x}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
			if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "--node-name=n1", "--kubeconfig="+kubeconfig, "--ovs-rundir="+rundir, "--datapath-type="+tc.datapath,
				"--state-dir="+filepath.Join(state, "state"), "--cni-socket="+filepath.Join(state, "cni.sock"),
				"--cni-conf-dir="+filepath.Join(state, "net.d"), "--cni-bin-dir="+filepath.Join(state, "bin"))
			began := time.Now()
			out, err := cmd.CombinedOutput()
			took := time.Since(began)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("agent: %v, want a non-zero exit\n%s", err, out)
			}
			if took > Wait+15*time.Second {
				t.Errorf("the agent took %v to give up", took)
			}
			var line string
			for _, l := range strings.Split(string(out), "\n") {
				if strings.Contains(l, "node prerequisite missing") {
					if line != "" {
						t.Errorf("more than one line says what is missing:\n%s", out)
					}
					line = l
				}
			}
			t.Logf("exit %d after %v: %s", ee.ExitCode(), took.Round(time.Millisecond), line)
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("the agent's line lacks %q:\n%s", w, out)
				}
			}
			if after != nil {
				after(t)
			}
		})
	}
}
