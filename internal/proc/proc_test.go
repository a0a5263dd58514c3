package proc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestAliveAndStartTime(t *testing.T) {
	if !Alive(os.Getpid()) {
		t.Fatal("this process is not alive")
	}
	for _, pid := range []int{0, -1} {
		if Alive(pid) {
			t.Errorf("Alive(%d)", pid)
		}
	}
	s1, err := StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s2, _ := StartTime(os.Getpid()); s1 != s2 || s1 == 0 {
		t.Errorf("start time %d then %d", s1, s2)
	}
	if parent, _ := StartTime(os.Getppid()); parent > s1 {
		t.Errorf("the parent started (%d) after its child (%d)", parent, s1)
	}

	// An exited child that is not reaped yet is a zombie: gone for Alive. Once reaped, its PID is free.
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	zombie := func() bool { state, _, err := stat(pid); return err == nil && state == "Z" }
	if err := Until(context.Background(), time.Minute, zombie); err != nil {
		t.Fatalf("child %d never became a zombie: %v", pid, err)
	}
	if Alive(pid) {
		t.Errorf("a zombie counts as alive")
	}
	_ = cmd.Wait()
	if Alive(pid) {
		t.Skipf("pid %d was reused at once", pid)
	}
	if _, err := StartTime(pid); err == nil {
		t.Errorf("start time of a reaped process")
	}
}

func TestReadPIDFileAndOwner(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		content string // "" = no file
		want    int
	}{{"", 0}, {"1234\n", 1234}, {" 77 ", 77}, {"1", 0}, {"0", 0}, {"-5", 0}, {"12a", 0}, {"\n", 0}} {
		path := filepath.Join(dir, "missing.pid")
		if tc.content != "" {
			path = filepath.Join(dir, fmt.Sprintf("%q.pid", tc.content))
			if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if got := ReadPIDFile(path); got != tc.want {
			t.Errorf("ReadPIDFile(%q) = %d, want %d", tc.content, got, tc.want)
		}
	}

	for _, tc := range []struct {
		name   string
		pid    int
		wantOK bool
	}{
		{"ofsdn-t-123-4", 123, true}, {"ofsdn-t-123", 123, true}, {"ofsdn-t-x-4", 0, false},
		{"ofsdn-t--4", 0, false}, {"other-123-4", 0, false}, {"ofsdn-t-0-1", 0, false},
	} {
		pid, ok := OwnerPID(tc.name, "ofsdn-t-")
		if ok != tc.wantOK || ok && pid != tc.pid {
			t.Errorf("OwnerPID(%q) = %d, %v; want %d, %v", tc.name, pid, ok, tc.pid, tc.wantOK)
		}
	}
	if !OwnerAlive("ofsdn-t-"+strconv.Itoa(os.Getpid())+"-1", "ofsdn-t-") {
		t.Errorf("this process does not own what its PID names")
	}
	if OwnerAlive("ofsdn-t-x-1", "ofsdn-t-") {
		t.Errorf("a name without a PID has a live owner")
	}
}

func TestPollAndUntil(t *testing.T) {
	ctx := context.Background()
	n := 0
	if err := Poll(ctx, time.Millisecond, func() (bool, error) { n++; return n == 3, nil }); err != nil || n != 3 {
		t.Errorf("Poll: %v after %d tests, want nil after 3", err, n)
	}
	boom := errors.New("boom")
	if err := Poll(ctx, time.Millisecond, func() (bool, error) { return false, boom }); !errors.Is(err, boom) {
		t.Errorf("Poll: %v, want the condition's error", err)
	}
	err := Until(ctx, time.Millisecond, func() bool { return false })
	if !errors.Is(err, errTimeout) || !strings.Contains(err.Error(), "1ms") {
		t.Errorf("Until: %v, want a timeout that names the bound", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := Until(cctx, 0, func() bool { return false }); !errors.Is(err, context.Canceled) {
		t.Errorf("Until on a cancelled context: %v", err)
	}
	if err := Until(cctx, 0, func() bool { return true }); err != nil {
		t.Errorf("a condition that holds at once still failed: %v", err)
	}
}

func TestTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	var b strings.Builder
	for i := range 100_000 { // > 64 KiB: Tail reads only the end
		fmt.Fprintf(&b, "line %d\n", i)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, want := Tail(path, 3), "line 99997\nline 99998\nline 99999"; got != want {
		t.Errorf("Tail = %q, want %q", got, want)
	}
	if got := Tail(filepath.Join(t.TempDir(), "none"), 3); !strings.Contains(got, "no log") {
		t.Errorf("Tail of a missing file = %q", got)
	}
}

// A daemon's group goes with it: a child it forked is killed by Stop, and Stop waits for both.
func TestDaemonStopReachesTheGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	// The shell ignores SIGTERM, so only the SIGKILL after the grace period ends it; its child sleeps.
	d, err := Start(exec.Command("sh", "-c", `trap "" TERM; sleep 600 & echo $! > `+pidFile+`; wait`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Kill)
	var child int
	Eventually(t, time.Minute, "the daemon's child", func() bool { child = ReadPIDFile(pidFile); return child > 0 })
	if exited, _ := d.Exited(); exited {
		t.Fatal("daemon exited by itself")
	}
	d.Stop(100 * time.Millisecond)
	if exited, err := d.Exited(); !exited || err == nil {
		t.Errorf("after Stop: exited %v, %v; want killed", exited, err)
	}
	if Alive(child) {
		t.Errorf("the daemon's child %d survived Stop", child)
	}
	if syscall.Kill(-d.PID(), 0) == nil {
		t.Errorf("process group %d not empty after Stop", d.PID())
	}
	d.Stop(time.Millisecond) // idempotent
}
