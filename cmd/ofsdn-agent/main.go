// Command ofsdn-agent is ofsdn's node agent (a DaemonSet pod with hostNetwork). See agent/.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/ofsdn/ofsdn/agent"
	"github.com/ofsdn/ofsdn/internal/kubeconfig"
	"k8s.io/klog/v2"
)

func main() {
	klog.InitFlags(nil)
	var cfg agent.Config
	var kubeconfigPath string
	flag.StringVar(&cfg.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	flag.StringVar(&kubeconfigPath, "kubeconfig", "", "kubeconfig; empty for in-cluster configuration")
	flag.StringVar(&cfg.OVSRunDir, "ovs-rundir", "/var/run/openvswitch", "Open vSwitch run directory (db.sock, <bridge>.mgmt)")
	flag.StringVar(&cfg.OVSDBEndpoint, "ovsdb", "", "OVSDB endpoint (default unix:<ovs-rundir>/db.sock)")
	flag.StringVar(&cfg.Bridge, "bridge", "br0", "integration bridge")
	flag.StringVar(&cfg.DatapathType, "datapath-type", "system", "system (kernel) or netdev (userspace)")
	flag.StringVar(&cfg.HostNetNS, "host-netns", "", "network namespace of the node (default: the agent's own)")
	flag.StringVar(&cfg.StateDir, "state-dir", "/var/lib/ofsdn", "node-local state (pod address store)")
	flag.StringVar(&cfg.CNISocket, "cni-socket", "/var/run/ofsdn/cni-server.sock", "socket the CNI plugin talks to")
	flag.StringVar(&cfg.CNIConfDir, "cni-conf-dir", "/etc/cni/net.d", "where to install the conflist")
	flag.StringVar(&cfg.CNIBinDir, "cni-bin-dir", "/opt/cni/bin", "where to install the plugin binary")
	flag.StringVar(&cfg.PluginBinary, "cni-plugin", defaultPlugin(), "plugin binary to install")
	flag.Parse()

	var err error
	cfg.RestConfig, err = kubeconfig.Load(kubeconfigPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ofsdn-agent:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := agent.Run(ctx, cfg); err != nil {
		klog.ErrorS(err, "ofsdn-agent failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// defaultPlugin is the ofsdn plugin binary shipped next to the agent's.
func defaultPlugin() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return filepath.Join(filepath.Dir(exe), "ofsdn")
}
