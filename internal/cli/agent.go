package cli

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ofsdn/ofsdn/agent"
	"github.com/ofsdn/ofsdn/agent/attach"
	"github.com/ofsdn/ofsdn/agent/egress"
	"github.com/ofsdn/ofsdn/agent/hostnet"
	"github.com/ofsdn/ofsdn/internal/kubeconfig"
	"github.com/ofsdn/ofsdn/internal/version"
	"k8s.io/klog/v2"
)

// Agent is ofsdn-agent's command line: the node agent (a DaemonSet pod with hostNetwork). See agent/.
func Agent(args []string) int {
	fs := flag.NewFlagSet("ofsdn-agent", flag.ExitOnError)
	klog.InitFlags(fs)
	var cfg agent.Config
	var kubeconfigPath string
	var showVersion bool
	fs.StringVar(&cfg.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	fs.StringVar(&kubeconfigPath, "kubeconfig", "", "kubeconfig; empty for in-cluster configuration")
	fs.StringVar(&cfg.OVSRunDir, "ovs-rundir", "/var/run/openvswitch", "Open vSwitch run directory (db.sock, <bridge>.mgmt)")
	fs.StringVar(&cfg.OVSDBEndpoint, "ovsdb", "", "OVSDB endpoint (default unix:<ovs-rundir>/db.sock)")
	fs.StringVar(&cfg.Bridge, "bridge", "br0", "integration bridge")
	fs.StringVar(&cfg.DatapathType, "datapath-type", "system", "system (kernel) or netdev (userspace)")
	fs.StringVar(&cfg.HostNetNS, "host-netns", "", "network namespace of the node (default: the agent's own)")
	fs.StringVar(&cfg.StateDir, "state-dir", "/var/lib/ofsdn", "node-local state (pod address store)")
	fs.StringVar(&cfg.CNISocket, "cni-socket", "/var/run/ofsdn/cni-server.sock", "socket the CNI plugin talks to")
	fs.StringVar(&cfg.CNIConfDir, "cni-conf-dir", "/etc/cni/net.d", "where to install the conflist")
	fs.StringVar(&cfg.CNIBinDir, "cni-bin-dir", "/opt/cni/bin", "where to install the plugin binary")
	fs.StringVar(&cfg.PluginBinary, "cni-plugin", defaultPlugin(), "plugin binary to install")
	fs.DurationVar(&cfg.AbsentPodGrace, "absent-pod-grace", attach.DefaultAbsentPodGrace,
		"how long after its ADD an attached pod may be missing from the API before its attachment is released (static pods get their mirror late)")
	fs.DurationVar(&cfg.UplinkLinger, "uplink-linger", hostnet.DefaultUplinkLinger,
		"encapsulation none: how long the uplink port stays after a change back to vxlan, for peers that have not followed yet")
	fs.IntVar(&cfg.EgressPort, "egress-port", egress.DefaultPort,
		"UDP port on every node's address of the egress IP membership (heartbeats between the nodes that may hold egress IPs); pods cannot send to it")
	fs.DurationVar(&cfg.EgressInterval, "egress-heartbeat-interval", egress.DefaultInterval, "how often a node that may hold egress IPs tells the others it lives")
	fs.StringVar(&cfg.EgressDNSServer, "egress-dns-server", "",
		"DNS server (HOST:PORT) the agent resolves EgressNetworkPolicy DNS names with (empty: the first nameserver of the node's /etc/resolv.conf)")
	fs.DurationVar(&cfg.EgressDeadAfter, "egress-dead-after", egress.DefaultDeadAfter,
		"how long a silent node counts as alive: its egress IPs move to another node after this")
	fs.StringVar(&cfg.MetricsAddress, "metrics-address", ":9101", "address of /metrics, /healthz and /readyz, over TLS; /metrics needs a token allowed get on the non-resource URL /metrics (empty: not served)")
	fs.StringVar(&cfg.DebugAddress, "debug-address", "", "address of the read-only debug API flowctl reaches through the API server's node proxy, over TLS, for tokens allowed nodes/debug of network.ofsdn.io, e.g. $(HOST_IP):9103 (empty: not served)")
	fs.StringVar(&cfg.DebugSocket, "debug-socket", "", "unix socket of the debug API for flowctl on the node, root only (default <ovs-rundir>/<bridge>.ofsdn.sock; - : not served)")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert-file", "", "serving certificate (PEM) of the metrics and debug addresses (default: a self-signed one the agent keeps in <state-dir>/pki)")
	fs.StringVar(&cfg.TLSKeyFile, "tls-private-key-file", "", "key (PEM) of --tls-cert-file")
	fs.BoolVar(&cfg.Profiling, "profiling", false, "serve Go's /debug/pprof/ on the metrics address, for tokens allowed nodes/pprof of network.ofsdn.io (a profile costs the node CPU: enable while investigating)")
	fs.DurationVar(&cfg.ResyncPeriod, "drift-check-period", 5*time.Minute, "how often to compare br0 with the desired flows and repair what differs")
	fs.BoolVar(&showVersion, "version", false, "print the version and exit")
	_ = fs.Parse(args) // ExitOnError
	if showVersion {
		fmt.Println("ofsdn-agent", version.String())
		return 0
	}
	defer klog.Flush()

	var err error
	cfg.RestConfig, err = kubeconfig.Load(kubeconfigPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ofsdn-agent:", err)
		return 1
	}
	klog.InfoS("ofsdn-agent starting", "version", version.String())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := agent.Run(ctx, cfg); err != nil {
		klog.ErrorS(err, "ofsdn-agent failed")
		return 1
	}
	return 0
}

// defaultPlugin is the ofsdn plugin binary shipped next to the agent's.
func defaultPlugin() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return filepath.Join(filepath.Dir(exe), "ofsdn")
}
