// Package demo is `make demo`: a whole ofsdn cluster in the lab (e2e/cluster: three node namespaces with
// their own Open vSwitch, a real kube-apiserver, the controller, an agent per node, pods run through the
// CNI plugin), two tenants plus pods in `default`, the connectivity matrix and a short flowctl dump.
package demo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/cluster"
)

// Options configure a demo run.
type Options struct {
	Nodes int
	Mode  networkv1.PluginMode
	// BinDir holds prebuilt binaries (make build's _output/bin); empty builds them.
	BinDir string
	// Keep leaves the cluster running until ctx ends (for a person to poke at it).
	Keep bool
	// Kubelets runs the demo on real containerd and kubelet per node, ofsdn from deploy/ and its image
	// (cluster.Options.Kubelets); CoreDNS names a CoreDNS binary for the cluster DNS (optional).
	Kubelets bool
	CoreDNS  string
	Logger   *slog.Logger
}

// Result is what the demo measured.
type Result struct {
	Pods   []*cluster.Pod
	NetIDs map[string]uint32
	Reach  cluster.Matrix
	Expect cluster.Matrix
}

// Namespaces: two tenants and the global "default".
var Namespaces = []string{"blue", "red", "default"}

// Run brings the cluster up, runs the demo, prints what it saw, and tears the cluster down.
func Run(ctx context.Context, out io.Writer, opts Options) (*Result, error) {
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Mode == "" {
		opts.Mode = networkv1.PluginModeMultitenant
	}
	start := time.Now()
	if opts.Kubelets {
		fmt.Fprintf(out, "starting a %d-node lab: OVS per node namespace, etcd + kube-apiserver + controller-manager + scheduler,\n"+
			"containerd and kubelet per node; deploy/ applied: ofsdn-controller and an ofsdn-agent per node from the image,\n"+
			"pods started by kubelet through the ofsdn CNI plugin...\n", opts.Nodes)
	} else {
		fmt.Fprintf(out, "starting a %d-node lab: OVS per node namespace, etcd + kube-apiserver + controller-manager + scheduler,\n"+
			"ofsdn-controller, ofsdn-agent per node, kubelet stand-ins running pods through the ofsdn CNI plugin...\n", opts.Nodes)
	}
	c, err := cluster.Start(ctx, cluster.Options{Nodes: opts.Nodes, Mode: opts.Mode, BinDir: opts.BinDir, Logger: opts.Logger,
		Kubelets: opts.Kubelets, CoreDNS: opts.CoreDNS})
	if err != nil {
		return nil, err
	}
	defer c.Stop()
	fmt.Fprintf(out, "cluster up in %s (API server %s)\n\n", time.Since(start).Round(time.Millisecond), c.API.Server())
	if s, err := c.API.Kubectl("get", "hostsubnets"); err == nil {
		fmt.Fprintf(out, "$ kubectl get hostsubnets\n%s\n", s)
	}

	res := &Result{}
	for _, ns := range Namespaces {
		if err := c.EnsureNamespace(ctx, ns); err != nil {
			return nil, err
		}
	}
	type made struct {
		p   *cluster.Pod
		err error
	}
	ch := make(chan made)
	for _, ns := range Namespaces {
		for _, n := range c.Nodes {
			go func() {
				p, err := c.RunPod(ctx, cluster.PodSpec(ns, "web-"+n.Name, n.Name))
				ch <- made{p, err}
			}()
		}
	}
	for range len(Namespaces) * len(c.Nodes) {
		m := <-ch
		if m.err != nil {
			return nil, m.err
		}
		res.Pods = append(res.Pods, m.p)
	}
	sort.Slice(res.Pods, func(i, j int) bool { return res.Pods[i].Key() < res.Pods[j].Key() })
	if s, err := c.API.Kubectl("get", "netnamespaces", Namespaces[0], Namespaces[1], Namespaces[2]); err == nil {
		fmt.Fprintf(out, "$ kubectl get netnamespaces %s\n%s\n", strings.Join(Namespaces, " "), s)
	}
	if res.NetIDs, err = c.NetIDs(ctx, Namespaces...); err != nil {
		return nil, err
	}
	res.Expect = cluster.Expected(res.Pods, res.NetIDs, opts.Mode)
	// A fresh tunnel neighbour may need a moment (ARP through the overlay): retry briefly.
	var diff []string
	res.Reach, diff, _ = c.WaitMatrix(ctx, res.Pods, res.Expect, 5*time.Second)
	fmt.Fprintf(out, "connectivity in %s mode (row reaches column over TCP; x = reached, . = blocked):\n%s", opts.Mode, res.Reach.Format(res.Pods))
	if len(diff) == 0 {
		fmt.Fprintln(out, "every pair as expected: tenants are isolated from each other, default reaches and is reached by all")
	} else {
		fmt.Fprintf(out, "%d pairs NOT as expected:\n%s\n", len(diff), strings.Join(diff, "\n"))
	}

	n := c.Nodes[0]
	fmt.Fprintf(out, "\n$ flowctl dump --table ingress-isolation   (on %s)\n", n.Name)
	dump, err := exec.CommandContext(ctx, filepath.Join(c.BinDir, "flowctl"), "dump", "--rundir", n.Dir, "--table", "ingress-isolation").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("flowctl dump: %w: %s", err, dump)
	}
	out.Write(dump)
	fmt.Fprintf(out, "\ndemo took %s\n", time.Since(start).Round(time.Millisecond))
	if opts.Keep {
		fmt.Fprintf(out, "the cluster stays up until interrupted: kubectl --kubeconfig %s; node namespaces %s-*\n", c.API.KubeconfigPath(), c.Lab.Prefix)
		<-ctx.Done()
	}
	return res, nil
}

// Mismatches lists pairs whose reachability differs from the expectation.
func (r *Result) Mismatches() []string { return r.Reach.Diff(r.Expect) }
