package cni

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ofsdn/ofsdn/internal/atomicfile"
)

// DefaultPendingDeletesDir is where the plugin leaves DELs for an agent at DefaultSocket.
var DefaultPendingDeletesDir = PendingDeletesDirFor(DefaultSocket)

// PendingDeletesDirFor is the pending-deletes directory next to an agent socket: the same host directory
// the agent's DaemonSet mounts for its socket (/var/run/ofsdn), so both sides see it. It lives on tmpfs:
// a reboot empties it, and takes every pod's network namespace with it, which the agent's start-up
// reconciliation then finds gone.
func PendingDeletesDirFor(socket string) string {
	return filepath.Join(filepath.Dir(socket), "pending-deletes")
}

// PendingDelete is a DEL the agent could not take: none was listening, or it died or froze while
// serving it.
type PendingDelete struct {
	ContainerID string            `json:"containerID"`
	IfName      string            `json:"ifName"`
	Netns       string            `json:"netns,omitempty"`
	Args        map[string]string `json:"args,omitempty"`
	Reason      string            `json:"reason"`
	Written     time.Time         `json:"written"`
}

// PodNamespace and PodName come from the DEL's CNI_ARGS.
func (d *PendingDelete) PodNamespace() string { return d.Args["K8S_POD_NAMESPACE"] }
func (d *PendingDelete) PodName() string      { return d.Args["K8S_POD_NAME"] }

// Request is the DEL as the agent serves it.
func (d *PendingDelete) Request() *Request {
	return &Request{Command: CmdDel, ContainerID: d.ContainerID, Netns: d.Netns, IfName: d.IfName, Args: d.Args}
}

// pendingFile names an attachment's pending DEL: one file per attachment, so repeated DELs overwrite
// each other instead of piling up.
func pendingFile(dir, containerID, ifName string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifName))
	return filepath.Join(dir, hex.EncodeToString(sum[:16])+".json")
}

// WritePendingDelete leaves a DEL for the agent, durably (internal/atomicfile: the agent reads either
// the whole DEL or none, and it survives a crash once written).
//
// Why a pending delete rather than failing the DEL with "try again later": the runtime would retry, but
// kubelet cannot finish deleting a pod (nor its namespace, nor drain the node) until a DEL succeeds, so
// an agent that is down — crash-looping, or being upgraded — would hold every pod deletion on the node
// hostage, and a DEL a runtime stops retrying (sandbox force-removed) would still leak. The pending
// delete lets the runtime go on and the agent catch up: it serves every pending delete before it serves
// any request (and before an ADD for the same attachment, which the runtime can only send after this
// DEL returned), then every few seconds. When the DEL cannot even be written, the plugin fails it with
// code 11 and the runtime retries.
func WritePendingDelete(dir string, req *Request, reason error) error {
	if err := os.MkdirAll(dir, 0o700); err != nil { // root's alone, as the agent's socket is
		return fmt.Errorf("pending delete: %w", err)
	}
	data, err := json.Marshal(&PendingDelete{ContainerID: req.ContainerID, IfName: req.IfName, Netns: req.Netns, Args: req.Args,
		Reason: reason.Error(), Written: time.Now().UTC()})
	if err != nil {
		return err
	}
	return atomicfile.Write(pendingFile(dir, req.ContainerID, req.IfName), data, 0o600)
}

// ReadPendingDeletes returns the pending DELs in dir, oldest first, and the files it could not read.
// Temporary files a plugin left when it died mid-write are removed once they are a minute old.
func ReadPendingDeletes(dir string) ([]PendingDelete, []error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, []error{fmt.Errorf("pending deletes: %w", err)}
	}
	var out []PendingDelete
	var errs []error
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if atomicfile.IsTemp(e.Name()) {
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Minute {
				_ = os.Remove(path)
			}
			continue
		}
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		d, err := readPendingFile(path)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) { // served meanwhile
				errs = append(errs, err)
			}
			continue
		}
		out = append(out, d)
	}
	// Oldest first: a runtime's DELs for different sandboxes keep their order.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].Written.Before(out[j-1].Written); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out, errs
}

// ReadPendingDelete returns the pending DEL of one attachment, if there is one.
func ReadPendingDelete(dir, containerID, ifName string) (PendingDelete, bool, error) {
	d, err := readPendingFile(pendingFile(dir, containerID, ifName))
	if errors.Is(err, os.ErrNotExist) {
		return PendingDelete{}, false, nil
	}
	if err != nil {
		return PendingDelete{}, false, err
	}
	return d, true, nil
}

func readPendingFile(path string) (PendingDelete, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return PendingDelete{}, err
	}
	var d PendingDelete
	if err := json.Unmarshal(data, &d); err != nil {
		return PendingDelete{}, &MalformedPendingDelete{Path: path, Err: err}
	}
	if d.ContainerID == "" || d.IfName == "" {
		return PendingDelete{}, &MalformedPendingDelete{Path: path, Err: errors.New("no container ID or interface name")}
	}
	return d, nil
}

// MalformedPendingDelete is a file in the pending-deletes directory that is no pending DEL.
type MalformedPendingDelete struct {
	Path string
	Err  error
}

func (e *MalformedPendingDelete) Error() string {
	return fmt.Sprintf("pending delete %s is malformed: %v", e.Path, e.Err)
}

// RemovePendingDelete removes a pending DEL the agent served, unless the plugin replaced it meanwhile
// with a newer one (which the agent then serves too).
func RemovePendingDelete(dir string, served PendingDelete) error {
	path := pendingFile(dir, served.ContainerID, served.IfName)
	cur, err := readPendingFile(path)
	if errors.Is(err, os.ErrNotExist) || err == nil && !cur.Written.Equal(served.Written) {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// RemoveMalformedPendingDelete removes a file that is no pending DEL (after the agent reported it).
func RemoveMalformedPendingDelete(m *MalformedPendingDelete) error {
	if err := os.Remove(m.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
