package testpod

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

// Connect answers as agnhost's `connect` does, which the upstream ClusterNetworkPolicy conformance suite
// runs in its pods through pods/exec: one connection attempt to addr over proto, bounded by timeout; on
// success nothing is written and the exit code is 0; otherwise one word on stderr and exit code 1:
// TIMEOUT (nothing answered: what a policy's drop looks like), REFUSED (a reset or an ICMP port
// unreachable), or OTHER with the error. TCP connects; UDP sends a datagram and waits for any answer;
// SCTP sends an INIT and waits for the INIT-ACK (user space, see sctp.go: the lab's kernel has no SCTP).
func Connect(ctx context.Context, proto, addr string, timeout time.Duration) (stderr string, code int) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var err error
	switch proto {
	case "tcp":
		var c net.Conn
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
		}
	case "udp":
		err = udpConnect(ctx, addr)
	case "sctp":
		_, err = ProbeSCTP(ctx, addr)
	default:
		return fmt.Sprintf("OTHER: unsupported protocol %q\n", proto), 1
	}
	var ne net.Error
	switch {
	case err == nil:
		return "", 0
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded):
		return "TIMEOUT\n", 1
	case errors.Is(err, syscall.ECONNREFUSED):
		return "REFUSED\n", 1
	}
	return fmt.Sprintf("OTHER: %v\n", err), 1
}

func udpConnect(ctx context.Context, addr string) error {
	c, err := (&net.Dialer{}).DialContext(ctx, "udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte("hostname\n")); err != nil {
		return err
	}
	buf := make([]byte, 1024)
	_, err = c.Read(buf)
	return err
}
