// Package cni is ofsdn's CNI plugin (type "ofsdn") and the agent's CNI server. The plugin binary that
// kubelet's runtime execs does no networking itself: it forwards each call over a root-only unix socket
// to the node agent, which owns the IPAM store, the OVS port and the flows. Keeping the work in the
// agent means one process serialises pod changes and reconciles their flows (openshift-sdn did the same).
//
// Every call has a time budget per verb (Timeouts), and the agent confirms within seconds that it read
// the request, so a frozen agent fails a call fast while a busy one may take long. A DEL the agent
// cannot take (not running, died or froze while serving it) is left as a pending delete in a directory
// the agent processes before it serves and then periodically (pending.go), and the runtime is told it
// succeeded: see WritePendingDelete for why. The agent installs the conflist the plugin reads, and the
// plugin binary, through Install (install.go).
package cni

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
)

// DefaultSocket is where the agent listens for the plugin.
const DefaultSocket = "/var/run/ofsdn/cni-server.sock"

// maxMessage bounds a request or an answer on the socket (a CNI config and result are a few KiB).
const maxMessage = 1 << 20

// Command is a CNI verb.
type Command string

const (
	CmdAdd    Command = "ADD"
	CmdDel    Command = "DEL"
	CmdCheck  Command = "CHECK"
	CmdStatus Command = "STATUS"
	CmdGC     Command = "GC"
)

// NetConf is the plugin's network configuration (the conflist's plugin entry).
type NetConf struct {
	types.NetConf
	// AgentSocket overrides DefaultSocket.
	AgentSocket string `json:"agentSocket,omitempty"`
	// MTU of the pod interface; the agent fills it in when it writes the conflist (uplink MTU - 50).
	MTU int `json:"mtu,omitempty"`
	// PendingDeletesDir is where the plugin leaves DELs the agent could not take (default: next to the
	// agent's socket, DefaultPendingDeletesDir).
	PendingDeletesDir string `json:"pendingDeletesDir,omitempty"`
	// Network names an ofsdn Network (network.ofsdn.io): the configuration of a
	// NetworkAttachmentDefinition, which Multus passes with CNI_IFNAME=net1...; the call attaches that
	// one interface to that Network. Empty: the cluster network (eth0), and the pod's networks.
	Network string `json:"network,omitempty"`
	// AttachNetworks false leaves the pod's k8s.v1.cni.cncf.io/networks to a meta-plugin (Multus);
	// unset or true, the cluster network's ADD attaches them too, so no meta-plugin is needed.
	AttachNetworks *bool `json:"attachNetworks,omitempty"`
	// RuntimeConfig carries what a runtime passes for the capabilities ips and mac (Multus: the
	// annotation's static address and MAC).
	RuntimeConfig RuntimeConfig `json:"runtimeConfig,omitzero"`
}

// RuntimeConfig is the runtimeConfig ofsdn reads.
type RuntimeConfig struct {
	IPs []string `json:"ips,omitempty"`
	MAC string   `json:"mac,omitempty"`
}

// AttachesNetworks says whether the cluster network's ADD attaches the pod's networks too.
func (c *NetConf) AttachesNetworks() bool { return c.AttachNetworks == nil || *c.AttachNetworks }

// Validate reports configuration errors with the spec's codes: fields ofsdn does not support (2) and
// values it cannot use (7).
func (c *NetConf) Validate() error {
	if c.Type != "" && c.Type != "ofsdn" {
		return Errorf(ErrInvalidConfig, "ofsdn: network configuration has type %q, want \"ofsdn\"", c.Type)
	}
	// ofsdn allocates addresses from the node's HostSubnet itself: an ipam section would be ignored.
	if c.IPAM.Type != "" {
		return Errorf(ErrUnsupportedField, "ofsdn: unsupported field ipam.type=%q: ofsdn allocates pod addresses from the node's HostSubnet itself", c.IPAM.Type)
	}
	if c.MTU != 0 && (c.MTU < 576 || c.MTU > 65535) {
		return Errorf(ErrInvalidConfig, "ofsdn: mtu %d out of range [576, 65535]", c.MTU)
	}
	if c.Network != "" && (len(c.Network) > 63 || strings.ContainsAny(c.Network, "/ \t\n")) {
		return Errorf(ErrInvalidConfig, "ofsdn: network %q is no Network name", c.Network)
	}
	if c.Network == "" && (len(c.RuntimeConfig.IPs) > 0 || c.RuntimeConfig.MAC != "") {
		return Errorf(ErrInvalidConfig, "ofsdn: runtimeConfig ips and mac apply to a Network's interface (\"network\"), not the cluster network's")
	}
	for field, path := range map[string]string{"agentSocket": c.AgentSocket, "pendingDeletesDir": c.PendingDeletesDir} {
		if path != "" && !filepath.IsAbs(path) {
			return Errorf(ErrInvalidConfig, "ofsdn: %s %q must be an absolute path", field, path)
		}
	}
	return nil
}

// socket is the agent's socket the configuration names.
func (c *NetConf) socket() string {
	if c.AgentSocket == "" {
		return DefaultSocket
	}
	return c.AgentSocket
}

// pendingDeletesDir is where DELs the agent could not take go.
func (c *NetConf) pendingDeletesDir() string {
	if c.PendingDeletesDir != "" {
		return c.PendingDeletesDir
	}
	return PendingDeletesDirFor(c.socket())
}

// Request is what the plugin sends the agent: the verb, the CNI_* arguments and the raw config.
type Request struct {
	Command     Command `json:"command"`
	ContainerID string  `json:"containerID"`
	Netns       string  `json:"netns,omitempty"`
	IfName      string  `json:"ifName,omitempty"`
	// Args is CNI_ARGS as parsed: K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_UID, ...
	Args   map[string]string `json:"args,omitempty"`
	Config json.RawMessage   `json:"config"`
	// Ack asks the agent to confirm it read the request before it works on it (Response.Accepted): the
	// plugin tells a frozen agent from a busy one, and the agent drops requests whose plugin left.
	Ack bool `json:"ack,omitempty"`
}

// PodNamespace and PodName come from CNI_ARGS as kubelet's runtimes pass them.
func (r *Request) PodNamespace() string { return r.Args["K8S_POD_NAMESPACE"] }
func (r *Request) PodName() string      { return r.Args["K8S_POD_NAME"] }

// Response is the agent's answer: a CNI result (ADD) or a CNI error. When the request asked for an
// acknowledgement, a Response with only Accepted set comes first.
type Response struct {
	Accepted bool            `json:"accepted,omitempty"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    *types.Error    `json:"error,omitempty"`
}

// ParseArgs parses CNI_ARGS ("K1=V1;K2=V2").
func ParseArgs(s string) (map[string]string, error) {
	out := map[string]string{}
	if s == "" {
		return out, nil
	}
	for _, kv := range splitNonEmpty(s, ';') {
		k, v, ok := cut(kv, '=')
		if !ok || k == "" {
			return nil, fmt.Errorf("CNI_ARGS: %q is not KEY=VALUE", kv)
		}
		out[k] = v
	}
	return out, nil
}

func splitNonEmpty(s string, sep byte) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == sep {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}

func cut(s string, sep byte) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == sep {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// Errorf builds a CNI error with a code from the CNI spec and a message that says what to fix.
func Errorf(code uint, format string, args ...any) *types.Error {
	return &types.Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// CNI spec error codes used by ofsdn (spec 1.1, "Error"). Which failure gets which code:
//
//	1  the caller's cniVersion cannot be served, or a result cannot be converted to it
//	2  a configuration field ofsdn does not support (ipam: ofsdn allocates addresses itself)
//	3  CHECK for a sandbox interface ofsdn never attached
//	4  a CNI_* variable or CNI_ARGS is missing or unusable: CNI_IFNAME names an interface ofsdn did not
//	   make, CNI_NETNS differs from the attached sandbox's or no longer exists
//	5  the node's address store cannot be read or written
//	6  configuration, request or result that does not decode
//	7  configuration values ofsdn cannot use (type, mtu, relative paths)
//	11 transient: the agent is not running, restarting, frozen or not ready yet; the node's subnet is
//	   full; flows could not be installed yet
//	50 STATUS: the agent cannot serve ADDs (not running, not answering, or not ready)
//	51 STATUS: besides, the agent has lost its bridge, so existing pods may have limited connectivity
//	999 anything else (the message says what)
const (
	ErrIncompatibleVersion    uint = types.ErrIncompatibleCNIVersion // 1
	ErrUnsupportedField       uint = types.ErrUnsupportedField       // 2
	ErrUnknownContainer       uint = types.ErrUnknownContainer       // 3
	ErrInvalidEnv             uint = types.ErrInvalidEnvironmentVariables
	ErrIO                     uint = types.ErrIOFailure       // 5
	ErrDecoding               uint = types.ErrDecodingFailure // 6
	ErrInvalidConfig          uint = types.ErrInvalidNetworkConfig
	ErrTryAgainLater          uint = types.ErrTryAgainLater // 11
	ErrPluginNotAvailable     uint = 50                     // STATUS: the plugin cannot serve ADDs now
	ErrPluginNotAvailableConn uint = 51                     // STATUS: ... and existing pods may have limited connectivity
	ErrInternal               uint = types.ErrInternal      // 999
)
