package image

import (
	"context"
	"crypto/sha256"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestBuildIsReproducible builds the real image twice from this checkout, the second time with
// another umask and another temporary directory, and wants the same digest and the same tarball
// bytes; then it runs the binaries of the unpacked image. It compiles everything with the image's
// flags (minutes the first time on a cold build cache, seconds after), so it skips under -short.
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

	t.Setenv("TMPDIR", t.TempDir())
	old := syscall.Umask(0o077)
	second := build(t.TempDir())
	syscall.Umask(old)

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

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(data)
}
