// Package image builds ofsdn's container image without a container runtime or a base image: static
// binaries compiled here, a few files written here, assembled into an OCI image with
// go-containerregistry, and written as an OCI layout directory and as one tarball that both
// `docker load` and `ctr import` read (an OCI layout plus docker's manifest.json, as `docker save`
// writes since Docker 25). `make image` runs it through internal/cmd/mkimage.
//
// What is in the image (see Files):
//
//	/usr/local/bin/ofsdn-multicall    ofsdn-agent, ofsdn-controller and flowctl in one binary (internal/cli)
//	/usr/local/bin/ofsdn-agent        \
//	/usr/local/bin/ofsdn-controller    > hard links to ofsdn-multicall, which runs the command it is named as
//	/usr/local/bin/flowctl            /
//	/usr/local/bin/ofsdn              the CNI plugin, which the agent copies into the host's CNI bin dir
//	/etc/passwd, /etc/group           root, and nonroot (65532), the image's default user
//	/tmp
//
// No OVS userland (the agent speaks OpenFlow and OVSDB itself) and no CA bundle: the components talk
// only to the API server, with the cluster's CA from their service account or kubeconfig.
//
// Reproducible: the same commit gives the same digest. The binaries are built with -trimpath and no
// build ID, every file's time is the commit's time (or SOURCE_DATE_EPOCH), owners are 0:0, entries are
// in a fixed order, and the config's created time and labels come from git, never from the clock.
package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Options say what to build and where to put it.
type Options struct {
	// RepoRoot is the ofsdn checkout to build from (its git history gives version, revision and time).
	RepoRoot string
	// OutDir receives oci/ (the OCI layout) and TarballName.
	OutDir string
	// Name is the image's name without tag; DefaultName when empty.
	Name string
	// Source is the org.opencontainers.image.source label; DefaultSource when empty.
	Source string
	// Arch is the GOARCH to build for; the running one when empty.
	Arch string
	// Version, Revision and Created override what git says (Created also comes from
	// SOURCE_DATE_EPOCH when set); with all three, RepoRoot need not be a git checkout.
	Version, Revision string
	Created           time.Time
	// Go is the go command; "go" when empty.
	Go string
	// Log receives progress lines; nothing when nil.
	Log io.Writer
}

// Defaults of Options.
const (
	DefaultName   = "ofsdn/ofsdn"
	DefaultSource = "https://github.com/ofsdn/ofsdn"
	// TarballName is the tarball's file name in OutDir.
	TarballName = "ofsdn-image.tar"
	// LayoutDir is the OCI layout's directory name in OutDir.
	LayoutDir = "oci"
)

// Result is what Build made.
type Result struct {
	Ref        string  // name:tag, the tag being the version
	Digest     v1.Hash // the manifest's digest: what a node pulls or imports
	Size       int64   // uncompressed: the sum of the layers' tar streams
	Compressed int64   // the sum of the gzip-compressed layers
	Layout     string  // the OCI layout directory
	Tarball    string  // the docker load / ctr import tarball
	Info       BuildInfo
}

// Build compiles the binaries, assembles the image and writes the layout and the tarball.
func Build(ctx context.Context, opts Options) (*Result, error) {
	if opts.RepoRoot == "" || opts.OutDir == "" {
		return nil, errors.New("image: RepoRoot and OutDir are required")
	}
	if opts.Name == "" {
		opts.Name = DefaultName
	}
	if opts.Source == "" {
		opts.Source = DefaultSource
	}
	if opts.Arch == "" {
		opts.Arch = runtime.GOARCH
	}
	if opts.Go == "" {
		opts.Go = "go"
	}
	logf := func(format string, args ...any) {
		if opts.Log != nil {
			fmt.Fprintf(opts.Log, format+"\n", args...)
		}
	}
	// A tree without git (a source archive) builds when told version, revision and time.
	var info BuildInfo
	if opts.Version == "" || opts.Revision == "" || opts.Created.IsZero() && os.Getenv("SOURCE_DATE_EPOCH") == "" {
		var err error
		if info, err = GitInfo(ctx, opts.RepoRoot); err != nil {
			return nil, err
		}
	}
	if opts.Version != "" {
		info.Version = opts.Version
	}
	if opts.Revision != "" {
		info.Revision = opts.Revision
	}
	if !opts.Created.IsZero() {
		info.Created = opts.Created
	} else if t, ok, err := sourceDateEpoch(); err != nil {
		return nil, err
	} else if ok {
		info.Created = t
	}
	info.Created = info.Created.UTC().Truncate(time.Second)
	info.Source, info.Arch = opts.Source, opts.Arch
	if !tagPattern.MatchString(info.Version) {
		return nil, fmt.Errorf("image: version %q cannot be an image tag (letters, digits, _ . -; at most 128, not starting with . or -)", info.Version)
	}
	if !revisionPattern.MatchString(info.Revision) {
		return nil, fmt.Errorf("image: revision %q is not a commit ID", info.Revision)
	}

	work, err := os.MkdirTemp("", "ofsdn-image-")
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	defer os.RemoveAll(work)
	logf("building %s for linux/%s at %s (version %s)", opts.Name, opts.Arch, info.Revision, info.Version)
	began := time.Now()
	bins, err := CompileBinaries(ctx, opts.Go, opts.RepoRoot, work, info)
	if err != nil {
		return nil, err
	}
	logf("compiled %d binaries in %s", len(bins), time.Since(began).Round(time.Millisecond))
	img, sizes, err := Assemble(Files(bins, info), info)
	if err != nil {
		return nil, err
	}
	ref := opts.Name + ":" + info.Version
	if err := os.MkdirAll(opts.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	res := &Result{Ref: ref, Size: sizes.Uncompressed, Compressed: sizes.Compressed, Info: info,
		Layout: filepath.Join(opts.OutDir, LayoutDir), Tarball: filepath.Join(opts.OutDir, TarballName)}
	if res.Digest, err = img.Digest(); err != nil {
		return nil, fmt.Errorf("image: digest: %w", err)
	}
	if err := WriteLayout(res.Layout, img, ref); err != nil {
		return nil, err
	}
	if err := WriteTarball(res.Tarball, res.Layout, img, ref, info.Created); err != nil {
		return nil, err
	}
	return res, nil
}

// A tag as the distribution spec allows it; a revision as git spells a commit.
var (
	tagPattern      = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
	revisionPattern = regexp.MustCompile(`^[0-9a-f]{7,64}$`)
)

// Summary is what `make image` prints.
func (r *Result) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "image    %s\n", r.Ref)
	fmt.Fprintf(&b, "digest   %s\n", r.Digest)
	over := ""
	if r.Size > SizeLimit {
		over = " OVER THE LIMIT: what grew? (go version -m on the binaries)"
	}
	fmt.Fprintf(&b, "size     %.1f MB uncompressed, %.1f MB compressed (limit %d MB uncompressed)%s\n",
		float64(r.Size)/1e6, float64(r.Compressed)/1e6, SizeLimit/1_000_000, over)
	fmt.Fprintf(&b, "revision %s, created %s\n", r.Info.Revision, r.Info.Created.Format(time.RFC3339))
	fmt.Fprintf(&b, "layout   %s\n", r.Layout)
	fmt.Fprintf(&b, "tarball  %s  (docker load -i FILE; ctr -n k8s.io images import FILE)\n", r.Tarball)
	return b.String()
}

// SizeLimit is the most the image should weigh uncompressed: Summary flags an image above it and
// TestBuildIsReproducible fails, so growth is seen without keeping anyone from building.
// Most of the weight is client-go's full clientset (every API group's types, typed clients and apply
// configurations, ~12 MB of symbols); ofsdn's own code is a few MB. It was 60 MB until the console and
// the node API's authentication took ofsdn-multicall from 56.9 to 58.1 MB, and with the CNI plugin
// (3.3 MB) the image to 61.3 MB.
const SizeLimit = 75_000_000

// RepoRoot is the directory of the main module the go command sees from the working directory.
func RepoRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("image: find the ofsdn checkout (go list -m): %w", err)
	}
	dir := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(dir, "cmd", "ofsdn-multicall")); err != nil {
		return "", fmt.Errorf("image: %s is not the ofsdn checkout: %w", dir, err)
	}
	return dir, nil
}
