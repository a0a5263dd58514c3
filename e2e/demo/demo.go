// Package demo shows ofsdn's data plane on a lab of real Open vSwitch nodes: each node's br0 is built
// through OVSDB (vxlan0, tun0, pod ports), its pipeline rendered by flows.Render and installed over
// ofsdn's own OpenFlow 1.3 session, and pods in two tenants and the global VNID talk across nodes
// through VXLAN. It prints the connectivity matrix and a flowctl dump.
//
// It drives the node code directly, without an API server or agent, until the agent's lab lands
// (node state is written here as the agent's informers will assemble it).
package demo

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ofsdn/ofsdn/agent/podnet"
	"github.com/ofsdn/ofsdn/e2e/lab"
	"github.com/ofsdn/ofsdn/flowctl"
	"github.com/ofsdn/ofsdn/flows"
	"github.com/ofsdn/ofsdn/ofswitch"
	"github.com/ofsdn/ofsdn/ovsdb"
	"k8s.io/klog/v2"
)

// Pod is one demo pod.
type Pod struct {
	Namespace, Name string
	Node            int
	VNID            uint32
	IP              netip.Addr
	NetNS           string
}

// Options configure a demo run.
type Options struct {
	Nodes int
	Mode  flows.Mode
	// Keep leaves the lab running until ctx ends (for a person to poke at it).
	Keep bool
}

// Result is what the demo measured.
type Result struct {
	Pods   []Pod
	Reach  map[[2]int]bool // [from, to] pod indexes
	Expect map[[2]int]bool
}

var clusterNet = netip.MustParsePrefix("10.128.0.0/14")

func nodeSubnet(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128, byte(2 * i), 0}), 23)
}

// tenants: two isolated tenants and the global "default" namespace.
var tenants = []struct {
	ns   string
	vnid uint32
}{{"blue", 11}, {"red", 12}, {"default", flows.GlobalVNID}}

// Run builds the lab, runs the demo, prints what it saw, and tears the lab down.
func Run(ctx context.Context, out io.Writer, opts Options) (*Result, error) {
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	if opts.Mode == "" {
		opts.Mode = flows.ModeMultitenant
	}
	start := time.Now()
	l, err := lab.Start(ctx, lab.Options{Nodes: opts.Nodes})
	if err != nil {
		return nil, err
	}
	defer l.Stop()
	fmt.Fprintf(out, "lab: %d nodes on %s, each with its own ovsdb-server and userspace ovs-vswitchd (%s)\n",
		len(l.Nodes), l.Underlay, l.StartDuration.Round(time.Millisecond))

	type nodeRT struct {
		db   *ovsdb.Client
		sess *ofswitch.Session
		r    *flows.Reconciler
	}
	rts := make([]nodeRT, len(l.Nodes))
	for i, n := range l.Nodes {
		db, err := ovsdb.Connect(ctx, "unix:"+n.DBSocket(), klog.Background())
		if err != nil {
			return nil, err
		}
		defer db.Close()
		if err := db.EnsureBridge(ctx, ovsdb.BridgeConfig{Name: "br0", DatapathType: "netdev"}); err != nil {
			return nil, err
		}
		if _, err := db.EnsureVXLANPort(ctx, "br0", "vxlan0", 4789, int(flows.PortVXLAN)); err != nil {
			return nil, err
		}
		if _, err := db.EnsureInternalPort(ctx, "br0", "tun0", int(flows.PortTun0)); err != nil {
			return nil, err
		}
		if err := waitSocket(ctx, n.MgmtSocket("br0")); err != nil {
			return nil, err
		}
		sess, err := ofswitch.Dial(ctx, ofswitch.Config{Socket: n.MgmtSocket("br0"), Bridge: "br0"})
		if err != nil {
			return nil, err
		}
		defer sess.Close()
		r := flows.NewReconciler(ofswitch.FlowsSwitch(sess), flows.ReconcilerConfig{Round: 1, PipelineVersion: flows.PipelineVersion,
			OwnerIndexPath: filepath.Join(n.Dir, "br0.owners.json")})
		rts[i] = nodeRT{db: db, sess: sess, r: r}
	}

	// Pods: one per tenant per node, plumbed like the agent does (veth, MAC from IP, MTU, routes).
	res := &Result{Reach: map[[2]int]bool{}, Expect: map[[2]int]bool{}}
	states := make([]flows.NodeState, len(l.Nodes))
	for i, n := range l.Nodes {
		states[i] = flows.NodeState{Mode: opts.Mode, NodeName: n.Name, NodeIP: n.IP, LocalSubnet: nodeSubnet(i),
			ClusterNetworks: []netip.Prefix{clusterNet}}
		for j, other := range l.Nodes {
			if j != i {
				states[i].RemoteNodes = append(states[i].RemoteNodes, flows.RemoteNode{Name: other.Name, NodeIP: other.IP, Subnet: nodeSubnet(j)})
			}
		}
		ip := flows.Gateway(nodeSubnet(i))
		for _, t := range tenants {
			ip = ip.Next()
			p := Pod{Namespace: t.ns, Name: fmt.Sprintf("web-%d", i+1), Node: i, VNID: t.vnid, IP: ip,
				NetNS: l.NetNSName(fmt.Sprintf("pod-%s-%d", t.ns, i+1))}
			if out, err := exec.CommandContext(ctx, "ip", "netns", "add", p.NetNS).CombinedOutput(); err != nil {
				return nil, fmt.Errorf("pod netns: %v: %s", err, out)
			}
			hostVeth := podnet.HostVethName(p.Namespace+"-"+p.Name, "eth0")
			mac, err := podnet.Setup(podnet.Config{NetNS: "/var/run/netns/" + p.NetNS, HostNetNS: "/var/run/netns/" + n.NetNS,
				IfName: "eth0", HostVeth: hostVeth, IP: netip.PrefixFrom(ip, 23), Gateway: flows.Gateway(nodeSubnet(i)),
				ClusterNetworks: []netip.Prefix{clusterNet}, MTU: l.PodMTU(), TxChecksumOff: true})
			if err != nil {
				return nil, err
			}
			ofport, err := rts[i].db.EnsureSystemPort(ctx, "br0", hostVeth, map[string]string{"ofsdn/pod-namespace": p.Namespace, "ofsdn/pod-name": p.Name})
			if err != nil {
				return nil, err
			}
			states[i].Pods = append(states[i].Pods, flows.PodState{Namespace: p.Namespace, Name: p.Name, IP: ip, MAC: mac, OFPort: uint32(ofport), VNID: p.VNID})
			res.Pods = append(res.Pods, p)
		}
	}
	for i := range l.Nodes {
		owners, err := flows.Render(states[i])
		if err != nil {
			return nil, err
		}
		if err := rts[i].r.SetDesiredBatch(owners); err != nil {
			return nil, err
		}
		st, err := rts[i].r.SyncAll(ctx)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(out, "%s: %d pods, pipeline installed in one bundle (%s)\n", l.Nodes[i].Name, len(states[i].Pods), st)
	}

	// The matrix: every pod pings every other pod (a warm-up packet first: OVS resolves a new tunnel
	// neighbour's ARP before it forwards).
	var mu sync.Mutex
	var wg sync.WaitGroup
	for a, from := range res.Pods {
		for b, to := range res.Pods {
			if a == b {
				continue
			}
			res.Expect[[2]int{a, b}] = opts.Mode != flows.ModeMultitenant || from.VNID == to.VNID ||
				from.VNID == flows.GlobalVNID || to.VNID == flows.GlobalVNID
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok := reach(ctx, from.NetNS, to.IP)
				mu.Lock()
				res.Reach[[2]int{a, b}] = ok
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	printMatrix(out, res, opts.Mode)

	fmt.Fprintf(out, "\nflowctl dump --table ingress-isolation on %s:\n", l.Nodes[0].Name)
	dial := func(ctx context.Context, socket, bridge string) (flowctl.FlowSource, func(), error) {
		return flowctl.DialBridge(ctx, socket, bridge)
	}
	if err := flowctl.RunDump(ctx, []string{"--rundir", l.Nodes[0].Dir, "--table", "ingress-isolation"}, out, out, dial); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "\ndemo took %s\n", time.Since(start).Round(time.Millisecond))
	if opts.Keep {
		fmt.Fprintf(out, "lab %s stays up until interrupted (namespaces %s-*)\n", l.Prefix, l.Prefix)
		<-ctx.Done()
	}
	return res, nil
}

func reach(ctx context.Context, netns string, dst netip.Addr) bool {
	for attempt := 0; attempt < 3; attempt++ {
		err := exec.CommandContext(ctx, "ip", "netns", "exec", netns, "ping", "-n", "-q", "-c", "1", "-W", "1", dst.String()).Run()
		if err == nil {
			return true
		}
	}
	return false
}

func printMatrix(out io.Writer, res *Result, mode flows.Mode) {
	names := make([]string, len(res.Pods))
	for i, p := range res.Pods {
		names[i] = fmt.Sprintf("%s/%s(%d)", p.Namespace, p.Name, p.VNID)
	}
	w := 0
	for _, n := range names {
		w = max(w, len(n))
	}
	fmt.Fprintf(out, "\nconnectivity in %s mode (row pings column; ok = reached, -- = blocked, ! = not as expected):\n", mode)
	fmt.Fprintf(out, "%*s", w+2, "")
	for i := range names {
		fmt.Fprintf(out, " %4d", i+1)
	}
	fmt.Fprintln(out)
	wrong := 0
	for a := range names {
		fmt.Fprintf(out, "%2d %-*s", a+1, w, names[a])
		for b := range names {
			cell := "  . "
			if a != b {
				got, want := res.Reach[[2]int{a, b}], res.Expect[[2]int{a, b}]
				switch {
				case got != want:
					cell, wrong = "  ! ", wrong+1
				case got:
					cell = " ok "
				default:
					cell = " -- "
				}
			}
			fmt.Fprintf(out, " %s", cell)
		}
		fmt.Fprintln(out)
	}
	if wrong == 0 {
		fmt.Fprintln(out, "every pair as expected")
	} else {
		fmt.Fprintf(out, "%d pairs NOT as expected\n", wrong)
	}
}

// Mismatches lists pairs whose reachability differs from the expectation.
func (r *Result) Mismatches() []string {
	var out []string
	for k, want := range r.Expect {
		if r.Reach[k] != want {
			a, b := r.Pods[k[0]], r.Pods[k[1]]
			out = append(out, fmt.Sprintf("%s/%s → %s/%s: reached=%v want %v", a.Namespace, a.Name, b.Namespace, b.Name, r.Reach[k], want))
		}
	}
	sort.Strings(out)
	return out
}

func waitSocket(ctx context.Context, path string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if out, err := exec.CommandContext(ctx, "test", "-S", path).CombinedOutput(); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("%s never appeared: %s", path, strings.TrimSpace(string(out)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
