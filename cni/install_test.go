package cni

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

// The installed conflist works for runtimes on either side of CNI 1.1: a libcni that knows 1.1 (this
// module's) picks 1.1.0 from cniVersions, and one that predates it (containerd 1.6 and 1.7) reads
// cniVersion, which must be a version it knows (at most 1.0.0) — a 1.1.0 there failed every pod.
func TestInstalledConflistServesOldAndNewRuntimes(t *testing.T) {
	dir := t.TempDir()
	if err := (Install{ConfDir: dir, Socket: "/var/run/ofsdn/cni-server.sock", MTU: 1450}).Write(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "80-ofsdn.conflist")
	list, err := libcni.ConfListFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if list.CNIVersion != "1.1.0" {
		t.Errorf("a CNI 1.1 runtime gets version %q, want 1.1.0", list.CNIVersion)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		CNIVersion string `json:"cniVersion"`
		Plugins    []struct {
			Type string `json:"type"`
			MTU  int    `json:"mtu"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	if raw.CNIVersion != "1.0.0" {
		t.Errorf("cniVersion %q: a runtime before CNI 1.1 needs a version it knows (1.0.0)", raw.CNIVersion)
	}
	if len(raw.Plugins) != 1 || raw.Plugins[0].Type != "ofsdn" || raw.Plugins[0].MTU != 1450 {
		t.Errorf("plugins %+v", raw.Plugins)
	}
}
