// Package version says which ofsdn a binary is. Image builds (internal/image) stamp Version and Revision
// with the linker's -X; other builds fall back to the VCS data the go command embeds.
package version

import "runtime/debug"

// Set with -ldflags "-X github.com/ofsdn/ofsdn/internal/version.Version=v1.2.3 -X ...Revision=<sha>".
var (
	Version  string
	Revision string
)

// Get returns the version and the commit it was built from ("" when neither was stamped nor embedded).
func Get() (version, revision string) {
	version, revision = Version, Revision
	if revision == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			modified := false
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					revision = s.Value
				case "vcs.modified":
					modified = s.Value == "true"
				}
			}
			if revision != "" && modified {
				revision += "-dirty"
			}
		}
	}
	if version == "" {
		version = "devel"
	}
	return version, revision
}

// String is "<version> (<revision>)", for --version and start-up logs.
func String() string {
	v, r := Get()
	if r == "" {
		return v
	}
	return v + " (" + r + ")"
}
