package ofswitch

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ofsdn/ofsdn/flows/openflow"
)

const (
	readBufSize  = 1 << 17 // a multipart chunk is at most 64 KiB; room for two
	writeBufSize = 1 << 18 // large writes keep the switch's socket full during big bundles
)

// conn is one established connection (hello and features done), its goroutines and the requests
// waiting on it. It dies once; the session then makes a new one.
type conn struct {
	nc   net.Conn
	s    *Session
	born time.Time

	wsem chan struct{} // one writer at a time; a channel so that waiting honours contexts
	w    *bufio.Writer

	mu      sync.Mutex
	waiters map[uint32]*waiter // single-xid requests
	ranges  []*waiter          // bundles and sends: a contiguous range of xids each

	lastRecv atomic.Int64 // nanoseconds since born of the last message read
	pings    chan []byte  // echo requests to answer: the reader never blocks on writing

	dead      chan struct{}
	deathOnce sync.Once
	err       error // why it died; written before dead is closed
}

func newConn(s *Session, nc net.Conn) *conn {
	c := &conn{
		nc:      nc,
		s:       s,
		born:    time.Now(),
		wsem:    make(chan struct{}, 1),
		w:       bufio.NewWriterSize(nc, writeBufSize),
		waiters: map[uint32]*waiter{},
		pings:   make(chan []byte, 8),
		dead:    make(chan struct{}),
	}
	c.lastRecv.Store(0)
	return c
}

// start runs the connection's goroutines: reader, echo answerer and keepalive.
func (c *conn) start(r *bufio.Reader) {
	c.s.wg.Add(3)
	go func() { defer c.s.wg.Done(); c.readLoop(r) }()
	go func() { defer c.s.wg.Done(); c.answerEchoes() }()
	go func() { defer c.s.wg.Done(); c.keepalive() }()
}

// kill closes the connection once; requests waiting on it fail with an error wrapping ErrDisconnected.
func (c *conn) kill(err error) {
	c.deathOnce.Do(func() {
		c.err = err
		close(c.dead)
		_ = c.nc.Close()
		c.s.lost(c)
	})
}

func (c *conn) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// deathErr is the error of a request the connection's death cut short.
func (c *conn) deathErr() error {
	return fmt.Errorf("%w: %w", ErrDisconnected, c.err)
}

func (c *conn) readLoop(r *bufio.Reader) {
	log := c.s.log
	for {
		msg, err := openflow.ReadMessage(r)
		if err != nil {
			c.kill(fmt.Errorf("read: %w", err))
			return
		}
		c.lastRecv.Store(int64(time.Since(c.born)))
		switch msg[1] {
		case openflow.TypeEchoRequest:
			msg[1] = openflow.TypeEchoReply
			select {
			case c.pings <- msg:
			default: // a flood of echoes: answering some is enough
			}
		case openflow.TypeEchoReply:
			// keepalive: lastRecv is all it needs
		case openflow.TypePacketIn:
			if f := c.s.cfg.OnPacketIn; f != nil {
				f(msg)
			}
		case openflow.TypeError, openflow.TypeFeaturesReply, openflow.TypeMultipartReply, openflow.TypeBarrierReply, openflow.TypeExperimenter:
			if !c.deliver(openflow.XID(msg), msg) {
				log.V(4).Info("dropping a reply nobody waits for", "type", msg[1], "xid", openflow.XID(msg))
			}
		default:
			log.V(4).Info("ignoring unsolicited message", "type", msg[1], "len", len(msg))
		}
	}
}

func (c *conn) answerEchoes() {
	for {
		select {
		case <-c.dead:
			return
		case m := <-c.pings:
			if err := c.write(context.Background(), func(w *bufio.Writer) error { _, err := w.Write(m); return err }); err != nil {
				return // write killed the connection
			}
		}
	}
}

// keepalive sends an echo request when the switch has been quiet for an echo interval, and drops the
// connection when it has been quiet for three. Any message counts as a sign of life, so a switch busy
// committing a large bundle is not mistaken for a dead one while it still answers something.
func (c *conn) keepalive() {
	interval := c.s.cfg.EchoInterval
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-c.dead:
			return
		case <-t.C:
		}
		quiet := time.Since(c.born) - time.Duration(c.lastRecv.Load())
		switch {
		case quiet >= 3*interval:
			c.kill(fmt.Errorf("no message from the switch for %v (echo interval %v)", quiet.Round(time.Millisecond), interval))
			return
		case quiet >= interval:
			c.tryWrite(openflow.HeaderOnly(openflow.TypeEchoRequest, c.s.nextXID()))
		}
	}
}

// ---- writing ----

// write runs f on the buffered writer with the connection to itself, then flushes. A cancelled
// context interrupts a blocked write; since the stream may then hold half a message, any failed write
// kills the connection.
func (c *conn) write(ctx context.Context, f func(w *bufio.Writer) error) error {
	select {
	case c.wsem <- struct{}{}:
	case <-c.dead:
		return c.deathErr()
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.wsem }()
	return c.writeLocked(ctx, f)
}

// tryWrite writes b unless another write is in progress (which proves nothing about the peer).
func (c *conn) tryWrite(b []byte) {
	select {
	case c.wsem <- struct{}{}:
	default:
		return
	}
	defer func() { <-c.wsem }()
	_ = c.writeLocked(context.Background(), func(w *bufio.Writer) error { _, err := w.Write(b); return err })
}

func (c *conn) writeLocked(ctx context.Context, f func(w *bufio.Writer) error) error {
	if c.isDead() {
		return c.deathErr()
	}
	if err := ctx.Err(); err != nil {
		return err // nothing written: the connection stays good
	}
	var mu sync.Mutex
	finished := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			_ = c.nc.SetWriteDeadline(time.Unix(1, 0))
		}
	})
	err := f(c.w)
	if err == nil {
		err = c.w.Flush()
	}
	mu.Lock()
	finished = true
	mu.Unlock()
	if !stop() {
		_ = c.nc.SetWriteDeadline(time.Time{}) // the interruption came after the last byte
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (interrupted write: %v)", ctx.Err(), err)
		}
		err = fmt.Errorf("write: %w", err)
		c.kill(err)
		return fmt.Errorf("%w: %w", ErrDisconnected, err)
	}
	return nil
}

// ---- replies ----

// waiter collects the replies to one request (one xid, or a range of xids for bundles). Delivery never
// blocks the reader: the switch stops reading once its replies back up, so a reader waiting for a
// request that is still writing would deadlock both.
type waiter struct {
	lo, hi uint32
	mu     sync.Mutex
	q      [][]byte
	signal chan struct{}
}

func (w *waiter) push(msg []byte) {
	w.mu.Lock()
	w.q = append(w.q, msg)
	w.mu.Unlock()
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

func (w *waiter) pop() ([]byte, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.q) == 0 {
		return nil, false
	}
	m := w.q[0]
	w.q[0] = nil
	w.q = w.q[1:]
	return m, true
}

// covers reports whether xid is in [lo, hi], modulo 2^32 (xids wrap).
func (w *waiter) covers(xid uint32) bool { return xid-w.lo <= w.hi-w.lo }

// wait registers a waiter for the xids lo..hi.
func (c *conn) wait(lo, hi uint32) *waiter {
	w := &waiter{lo: lo, hi: hi, signal: make(chan struct{}, 1)}
	c.mu.Lock()
	if lo == hi {
		c.waiters[lo] = w
	} else {
		c.ranges = append(c.ranges, w)
	}
	c.mu.Unlock()
	return w
}

func (c *conn) unwait(w *waiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.lo == w.hi {
		if c.waiters[w.lo] == w {
			delete(c.waiters, w.lo)
		}
		return
	}
	for i, rw := range c.ranges {
		if rw == w {
			c.ranges = append(c.ranges[:i:i], c.ranges[i+1:]...)
			return
		}
	}
}

func (c *conn) deliver(xid uint32, msg []byte) bool {
	c.mu.Lock()
	w := c.waiters[xid]
	if w == nil {
		for _, rw := range c.ranges {
			if rw.covers(xid) {
				w = rw
				break
			}
		}
	}
	c.mu.Unlock()
	if w == nil {
		return false
	}
	w.push(msg)
	return true
}

// next returns the next reply for w.
func (c *conn) next(ctx context.Context, w *waiter) ([]byte, error) {
	for {
		if m, ok := w.pop(); ok {
			return m, nil
		}
		select {
		case <-w.signal:
		case <-c.dead:
			// The reader may have delivered a last reply just before the connection died.
			if m, ok := w.pop(); ok {
				return m, nil
			}
			return nil, c.deathErr()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// roundTrip sends one message (its xid already set) and returns the reply of type replyType; an
// OFPT_ERROR with the same xid becomes an *openflow.OFError.
func (c *conn) roundTrip(ctx context.Context, msg []byte, replyType uint8) ([]byte, error) {
	xid := openflow.XID(msg)
	w := c.wait(xid, xid)
	defer c.unwait(w)
	if err := c.write(ctx, func(bw *bufio.Writer) error { _, err := bw.Write(msg); return err }); err != nil {
		return nil, err
	}
	for {
		reply, err := c.next(ctx, w)
		if err != nil {
			return nil, err
		}
		switch reply[1] {
		case openflow.TypeError:
			return nil, openflow.ParseError(reply[openflow.HeaderLen:])
		case replyType:
			return reply, nil
		}
	}
}
