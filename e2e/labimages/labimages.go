// Package labimages builds the container images the lab's real kubelets run, without a registry and
// without docker: every image is assembled by ofsdn's own image builder (internal/image) from binaries
// compiled here and files of Debian's packages, written as a tarball that `ctr images import` reads.
//
//	pause           lab.ofsdn.test/pause:3.10.1                        e2e/cmd/ofsdn-pause (the sandbox)
//	agnhost         lab.ofsdn.test/e2e-test-images/agnhost:2.56        k8s.io/kubernetes/test/images/agnhost at
//	                                                                   the lab's Kubernetes version, + tools
//	jessie-dnsutils lab.ofsdn.test/e2e-test-images/jessie-dnsutils:1.7 the tools (dig, getent, sh)
//	busybox         lab.ofsdn.test/e2e-test-images/busybox:1.37.0-1    Debian's busybox-static
//	ofsdn-testpod   lab.ofsdn.test/ofsdn-testpod:lab                   e2e/cmd/ofsdn-testpod (the lab's pods)
//	coredns         lab.ofsdn.test/coredns:v1.12.1                     CoreDNS (hack/build-k8s-e2e.sh builds it),
//	                                                                   when Options.CoreDNS names the binary
//
// The tools layer shared by agnhost and jessie-dnsutils carries what Kubernetes' e2e tests run inside
// those images and upstream installs from Alpine: a shell and the usual commands (busybox), curl, dig
// and getent, with the shared libraries they link (checked at build time: internal/image.CheckLinked).
//
// Names: the e2e framework builds image names from registries it reads from KUBE_TEST_REPO_LIST
// (RepoList writes that file); names and tags stay the framework's, the registry is the lab's own,
// a name nothing resolves, so a node never tries to pull them from anywhere.
package labimages

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ofsdn/ofsdn/internal/image"
)

const (
	// Registry is the registry part of every lab image's name.
	Registry = "lab.ofsdn.test"
	// E2ERegistry replaces registry.k8s.io/e2e-test-images (the framework's promoterE2eRegistry).
	E2ERegistry = Registry + "/e2e-test-images"

	// Pause is the pod sandbox image containerd runs (its CRI sandbox_image).
	Pause = Registry + "/pause:3.10.1"
	// Agnhost is the e2e framework's Agnhost image.
	Agnhost = E2ERegistry + "/agnhost:2.56"
	// JessieDnsutils is the e2e framework's JessieDnsutils image (the DNS tests' second prober).
	JessieDnsutils = E2ERegistry + "/jessie-dnsutils:1.7"
	// BusyBox is the e2e framework's BusyBox image.
	BusyBox = E2ERegistry + "/busybox:1.37.0-1"
	// TestPod runs the lab's own pods (e2e/cluster's PodSpec) on real kubelets.
	TestPod = Registry + "/ofsdn-testpod:lab"
	// CoreDNS is the lab's cluster DNS.
	CoreDNS = Registry + "/coredns:v1.12.1"
)

// RepoList is the KUBE_TEST_REPO_LIST file that makes the e2e framework name the images as the lab
// imports them.
func RepoList() string {
	return fmt.Sprintf("gcRegistry: %s\npromoterE2eRegistry: %s\n", Registry, E2ERegistry)
}

// Options say where to build from and to.
type Options struct {
	// RepoRoot is the ofsdn checkout (its module builds pause and testpod, hack/k8s builds agnhost).
	RepoRoot string
	// OutDir receives <name>.tar per image (and a stamp per image, so an unchanged image is not
	// written again) and a cache of Debian packages (debs/).
	OutDir string
	// CoreDNS is a CoreDNS binary to build the CoreDNS image from; empty: no CoreDNS image.
	CoreDNS string
	// Only builds just these images (refs of All); empty: all of them.
	Only []string
	Log  func(format string, args ...any)
}

// Image is one built image.
type Image struct {
	Ref     string
	Tarball string
	Digest  string
	Size    int64 // uncompressed layers
}

// All lists every lab image's name.
var All = []string{Pause, Agnhost, JessieDnsutils, BusyBox, TestPod}

// Build builds every lab image into OutDir, skipping those whose content did not change, and returns
// them in the order of All.
func Build(ctx context.Context, opts Options) ([]Image, error) {
	if opts.RepoRoot == "" || opts.OutDir == "" {
		return nil, fmt.Errorf("labimages: RepoRoot and OutDir are required")
	}
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	var err error
	if opts.OutDir, err = filepath.Abs(opts.OutDir); err != nil {
		return nil, fmt.Errorf("labimages: %w", err)
	}
	began := time.Now()
	info, err := image.GitInfo(ctx, opts.RepoRoot)
	if err != nil {
		return nil, err
	}
	info.Arch = "amd64"
	if out, err := exec.CommandContext(ctx, "go", "env", "GOARCH").Output(); err == nil {
		info.Arch = strings.TrimSpace(string(out))
	}
	want := func(ref string) bool { return len(opts.Only) == 0 || slices.Contains(opts.Only, ref) }
	bins := filepath.Join(opts.OutDir, "bin")
	if err := compile(ctx, opts.RepoRoot, bins, want(Agnhost)); err != nil {
		return nil, err
	}
	opts.Log("labimages: compiled the images' programs in %s", time.Since(began).Round(time.Millisecond))
	fetch := &image.DebFetcher{CacheDir: filepath.Join(opts.OutDir, "debs"), Log: opts.Log}
	var tools, bbox, agnhostLayer image.Layer
	if want(Agnhost) || want(JessieDnsutils) {
		if tools, err = toolsLayer(ctx, fetch); err != nil {
			return nil, err
		}
	}
	if want(BusyBox) {
		if bbox, err = busyboxLayer(ctx, fetch); err != nil {
			return nil, err
		}
	}
	if want(Agnhost) {
		if agnhostLayer, err = agnhostFiles(ctx, opts, bins); err != nil {
			return nil, err
		}
	}
	base := baseLayer()
	path := "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	specs := []struct {
		ref    string
		layers []image.Layer
		cfg    image.Config
	}{
		{Pause, []image.Layer{{CreatedBy: "ofsdn lab: /pause (e2e/cmd/ofsdn-pause)", Files: []image.File{
			{Path: "pause", Type: tar.TypeReg, Mode: 0o755, Source: filepath.Join(bins, "ofsdn-pause")}}}},
			image.Config{Entrypoint: []string{"/pause"}, User: "65535:65535"}},
		{Agnhost, []image.Layer{base, tools, agnhostLayer}, image.Config{Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, Env: []string{path}}},
		{JessieDnsutils, []image.Layer{base, tools}, image.Config{Cmd: []string{"/bin/sh"}, Env: []string{path}}},
		{BusyBox, []image.Layer{base, bbox}, image.Config{Cmd: []string{"/bin/sh"}, Env: []string{path}}},
		{TestPod, []image.Layer{{CreatedBy: "ofsdn lab: /ofsdn-testpod (e2e/cmd/ofsdn-testpod)", Files: []image.File{
			{Path: "ofsdn-testpod", Type: tar.TypeReg, Mode: 0o755, Source: filepath.Join(bins, "ofsdn-testpod")}}}},
			image.Config{Entrypoint: []string{"/ofsdn-testpod"}, Cmd: []string{"serve"}}},
	}
	if opts.CoreDNS != "" {
		specs = append(specs, struct {
			ref    string
			layers []image.Layer
			cfg    image.Config
		}{CoreDNS, []image.Layer{base, {CreatedBy: "ofsdn lab: /coredns (github.com/coredns/coredns, hack/coredns)", Files: []image.File{
			{Path: "coredns", Type: tar.TypeReg, Mode: 0o755, Source: opts.CoreDNS}}}},
			image.Config{Entrypoint: []string{"/coredns"}, Env: []string{path}}})
	}
	var out []Image
	for _, s := range specs {
		if !want(s.ref) && s.ref != CoreDNS {
			continue
		}
		s.cfg.Labels = map[string]string{"org.opencontainers.image.source": image.DefaultSource,
			"org.opencontainers.image.revision": info.Revision, "org.opencontainers.image.description": "ofsdn lab image " + s.ref}
		img, err := write(opts, s.ref, s.layers, s.cfg, info)
		if err != nil {
			return nil, err
		}
		out = append(out, img)
	}
	opts.Log("labimages: %d images in %s (%s)", len(out), time.Since(began).Round(time.Millisecond), opts.OutDir)
	return out, nil
}

// fileName is the tarball's name for a ref: its last path element and tag.
func fileName(ref string) string {
	return strings.NewReplacer(":", "_", "/", "_").Replace(ref[strings.LastIndex(ref, "/")+1:])
}

// write assembles an image and saves it, unless the stamp says the same content is there already.
func write(opts Options, ref string, layers []image.Layer, cfg image.Config, info image.BuildInfo) (Image, error) {
	tarPath := filepath.Join(opts.OutDir, fileName(ref)+".tar")
	stampPath := tarPath + ".stamp"
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", ref, info.Arch)
	_ = json.NewEncoder(h).Encode(cfg)
	for _, l := range layers {
		data, err := image.LayerTar(l.Files, info.Created)
		if err != nil {
			return Image{}, fmt.Errorf("labimages: %s: %w", ref, err)
		}
		h.Write(data)
	}
	type stamped struct {
		Image
		Stamp string
	}
	stamp := hex.EncodeToString(h.Sum(nil))
	var prev stamped
	if b, err := os.ReadFile(stampPath); err == nil && json.Unmarshal(b, &prev) == nil && prev.Stamp == stamp && prev.Ref == ref {
		if _, err := os.Stat(tarPath); err == nil {
			prev.Tarball = tarPath
			return prev.Image, nil
		}
	}
	img, sizes, err := image.AssembleConfig(layers, info, cfg)
	if err != nil {
		return Image{}, fmt.Errorf("labimages: %s: %w", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return Image{}, fmt.Errorf("labimages: %s: %w", ref, err)
	}
	layout, err := os.MkdirTemp(opts.OutDir, ".layout-")
	if err != nil {
		return Image{}, fmt.Errorf("labimages: %w", err)
	}
	defer os.RemoveAll(layout)
	if err := image.Save(img, ref, filepath.Join(layout, "oci"), tarPath, info.Created); err != nil {
		return Image{}, fmt.Errorf("labimages: %s: %w", ref, err)
	}
	res := Image{Ref: ref, Tarball: tarPath, Digest: digest.String(), Size: sizes.Uncompressed}
	b, _ := json.Marshal(stamped{res, stamp})
	if err := os.WriteFile(stampPath, b, 0o644); err != nil {
		return Image{}, fmt.Errorf("labimages: %w", err)
	}
	opts.Log("labimages: %s %s (%.1f MB)", ref, digest, float64(sizes.Uncompressed)/1e6)
	return res, nil
}

// compile builds the Go binaries: pause and testpod in ofsdn's module, agnhost in hack/k8s (a package
// of k8s.io/kubernetes itself, at the version the lab's control plane runs). All static.
func compile(ctx context.Context, root, dir string, agnhost bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("labimages: %w", err)
	}
	builds := []struct{ moduleDir, pkgs string }{{root, "./e2e/cmd/ofsdn-pause ./e2e/cmd/ofsdn-testpod"}}
	if agnhost {
		builds = append(builds, struct{ moduleDir, pkgs string }{filepath.Join(root, "hack", "k8s"), "k8s.io/kubernetes/test/images/agnhost"})
	}
	for _, b := range builds {
		args := append([]string{"build", "-trimpath", "-ldflags", "-s -w -buildid=", "-o", dir + "/"}, strings.Fields(b.pkgs)...)
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = b.moduleDir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("labimages: go %s (in %s): %w\n%s", strings.Join(args, " "), b.moduleDir, err, out)
		}
	}
	return nil
}

// agnhostFiles is what upstream's agnhost image (test/images/agnhost/Dockerfile) adds besides its
// tools: the binary (and agnhost-2, a link to it), porter's TLS certificate and key (the Proxy tests'
// https ports), /uploads, CoreDNS at /coredns (the DNS tests start it from this image; the lab's build,
// when there is one) and the user and group the image defines.
func agnhostFiles(ctx context.Context, opts Options, bins string) (image.Layer, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes")
	cmd.Dir = filepath.Join(opts.RepoRoot, "hack", "k8s")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	if err != nil {
		return image.Layer{}, fmt.Errorf("labimages: find k8s.io/kubernetes's source: %w", err)
	}
	porter := filepath.Join(strings.TrimSpace(string(out)), "test", "images", "agnhost", "porter")
	files := []image.File{
		{Path: "agnhost", Type: tar.TypeReg, Mode: 0o755, Source: filepath.Join(bins, "agnhost")},
		{Path: "agnhost-2", Type: tar.TypeSymlink, Mode: 0o777, Link: "agnhost"},
		{Path: "localhost.crt", Type: tar.TypeReg, Mode: 0o644, Source: filepath.Join(porter, "localhost.crt")},
		{Path: "localhost.key", Type: tar.TypeReg, Mode: 0o644, Source: filepath.Join(porter, "localhost.key")},
		{Path: "uploads", Type: tar.TypeDir, Mode: 0o755},
		{Path: "etc", Type: tar.TypeDir, Mode: 0o755},
		{Path: "etc/passwd", Type: tar.TypeReg, Mode: 0o644, Data: []byte(passwd + "user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n")},
		{Path: "etc/group", Type: tar.TypeReg, Mode: 0o644, Data: []byte(group + "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n")},
	}
	if opts.CoreDNS != "" {
		files = append(files, image.File{Path: "coredns", Type: tar.TypeReg, Mode: 0o755, Source: opts.CoreDNS})
	}
	return image.Layer{CreatedBy: "ofsdn lab: /agnhost (k8s.io/kubernetes/test/images/agnhost) and what its Dockerfile adds", Files: files}, nil
}

// passwd and group of the lab's Debian-based images.
const (
	passwd = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
	group  = "root:x:0:\nnogroup:x:65534:\n"
)

// baseLayer is what a Debian-based image expects in /etc, and /tmp.
func baseLayer() image.Layer {
	dir := func(p string, mode int64) image.File { return image.File{Path: p, Type: tar.TypeDir, Mode: mode} }
	reg := func(p, data string) image.File {
		return image.File{Path: p, Type: tar.TypeReg, Mode: 0o644, Data: []byte(data)}
	}
	return image.Layer{CreatedBy: "ofsdn lab: /etc (passwd, group, nsswitch.conf), /tmp", Files: []image.File{
		dir("etc", 0o755),
		reg("etc/passwd", passwd),
		reg("etc/group", group),
		reg("etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files dns\n"),
		dir("root", 0o700),
		dir("tmp", 0o1777),
	}}
}

// toolsPackages are the tools layer's programs; their shared libraries come along (LibraryClosure).
var toolsPackages = []image.DebPackage{
	{Name: "busybox-static", Keep: []string{"bin/busybox"}},
	{Name: "curl", Keep: []string{"usr/bin/curl"}},
	{Name: "bind9-dnsutils", Keep: []string{"usr/bin/dig", "usr/bin/nslookup"}},
	{Name: "libc-bin", Keep: []string{"usr/bin/getent"}},
	// The tests run `nc -v -t -w 2 HOST PORT`, `nc -v -u ...`, `nc -zv ...`: Alpine's nc (upstream's
	// agnhost) takes those options, Debian's busybox nc does not; OpenBSD's netcat does.
	{Name: "netcat-openbsd", Keep: []string{"bin/nc.openbsd"}},
	// /bin/sh is Debian's dash: Debian's static busybox shell runs its own applets before PATH
	// (FEATURE_SH_STANDALONE), so `sh -c "nc ..."` would never reach the nc above.
	{Name: "dash", Keep: []string{"bin/dash"}},
	// The rest of what upstream's agnhost image adds to Alpine: iproute2, iperf, bash.
	{Name: "iproute2", Keep: []string{"bin/ip", "sbin/ip", "usr/bin/ip", "usr/sbin/ip"}},
	{Name: "iperf", Keep: []string{"usr/bin/iperf"}},
	{Name: "bash", Keep: []string{"bin/bash"}},
	// The tests run `wget -q -O - -T 1 URL`: Debian's busybox wget has no -T (and crashes on it).
	{Name: "wget", Keep: []string{"usr/bin/wget"}},
}

// toolsLayer: busybox with its applets as symbolic links, curl, dig, getent and their libraries.
func toolsLayer(ctx context.Context, fetch *image.DebFetcher) (image.Layer, error) {
	libs, err := image.LibraryClosure(ctx, []string{"libc6", "libcurl4", "zlib1g", "bind9-libs", "libedit2", "libidn2-0",
		"libjemalloc2", "libkrb5-3", "libprotobuf-c1", "libbsd0", "libbpf1", "libcap2", "libdb5.3", "libelf1", "libmnl0",
		"libselinux1", "libtirpc3", "libxtables12", "libstdc++6", "libtinfo6", "libpcre2-8-0", "libuuid1", "libgnutls30"}, "zlib1g", "bind9-libs")
	if err != nil {
		return image.Layer{}, err
	}
	pkgs := slices.Clone(toolsPackages)
	for _, l := range libs {
		pkgs = append(pkgs, image.DebPackage{Name: l, Keep: image.LibraryDirs, MayBeEmpty: true})
	}
	files, versions, err := image.DebianFiles(ctx, fetch, pkgs)
	if err != nil {
		return image.Layer{}, err
	}
	// nslookup is dig's (bind9-dnsutils'), nc OpenBSD's, sh dash, wget GNU's: busybox's must not replace them. (Debian makes
	// nc a link through update-alternatives when it installs the package; the image links it here.)
	files = append(files, image.File{Path: "bin/nc", Type: tar.TypeSymlink, Mode: 0o777, Link: "nc.openbsd"},
		image.File{Path: "bin/sh", Type: tar.TypeSymlink, Mode: 0o777, Link: "dash"})
	files, err = withApplets(ctx, files, "bin/busybox", map[string]bool{"nslookup": true, "nc": true, "sh": true, "wget": true})
	if err != nil {
		return image.Layer{}, err
	}
	if err := image.CheckLinked(files); err != nil {
		return image.Layer{}, fmt.Errorf("labimages: tools layer: %w", err)
	}
	return image.Layer{CreatedBy: "ofsdn lab: tools from Debian: " + describe(versions), Files: files}, nil
}

func busyboxLayer(ctx context.Context, fetch *image.DebFetcher) (image.Layer, error) {
	files, versions, err := image.DebianFiles(ctx, fetch, []image.DebPackage{{Name: "busybox-static", Keep: []string{"bin/busybox"}}})
	if err != nil {
		return image.Layer{}, err
	}
	if files, err = withApplets(ctx, files, "bin/busybox", nil); err != nil {
		return image.Layer{}, err
	}
	return image.Layer{CreatedBy: "ofsdn lab: busybox from Debian: " + describe(versions), Files: files}, nil
}

// withApplets adds a symbolic link in /bin for every applet the static busybox at bbPath says it has
// (busybox --list), except those in skip and those a file already has.
func withApplets(ctx context.Context, files []image.File, bbPath string, skip map[string]bool) ([]image.File, error) {
	var bb *image.File
	have := map[string]bool{}
	for i := range files {
		have[files[i].Path] = true
		if files[i].Path == bbPath {
			bb = &files[i]
		}
	}
	if bb == nil {
		return nil, fmt.Errorf("labimages: no %s", bbPath)
	}
	// busybox picks its applet by the name it runs as: it must run as "busybox".
	tmpDir, err := os.MkdirTemp("", "ofsdn-busybox-")
	if err != nil {
		return nil, fmt.Errorf("labimages: %w", err)
	}
	defer os.RemoveAll(tmpDir)
	bin := filepath.Join(tmpDir, "busybox")
	if err := os.WriteFile(bin, bb.Data, 0o755); err != nil {
		return nil, fmt.Errorf("labimages: %w", err)
	}
	out, err := exec.CommandContext(ctx, bin, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("labimages: busybox --list: %w", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		p := "bin/" + applet
		if skip[applet] || have[p] || have["usr/"+p] || have["usr/s"+p] || applet == "busybox" {
			continue
		}
		have[p] = true
		files = append(files, image.File{Path: p, Type: tar.TypeSymlink, Mode: 0o777, Link: "busybox"})
	}
	return files, nil
}

func describe(versions map[string]string) string {
	var parts []string
	for name, v := range versions {
		parts = append(parts, name+"="+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}
