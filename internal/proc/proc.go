// Package proc is the test harnesses' one way to handle processes and to wait (internal/ovstest,
// lab/kubelab, lab, e2e/cluster and the tests and benchmarks on them): whether a PID still runs, when
// it started (so a recycled PID is not taken for its first owner), the PID a file or a name carries,
// daemons run in process groups of their own, the tail of their logs, and polling a condition until it
// holds.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Alive reports whether pid runs. A zombie (a process that exited and that its parent has not reaped
// yet) counts as gone: it holds no resources and does nothing any more.
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	state, _, err := stat(pid)
	return err == nil && state != "Z"
}

// StartTime returns when pid started, in clock ticks since boot (/proc/<pid>/stat field 22): a PID with
// another start time than the one recorded is another process.
func StartTime(pid int) (uint64, error) {
	_, start, err := stat(pid)
	return start, err
}

// stat reads a process's state and start time from /proc/<pid>/stat.
func stat(pid int) (state string, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, err
	}
	// The command name may hold spaces and parentheses: fields count from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return "", 0, fmt.Errorf("pid %d: malformed stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return "", 0, fmt.Errorf("pid %d: short stat", pid)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("pid %d: start time: %w", pid, err)
	}
	return f[0], start, nil
}

// ReadPIDFile returns the PID a pidfile holds, or 0 when it is missing, malformed or names init. It
// does not say whether that process runs: see Alive.
func ReadPIDFile(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0
	}
	return pid
}

// OwnerPID reads the PID from a name "<prefix><pid>-...", the way the harnesses name what a test
// process creates; ok is false for a name of another shape.
func OwnerPID(name, prefix string) (pid int, ok bool) {
	rest, found := strings.CutPrefix(name, prefix)
	if !found {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
	return pid, err == nil && pid > 0
}

// OwnerAlive reports whether the process a name "<prefix><pid>-..." names still runs: what it owns must
// not be swept.
func OwnerAlive(name, prefix string) bool {
	pid, ok := OwnerPID(name, prefix)
	return ok && Alive(pid)
}

// PollInterval is how often Until tests its condition.
const PollInterval = 50 * time.Millisecond

// Poll tests cond every interval, at once first, until it holds (nil), fails (its error), or ctx ends
// (an error wrapping ctx's cause).
func Poll(ctx context.Context, interval time.Duration, cond func() (bool, error)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
}

// errTimeout is the cause Until gives a wait that ran out of time.
var errTimeout = errors.New("time ran out")

// Until tests cond every PollInterval until it holds, timeout passes or ctx ends; timeout 0 waits for
// ctx alone.
func Until(ctx context.Context, timeout time.Duration, cond func() bool) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, timeout, fmt.Errorf("%w after %s", errTimeout, timeout))
		defer cancel()
	}
	return Poll(ctx, PollInterval, func() (bool, error) { return cond(), nil })
}

// WaitGone waits until pid no longer runs.
func WaitGone(pid int, timeout time.Duration) error {
	if err := Until(context.Background(), timeout, func() bool { return !Alive(pid) }); err != nil {
		return fmt.Errorf("process %d still runs: %w", pid, err)
	}
	return nil
}

// Eventually fails the test when cond does not hold within timeout; what names the awaited state in
// the failure.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := Until(context.Background(), timeout, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// Tail returns the last n lines of a log file (reading at most its last 64 KiB), or a note saying why
// there is none.
func Tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	const maxRead = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > maxRead {
		_, _ = f.Seek(-maxRead, io.SeekEnd)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
