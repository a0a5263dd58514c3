// Package imagetest proves the container image works, not just that it exists: it builds the image
// as `make image` does, unpacks its layers into a root file system, and runs the lab cluster's
// controller, agents, CNI plugin and flowctl from that root file system.
package imagetest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/internal/image"
	"github.com/ofsdn/ofsdn/lab"
	"github.com/ofsdn/ofsdn/lab/kubelab"
)

// imageBinaries are what the lab runs from the image (the test pod's binary is the lab's own).
var imageBinaries = []string{"ofsdn-agent", "ofsdn-controller", "ofsdn", "flowctl"}

// TestClusterRunsFromTheImage: three lab nodes whose controller, agents, CNI plugin and flowctl are
// the files of the unpacked image. Pods of two tenants and default on every node reach each other
// as multitenant mode promises, within a node and across nodes; flowctl from the image joins the two
// tenants through the image's controller and agents, and the matrix follows.
func TestClusterRunsFromTheImage(t *testing.T) {
	lab.Require(t)
	if _, err := kubelab.BinDir(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	root, err := image.RepoRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := image.Build(ctx, image.Options{RepoRoot: root, OutDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", res.Summary())
	img, err := image.ReadLayout(res.Layout)
	if err != nil {
		t.Fatal(err)
	}
	rootfs := t.TempDir()
	if err := image.Unpack(img, rootfs); err != nil {
		t.Fatal(err)
	}
	imageBin := filepath.Join(rootfs, image.BinDir)

	// The lab runs whatever BinDir holds: the image's files, by symbolic link, and the test pod.
	binDir := t.TempDir()
	for _, name := range imageBinaries {
		if err := os.Symlink(filepath.Join(imageBin, name), filepath.Join(binDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", binDir+"/", "./e2e/cmd/ofsdn-testpod")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the test pod: %v\n%s", err, out)
	}

	c, err := cluster.Start(ctx, cluster.Options{BinDir: binDir, Mode: networkv1.PluginModeMultitenant})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()

	// Every daemon of the cluster is an image file (the kernel names the file a process runs).
	for _, n := range c.Nodes {
		if exe := exeOf(t, n.AgentPID()); exe != filepath.Join(imageBin, "ofsdn-agent") {
			t.Errorf("the agent on %s runs %q, not the image's", n.Name, exe)
		}
	}
	if pids := processesRunning(t, filepath.Join(imageBin, "ofsdn-controller")); len(pids) != 1 {
		t.Errorf("%d processes run the image's ofsdn-controller, want 1", len(pids))
	}

	namespaces := []string{"blue", "red", "default"}
	for _, ns := range namespaces {
		if err := c.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	var pods []*cluster.Pod
	for _, ns := range namespaces {
		for _, n := range c.Nodes {
			p, err := c.RunPod(ctx, cluster.PodSpec(ns, "web-"+n.Name, n.Name))
			if err != nil {
				t.Fatalf("%v\n%s", err, c.Logs(30))
			}
			pods = append(pods, p)
		}
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Key() < pods[j].Key() })
	// The plugin that ran those pods is the image's: the agent installed it from the image.
	shipped, err := os.ReadFile(filepath.Join(imageBin, "ofsdn"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		installed, err := os.ReadFile(filepath.Join(n.CNIBinDir, "ofsdn"))
		if err != nil || string(installed) != string(shipped) {
			t.Errorf("the CNI plugin installed on %s is not the image's (%v)", n.Name, err)
		}
	}
	checkMatrix(t, ctx, c, pods, namespaces, "tenants apart")

	// flowctl from the image asks the image's controller to join red to blue.
	flowctl := exec.CommandContext(ctx, filepath.Join(binDir, "flowctl"), "pod-network", "join-projects", "--to=blue", "red",
		"--kubeconfig", c.API.KubeconfigPath())
	if out, err := flowctl.CombinedOutput(); err != nil {
		t.Fatalf("flowctl pod-network join-projects: %v\n%s", err, out)
	}
	netids := checkMatrix(t, ctx, c, pods, namespaces, "red joined to blue")
	if netids["red"] != netids["blue"] || netids["blue"] == 0 {
		t.Errorf("after the join, NETIDs %v", netids)
	}
}

// checkMatrix compares who reaches whom with what multitenant mode promises for the NETIDs the
// controller gave, and returns those NETIDs.
func checkMatrix(t *testing.T, ctx context.Context, c *cluster.Cluster, pods []*cluster.Pod, namespaces []string, what string) map[string]uint32 {
	t.Helper()
	netids, err := c.NetIDs(ctx, namespaces...)
	if err != nil {
		t.Fatal(err)
	}
	want := cluster.Expected(pods, netids, networkv1.PluginModeMultitenant)
	got, diff, took := c.WaitMatrix(ctx, pods, want, 20*time.Second)
	if len(diff) > 0 {
		t.Fatalf("%s: %d pairs not as expected (NETIDs %v):\n%s\n%s\n%s", what, len(diff), netids, strings.Join(diff, "\n"), got.Format(pods), c.Logs(30))
	}
	crossNode, sameNode := 0, 0
	for _, a := range pods {
		for _, b := range pods {
			if a != b && want[a.Key()][b.Key()] {
				if a.Node == b.Node {
					sameNode++
				} else {
					crossNode++
				}
			}
		}
	}
	if sameNode == 0 || crossNode == 0 {
		t.Fatalf("%s: the matrix holds %d reachable same-node and %d cross-node pairs; it must test both", what, sameNode, crossNode)
	}
	t.Logf("%s: %d same-node and %d cross-node pairs reach each other as expected (in %v), NETIDs %v", what, sameNode, crossNode, took.Round(time.Millisecond), netids)
	return netids
}

// exeOf is the file a process runs.
func exeOf(t *testing.T, pid int) string {
	t.Helper()
	if pid == 0 {
		t.Fatal("no such process")
	}
	exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// processesRunning lists the processes whose executable is path.
func processesRunning(t *testing.T, path string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink("/proc/" + e.Name() + "/exe"); err == nil && exe == path {
			pids = append(pids, pid)
		}
	}
	return pids
}
