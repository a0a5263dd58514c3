package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// NonRootUID is the image's default user (the controller's); the agent's DaemonSet runs as root.
const NonRootUID = 65532

// File is one entry of a layer.
type File struct {
	Path   string // relative to /, no trailing slash
	Type   byte   // tar.TypeReg, tar.TypeDir or tar.TypeLink
	Mode   int64  // permission bits (and sticky)
	Data   []byte // a regular file's content, unless Source is set
	Source string // a regular file's content: this file
	Link   string // TypeLink: the entry (Path) this one is a hard link to; TypeSymlink: the link's target
}

// Layer is a layer's files, and the history line that says what it holds.
type Layer struct {
	CreatedBy string
	Files     []File
}

// Files lays out the image: a base layer that rarely changes (accounts, directories) and one with
// the binaries (bins by name, from CompileBinaries).
func Files(bins map[string]string, info BuildInfo) []Layer {
	dir := func(p string, mode int64) File { return File{Path: p, Type: tar.TypeDir, Mode: mode} }
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRootUID, NonRootUID)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", NonRootUID)
	base := Layer{CreatedBy: "ofsdn image: /etc/passwd and /etc/group (root, nonroot 65532), /tmp", Files: []File{
		dir("etc", 0o755),
		{Path: "etc/group", Type: tar.TypeReg, Mode: 0o644, Data: []byte(group)},
		{Path: "etc/passwd", Type: tar.TypeReg, Mode: 0o644, Data: []byte(passwd)},
		dir("home", 0o755),
		dir("root", 0o700),
		dir("tmp", 0o1777),
		dir("usr", 0o755),
		dir("usr/local", 0o755),
		dir(BinDir, 0o755),
	}}
	multi := path.Join(BinDir, "ofsdn-multicall")
	binLayer := Layer{CreatedBy: fmt.Sprintf("ofsdn image: ofsdn-multicall (%s) and the ofsdn CNI plugin, version %s",
		strings.Join(MultiCallNames, ", "), info.Version), Files: []File{
		{Path: multi, Type: tar.TypeReg, Mode: 0o755, Source: bins["ofsdn-multicall"]},
		{Path: path.Join(BinDir, "ofsdn"), Type: tar.TypeReg, Mode: 0o755, Source: bins["ofsdn"]},
	}}
	for _, name := range MultiCallNames {
		binLayer.Files = append(binLayer.Files, File{Path: path.Join(BinDir, name), Type: tar.TypeLink, Mode: 0o755, Link: multi})
	}
	return []Layer{base, binLayer}
}

// Labels are the OCI annotations the image carries as config labels and manifest annotations.
func Labels(info BuildInfo) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "ofsdn",
		"org.opencontainers.image.description": "ofsdn network plugin: ofsdn-agent, ofsdn-controller, flowctl and the ofsdn CNI plugin",
		"org.opencontainers.image.version":     info.Version,
		"org.opencontainers.image.revision":    info.Revision,
		"org.opencontainers.image.source":      info.Source,
		"org.opencontainers.image.created":     info.Created.UTC().Format("2006-01-02T15:04:05Z"),
	}
}

// Sizes of an image's layers, summed.
type Sizes struct {
	Uncompressed int64
	Compressed   int64
}

// Assemble makes the OCI image: one gzip layer per Layer, a config with the labels, the nonroot user
// and the creation time of info, and OCI media types throughout.
func Assemble(layers []Layer, info BuildInfo) (v1.Image, Sizes, error) {
	return AssembleConfig(layers, info, Config{
		User:       fmt.Sprintf("%d:%d", NonRootUID, NonRootUID),
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		WorkingDir: "/",
		Labels:     Labels(info),
	})
}

// Config is what an image's config says besides its layers: how a runtime starts it, and its labels
// (also written as the manifest's annotations).
type Config struct {
	User       string
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	Labels     map[string]string
}

// AssembleConfig is Assemble for any image: the layers, the creation time and architecture of info,
// and cfg.
func AssembleConfig(layers []Layer, info BuildInfo, cfg Config) (v1.Image, Sizes, error) {
	var sizes Sizes
	labels := cfg.Labels
	created := v1.Time{Time: info.Created}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: info.Arch,
		OS:           "linux",
		Created:      created,
		Config: v1.Config{
			User:       cfg.User,
			Entrypoint: cfg.Entrypoint,
			Cmd:        cfg.Cmd,
			Env:        cfg.Env,
			WorkingDir: cfg.WorkingDir,
			Labels:     labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, sizes, fmt.Errorf("image: config: %w", err)
	}
	for _, l := range layers {
		data, err := LayerTar(l.Files, info.Created)
		if err != nil {
			return nil, sizes, err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
			tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression), tarball.WithCompressedCaching)
		if err != nil {
			return nil, sizes, fmt.Errorf("image: layer: %w", err)
		}
		compressed, err := layer.Size()
		if err != nil {
			return nil, sizes, fmt.Errorf("image: layer: %w", err)
		}
		sizes.Uncompressed += int64(len(data))
		sizes.Compressed += compressed
		img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
			History: v1.History{Created: created, CreatedBy: l.CreatedBy}})
		if err != nil {
			return nil, sizes, fmt.Errorf("image: append layer: %w", err)
		}
	}
	if len(labels) == 0 {
		return img, sizes, nil
	}
	return mutate.Annotations(img, labels).(v1.Image), sizes, nil
}

// LayerTar writes files as an uncompressed tar stream in path order (hard links last, so that each
// follows the file it names), every entry owned by 0:0 and dated mtime, with no access or change
// times: the same files give the same bytes.
func LayerTar(files []File, mtime time.Time) ([]byte, error) {
	files = slices.Clone(files)
	slices.SortFunc(files, func(a, b File) int {
		if al, bl := a.Type == tar.TypeLink, b.Type == tar.TypeLink; al != bl {
			if al {
				return 1
			}
			return -1
		}
		return strings.Compare(a.Path, b.Path)
	})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	written := map[string]byte{}
	for _, f := range files {
		if _, dup := written[f.Path]; dup {
			return nil, fmt.Errorf("image: %s twice in one layer", f.Path)
		}
		if f.Type == tar.TypeSymlink && f.Link == "" {
			return nil, fmt.Errorf("image: symbolic link %s has no target", f.Path)
		}
		if f.Type == tar.TypeLink && written[f.Link] != tar.TypeReg {
			return nil, fmt.Errorf("image: %s links to %s, which is no regular file of this layer", f.Path, f.Link)
		}
		written[f.Path] = f.Type
		if f.Path == "" || strings.HasPrefix(f.Path, "/") || strings.HasSuffix(f.Path, "/") || path.Clean(f.Path) != f.Path {
			return nil, fmt.Errorf("image: bad path %q", f.Path)
		}
		hdr := &tar.Header{Typeflag: f.Type, Name: f.Path, Mode: f.Mode, ModTime: mtime, Format: tar.FormatPAX}
		var data []byte
		switch f.Type {
		case tar.TypeDir:
			hdr.Name += "/"
		case tar.TypeLink, tar.TypeSymlink:
			hdr.Linkname = f.Link
		case tar.TypeReg:
			data = f.Data
			if f.Source != "" {
				var err error
				if data, err = os.ReadFile(f.Source); err != nil {
					return nil, fmt.Errorf("image: %s: %w", f.Path, err)
				}
			}
			hdr.Size = int64(len(data))
		default:
			return nil, fmt.Errorf("image: %s: unsupported entry type %q", f.Path, f.Type)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("image: %s: %w", f.Path, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("image: %s: %w", f.Path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	return buf.Bytes(), nil
}
