package flowctl

import (
	"flag"
	"fmt"
	"os"

	"github.com/ofsdn/ofsdn/debugapi"
	"k8s.io/client-go/rest"
)

// How flowctl reaches nodes (README, "flowctl" and "The node API"): on a node, the agent's debug API
// on its unix socket beside the bridge (<rundir>/<bridge>.ofsdn.sock, root only: its file mode is the
// authorization) and Open vSwitch's own sockets in the run directory; any other node through the API
// server's node proxy, /api/v1/nodes/https:<node>:<port>/proxy/, to the debug API the agent serves over
// TLS on the node's address. Two checks guard that path. The API server's: the user's kubeconfig needs
// get on nodes/proxy (create for a trace), which cluster admins have. The agent's: the proxy carries no
// identity to the node (it drops the user's credentials and presents none of its own), so flowctl mints
// a ten-minute token of ServiceAccount ofsdn/ofsdn-flowctl for the node API's audience with the user's
// kubeconfig (create on its serviceaccounts/token: Role ofsdn/ofsdn-flowctl) and sends it in
// debugapi.TokenHeader; the agent has the API server review it and check nodes/debug of
// network.ofsdn.io (ClusterRole ofsdn-node-reader, bound to that ServiceAccount). The user's own
// credentials never leave for a node. Nothing in the API changes anything.

// DefaultAgentPort is the port of the agents' debug API (deploy/agent/daemonset.yaml, --debug-address).
const DefaultAgentPort = 9103

// nodeFlags are the flags that say which node's agent to ask.
type nodeFlags struct {
	rundir, bridge, socket string
	node, kubeconfig       string
	port                   int
	tokenSA                string // namespace/name of the ServiceAccount whose tokens go to the agents
	tokens                 *debugapi.ServiceAccountTokens
}

// register adds the flags; withNode adds --node (trace finds its nodes itself).
func (n *nodeFlags) register(fs *flag.FlagSet, withNode bool) {
	fs.StringVar(&n.rundir, "rundir", defaultRunDir(), "Open vSwitch run directory on this node (holds <bridge>.mgmt and the agent's <bridge>.ofsdn.sock)")
	fs.StringVar(&n.bridge, "bridge", "br0", "bridge name")
	fs.StringVar(&n.socket, "socket", "", "the agent's debug socket (default <rundir>/<bridge>.ofsdn.sock)")
	if withNode {
		fs.StringVar(&n.node, "node", "", "ask this node's agent through the API server's node proxy instead of the local one")
	}
	fs.StringVar(&n.kubeconfig, "kubeconfig", "", "kubeconfig for --node and names (default: $KUBECONFIG, else in-cluster)")
	fs.IntVar(&n.port, "agent-port", DefaultAgentPort, "port of the agents' debug API (the node proxy connects to it)")
	fs.StringVar(&n.tokenSA, "token-serviceaccount", debugapi.DefaultTokenServiceAccount,
		"namespace/name of the ServiceAccount whose short-lived tokens flowctl mints and shows the agents it asks through the API server")
}

func (n *nodeFlags) socketPath() string {
	if n.socket != "" {
		return n.socket
	}
	return debugapi.DefaultSocket(n.rundir, n.bridge)
}

// local is the agent on this node.
func (n *nodeFlags) local() (*debugapi.Client, error) {
	path := n.socketPath()
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("no ofsdn agent debug socket at %s (is the agent running on this node? use --rundir, or --node NAME to go through the API server): %w", path, err)
	}
	return debugapi.NewSocketClient(path), nil
}

// remote is node's agent through the API server. Every node asked in one run shares one token.
func (n *nodeFlags) remote(cfg *rest.Config, node string) (*debugapi.Client, error) {
	if err := n.initTokens(cfg); err != nil {
		return nil, err
	}
	return debugapi.NewNodeProxyClient(cfg, node, n.port, n.tokens)
}

// initTokens makes the token source every node of the run shares; callers that ask nodes from
// several goroutines call it once before they start.
func (n *nodeFlags) initTokens(cfg *rest.Config) error {
	if n.tokens == nil {
		tokens, err := debugapi.NewServiceAccountTokens(cfg, n.tokenSA)
		if err != nil {
			return fmt.Errorf("--token-serviceaccount: %w", err)
		}
		n.tokens = tokens
	}
	return nil
}

// agent is the agent --node names, else the local one.
func (n *nodeFlags) agent() (*debugapi.Client, error) {
	if n.node == "" {
		return n.local()
	}
	cfg, err := restConfig(n.kubeconfig)
	if err != nil {
		return nil, err
	}
	return n.remote(cfg, n.node)
}
