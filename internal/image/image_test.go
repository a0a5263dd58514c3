package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/ofsdn/ofsdn/internal/cli"
)

var testInfo = BuildInfo{Version: "v1.2.3", Revision: "0123456789abcdef0123456789abcdef01234567",
	Created: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC), Source: DefaultSource, Arch: "amd64"}

// fakeBinaries stands in for CompileBinaries: distinct contents per binary.
func fakeBinaries(t *testing.T) map[string]string {
	t.Helper()
	dir := t.TempDir()
	bins := map[string]string{}
	for name := range binaryPackages {
		bins[name] = filepath.Join(dir, name)
		if err := os.WriteFile(bins[name], []byte("#!/bin/sh\necho "+name+"\n"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return bins
}

type tarEntry struct {
	name, link string
	typ        byte
	mode       int64
	uid, gid   int
	mtime      time.Time
	data       string
}

func readTar(t *testing.T, r io.Reader) []tarEntry {
	t.Helper()
	var out []tarEntry
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		out = append(out, tarEntry{h.Name, h.Linkname, h.Typeflag, h.Mode, h.Uid, h.Gid, h.ModTime, string(data)})
	}
}

func TestLayerTarIsDeterministicWithLinksAfterTheirTargets(t *testing.T) {
	files := Files(fakeBinaries(t), testInfo)[1].Files
	a, err := LayerTar(files, testInfo.Created)
	if err != nil {
		t.Fatal(err)
	}
	shuffled := slices.Clone(files)
	slices.Reverse(shuffled)
	b, err := LayerTar(shuffled, testInfo.Created)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("the same files in another order gave another tar stream")
	}
	seen := map[string]bool{}
	var names []string
	for _, e := range readTar(t, bytes.NewReader(a)) {
		names = append(names, e.name)
		if e.uid != 0 || e.gid != 0 || !e.mtime.Equal(testInfo.Created) {
			t.Errorf("%s: owner %d:%d time %v, want 0:0 at %v", e.name, e.uid, e.gid, e.mtime, testInfo.Created)
		}
		if e.typ == tar.TypeLink && !seen[e.link] {
			t.Errorf("%s links to %s, which comes later or not at all", e.name, e.link)
		}
		seen[e.name] = true
	}
	want := []string{"usr/local/bin/ofsdn", "usr/local/bin/ofsdn-multicall", "usr/local/bin/flowctl",
		"usr/local/bin/ofsdn-agent", "usr/local/bin/ofsdn-controller"}
	if !slices.Equal(names, want) {
		t.Errorf("entries %q, want %q", names, want)
	}
}

func TestLayerTarRefusesBadEntries(t *testing.T) {
	reg := func(p string) File { return File{Path: p, Type: tar.TypeReg, Mode: 0o644} }
	for name, files := range map[string][]File{
		"duplicate":       {reg("etc/a"), reg("etc/a")},
		"absolute":        {reg("/etc/a")},
		"dot-dot":         {reg("etc/../../a")},
		"trailing slash":  {reg("etc/")},
		"dangling link":   {{Path: "bin/b", Type: tar.TypeLink, Link: "bin/a"}},
		"link to a dir":   {{Path: "bin", Type: tar.TypeDir}, {Path: "x", Type: tar.TypeLink, Link: "bin"}},
		"unsupported":     {{Path: "dev/null", Type: tar.TypeChar}},
		"missing content": {{Path: "a", Type: tar.TypeReg, Source: "/nonexistent/ofsdn"}},
	} {
		if _, err := LayerTar(files, testInfo.Created); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// Every command of the multi-call binary is in the image under its name.
func TestImageShipsEveryMultiCallCommand(t *testing.T) {
	names := slices.Sorted(slices.Values(MultiCallNames))
	if !slices.Equal(names, cli.Names()) {
		t.Errorf("image links %q, the multi-call binary has %q", names, cli.Names())
	}
}

func TestAssembleIsReproducibleAndLabelled(t *testing.T) {
	bins := fakeBinaries(t)
	img, _, err := Assemble(Files(bins, testInfo), testInfo)
	if err != nil {
		t.Fatal(err)
	}
	again, _, err := Assemble(Files(bins, testInfo), testInfo)
	if err != nil {
		t.Fatal(err)
	}
	d1, d2 := digest(t, img), digest(t, again)
	if d1 != d2 {
		t.Fatalf("same inputs, digests %s and %s", d1, d2)
	}
	later := testInfo
	later.Created = later.Created.Add(time.Second)
	other, _, err := Assemble(Files(bins, later), later)
	if err != nil {
		t.Fatal(err)
	}
	if digest(t, other) == d1 {
		t.Error("another commit time gave the same digest: the time is not in the image")
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.version":  "v1.2.3",
		"org.opencontainers.image.revision": testInfo.Revision,
		"org.opencontainers.image.source":   DefaultSource,
		"org.opencontainers.image.created":  "2026-03-04T05:06:07Z",
	}
	for k, v := range wantLabels {
		if cf.Config.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, cf.Config.Labels[k], v)
		}
	}
	if cf.Config.User != "65532:65532" || cf.OS != "linux" || cf.Architecture != "amd64" || !cf.Created.Equal(testInfo.Created) {
		t.Errorf("config: user %q, platform %s/%s, created %v", cf.Config.User, cf.OS, cf.Architecture, cf.Created)
	}
	if len(cf.History) != 2 || len(cf.RootFS.DiffIDs) != 2 {
		t.Errorf("config: %d history entries and %d diff IDs, want 2 each", len(cf.History), len(cf.RootFS.DiffIDs))
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("media types: manifest %s, config %s", m.MediaType, m.Config.MediaType)
	}
	for _, l := range m.Layers {
		if l.MediaType != types.OCILayer {
			t.Errorf("layer %s: media type %s", l.Digest, l.MediaType)
		}
	}
	if m.Annotations["org.opencontainers.image.revision"] != testInfo.Revision {
		t.Errorf("manifest annotations %v", m.Annotations)
	}
}

// The layout and the tarball read back through go-containerregistry's own readers (OCI layout, and
// docker's manifest.json as docker load reads it) as the same image, and unpack into a root file
// system with the accounts, the binaries and their hard links.
func TestWriteReadBackAndUnpack(t *testing.T) {
	img, _, err := Assemble(Files(fakeBinaries(t), testInfo), testInfo)
	if err != nil {
		t.Fatal(err)
	}
	ref := "registry.example:5000/ofsdn/ofsdn:v1.2.3"
	var tarSums [][32]byte
	for range 2 {
		out := t.TempDir()
		if err := WriteLayout(filepath.Join(out, LayoutDir), img, ref); err != nil {
			t.Fatal(err)
		}
		// Writing again replaces the layout instead of adding to it.
		if err := WriteLayout(filepath.Join(out, LayoutDir), img, ref); err != nil {
			t.Fatal(err)
		}
		tb := filepath.Join(out, TarballName)
		if err := WriteTarball(tb, filepath.Join(out, LayoutDir), img, ref, testInfo.Created); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(tb)
		if err != nil {
			t.Fatal(err)
		}
		tarSums = append(tarSums, sha256.Sum256(data))

		fromLayout, err := ReadLayout(filepath.Join(out, LayoutDir))
		if err != nil {
			t.Fatal(err)
		}
		if digest(t, fromLayout) != digest(t, img) {
			t.Errorf("layout holds %s, want %s", digest(t, fromLayout), digest(t, img))
		}
		index, err := os.ReadFile(filepath.Join(out, LayoutDir, "index.json"))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`"io.containerd.image.name": "registry.example:5000/ofsdn/ofsdn:v1.2.3"`, `"org.opencontainers.image.ref.name": "v1.2.3"`} {
			if !strings.Contains(string(index), want) {
				t.Errorf("index.json lacks %s:\n%s", want, index)
			}
		}
		fromDocker, err := tarball.ImageFromPath(tb, nil)
		if err != nil {
			t.Fatal(err)
		}
		sameLayers(t, fromDocker, img)

		root := t.TempDir()
		if err := Unpack(fromLayout, root); err != nil {
			t.Fatal(err)
		}
		checkRootFS(t, root)
	}
	if tarSums[0] != tarSums[1] {
		t.Error("two tarballs of the same image differ")
	}
}

func TestFullRef(t *testing.T) {
	for in, want := range map[string]string{
		"ofsdn/ofsdn:v1":                  "docker.io/ofsdn/ofsdn:v1",
		"ofsdn:v1":                        "docker.io/ofsdn:v1",
		"quay.io/ofsdn/ofsdn:v1":          "quay.io/ofsdn/ofsdn:v1",
		"localhost/ofsdn:v1":              "localhost/ofsdn:v1",
		"registry.example:5000/ofsdn:abc": "registry.example:5000/ofsdn:abc",
	} {
		if got := fullRef(in); got != want {
			t.Errorf("fullRef(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUnpackKeepsEntriesInsideTheRoot(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	write := func(h *tar.Header, data string) {
		h.Size = int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	write(&tar.Header{Name: "../../escaped", Typeflag: tar.TypeReg, Mode: 0o644}, "x")
	write(&tar.Header{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "/"}, "")
	tw.Close()
	outer := t.TempDir()
	root := filepath.Join(outer, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unpackLayer(tar.NewReader(bytes.NewReader(buf.Bytes())), root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "escaped")); err != nil {
		t.Errorf("../../escaped did not land inside the root: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outer, "escaped")); err == nil {
		t.Error("an entry escaped the root")
	}
	// A file under a symbolic link would be written wherever the link points: refused.
	buf.Reset()
	tw = tar.NewWriter(&buf)
	write(&tar.Header{Name: "up/tmp/ofsdn-unpack-escape", Typeflag: tar.TypeReg, Mode: 0o644}, "x")
	tw.Close()
	if err := unpackLayer(tar.NewReader(bytes.NewReader(buf.Bytes())), root); err == nil {
		t.Error("a file under a symbolic link was written")
	}
}

func digest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func sameLayers(t *testing.T, got, want v1.Image) {
	t.Helper()
	gl, err := got.Layers()
	if err != nil {
		t.Fatal(err)
	}
	wl, err := want.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(gl) != len(wl) {
		t.Fatalf("%d layers, want %d", len(gl), len(wl))
	}
	for i := range gl {
		g, err := gl[i].DiffID()
		if err != nil {
			t.Fatal(err)
		}
		w, err := wl[i].DiffID()
		if err != nil {
			t.Fatal(err)
		}
		if g != w {
			t.Errorf("layer %d: diff ID %s, want %s", i, g, w)
		}
	}
	gc, err := got.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	wc, err := want.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	if gc != wc {
		t.Errorf("config %s, want %s", gc, wc)
	}
}

// checkRootFS checks an unpacked image against what Files promises.
func checkRootFS(t *testing.T, root string) {
	t.Helper()
	passwd, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil || !strings.Contains(string(passwd), "nonroot:x:65532:65532:") || !strings.HasPrefix(string(passwd), "root:x:0:0:") {
		t.Errorf("/etc/passwd: %q %v", passwd, err)
	}
	if group, err := os.ReadFile(filepath.Join(root, "etc/group")); err != nil || !strings.Contains(string(group), "nonroot:x:65532:") {
		t.Errorf("/etc/group: %q %v", group, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("/tmp: %v %v", fi.Mode(), err)
	}
	multi, err := os.Stat(filepath.Join(root, BinDir, "ofsdn-multicall"))
	if err != nil {
		t.Fatal(err)
	}
	if multi.Mode().Perm() != 0o755 {
		t.Errorf("ofsdn-multicall mode %v", multi.Mode())
	}
	for _, name := range MultiCallNames {
		fi, err := os.Stat(filepath.Join(root, BinDir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if !os.SameFile(fi, multi) {
			t.Errorf("%s is not a hard link to ofsdn-multicall", name)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, BinDir, "ofsdn")); err != nil || os.SameFile(fi, multi) || fi.Mode().Perm() != 0o755 {
		t.Errorf("the CNI plugin ofsdn: %v", err)
	}
}

func TestBuildRefusesABadVersionOrRevision(t *testing.T) {
	when := time.Unix(1700000000, 0)
	for _, opts := range []Options{
		{Version: "v1 with spaces", Revision: testInfo.Revision, Created: when},
		{Version: "-v1", Revision: testInfo.Revision, Created: when},
		{Version: strings.Repeat("v", 129), Revision: testInfo.Revision, Created: when},
		{Version: "v1.2.3", Revision: "HEAD; rm -rf /", Created: when},
	} {
		opts.RepoRoot, opts.OutDir = t.TempDir(), t.TempDir()
		_, err := Build(t.Context(), opts)
		if err == nil || !strings.Contains(err.Error(), "image: ") || strings.Contains(err.Error(), "go build") {
			t.Errorf("version %q revision %q: %v, want a refusal before building", opts.Version, opts.Revision, err)
		}
	}
}

// Push to a registry (go-containerregistry's, in memory, on loopback): the registry then serves the
// same manifest digest and layers, and the returned reference names the image by that digest.
func TestPushToARegistry(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	img, _, err := Assemble(Files(fakeBinaries(t), testInfo), testInfo)
	if err != nil {
		t.Fatal(err)
	}
	byDigest, err := Push(t.Context(), img, host+"/ofsdn/ofsdn:v1.2.3", true)
	if err != nil {
		t.Fatal(err)
	}
	if want := host + "/ofsdn/ofsdn@" + digest(t, img).String(); byDigest != want {
		t.Errorf("Push returned %q, want %q", byDigest, want)
	}
	ref, err := name.ParseReference(host+"/ofsdn/ofsdn:v1.2.3", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Image(ref, remote.WithContext(t.Context()))
	if err != nil {
		t.Fatal(err)
	}
	if digest(t, pulled) != digest(t, img) {
		t.Errorf("the registry serves %s, pushed %s", digest(t, pulled), digest(t, img))
	}
	sameLayers(t, pulled, img)
	if _, err := Push(t.Context(), img, "not a reference", true); err == nil {
		t.Error("a bad reference was pushed")
	}
}
