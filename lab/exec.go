package lab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cmdTimeout bounds every command the lab runs, on top of the caller's context.
const cmdTimeout = 30 * time.Second

// output runs a command (env nil: this process's environment) and returns its standard output; the
// error carries the command line and its standard error.
func output(ctx context.Context, env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	// A daemon that is killed while detaching could keep our pipes open; don't wait for it forever.
	cmd.WaitDelay = 2 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

func run(ctx context.Context, name string, args ...string) error {
	_, err := output(ctx, nil, name, args...)
	return err
}

func runAll(ctx context.Context, cmds [][]string) error {
	for _, c := range cmds {
		if err := run(ctx, c[0], c[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// InNetNS runs fn on an OS thread switched into the named network namespace (as created by
// "ip netns add"; "" means the caller's namespace). Sockets fn opens belong to that namespace for good,
// so a test can listen or dial "inside" a node, a host or a pod and use the connection afterwards from
// any goroutine. fn must not start goroutines that expect to be in the namespace.
func InNetNS(name string, fn func() error) error {
	if name == "" {
		return fn()
	}
	target, err := os.Open("/run/netns/" + name)
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	defer target.Close()
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("own netns: %w", err)
	}
	defer orig.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns %s: %w", name, err)
	}
	defer func() {
		// A thread that cannot get back stays locked, so the runtime ends it with the goroutine
		// instead of reusing it in the wrong namespace.
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return fn()
}
