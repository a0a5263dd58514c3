// Package ofswitch is ofsdn's OpenFlow 1.3 session to one bridge: connect to <rundir>/<bridge>.mgmt,
// negotiate 1.3, keep the connection alive with echoes, match replies to requests by xid, collect every
// chunk of multipart replies, apply atomic bundles, and reconnect with backoff and a replay hook.
//
// It exists because ofnet speaks only OpenFlow 1.5 (and reads only the first chunk of a flow dump). It
// connects actively to the bridge's management socket and never sets a controller in OVSDB: setting or
// removing a controller flushes every flow and group of the bridge (shared/LAB.md).
//
// The session is a transport: it moves complete OpenFlow messages as bytes. flows/ encodes and decodes
// them; FlowsSwitch adapts a Session to flows.Switch.
package ofswitch

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	of "antrea.io/libOpenflow/openflow13"
	"k8s.io/klog/v2"
)

// OpenFlow message types the session handles.
const (
	ofVersion13        = 4
	typeHello          = 0
	typeError          = 1
	typeEchoRequest    = 2
	typeEchoReply      = 3
	typeExperimenter   = 4
	typeFeaturesReq    = 5
	typeFeaturesReply  = 6
	typeMultipartReq   = 18
	typeMultipartReply = 19
	typeBarrierReq     = 20
	typeBarrierReply   = 21

	multipartFlow      = 1
	multipartGroupDesc = 7
	replyMore          = 1

	onfExperimenter  = 0x4f4e4600
	onfBundleControl = 2300
	onfBundleAdd     = 2301

	bundleOpenReply   = 1
	bundleCommitReply = 5

	headerLen = 8
	// MaxMessageLen is the largest OpenFlow message; a bundle-add needs 16 bytes of it.
	MaxMessageLen = 0xffff
	bundleAddLen  = 24
)

// Config configures a Session.
type Config struct {
	// Socket is the bridge's management socket, e.g. /var/run/openvswitch/br0.mgmt.
	Socket string
	// Bridge names the bridge in logs and errors.
	Bridge         string
	RequestTimeout time.Duration // default 30 s; bounds requests whose context has no deadline
	EchoInterval   time.Duration // default 5 s; a missed echo reply drops and re-establishes the connection
	ReconnectMin   time.Duration // default 50 ms
	ReconnectMax   time.Duration // default 5 s
	Logger         klog.Logger
}

func (c *Config) defaults() {
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 30 * time.Second
	}
	if c.EchoInterval == 0 {
		c.EchoInterval = 5 * time.Second
	}
	if c.ReconnectMin == 0 {
		c.ReconnectMin = 50 * time.Millisecond
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = 5 * time.Second
	}
	if c.Bridge == "" {
		c.Bridge = c.Socket
	}
}

// Session is one OpenFlow 1.3 connection to a bridge, re-established whenever it drops.
type Session struct {
	cfg Config
	log klog.Logger

	xid      atomic.Uint32
	bundleID atomic.Uint32

	mu        sync.Mutex
	conn      *conn         // nil while disconnected
	ready     chan struct{} // closed while connected
	closed    bool
	replay    func(ctx context.Context) error
	dpid      uint64
	stop      context.CancelFunc
	done      chan struct{}
	reconnect int
}

// conn is one established connection and the requests waiting on it.
type conn struct {
	nc      net.Conn
	wmu     sync.Mutex
	w       *bufio.Writer
	mu      sync.Mutex
	waiters map[uint32]*waiter
	ranges  []*waiter // bundle waiters cover a range of xids
	dead    chan struct{}
	err     error
}

// waiter receives the replies (and errors) to one request, or to a range of xids for a bundle.
type waiter struct {
	lo, hi uint32
	ch     chan []byte
	gone   chan struct{}
}

// Dial connects to the bridge and starts the session: the first connection must succeed within ctx;
// later losses are repaired in the background.
func Dial(ctx context.Context, cfg Config) (*Session, error) {
	cfg.defaults()
	log := cfg.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	s := &Session{cfg: cfg, log: log.WithName("ofswitch").WithValues("bridge", cfg.Bridge), ready: make(chan struct{}), done: make(chan struct{})}
	s.xid.Store(1 << 20)
	c, dpid, err := s.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", cfg.Bridge, err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.install(c, dpid)
	go s.run(runCtx, c)
	return s, nil
}

func (s *Session) install(c *conn, dpid uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conn, s.dpid = c, dpid
	close(s.ready)
}

// OnReconnect sets the hook run after every re-established connection (not the first): the place to
// replay flows into a ovs-vswitchd that restarted with an empty table. A failing hook is retried
// with backoff on the same connection.
func (s *Session) OnReconnect(f func(ctx context.Context) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replay = f
}

// Connected reports whether the session has a live connection now.
func (s *Session) Connected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn != nil
}

// DatapathID is the bridge's datapath ID from the last features reply.
func (s *Session) DatapathID() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dpid
}

// Reconnects counts how many times the session re-established its connection.
func (s *Session) Reconnects() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reconnect
}

// Close ends the session and its goroutines.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	c := s.conn
	s.mu.Unlock()
	s.stop()
	if c != nil {
		c.nc.Close()
	}
	<-s.done
	return nil
}

// connect dials the socket and does hello + features.
func (s *Session) connect(ctx context.Context) (*conn, uint64, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", s.cfg.Socket)
	if err != nil {
		return nil, 0, fmt.Errorf("connect %s: %w", s.cfg.Socket, err)
	}
	ok := false
	defer func() {
		if !ok {
			nc.Close()
		}
	}()
	if dl, has := ctx.Deadline(); has {
		_ = nc.SetDeadline(dl)
	} else {
		_ = nc.SetDeadline(time.Now().Add(s.cfg.RequestTimeout))
	}
	if err := writeMsg(nc, hello13, 1); err != nil {
		return nil, 0, fmt.Errorf("hello: %w", err)
	}
	r := bufio.NewReaderSize(nc, 1<<16)
	msg, err := readMsg(r)
	if err != nil {
		return nil, 0, fmt.Errorf("hello: %w", err)
	}
	if msg[1] != typeHello {
		return nil, 0, fmt.Errorf("hello: switch sent message type %d first", msg[1])
	}
	if !helloAllows13(msg) {
		return nil, 0, fmt.Errorf("hello: the bridge does not speak OpenFlow 1.3 (its hello offers version %d); set protocols=OpenFlow13 on it", msg[0])
	}
	if err := writeMsg(nc, of.NewFeaturesRequest(), 2); err != nil {
		return nil, 0, fmt.Errorf("features: %w", err)
	}
	var dpid uint64
	for {
		msg, err = readMsg(r)
		if err != nil {
			return nil, 0, fmt.Errorf("features: %w", err)
		}
		if msg[1] == typeFeaturesReply && len(msg) >= 16 {
			dpid = binary.BigEndian.Uint64(msg[8:])
			break
		}
		if msg[1] == typeError {
			return nil, 0, fmt.Errorf("features: %w", parseError(msg[headerLen:]))
		}
	}
	_ = nc.SetDeadline(time.Time{})
	c := &conn{nc: nc, w: bufio.NewWriterSize(nc, 1<<18), waiters: map[uint32]*waiter{}, dead: make(chan struct{})}
	go c.readLoop(r, s)
	ok = true
	return c, dpid, nil
}

// helloAllows13 reads the switch's hello: version 4 or higher in the header, and version 4 in the
// version bitmap when the switch sent one.
func helloAllows13(msg []byte) bool {
	if msg[0] < ofVersion13 {
		return false
	}
	body := msg[headerLen:]
	for len(body) >= 4 {
		typ, n := binary.BigEndian.Uint16(body), int(binary.BigEndian.Uint16(body[2:]))
		if n < 4 || n > len(body) {
			break
		}
		if typ == 1 && n >= 8 { // OFPHET_VERSIONBITMAP
			return binary.BigEndian.Uint32(body[4:])&(1<<ofVersion13) != 0
		}
		step := (n + 7) / 8 * 8
		if step > len(body) {
			break
		}
		body = body[step:]
	}
	return true
}

// hello13 offers exactly OpenFlow 1.3: the header's version and a version bitmap with only bit 4.
// (libOpenflow's common.NewHello encodes a bitmap OVS rejects as OFPHFC_INCOMPATIBLE.)
var hello13 = rawMsg{ofVersion13, typeHello, 0, 16, 0, 0, 0, 0, 0, 1, 0, 8, 0, 0, 0, 1 << ofVersion13}

type marshaler interface{ MarshalBinary() ([]byte, error) }

func writeMsg(w io.Writer, m marshaler, xid uint32) error {
	b, err := m.MarshalBinary()
	if err != nil {
		return err
	}
	if len(b) < headerLen {
		return errors.New("message shorter than a header")
	}
	binary.BigEndian.PutUint32(b[4:], xid)
	_, err = w.Write(b)
	return err
}

// readMsg reads one complete message; malformed lengths are errors, never panics.
func readMsg(r *bufio.Reader) ([]byte, error) {
	hdr, err := r.Peek(headerLen)
	if err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(hdr[2:]))
	if n < headerLen {
		return nil, fmt.Errorf("message of length %d is shorter than its header", n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	return msg, nil
}

// run keeps the session connected until Close.
func (s *Session) run(ctx context.Context, c *conn) {
	defer close(s.done)
	for {
		s.keepalive(ctx, c)
		<-c.dead
		s.mu.Lock()
		s.conn = nil
		s.ready = make(chan struct{})
		closed := s.closed
		s.mu.Unlock()
		if closed || ctx.Err() != nil {
			return
		}
		s.log.Info("OpenFlow connection lost; reconnecting", "err", c.err)
		var dpid uint64
		c, dpid = s.redial(ctx)
		if c == nil {
			return
		}
		s.mu.Lock()
		s.reconnect++
		replay := s.replay
		s.mu.Unlock()
		s.install(c, dpid)
		s.log.Info("OpenFlow connection re-established", "datapathID", fmt.Sprintf("%016x", dpid))
		if replay != nil {
			s.runReplay(ctx, c, replay)
		}
	}
}

func (s *Session) redial(ctx context.Context) (*conn, uint64) {
	backoff := s.cfg.ReconnectMin
	for {
		attempt, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
		c, dpid, err := s.connect(attempt)
		cancel()
		if err == nil {
			return c, dpid
		}
		s.log.V(2).Info("reconnect failed", "err", err, "retryIn", backoff)
		select {
		case <-ctx.Done():
			return nil, 0
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, s.cfg.ReconnectMax)
	}
}

func (s *Session) runReplay(ctx context.Context, c *conn, replay func(context.Context) error) {
	backoff := s.cfg.ReconnectMin
	for {
		err := replay(ctx)
		if err == nil {
			return
		}
		s.log.Error(err, "replay after reconnect failed; retrying", "retryIn", backoff)
		select {
		case <-ctx.Done():
			return
		case <-c.dead:
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, s.cfg.ReconnectMax)
	}
}

// keepalive sends echo requests in the background; a missing reply kills the connection.
func (s *Session) keepalive(ctx context.Context, c *conn) {
	go func() {
		t := time.NewTicker(s.cfg.EchoInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				c.kill(ErrClosed)
				return
			case <-c.dead:
				return
			case <-t.C:
				echoCtx, cancel := context.WithTimeout(ctx, s.cfg.EchoInterval)
				_, err := c.request(echoCtx, s.nextXID(), of.NewEchoRequest(), typeEchoReply)
				cancel()
				if err != nil && ctx.Err() == nil {
					c.kill(fmt.Errorf("echo: %w", err))
					return
				}
			}
		}
	}()
}

func (s *Session) nextXID() uint32 { return s.xid.Add(1) }

// current waits for a live connection.
func (s *Session) current(ctx context.Context) (*conn, error) {
	for {
		s.mu.Lock()
		c, ready, closed := s.conn, s.ready, s.closed
		s.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		if c != nil {
			return c, nil
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, fmt.Errorf("bridge %s: waiting for the OpenFlow connection: %w", s.cfg.Bridge, ctx.Err())
		}
	}
}

func (s *Session) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.cfg.RequestTimeout)
}

// ---- the connection's reader and request plumbing ----

func (c *conn) kill(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.dead:
		return
	default:
	}
	c.err = err
	close(c.dead)
	c.nc.Close()
}

func (c *conn) readLoop(r *bufio.Reader, s *Session) {
	for {
		msg, err := readMsg(r)
		if err != nil {
			c.kill(fmt.Errorf("%w: %v", ErrDisconnected, err))
			return
		}
		switch msg[1] {
		case typeEchoRequest:
			reply := append([]byte(nil), msg...)
			reply[1] = typeEchoReply
			if err := c.write(func(w *bufio.Writer) error { _, err := w.Write(reply); return err }); err != nil {
				c.kill(err)
				return
			}
			continue
		case typeError, typeEchoReply, typeFeaturesReply, typeMultipartReply, typeBarrierReply, typeExperimenter:
			c.deliver(binary.BigEndian.Uint32(msg[4:]), msg)
		default:
			s.log.V(4).Info("ignoring unsolicited message", "type", msg[1])
		}
	}
}

func (c *conn) deliver(xid uint32, msg []byte) {
	c.mu.Lock()
	w := c.waiters[xid]
	if w == nil {
		for _, rw := range c.ranges {
			if xid >= rw.lo && xid <= rw.hi {
				w = rw
				break
			}
		}
	}
	c.mu.Unlock()
	if w == nil {
		return
	}
	select {
	case w.ch <- msg:
	case <-w.gone:
	case <-c.dead:
	}
}

func (c *conn) wait(lo, hi uint32, buffer int) *waiter {
	w := &waiter{lo: lo, hi: hi, ch: make(chan []byte, buffer), gone: make(chan struct{})}
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
	if c.waiters[w.lo] == w {
		delete(c.waiters, w.lo)
	}
	for i, rw := range c.ranges {
		if rw == w {
			c.ranges = append(c.ranges[:i:i], c.ranges[i+1:]...)
			break
		}
	}
	c.mu.Unlock()
	close(w.gone)
}

func (c *conn) write(f func(w *bufio.Writer) error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := f(c.w); err != nil {
		return fmt.Errorf("%w: write: %v", ErrDisconnected, err)
	}
	if err := c.w.Flush(); err != nil {
		return fmt.Errorf("%w: write: %v", ErrDisconnected, err)
	}
	return nil
}

// next waits for the next message to w.
func (c *conn) next(ctx context.Context, w *waiter) ([]byte, error) {
	select {
	case m := <-w.ch:
		return m, nil
	case <-c.dead:
		// A reply may have been delivered just before the connection died.
		select {
		case m := <-w.ch:
			return m, nil
		default:
		}
		return nil, fmt.Errorf("%w (%v)", ErrDisconnected, c.err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// request sends one message and waits for its reply of the given type (or an error).
func (c *conn) request(ctx context.Context, xid uint32, m marshaler, replyType uint8) ([]byte, error) {
	w := c.wait(xid, xid, 4)
	defer c.unwait(w)
	if err := c.write(func(bw *bufio.Writer) error { return writeMsg(bw, m, xid) }); err != nil {
		c.kill(err)
		return nil, err
	}
	for {
		msg, err := c.next(ctx, w)
		if err != nil {
			return nil, err
		}
		switch msg[1] {
		case typeError:
			return nil, parseError(msg[headerLen:])
		case replyType:
			return msg, nil
		}
	}
}

// ---- requests ----

// Barrier waits until the switch has processed everything sent before it.
func (s *Session) Barrier(ctx context.Context) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	c, err := s.current(ctx)
	if err != nil {
		return err
	}
	h := of.NewOfp13Header()
	h.Type = typeBarrierReq
	_, err = c.request(ctx, s.nextXID(), &h, typeBarrierReply)
	if err != nil {
		return fmt.Errorf("bridge %s: barrier: %w", s.cfg.Bridge, err)
	}
	return nil
}

// Bundle applies complete OpenFlow 1.3 messages atomically (ONF bundle extension, flags ATOMIC and
// ORDERED): the switch installs all of them or none. Everything is written without waiting per message;
// the commit's reply says whether it took. A failure returns *BundleError naming the message blamed.
func (s *Session) Bundle(ctx context.Context, msgs [][]byte) error {
	if len(msgs) == 0 {
		return nil
	}
	for i, m := range msgs {
		if len(m) < headerLen || int(binary.BigEndian.Uint16(m[2:])) != len(m) {
			return fmt.Errorf("bridge %s: bundle message %d: length field does not match its %d bytes", s.cfg.Bridge, i, len(m))
		}
		if len(m)+bundleAddLen-headerLen > MaxMessageLen {
			return fmt.Errorf("bridge %s: bundle message %d: %d bytes do not fit a bundle-add (at most %d)", s.cfg.Bridge, i, len(m), MaxMessageLen-(bundleAddLen-headerLen))
		}
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	c, err := s.current(ctx)
	if err != nil {
		return err
	}
	id := s.bundleID.Add(1)
	// xids: open, one per message, commit — contiguous, so one range waiter catches every reply.
	first := s.xid.Add(uint32(len(msgs)+2)) - uint32(len(msgs)+1)
	openXID, commitXID := first, first+uint32(len(msgs))+1
	w := c.wait(openXID, commitXID, 64)
	defer c.unwait(w)

	err = c.write(func(bw *bufio.Writer) error {
		if err := writeBundleControl(bw, id, of.OFPBCT_OPEN_REQUEST, openXID); err != nil {
			return err
		}
		var hdr [bundleAddLen]byte
		for i, m := range msgs {
			xid := openXID + 1 + uint32(i)
			binary.BigEndian.PutUint32(m[4:], xid) // the embedded message carries the bundle-add's xid
			hdr[0], hdr[1] = ofVersion13, typeExperimenter
			binary.BigEndian.PutUint16(hdr[2:], uint16(bundleAddLen+len(m)))
			binary.BigEndian.PutUint32(hdr[4:], xid)
			binary.BigEndian.PutUint32(hdr[8:], onfExperimenter)
			binary.BigEndian.PutUint32(hdr[12:], onfBundleAdd)
			binary.BigEndian.PutUint32(hdr[16:], id)
			binary.BigEndian.PutUint16(hdr[20:], 0)
			binary.BigEndian.PutUint16(hdr[22:], of.OFPBCT_ATOMIC|of.OFPBCT_ORDERED)
			if _, err := bw.Write(hdr[:]); err != nil {
				return err
			}
			if _, err := bw.Write(m); err != nil {
				return err
			}
		}
		return writeBundleControl(bw, id, of.OFPBCT_COMMIT_REQUEST, commitXID)
	})
	if err != nil {
		c.kill(err)
		return fmt.Errorf("bridge %s: bundle: %w", s.cfg.Bridge, err)
	}
	var blamed *BundleError
	for {
		msg, err := c.next(ctx, w)
		if err != nil {
			return fmt.Errorf("bridge %s: bundle of %d messages: %w", s.cfg.Bridge, len(msgs), err)
		}
		xid := binary.BigEndian.Uint32(msg[4:])
		switch {
		case msg[1] == typeError:
			e := parseError(msg[headerLen:])
			switch {
			case xid == commitXID || xid == openXID:
				if blamed == nil {
					return &BundleError{Index: -1, Cause: e}
				}
				blamed.Other = append(blamed.Other, e)
				return blamed
			case blamed == nil:
				blamed = &BundleError{Index: int(xid - openXID - 1), Cause: e}
			default:
				blamed.Other = append(blamed.Other, e)
			}
		case xid == commitXID && isBundleReply(msg, bundleCommitReply):
			if blamed != nil { // cannot happen with ATOMIC, but never report success over an error
				return blamed
			}
			return nil
		}
	}
}

func writeBundleControl(w io.Writer, id uint32, typ uint16, xid uint32) error {
	return writeMsg(w, of.NewBundleControl(&of.BundleControl{BundleID: id, Type: typ, Flags: of.OFPBCT_ATOMIC | of.OFPBCT_ORDERED}), xid)
}

func isBundleReply(msg []byte, typ uint16) bool {
	return len(msg) >= 22 && msg[1] == typeExperimenter && binary.BigEndian.Uint32(msg[8:]) == onfExperimenter &&
		binary.BigEndian.Uint32(msg[12:]) == onfBundleControl && binary.BigEndian.Uint16(msg[20:]) == typ
}

// Send writes messages outside any bundle, then a barrier; the first error the switch returns wins.
func (s *Session) Send(ctx context.Context, msgs [][]byte) error {
	if len(msgs) == 0 {
		return nil
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	c, err := s.current(ctx)
	if err != nil {
		return err
	}
	first := s.xid.Add(uint32(len(msgs)+1)) - uint32(len(msgs))
	barrier := first + uint32(len(msgs))
	w := c.wait(first, barrier, 64)
	defer c.unwait(w)
	err = c.write(func(bw *bufio.Writer) error {
		for i, m := range msgs {
			binary.BigEndian.PutUint32(m[4:], first+uint32(i))
			if _, err := bw.Write(m); err != nil {
				return err
			}
		}
		h := of.NewOfp13Header()
		h.Type = typeBarrierReq
		return writeMsg(bw, &h, barrier)
	})
	if err != nil {
		c.kill(err)
		return err
	}
	var firstErr *BundleError
	for {
		msg, err := c.next(ctx, w)
		if err != nil {
			return err
		}
		xid := binary.BigEndian.Uint32(msg[4:])
		if msg[1] == typeError && firstErr == nil {
			firstErr = &BundleError{Index: int(xid - first), Cause: parseError(msg[headerLen:])}
		}
		if msg[1] == typeBarrierReply && xid == barrier {
			if firstErr != nil {
				return firstErr
			}
			return nil
		}
	}
}

// FlowFilter selects flows of a dump.
type FlowFilter struct {
	TableID    uint8 // 0xff: all tables
	Cookie     uint64
	CookieMask uint64
}

// DumpFlows returns every ofp_flow_stats entry matching the filter, from every reply chunk.
func (s *Session) DumpFlows(ctx context.Context, f FlowFilter) ([][]byte, error) {
	body := make([]byte, 40)
	body[0] = f.TableID
	binary.BigEndian.PutUint32(body[4:], 0xffffffff) // out_port any
	binary.BigEndian.PutUint32(body[8:], 0xffffffff) // out_group any
	binary.BigEndian.PutUint64(body[16:], f.Cookie)
	binary.BigEndian.PutUint64(body[24:], f.CookieMask)
	binary.BigEndian.PutUint16(body[32:], 1) // empty OXM match
	binary.BigEndian.PutUint16(body[34:], 4)
	entries, err := s.multipart(ctx, multipartFlow, body)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: dump flows: %w", s.cfg.Bridge, err)
	}
	return entries, nil
}

// DumpGroups returns every ofp_group_desc entry, from every reply chunk.
func (s *Session) DumpGroups(ctx context.Context) ([][]byte, error) {
	entries, err := s.multipart(ctx, multipartGroupDesc, nil)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: dump groups: %w", s.cfg.Bridge, err)
	}
	return entries, nil
}

type rawMsg []byte

func (r rawMsg) MarshalBinary() ([]byte, error) { return append([]byte(nil), r...), nil }

// multipart sends a multipart request and splits every reply chunk's body into its entries (each
// starting with its own 16-bit length).
func (s *Session) multipart(ctx context.Context, typ uint16, body []byte) ([][]byte, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	c, err := s.current(ctx)
	if err != nil {
		return nil, err
	}
	req := make([]byte, 16+len(body))
	req[0], req[1] = ofVersion13, typeMultipartReq
	binary.BigEndian.PutUint16(req[2:], uint16(len(req)))
	binary.BigEndian.PutUint16(req[8:], typ)
	copy(req[16:], body)
	xid := s.nextXID()
	w := c.wait(xid, xid, 256)
	defer c.unwait(w)
	if err := c.write(func(bw *bufio.Writer) error { return writeMsg(bw, rawMsg(req), xid) }); err != nil {
		c.kill(err)
		return nil, err
	}
	var entries [][]byte
	for {
		msg, err := c.next(ctx, w)
		if err != nil {
			return nil, err
		}
		if msg[1] == typeError {
			return nil, parseError(msg[headerLen:])
		}
		if msg[1] != typeMultipartReply || len(msg) < 16 {
			continue
		}
		if binary.BigEndian.Uint16(msg[8:]) != typ {
			return nil, fmt.Errorf("multipart reply of type %d to a request of type %d", binary.BigEndian.Uint16(msg[8:]), typ)
		}
		rest := msg[16:]
		for len(rest) > 0 {
			if len(rest) < 2 {
				return nil, errors.New("multipart reply: truncated entry")
			}
			n := int(binary.BigEndian.Uint16(rest))
			if n < 4 || n > len(rest) {
				return nil, fmt.Errorf("multipart reply: entry length %d with %d bytes left", n, len(rest))
			}
			entries = append(entries, rest[:n:n])
			rest = rest[n:]
		}
		if binary.BigEndian.Uint16(msg[10:])&replyMore == 0 {
			return entries, nil
		}
	}
}
