package image

import (
	"context"
	"crypto/sha256"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/internal/ovstest"
)

// TestBuildIsReproducible builds the real image twice, the second time from a copy of the checkout in
// another directory, with another umask and another temporary directory, and wants the same digest
// and the same tarball bytes; then it runs the binaries of the unpacked image and imports the tarball
// into containerd. It compiles everything with the image's flags (minutes the first time on a cold
// build cache, seconds after), so it skips under -short.
func TestBuildIsReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the image twice: skipped under -short")
	}
	ctx := t.Context()
	root, err := RepoRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	build := func(out string) *Result {
		t.Helper()
		res, err := Build(ctx, Options{RepoRoot: root, OutDir: out})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	first := build(t.TempDir())

	// The second build: from a copy of the checkout elsewhere (no .git: told what git said), with
	// another umask and another temporary directory.
	copied := filepath.Join(t.TempDir(), "elsewhere", "ofsdn")
	copyTree(t, root, copied)
	t.Setenv("TMPDIR", t.TempDir())
	old := syscall.Umask(0o077)
	second, err := Build(ctx, Options{RepoRoot: copied, OutDir: t.TempDir(),
		Version: first.Info.Version, Revision: first.Info.Revision, Created: first.Info.Created})
	syscall.Umask(old)
	if err != nil {
		t.Fatal(err)
	}

	if first.Digest != second.Digest {
		t.Fatalf("two builds of %s: digests %s and %s", first.Info.Revision, first.Digest, second.Digest)
	}
	if a, b := fileSum(t, first.Tarball), fileSum(t, second.Tarball); a != b {
		t.Errorf("same digest, but the tarballs differ")
	}
	t.Logf("%s", first.Summary())
	if first.Size > SizeLimit {
		t.Errorf("%d bytes uncompressed, over %d", first.Size, SizeLimit)
	}

	// What git says, independently of Build, is what the image says.
	info, err := GitInfo(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	img, err := ReadLayout(second.Layout)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.Labels["org.opencontainers.image.revision"] != info.Revision || cf.Config.Labels["org.opencontainers.image.version"] != info.Version ||
		!cf.Created.Equal(info.Created) {
		t.Errorf("labels %v created %v; git says %s %s %v", cf.Config.Labels, cf.Created, info.Revision, info.Version, info.Created)
	}

	rootfs := t.TempDir()
	if err := Unpack(img, rootfs); err != nil {
		t.Fatal(err)
	}
	checkRootFS(t, rootfs)
	bin := filepath.Join(rootfs, BinDir)
	for _, name := range []string{"ofsdn-multicall", "ofsdn"} {
		f, err := elf.Open(filepath.Join(bin, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("%s is dynamically linked", name)
			}
		}
		f.Close()
	}
	for _, name := range []string{"ofsdn-agent", "ofsdn-controller"} {
		out := run(t, ctx, nil, filepath.Join(bin, name), "--version")
		if want := name + " " + info.Version + " (" + info.Revision + ")"; strings.TrimSpace(out) != want {
			t.Errorf("%s --version: %q, want %q", name, out, want)
		}
	}
	if out := run(t, ctx, nil, filepath.Join(bin, "flowctl"), "--help"); !strings.Contains(out, "pod-network") {
		t.Errorf("flowctl --help: %q", out)
	}
	if out := run(t, ctx, []string{"CNI_COMMAND=VERSION"}, filepath.Join(bin, "ofsdn")); !strings.Contains(out, `"supportedVersions"`) {
		t.Errorf("the CNI plugin's VERSION: %q", out)
	}

	// A node imports the tarball with ctr: same name, same digest, and the layers unpack to the same
	// files (hard links included).
	listing, snap := importIntoContainerd(t, ctx, second.Tarball, filepath.Join(BinDir, "ofsdn-agent"))
	if want := "docker.io/" + second.Ref; !strings.Contains(listing, want) || !strings.Contains(listing, second.Digest.String()) {
		t.Errorf("ctr images ls does not show %s at %s:\n%s", want, second.Digest, listing)
	}
	if snap == "" {
		t.Fatal("containerd unpacked no snapshot holding the agent")
	}
	checkRootFS(t, snap)
	for _, name := range []string{"ofsdn-multicall", "ofsdn"} {
		if a, b := fileSum(t, filepath.Join(snap, BinDir, name)), fileSum(t, filepath.Join(bin, name)); a != b {
			t.Errorf("%s as containerd unpacked it differs from the image's", name)
		}
	}
}

func run(t *testing.T, ctx context.Context, env []string, bin string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// copyTree copies the source tree at src to dst, without .git and _output.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || rel == "_output") {
			return filepath.SkipDir
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(target, data, 0o644)
		}
		return nil // .git as a file in a worktree, symbolic links: not sources
	})
	if err != nil {
		t.Fatal(err)
	}
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(data)
}

// importIntoContainerd starts a private containerd (its own root, state and sockets under a temporary
// directory, the native snapshotter, no CRI) and imports the tarball with ctr, as a node's operator
// would; it returns what `ctr images ls` lists and the root of the unpacked snapshot that holds path.
func importIntoContainerd(t *testing.T, ctx context.Context, tarball, path string) (listing, snapshot string) {
	t.Helper()
	for _, bin := range []string{"containerd", "ctr"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: run `make deps` (installs containerd)", bin)
		}
	}
	// Named as ovstest names its directories, so that make sweep clears what a killed run leaves.
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-containerd-", ovstest.Prefix, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "containerd.sock")
	config := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc", filepath.Join(dir, "opt"))
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	daemon := exec.Command("containerd", "--config", filepath.Join(dir, "config.toml"))
	daemon.Stdout, daemon.Stderr = logf, logf
	daemon.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = daemon.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = daemon.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = daemon.Process.Kill()
			<-done
		}
	})
	ctr := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", sock, "--namespace", "ofsdn-test"}, args...)...).CombinedOutput()
		if err != nil {
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("ctr %s: %v\n%s\ncontainerd:\n%s", strings.Join(args, " "), err, out, log)
		}
		return string(out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("containerd did not start:\n%s", log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ctr("images", "import", "--snapshotter", "native", tarball)
	listing = ctr("images", "ls")
	// The native snapshotter keeps each unpacked layer stack as a plain directory.
	snaps, _ := filepath.Glob(filepath.Join(dir, "root", "io.containerd.snapshotter.v1.native", "snapshots", "*"))
	for _, s := range snaps {
		if _, err := os.Stat(filepath.Join(s, path)); err == nil {
			snapshot = s
		}
	}
	return listing, snapshot
}
