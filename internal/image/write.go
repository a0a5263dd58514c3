package image

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/ofsdn/ofsdn/internal/atomicfile"
)

// Annotations of the image's entry in index.json: ctr import names the image from the first, other
// OCI tools from the second.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// WriteLayout writes img as the only image of a fresh OCI layout at dir, named in index.json by ref
// (for containerd) and by ref's tag (for OCI tools: skopeo copy oci:DIR:TAG). A layout already at dir
// is replaced whole (never merged: stale blobs would pile up), and only once the new one is complete.
func WriteLayout(dir string, img v1.Image, ref string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer os.RemoveAll(tmp)
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return fmt.Errorf("image: layout: %w", err)
	}
	tag := ref[strings.LastIndex(ref, ":")+1:]
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{annotationContainerdName: fullRef(ref), annotationRefName: tag})); err != nil {
		return fmt.Errorf("image: layout: %w", err)
	}
	// Plain modes, whatever the library and the umask chose: files 0644, directories 0755.
	err = filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.Chmod(p, 0o755)
		}
		return os.Chmod(p, 0o644)
	})
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	return nil
}

// fullRef spells a reference as containerd stores it (docker.io/ofsdn/ofsdn:v1 for ofsdn/ofsdn:v1), so
// that ctr import and a pod's image: ofsdn/ofsdn:v1 name the same image.
func fullRef(ref string) string {
	first, _, found := strings.Cut(ref, "/")
	if !found || (!strings.ContainsAny(first, ".:") && first != "localhost") {
		return "docker.io/" + ref
	}
	return ref
}

// dockerManifest is one entry of docker's manifest.json (what `docker load` reads).
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// WriteTarball writes the OCI layout at layoutDir as one tar file, plus docker's manifest.json
// pointing into its blobs: `docker load` reads manifest.json, `ctr import` (and Docker 25 and later)
// the OCI index. Entries are sorted and dated mtime, so the tarball is as reproducible as the image.
func WriteTarball(path, layoutDir string, img v1.Image, ref string, mtime time.Time) error {
	cfg, err := img.ConfigName()
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	dm := dockerManifest{Config: blobPath(cfg), RepoTags: []string{ref}}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return fmt.Errorf("image: %w", err)
		}
		dm.Layers = append(dm.Layers, blobPath(d))
	}
	manifestJSON, err := json.Marshal([]dockerManifest{dm})
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}

	type entry struct {
		name string
		dir  bool
		src  string
		data []byte
	}
	entries := []entry{{name: "manifest.json", data: manifestJSON}}
	err = filepath.WalkDir(layoutDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == layoutDir {
			return err
		}
		rel, err := filepath.Rel(layoutDir, p)
		if err != nil {
			return err
		}
		entries = append(entries, entry{name: filepath.ToSlash(rel), dir: d.IsDir(), src: p})
		return nil
	})
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })

	err = atomicfile.WriteFunc(path, 0o644, func(out io.Writer) error {
		tw := tar.NewWriter(out)
		for _, e := range entries {
			hdr := &tar.Header{Name: e.name, Mode: 0o644, ModTime: mtime, Format: tar.FormatPAX, Typeflag: tar.TypeReg}
			if e.dir {
				hdr.Name, hdr.Mode, hdr.Typeflag = e.name+"/", 0o755, tar.TypeDir
				if err := tw.WriteHeader(hdr); err != nil {
					return err
				}
				continue
			}
			data := e.data
			if e.src != "" {
				var err error
				if data, err = os.ReadFile(e.src); err != nil {
					return err
				}
			}
			hdr.Size = int64(len(data))
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := tw.Write(data); err != nil {
				return err
			}
		}
		return tw.Close()
	})
	if err != nil {
		return fmt.Errorf("image: tarball: %w", err)
	}
	return nil
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }
