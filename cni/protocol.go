// Package cni is ofsdn's CNI plugin (type "ofsdn") and the agent's CNI server. The plugin binary that
// kubelet's runtime execs does no networking itself: it forwards each call over a root-only unix socket
// to the node agent, which owns the IPAM store, the OVS port and the flows. Keeping the work in the
// agent means one process serialises pod changes and reconciles their flows (openshift-sdn did the same).
package cni

import (
	"encoding/json"
	"fmt"

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
}

// PodNamespace and PodName come from CNI_ARGS as kubelet's runtimes pass them.
func (r *Request) PodNamespace() string { return r.Args["K8S_POD_NAMESPACE"] }
func (r *Request) PodName() string      { return r.Args["K8S_POD_NAME"] }

// Response is the agent's answer: a CNI result (ADD) or a CNI error.
type Response struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *types.Error    `json:"error,omitempty"`
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

// CNI spec error codes used by ofsdn (spec 1.1, "Error").
const (
	ErrIncompatibleVersion uint = types.ErrIncompatibleCNIVersion // 1
	ErrUnsupportedField    uint = types.ErrUnsupportedField       // 2
	ErrUnknownContainer    uint = types.ErrUnknownContainer       // 3
	ErrInvalidEnv          uint = types.ErrInvalidEnvironmentVariables
	ErrIO                  uint = types.ErrIOFailure       // 5
	ErrDecoding            uint = types.ErrDecodingFailure // 6
	ErrInvalidConfig       uint = types.ErrInvalidNetworkConfig
	ErrTryAgainLater       uint = types.ErrTryAgainLater // 11
	ErrPluginNotAvailable  uint = 50                     // STATUS: the plugin cannot serve ADDs now
	ErrInternal            uint = types.ErrInternal      // 999
)
