package image

import (
	"archive/tar"
	"debug/elf"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestParseAptDepends(t *testing.T) {
	out := `openvswitch-switch
  PreDepends: init-system-helpers
 |Depends: kmod
  Depends: <module-init-tools>
  Depends: netbase
  Depends: <python3:any>
    python3
  Depends: libbpf1
  Breaks: openvswitch-common
libc6
  Depends: libgcc-s1
 |Depends: <debconf-2.0>
    cdebconf
  Depends: debconf
`
	got := parseAptDepends(out)
	want := []string{"init-system-helpers", "kmod", "netbase", "python3", "libbpf1", "libgcc-s1", "cdebconf"}
	if !slices.Equal(got, want) {
		t.Errorf("parseAptDepends = %v, want %v (the first of each alternative, providers of virtual packages, no Breaks)", got, want)
	}
}

func TestKeeps(t *testing.T) {
	tests := []struct {
		keep []string
		name string
		dir  bool
		want bool
	}{
		{nil, "usr/bin/curl", false, true},
		{nil, "usr/share/doc/curl/copyright", false, false},
		{nil, "usr/share/man", true, false},
		{nil, "usr/share/openvswitch/vswitch.ovsschema", false, true},
		{[]string{"usr/bin/dig"}, "usr/bin/dig", false, true},
		{[]string{"usr/bin/dig"}, "usr/bin/delv", false, false},
		{[]string{"usr/bin/dig"}, "usr/bin", true, false}, // directories come with their kept files
		{LibraryDirs, "usr/lib/x86_64-linux-gnu/libcurl.so.4", false, true},
		{LibraryDirs, "usr/lib/x86_64-linux-gnu/gconv/UTF-16.so", false, true},
		{LibraryDirs, "usr/share/doc/libcurl4/changelog.gz", false, false},
		{[]string{"usr/sbin/ovs-*"}, "usr/sbin/ovs-vswitchd", false, true},
	}
	for _, tt := range tests {
		if got := keeps(DebPackage{Name: "p", Keep: tt.keep}, tt.name, tt.dir); got != tt.want {
			t.Errorf("keeps(%v, %s) = %v, want %v", tt.keep, tt.name, got, tt.want)
		}
	}
}

// A real dynamically linked program (this machine's /bin/true) with and without the libraries it
// names: CheckLinked accepts the complete tree, following symbolic links, and names what is missing.
func TestCheckLinked(t *testing.T) {
	data, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Skip("no /bin/true here:", err)
	}
	ef, err := elf.Open("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	needed, _ := ef.ImportedLibraries()
	ef.Close()
	if len(needed) == 0 {
		t.Skip("/bin/true is static here")
	}
	prog := File{Path: "bin/true", Type: tar.TypeReg, Mode: 0o755, Data: data}
	if err := CheckLinked([]File{prog}); err == nil || !strings.Contains(err.Error(), needed[0]) || !strings.Contains(err.Error(), "interpreter") {
		t.Errorf("a program without its libraries: %v, want an error naming %s and the interpreter", err, needed[0])
	}
	lib := []byte(elf.ELFMAG + "not really an object")
	files := []File{prog,
		// the interpreter through an absolute symbolic link, as libc6 ships it
		{Path: "lib64/ld-linux-x86-64.so.2", Type: tar.TypeSymlink, Link: "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"},
		{Path: "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", Type: tar.TypeReg, Data: lib},
		{Path: "lib/ld-linux-aarch64.so.1", Type: tar.TypeReg, Data: lib},
	}
	for _, n := range needed {
		// each library through a relative symbolic link to its versioned file
		files = append(files, File{Path: "usr/lib/x86_64-linux-gnu/" + n, Type: tar.TypeSymlink, Link: n + ".0.0"},
			File{Path: "usr/lib/x86_64-linux-gnu/" + n + ".0.0", Type: tar.TypeReg, Data: lib})
	}
	if err := CheckLinked(files); err != nil {
		t.Errorf("a complete tree: %v", err)
	}
}
