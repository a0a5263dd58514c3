package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// ReadLayout returns the one image of an OCI layout, read back with go-containerregistry's reader.
func ReadLayout(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("image: read layout %s: %w", dir, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("image: read layout %s: %w", dir, err)
	}
	if len(im.Manifests) != 1 {
		return nil, fmt.Errorf("image: layout %s holds %d manifests, want 1", dir, len(im.Manifests))
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("image: read layout %s: %w", dir, err)
	}
	return img, nil
}

// Unpack applies img's layers in order into dst, as a container runtime's snapshotter does: a root
// file system to run the image's binaries from (tests; an unprivileged look inside). It handles the
// entries images hold — directories, regular files, hard and symbolic links, whiteouts — and refuses
// paths that leave dst. Owners are not applied.
func Unpack(img v1.Image, dst string) error {
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("image: unpack: %w", err)
	}
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return fmt.Errorf("image: unpack layer %d: %w", i, err)
		}
		err = unpackLayer(tar.NewReader(rc), dst)
		rc.Close()
		if err != nil {
			return fmt.Errorf("image: unpack layer %d: %w", i, err)
		}
	}
	return nil
}

func unpackLayer(tr *tar.Reader, dst string) error {
	dst, err := filepath.EvalSymlinks(dst)
	if err != nil {
		return err
	}
	// Cleaning under a leading / keeps every name inside dst ("../../etc" is "/etc"); a parent that
	// is a symbolic link could still lead out, so none is followed.
	within := func(name string) (string, error) {
		p := filepath.Join(dst, filepath.Clean("/"+name))
		if parent := filepath.Dir(p); parent != dst && strings.HasPrefix(parent, dst) {
			if real, err := filepath.EvalSymlinks(parent); err == nil && real != parent {
				return "", fmt.Errorf("entry %q: %s is a symbolic link", name, parent)
			}
		}
		return p, nil
	}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		target, err := within(hdr.Name)
		if err != nil {
			return err
		}
		if target == dst {
			continue
		}
		if base := filepath.Base(target); strings.HasPrefix(base, ".wh.") {
			if base == ".wh..wh..opq" { // opaque directory: drop what lower layers put there
				entries, _ := os.ReadDir(filepath.Dir(target))
				for _, e := range entries {
					if err := os.RemoveAll(filepath.Join(filepath.Dir(target), e.Name())); err != nil {
						return err
					}
				}
				continue
			}
			if err := os.RemoveAll(filepath.Join(filepath.Dir(target), strings.TrimPrefix(base, ".wh."))); err != nil {
				return err
			}
			continue
		}
		mode := os.FileMode(hdr.Mode & 0o777)
		if hdr.Mode&0o1000 != 0 {
			mode |= os.ModeSticky
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, mode); err != nil {
				return err
			}
			if err := os.Chmod(target, mode); err != nil {
				return err
			}
		case tar.TypeReg:
			_ = os.Remove(target)
			f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			if err := os.Chmod(target, mode); err != nil {
				return err
			}
		case tar.TypeLink:
			src, err := within(hdr.Linkname)
			if err != nil {
				return err
			}
			_ = os.Remove(target)
			if err := os.Link(src, target); err != nil {
				return err
			}
		case tar.TypeSymlink:
			_ = os.Remove(target)
			if err := os.Symlink(hdr.Linkname, target); err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q: unsupported type %q", hdr.Name, hdr.Typeflag)
		}
	}
}
