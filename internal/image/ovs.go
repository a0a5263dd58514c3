package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// The Open vSwitch image (`make image-ovs`, deploy/ovs) runs ovsdb-server and ovs-vswitchd on nodes
// without an Open vSwitch of their own. It is assembled like ofsdn's image, without docker or a base
// image: Open vSwitch's programs and schema from Debian's packages (the candidate version of the
// building machine's apt, each package's version in the image's labels), the shared libraries they
// link (LibraryClosure, proved complete by CheckLinked), and ofsdn-ovs, the entrypoint
// (cmd/ofsdn-ovs, internal/ovsnode).
//
//	/usr/local/bin/ofsdn-ovs                   entrypoint: the daemons in the foreground; `probe`
//	/usr/sbin/ovsdb-server, ovs-vswitchd       (ovs-vswitchd: Debian's /usr/lib/openvswitch-switch one)
//	/usr/bin/ovsdb-tool, ovs-vsctl, ovs-appctl, ovs-ofctl, ovs-dpctl, ovsdb-client   for a person on the node
//	/usr/share/openvswitch/vswitch.ovsschema

// DefaultOVSName is the Open vSwitch image's name.
const DefaultOVSName = "ofsdn/openvswitch"

// ovsPackages are the files the image takes from Open vSwitch's Debian packages.
var ovsPackages = []DebPackage{
	{Name: "openvswitch-switch", Keep: []string{"usr/lib/openvswitch-switch/ovs-vswitchd", "usr/bin/ovs-vsctl", "usr/bin/ovs-dpctl",
		"usr/share/openvswitch/vswitch.ovsschema"}},
	{Name: "openvswitch-common", Keep: []string{"usr/sbin/ovsdb-server", "usr/bin/ovsdb-tool", "usr/bin/ovs-appctl", "usr/bin/ovs-ofctl",
		"usr/bin/ovsdb-client"}},
}

// ovsLibraries are the library packages Open vSwitch's programs depend on (apt's metadata adds theirs).
var ovsLibraries = []string{"libc6", "libssl3", "libcap-ng0", "libnuma1", "libxdp1", "libbpf1", "libunbound8"}

// BuildOVS builds the Open vSwitch image into opts.OutDir (oci/ and TarballName), as Build does for
// ofsdn's; opts.Name defaults to DefaultOVSName. Debian packages are cached in debCache.
func BuildOVS(ctx context.Context, opts Options, debCache string) (*Result, error) {
	if opts.RepoRoot == "" || opts.OutDir == "" || debCache == "" {
		return nil, errors.New("image: RepoRoot, OutDir and the Debian package cache are required")
	}
	if opts.Name == "" {
		opts.Name = DefaultOVSName
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
	info, err := GitInfo(ctx, opts.RepoRoot)
	if err != nil {
		return nil, err
	}
	if opts.Version != "" {
		info.Version = opts.Version
	}
	if t, ok, err := sourceDateEpoch(); err != nil {
		return nil, err
	} else if ok {
		info.Created = t
	}
	info.Created = info.Created.UTC().Truncate(time.Second)
	info.Source, info.Arch = opts.Source, opts.Arch
	if !tagPattern.MatchString(info.Version) {
		return nil, fmt.Errorf("image: version %q cannot be an image tag", info.Version)
	}
	work, err := os.MkdirTemp("", "ofsdn-image-ovs-")
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	defer os.RemoveAll(work)
	logf("building %s for linux/%s at %s (version %s)", opts.Name, opts.Arch, info.Revision, info.Version)
	bins, err := compilePackages(ctx, opts.Go, opts.RepoRoot, work, info, map[string]string{"ofsdn-ovs": "./cmd/ofsdn-ovs"})
	if err != nil {
		return nil, err
	}
	fetch := &DebFetcher{CacheDir: debCache, Log: func(f string, a ...any) { logf(f, a...) }}
	libs, err := LibraryClosure(ctx, ovsLibraries, "zlib1g")
	if err != nil {
		return nil, err
	}
	pkgs := append([]DebPackage(nil), ovsPackages...)
	for _, l := range libs {
		pkgs = append(pkgs, DebPackage{Name: l, Keep: LibraryDirs, MayBeEmpty: true})
	}
	files, versions, err := DebianFiles(ctx, fetch, pkgs)
	if err != nil {
		return nil, err
	}
	// Debian points /usr/sbin/ovs-vswitchd at its build through update-alternatives when it installs the
	// package; the image links it itself.
	files = append(files, File{Path: "usr/sbin/ovs-vswitchd", Type: tar.TypeSymlink, Mode: 0o777, Link: "../lib/openvswitch-switch/ovs-vswitchd"})
	if err := CheckLinked(files); err != nil {
		return nil, err
	}
	dir := func(p string, mode int64) File { return File{Path: p, Type: tar.TypeDir, Mode: mode} }
	base := Layer{CreatedBy: "ofsdn openvswitch image: /etc/passwd, /etc/group, /tmp, the run and database directories", Files: []File{
		dir("etc", 0o755),
		{Path: "etc/group", Type: tar.TypeReg, Mode: 0o644, Data: []byte("root:x:0:\n")},
		{Path: "etc/passwd", Type: tar.TypeReg, Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\n")},
		dir("etc/openvswitch", 0o755),
		dir("root", 0o700),
		dir("tmp", 0o1777),
		dir("var", 0o755),
		dir("var/run", 0o755),
		dir("var/run/openvswitch", 0o755),
	}}
	labels := map[string]string{
		"org.opencontainers.image.title":       "ofsdn-openvswitch",
		"org.opencontainers.image.description": "Open vSwitch (ovsdb-server, ovs-vswitchd) for ofsdn nodes without their own, from Debian's packages",
		"org.opencontainers.image.version":     info.Version,
		"org.opencontainers.image.revision":    info.Revision,
		"org.opencontainers.image.source":      info.Source,
		"org.opencontainers.image.created":     info.Created.Format("2006-01-02T15:04:05Z"),
		"io.ofsdn.openvswitch.debian-packages": describeVersions(versions, "openvswitch-switch", "openvswitch-common"),
	}
	layers := []Layer{base,
		{CreatedBy: "ofsdn openvswitch image: Open vSwitch from Debian: " + describeVersions(versions), Files: files},
		{CreatedBy: "ofsdn openvswitch image: ofsdn-ovs " + info.Version, Files: []File{
			{Path: "usr", Type: tar.TypeDir, Mode: 0o755}, {Path: "usr/local", Type: tar.TypeDir, Mode: 0o755}, {Path: BinDir, Type: tar.TypeDir, Mode: 0o755},
			{Path: path.Join(BinDir, "ofsdn-ovs"), Type: tar.TypeReg, Mode: 0o755, Source: bins["ofsdn-ovs"]}}},
	}
	img, sizes, err := AssembleConfig(layers, info, Config{
		User: "0:0", Entrypoint: []string{"/usr/local/bin/ofsdn-ovs"}, WorkingDir: "/",
		Env: []string{"PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, Labels: labels})
	if err != nil {
		return nil, err
	}
	ref := opts.Name + ":" + info.Version
	res := &Result{Ref: ref, Size: sizes.Uncompressed, Compressed: sizes.Compressed, Info: info,
		Layout: filepath.Join(opts.OutDir, LayoutDir), Tarball: filepath.Join(opts.OutDir, OVSTarballName)}
	if res.Digest, err = img.Digest(); err != nil {
		return nil, fmt.Errorf("image: digest: %w", err)
	}
	if err := Save(img, ref, res.Layout, res.Tarball, info.Created); err != nil {
		return nil, err
	}
	return res, nil
}

// OVSTarballName is the Open vSwitch image's tarball in its OutDir.
const OVSTarballName = "ofsdn-openvswitch-image.tar"

// describeVersions lists name=version of the given packages (all when none is named), sorted.
func describeVersions(versions map[string]string, names ...string) string {
	if len(names) == 0 {
		for n := range versions {
			names = append(names, n)
		}
	}
	var parts []string
	for _, n := range names {
		parts = append(parts, n+"="+versions[n])
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}
