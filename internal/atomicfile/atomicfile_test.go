package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplacesWholeAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "f.json")
	for _, content := range []string{"first", "second, longer"} {
		if err := Write(path, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != content {
			t.Fatalf("read back %q, %v; want %q", got, err, content)
		}
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, %v; want 0640", st.Mode(), err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only the file: %v", len(entries), entries)
	}
}

// Write syncs the temporary file before the rename (so the name never points at unwritten data) and
// the directory after it (so the rename survives a crash).
func TestWriteSyncsFileThenDirectory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	type synced struct {
		name        string
		targetIsNew bool // the target already held the new content when this was synced
	}
	var got []synced
	orig := fsync
	t.Cleanup(func() { fsync = orig })
	fsync = func(f *os.File) error {
		content, _ := os.ReadFile(path)
		got = append(got, synced{f.Name(), string(content) == "new"})
		return orig(f)
	}
	if err := Write(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || filepath.Dir(got[0].name) != dir || !IsTemp(filepath.Base(got[0].name)) || got[0].targetIsNew ||
		got[1].name != dir || !got[1].targetIsNew {
		t.Fatalf("synced %+v; want the temporary file before the rename, then the directory %s after it", got, dir)
	}
}

// A failure at any step leaves the old content in place and no temporary file behind.
func TestWriteFailureKeepsOldContent(t *testing.T) {
	boom := errors.New("boom")
	cases := []struct {
		name  string
		fill  func(io.Writer) error
		fsync func(*os.File) error
	}{
		{"fill fails", func(w io.Writer) error { _, _ = w.Write([]byte("half")); return boom }, nil},
		{"file sync fails", nil, func(f *os.File) error { return boom }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f")
			if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.fsync != nil {
				orig := fsync
				t.Cleanup(func() { fsync = orig })
				fsync = tc.fsync
			}
			fill := tc.fill
			if fill == nil {
				fill = func(w io.Writer) error { _, err := w.Write([]byte("new")); return err }
			}
			if err := WriteFunc(path, 0o600, fill); !errors.Is(err, boom) {
				t.Fatalf("err %v, want %v", err, boom)
			}
			if got, _ := os.ReadFile(path); string(got) != "old" {
				t.Errorf("content %q after a failed write, want the old", got)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Errorf("directory holds %v, want only the file", entries)
			}
		})
	}
}

func TestWriteIntoUnwritableDirFails(t *testing.T) {
	if err := Write("/proc/ofsdn-atomicfile-test/x", []byte("x"), 0o600); err == nil {
		t.Fatal("want an error writing under /proc")
	}
}

func TestIsTemp(t *testing.T) {
	for name, want := range map[string]bool{
		".f.json.tmp-123": true, // Write's
		".tmp-123":        true, // an older writer's
		"f.json":          false,
		"tmp-1":           false,
		".hidden":         false,
	} {
		if got := IsTemp(name); got != want {
			t.Errorf("IsTemp(%q) = %v, want %v", name, got, want)
		}
	}
}
