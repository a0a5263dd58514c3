package image

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Binaries the image ships, by the name they are built as, and their packages.
var binaryPackages = map[string]string{
	"ofsdn-multicall": "./cmd/ofsdn-multicall",
	"ofsdn":           "./cmd/ofsdn",
}

// MultiCallNames are the commands that are hard links to ofsdn-multicall in the image (internal/cli).
var MultiCallNames = []string{"ofsdn-agent", "ofsdn-controller", "flowctl"}

// BinDir is where the binaries live in the image.
const BinDir = "usr/local/bin"

const versionPkg = "github.com/ofsdn/ofsdn/internal/version"

// CompileBinaries builds the image's binaries into dir: static (CGO_ENABLED=0), for linux/info.Arch,
// with -trimpath, stripped, without a build ID, and with version and revision stamped into
// internal/version. Settings of the caller's environment that change the code generated (GOFLAGS,
// GOAMD64, GOEXPERIMENT, ...) are dropped, so two machines with the same Go release produce the same
// bytes. It returns each binary's path by name.
func CompileBinaries(ctx context.Context, goCmd, root, dir string, info BuildInfo) (map[string]string, error) {
	return compilePackages(ctx, goCmd, root, dir, info, binaryPackages)
}

// compilePackages builds the named packages as CompileBinaries does.
func compilePackages(ctx context.Context, goCmd, root, dir string, info BuildInfo, packages map[string]string) (map[string]string, error) {
	ldflags := fmt.Sprintf("-s -w -buildid= -X %s.Version=%s -X %s.Revision=%s", versionPkg, info.Version, versionPkg, info.Revision)
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", dir + "/"}
	names := make([]string, 0, len(packages))
	for name := range packages {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		args = append(args, packages[name])
	}
	cmd := exec.CommandContext(ctx, goCmd, args...)
	cmd.Dir = root
	cmd.Env = append(buildEnv(os.Environ()), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+info.Arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("image: go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	bins := map[string]string{}
	for name := range packages {
		bins[name] = filepath.Join(dir, name)
		if _, err := os.Stat(bins[name]); err != nil {
			return nil, fmt.Errorf("image: go build made no %s: %w", name, err)
		}
	}
	return bins, nil
}

// buildEnv drops the variables that would make the binaries depend on who builds them.
func buildEnv(env []string) []string {
	drop := map[string]bool{"GOFLAGS": true, "GOOS": true, "GOARCH": true, "CGO_ENABLED": true, "GOEXPERIMENT": true,
		"GOAMD64": true, "GOARM": true, "GOARM64": true, "GO386": true, "GOPPC64": true, "GORISCV64": true, "GOMIPS": true,
		"GOMIPS64": true, "GOWASM": true, "GOFIPS140": true}
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if !drop[k] {
			out = append(out, kv)
		}
	}
	return out
}
