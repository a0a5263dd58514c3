package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"
)

// TCPThroughput sends one TCP stream for d from a socket in namespace srcNS to a listener it opens on
// dst:port in namespace dstNS, and returns the MB/s (10^6 bytes) that arrived. It retries the connect
// for a few seconds (a userspace datapath drops the first packets to a neighbour it has not resolved).
func TCPThroughput(ctx context.Context, srcNS, dstNS string, dst netip.Addr, port uint16, d time.Duration) (float64, error) {
	var ln net.Listener
	if err := InNetNS(dstNS, func() (err error) { ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port)); return err }); err != nil {
		return 0, err
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		got <- n
	}()
	var c net.Conn
	err := InNetNS(srcNS, func() (err error) {
		deadline := time.Now().Add(5 * time.Second)
		var dialer net.Dialer
		for {
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			c, err = dialer.DialContext(dctx, "tcp", netip.AddrPortFrom(dst, port).String())
			cancel()
			if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
				return err
			}
		}
	})
	if err != nil {
		return 0, fmt.Errorf("connect %s: %w", dst, err)
	}
	buf := make([]byte, 64<<10)
	start := time.Now()
	_ = c.SetWriteDeadline(start.Add(d))
	var sent int64
	var werr error
	for time.Since(start) < d && ctx.Err() == nil {
		m, err := c.Write(buf)
		sent += int64(m)
		if err != nil {
			werr = err
			break
		}
	}
	_ = c.Close()
	var n int64
	select {
	case n = <-got:
	case <-time.After(30 * time.Second):
		return 0, fmt.Errorf("the receiver never finished (sent %d bytes)", sent)
	}
	if n <= 0 {
		return 0, fmt.Errorf("no data arrived at %s (sent %d bytes, write error %v)", dst, sent, werr)
	}
	return float64(n) / time.Since(start).Seconds() / 1e6, nil
}
