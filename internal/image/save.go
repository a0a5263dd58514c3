package image

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Save writes img, named ref (name:tag), as an OCI layout at layoutDir and as the tarball at tarPath
// that `docker load` and `ctr import` read, as Build does for ofsdn's own image. Both are replaced
// whole, and only once complete.
func Save(img v1.Image, ref, layoutDir, tarPath string, created time.Time) error {
	if err := os.MkdirAll(filepath.Dir(tarPath), 0o755); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if err := WriteLayout(layoutDir, img, ref); err != nil {
		return err
	}
	return WriteTarball(tarPath, layoutDir, img, ref, created)
}
