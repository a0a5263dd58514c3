package image

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// DebPackage is a Debian package an image takes files from, and which of them.
type DebPackage struct {
	Name string
	// Keep selects files by their path in the package (no leading "/" or "./"): a pattern matches a path
	// (path.Match) or is a directory that holds it. Empty keeps every file but documentation (usr/share/
	// doc, man, info, locale, lintian, bug).
	Keep []string
	// MayBeEmpty lets Keep match nothing (a package of a library closure that ships no library).
	MayBeEmpty bool
}

// DebFetcher downloads Debian packages with the system's own apt (`apt-get download`: the candidate
// version of the machine's package lists, verified by apt) into a cache directory, once.
type DebFetcher struct {
	CacheDir string
	Log      func(format string, args ...any)
	updated  bool
}

// droppedDirs are never kept when DebPackage.Keep is empty.
var droppedDirs = []string{"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian", "usr/share/bug"}

// Fetch returns the paths of the packages' .debs, candidate versions (what apt would install),
// downloading those the cache does not hold yet, and the versions.
func (f *DebFetcher) Fetch(ctx context.Context, names []string) (debs, versions map[string]string, err error) {
	cands, err := f.candidates(ctx, names)
	if err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(f.CacheDir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("image: %w", err)
	}
	debs, versions = map[string]string{}, map[string]string{}
	var missing []string
	for _, name := range names {
		c := cands[name]
		debs[name], versions[name] = filepath.Join(f.CacheDir, c.fileName(name)), c.version
		if _, err := os.Stat(debs[name]); err != nil {
			missing = append(missing, name+"="+c.version)
		}
	}
	if len(missing) == 0 {
		return debs, versions, nil
	}
	cmd := exec.CommandContext(ctx, "apt-get", append([]string{"download", "-q"}, missing...)...)
	cmd.Dir = f.CacheDir
	if out, err := cmd.CombinedOutput(); err != nil {
		// Stale package lists (a fresh machine, a mirror that moved on) 404: refresh them once.
		if f.updated {
			return nil, nil, fmt.Errorf("image: apt-get download %s: %w\n%s", strings.Join(missing, " "), err, out)
		}
		f.logf("apt-get download failed, updating the package lists once: %s", strings.TrimSpace(string(out)))
		f.updated = true
		if out, err := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); err != nil {
			return nil, nil, fmt.Errorf("image: apt-get update: %w\n%s", err, out)
		}
		return f.Fetch(ctx, names)
	}
	for _, name := range names {
		if _, err := os.Stat(debs[name]); err != nil {
			return nil, nil, fmt.Errorf("image: apt-get download %s made no %s: %w", name, filepath.Base(debs[name]), err)
		}
	}
	f.logf("downloaded %d Debian packages into %s", len(missing), f.CacheDir)
	return debs, versions, nil
}

func (f *DebFetcher) logf(format string, args ...any) {
	if f.Log != nil {
		f.Log(format, args...)
	}
}

type candidate struct{ version, arch string }

// fileName is what apt-get download names the package's file: name_version_arch.deb, the epoch's
// colon escaped.
func (c candidate) fileName(name string) string {
	return fmt.Sprintf("%s_%s_%s.deb", name, strings.ReplaceAll(c.version, ":", "%3a"), c.arch)
}

// candidates asks apt, in one call, which version of each package it would install, and for which
// architecture.
func (f *DebFetcher) candidates(ctx context.Context, names []string) (map[string]candidate, error) {
	out, err := exec.CommandContext(ctx, "apt-cache", append([]string{"show", "--no-all-versions"}, names...)...).Output()
	if err != nil {
		return nil, fmt.Errorf("image: apt-cache show %s: %w (are they Debian package names?)", strings.Join(names, " "), err)
	}
	cands := map[string]candidate{}
	for _, stanza := range strings.Split(string(out), "\n\n") {
		var pkg string
		var c candidate
		for _, line := range strings.Split(stanza, "\n") {
			if v, ok := strings.CutPrefix(line, "Package: "); ok {
				pkg = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "Version: "); ok {
				c.version = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "Architecture: "); ok {
				c.arch = strings.TrimSpace(v)
			}
		}
		if _, seen := cands[pkg]; pkg != "" && !seen && c.version != "" && c.arch != "" {
			cands[pkg] = c
		}
	}
	for _, name := range names {
		if _, ok := cands[name]; !ok {
			return nil, fmt.Errorf("image: apt-cache show has no candidate for %s", name)
		}
	}
	return cands, nil
}

// DebianFiles fetches the packages and returns the files each keeps, as one layer's entries (parent
// directories included, each path once), and the version of every package. Packages must not ship
// different files at one path.
func DebianFiles(ctx context.Context, f *DebFetcher, pkgs []DebPackage) ([]File, map[string]string, error) {
	names := make([]string, len(pkgs))
	for i, p := range pkgs {
		names[i] = p.Name
	}
	debs, versions, err := f.Fetch(ctx, names)
	if err != nil {
		return nil, nil, err
	}
	byPath := map[string]File{}
	for _, p := range pkgs {
		files, err := debFiles(ctx, debs[p.Name], p)
		if err != nil {
			return nil, nil, err
		}
		for _, file := range files {
			if old, dup := byPath[file.Path]; dup {
				if old.Type == tar.TypeDir && file.Type == tar.TypeDir {
					continue
				}
				if old.Type != file.Type || !bytes.Equal(old.Data, file.Data) || old.Link != file.Link {
					return nil, nil, fmt.Errorf("image: %s ships %s, which another package ships differently", p.Name, file.Path)
				}
				continue
			}
			byPath[file.Path] = file
		}
	}
	// Every kept file's directories, as a package would have made them.
	for p := range byPath {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = File{Path: d, Type: tar.TypeDir, Mode: 0o755}
			}
		}
	}
	out := make([]File, 0, len(byPath))
	for _, file := range byPath {
		out = append(out, file)
	}
	slices.SortFunc(out, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return out, versions, nil
}

// debFiles reads a .deb's file system tree (dpkg-deb --fsys-tarfile, Debian's own reader) and returns
// the entries p keeps.
func debFiles(ctx context.Context, deb string, p DebPackage) ([]File, error) {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("image: dpkg-deb %s: %w", deb, err)
	}
	files, readErr := readDebTar(tar.NewReader(stdout), p)
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("image: dpkg-deb --fsys-tarfile %s: %w: %s", filepath.Base(deb), err, strings.TrimSpace(stderr.String()))
	}
	if readErr != nil {
		return nil, fmt.Errorf("image: %s: %w", filepath.Base(deb), readErr)
	}
	return files, nil
}

func readDebTar(tr *tar.Reader, p DebPackage) ([]File, error) {
	var files []File
	kept := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		name := strings.TrimSuffix(strings.TrimPrefix(path.Clean("/"+hdr.Name), "/"), "/")
		if name == "" || !keeps(p, name, hdr.Typeflag == tar.TypeDir) {
			continue
		}
		f := File{Path: name, Mode: hdr.Mode & 0o7777}
		switch hdr.Typeflag {
		case tar.TypeDir:
			f.Type = tar.TypeDir
		case tar.TypeReg:
			f.Type = tar.TypeReg
			if f.Data, err = io.ReadAll(tr); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
		case tar.TypeSymlink:
			f.Type, f.Link = tar.TypeSymlink, hdr.Linkname
		case tar.TypeLink:
			target := strings.TrimPrefix(path.Clean("/"+hdr.Linkname), "/")
			if !kept[target] {
				return nil, fmt.Errorf("%s is a hard link to %s, which the image does not keep", name, target)
			}
			f.Type, f.Link = tar.TypeLink, target
		default:
			continue // devices and fifos have no place in an image
		}
		kept[name] = true
		files = append(files, f)
	}
	if len(files) == 0 && !p.MayBeEmpty {
		return nil, fmt.Errorf("package %s: nothing matches %v", p.Name, p.Keep)
	}
	return files, nil
}

// keeps says whether the image takes the package's entry at name. Directories are kept only when they
// lead to a kept file (DebianFiles adds them), so with Keep set only the chosen files come along.
func keeps(p DebPackage, name string, dir bool) bool {
	if len(p.Keep) == 0 {
		for _, d := range droppedDirs {
			if name == d || strings.HasPrefix(name, d+"/") {
				return false
			}
		}
		return true
	}
	if dir {
		return false
	}
	for _, k := range p.Keep {
		if ok, _ := path.Match(k, name); ok || strings.HasPrefix(name, strings.TrimSuffix(k, "/")+"/") {
			return true
		}
	}
	return false
}

// libraryDirs are where the dynamic loader of Debian's glibc looks without an ld.so.cache (its trusted
// directories), in its order.
var libraryDirs = []string{"lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "usr/lib64", "lib", "usr/lib",
	"lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu"}

// CheckLinked verifies that every ELF executable and library among files finds, inside files, its
// program interpreter and every library it needs (DT_NEEDED, through RUNPATH or the loader's
// directories, following symbolic links). The error names each missing piece, so an image spec missing
// a package fails at build time, not when a container starts.
func CheckLinked(files []File) error {
	byPath := map[string]File{}
	for _, f := range files {
		byPath[f.Path] = f
	}
	// resolve follows symbolic links (absolute ones from the image's root) to a regular file.
	resolve := func(p string) (File, bool) {
		for range 16 {
			f, ok := byPath[p]
			if !ok {
				return File{}, false
			}
			switch f.Type {
			case tar.TypeSymlink:
				if strings.HasPrefix(f.Link, "/") {
					p = strings.TrimPrefix(path.Clean(f.Link), "/")
				} else {
					p = strings.TrimPrefix(path.Clean("/"+path.Join(path.Dir(p), f.Link)), "/")
				}
			case tar.TypeLink:
				p = f.Link
			default:
				return f, true
			}
		}
		return File{}, false
	}
	var missing []string
	for _, f := range files {
		if f.Type != tar.TypeReg || len(f.Data) < 4 || string(f.Data[:4]) != elf.ELFMAG {
			continue
		}
		ef, err := elf.NewFile(bytes.NewReader(f.Data))
		if err != nil {
			continue // not an object the loader would read either
		}
		for _, prog := range ef.Progs {
			if prog.Type != elf.PT_INTERP {
				continue
			}
			b, err := io.ReadAll(prog.Open())
			if err != nil {
				return fmt.Errorf("image: %s: %w", f.Path, err)
			}
			interp := strings.TrimPrefix(strings.TrimRight(string(b), "\x00"), "/")
			if _, ok := resolve(interp); !ok {
				missing = append(missing, fmt.Sprintf("%s: interpreter /%s", f.Path, interp))
			}
		}
		needed, _ := ef.ImportedLibraries()
		runpath, _ := ef.DynString(elf.DT_RUNPATH)
		rpath, _ := ef.DynString(elf.DT_RPATH)
		ef.Close()
		var dirs []string
		for _, rp := range append(runpath, rpath...) {
			for _, d := range strings.Split(rp, ":") {
				d = strings.ReplaceAll(d, "$ORIGIN", "/"+path.Dir(f.Path))
				dirs = append(dirs, strings.TrimPrefix(path.Clean(d), "/"))
			}
		}
		dirs = append(dirs, libraryDirs...)
		for _, lib := range needed {
			found := false
			for _, d := range dirs {
				if _, ok := resolve(path.Join(d, lib)); ok {
					found = true
					break
				}
			}
			if !found {
				missing = append(missing, fmt.Sprintf("%s: library %s", f.Path, lib))
			}
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("image: dynamic linking would fail (add the packages that ship these):\n  %s", strings.Join(slices.Compact(missing), "\n  "))
	}
	return nil
}

// LibraryDirs are the globs that keep a library package's shared objects (and the data glibc loads
// from there, e.g. gconv modules) and nothing else.
var LibraryDirs = []string{"lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "lib/aarch64-linux-gnu",
	"usr/lib/aarch64-linux-gnu", "lib/ld-linux-aarch64.so.1"}

// LibraryClosure returns roots and every package they need, transitively (Depends and Pre-Depends in
// apt's metadata, the first of each set of alternatives), that is a shared library package: named
// lib*, or listed in also (zlib1g, bind9-libs: libraries whose names say otherwise). Programs and
// scripts the libraries name (debconf, perl, ...) stay out; CheckLinked proves nothing needed was left.
func LibraryClosure(ctx context.Context, roots []string, also ...string) ([]string, error) {
	isLib := func(name string) bool { return strings.HasPrefix(name, "lib") || slices.Contains(also, name) }
	seen := map[string]bool{}
	level := slices.Clone(roots)
	var out []string
	for len(level) > 0 { // one apt-cache call per level: each costs half a second
		var fresh []string
		for _, p := range level {
			if !seen[p] {
				seen[p] = true
				fresh = append(fresh, p)
			}
		}
		if len(fresh) == 0 {
			break
		}
		out = append(out, fresh...)
		deps, err := aptDepends(ctx, fresh)
		if err != nil {
			return nil, err
		}
		level = nil
		for _, d := range deps {
			if isLib(d) && !seen[d] {
				level = append(level, d)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// aptDepends lists packages' Depends and Pre-Depends as apt-cache prints them: "  Depends: x",
// "  PreDepends: x", " |Depends: x" (an alternative: the next line is its other choice, skipped) and
// virtual packages "<x>", which are followed by the real packages providing them (the first is taken).
func aptDepends(ctx context.Context, names []string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "apt-cache", append([]string{"depends", "--no-recommends", "--no-suggests", "--no-conflicts",
		"--no-breaks", "--no-replaces", "--no-enhances"}, names...)...).Output()
	if err != nil {
		return nil, fmt.Errorf("image: apt-cache depends %s: %w", strings.Join(names, " "), err)
	}
	return parseAptDepends(string(out)), nil
}

func parseAptDepends(out string) []string {
	var deps []string
	skipNext, wantProvider := false, false
	for _, line := range strings.Split(out, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || !strings.HasPrefix(line, " ") { // the next package's name
			skipNext, wantProvider = false, false
			continue
		}
		if strings.HasPrefix(line, "    ") { // a provider of the virtual package above
			if wantProvider {
				deps = append(deps, trimmed)
				wantProvider = false
			}
			continue
		}
		wantProvider = false
		alt := strings.HasPrefix(trimmed, "|")
		kind, dep, ok := strings.Cut(strings.TrimPrefix(trimmed, "|"), ": ")
		if !ok || (kind != "Depends" && kind != "PreDepends") {
			skipNext = false
			continue
		}
		if skipNext {
			skipNext = alt
			continue
		}
		skipNext = alt
		if strings.HasPrefix(dep, "<") {
			wantProvider = true
			continue
		}
		deps = append(deps, dep)
	}
	return deps
}
