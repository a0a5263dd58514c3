package image

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// BuildInfo is what the image says about itself: its labels, the version stamped into the binaries,
// and the time every file and the config carry.
type BuildInfo struct {
	Version  string    // git describe: the nearest v* tag, else the short commit; "-dirty" with local changes
	Revision string    // the full commit
	Created  time.Time // the commit's time, never the clock's
	Dirty    bool      // the work tree differed from the commit
	Source   string
	Arch     string
}

// GitInfo reads version, revision and commit time of the checkout at root.
func GitInfo(ctx context.Context, root string) (BuildInfo, error) {
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", append([]string{"-C", root}, args...)...)
		out, err := cmd.Output()
		if err != nil {
			var stderr string
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = strings.TrimSpace(string(ee.Stderr))
			}
			return "", fmt.Errorf("image: git %s: %w %s", strings.Join(args, " "), err, stderr)
		}
		return strings.TrimSpace(string(out)), nil
	}
	var info BuildInfo
	var err error
	if info.Revision, err = git("rev-parse", "HEAD"); err != nil {
		return info, err
	}
	if info.Version, err = git("describe", "--tags", "--always", "--dirty", "--match", "v[0-9]*"); err != nil {
		return info, err
	}
	info.Dirty = strings.HasSuffix(info.Version, "-dirty")
	ct, err := git("log", "-1", "--format=%ct", "HEAD")
	if err != nil {
		return info, err
	}
	secs, err := strconv.ParseInt(ct, 10, 64)
	if err != nil {
		return info, fmt.Errorf("image: commit time %q: %w", ct, err)
	}
	info.Created = time.Unix(secs, 0).UTC()
	return info, nil
}

// sourceDateEpoch reads SOURCE_DATE_EPOCH (reproducible-builds.org), the usual way to pin a build's time.
func sourceDateEpoch() (time.Time, bool, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return time.Time{}, false, nil
	}
	secs, err := strconv.ParseInt(v, 10, 64)
	if err != nil || secs < 0 {
		return time.Time{}, false, fmt.Errorf("image: SOURCE_DATE_EPOCH=%q is not a count of seconds since 1970", v)
	}
	return time.Unix(secs, 0).UTC(), true, nil
}
