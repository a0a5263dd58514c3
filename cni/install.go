package cni

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/ofsdn/ofsdn/internal/atomicfile"
)

// Install is what the agent installs for the runtime: the conflist (NetConf) and the plugin binary.
type Install struct {
	ConfDir string // where the conflist goes ("": not written)
	BinDir  string // where the plugin binary goes ("": not copied)
	Plugin  string // the plugin binary to copy ("": not copied)
	Socket  string // the agent's CNI socket (NetConf.AgentSocket)
	MTU     int    // the pods' MTU
}

// Write writes the conflist and copies the plugin binary into the CNI directories, atomically. The
// conflist offers CNI 1.1 through cniVersions (runtimes whose libcni knows 1.1 take it, with STATUS and
// GC) and says 1.0.0 in cniVersion for the others: containerd 1.6 and 1.7 (libcni 1.1) refuse a 1.1.0
// result ("unsupported CNI result version"), which broke every pod on a real kubelet.
func (in Install) Write() error {
	if in.ConfDir != "" {
		conf := fmt.Sprintf(`{"cniVersion":"1.0.0","cniVersions":["1.0.0","1.1.0"],"name":"ofsdn","plugins":[{"type":"ofsdn","agentSocket":%q,"pendingDeletesDir":%q,"mtu":%d}]}`+"\n",
			in.Socket, PendingDeletesDirFor(in.Socket), in.MTU)
		if err := atomicfile.Write(filepath.Join(in.ConfDir, "80-ofsdn.conflist"), []byte(conf), 0o644); err != nil {
			return fmt.Errorf("install CNI config: %w", err)
		}
	}
	if in.BinDir != "" && in.Plugin != "" {
		data, err := os.ReadFile(in.Plugin)
		if err != nil {
			return fmt.Errorf("install CNI plugin: %w", err)
		}
		if err := atomicfile.Write(filepath.Join(in.BinDir, "ofsdn"), data, 0o755); err != nil {
			return fmt.Errorf("install CNI plugin: %w", err)
		}
	}
	return nil
}
