// Package atomicfile writes files that readers see whole or not at all, and that survive a crash once
// written: the new content goes to a temporary file in the same directory, which is synced, renamed
// over the target, and the directory synced so the rename itself is on disk.
package atomicfile

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// tempMarker is in the name of every temporary file: ".<base>.tmp-<random>".
const tempMarker = ".tmp-"

// fsync makes a file's or a directory's content durable; tests replace it to see what is synced when.
var fsync = (*os.File).Sync

// Write replaces path with data (mode perm), creating its directory (0755) when missing. A reader
// opening path sees the old content or the new, never a mix; once Write returns, the new content
// survives a crash. A crash during Write leaves at most a temporary file that IsTemp recognises.
func Write(path string, data []byte, perm os.FileMode) error {
	return WriteFunc(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFunc is Write for content that fill streams (a tarball, say) instead of holding in memory.
func WriteFunc(path string, perm os.FileMode, fill func(io.Writer) error) error {
	if err := writeFunc(path, perm, fill); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func writeFunc(path string, perm os.FileMode, fill func(io.Writer) error) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+tempMarker)
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	err = fill(tmp)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil {
		err = fsync(tmp)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = fsync(d)
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// IsTemp reports whether a directory entry's name is a temporary file of Write (or of an older writer
// that named them ".tmp-*"): readers of the directory skip it, and may remove it once it is old, as
// the writer that made it died.
func IsTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, tempMarker)
}
