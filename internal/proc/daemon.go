package proc

import (
	"context"
	"fmt"
	"os/exec"
	"syscall"
	"time"
)

// Daemon is a process a harness started in a process group of its own, so that stopping it reaches
// whatever it forked, and that dies with the harness (Pdeathsig: a test binary killed with SIGKILL takes
// its daemons along; the sweeps catch the rest). It is reaped as soon as it exits.
type Daemon struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // the exit status, valid once done is closed
}

// Start starts cmd as a Daemon. The caller sets up everything else about cmd (arguments, directory,
// output) first.
func Start(cmd *exec.Cmd) (*Daemon, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid, cmd.SysProcAttr.Pdeathsig = true, syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	d := &Daemon{cmd: cmd, done: make(chan struct{})}
	go func() {
		d.err = cmd.Wait()
		close(d.done)
	}()
	return d, nil
}

// PID is the daemon's process ID (and its process group's).
func (d *Daemon) PID() int { return d.cmd.Process.Pid }

// Done is closed once the daemon has exited and been reaped.
func (d *Daemon) Done() <-chan struct{} { return d.done }

// Exited reports whether the daemon has exited, and how.
func (d *Daemon) Exited() (bool, error) {
	select {
	case <-d.done:
		return true, d.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the daemon's process group and SIGKILL after grace, then waits until the daemon
// is reaped and nothing of its group is left. It is idempotent.
func (d *Daemon) Stop(grace time.Duration) {
	pgid := d.PID()
	_ = syscall.Kill(-pgid, syscall.SIGCONT) // a paused (SIGSTOP) daemon handles SIGTERM only once resumed
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(grace):
	}
	d.Kill()
}

// Kill sends SIGKILL to the daemon's process group, as a crash would, and waits until the daemon is
// reaped and nothing of its group is left (even a leader that exited may have left children).
func (d *Daemon) Kill() {
	pgid := d.PID()
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-d.done
	_ = Until(context.Background(), 5*time.Second, func() bool { return syscall.Kill(-pgid, 0) != nil })
}
