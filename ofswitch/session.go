package ofswitch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ofsdn/ofsdn/flows/openflow"

	"k8s.io/klog/v2"
)

// Config configures a Session.
type Config struct {
	// Socket is the bridge's management socket, e.g. /var/run/openvswitch/br0.mgmt.
	Socket string
	// Bridge names the bridge in logs and errors.
	Bridge string
	// RequestTimeout bounds every request whose context has no deadline, including the time spent
	// waiting for a connection (default 30 s), and each connection attempt.
	RequestTimeout time.Duration
	// EchoInterval: an echo request goes out when the switch has been quiet this long, and the
	// connection is dropped (and re-established) after three intervals without any message (default 5 s).
	EchoInterval time.Duration
	// ReconnectMin and ReconnectMax bound the exponential backoff between connection attempts and
	// between retries of the OnReconnect hook (defaults 50 ms and 5 s).
	ReconnectMin, ReconnectMax time.Duration
	// HoldRequestsDuringReplay makes requests wait, after a reconnection, until the OnReconnect hook
	// has succeeded. Off by default: a caller that holds its own lock across requests (reconcile.Reconciler
	// does) and whose hook needs that lock would otherwise stall until the waiting request times out.
	HoldRequestsDuringReplay bool
	// Logger receives structured logs; klog's global logger when unset.
	Logger klog.Logger
	// OnPacketIn, when set, receives every packet-in (the whole message, which it may keep), from the
	// connection's reader: it must not block (hand the message on or drop it). Each connection then
	// asks the switch for packet-ins of controller actions (OFPT_SET_ASYNC): Open vSwitch sends a
	// service connection, such as the bridge's management socket, no asynchronous message until asked.
	OnPacketIn func(msg []byte)
}

func (c *Config) defaults() {
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 30 * time.Second
	}
	if c.EchoInterval <= 0 {
		c.EchoInterval = 5 * time.Second
	}
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = 50 * time.Millisecond
	}
	if c.ReconnectMax < c.ReconnectMin {
		c.ReconnectMax = max(5*time.Second, c.ReconnectMin)
	}
	if c.Bridge == "" {
		c.Bridge = c.Socket
	}
}

// Session is one OpenFlow 1.3 connection to a bridge, re-established whenever it drops. All methods
// are safe for concurrent use.
type Session struct {
	cfg Config
	log klog.Logger

	xid      atomic.Uint32
	bundleID atomic.Uint32
	wg       sync.WaitGroup // every goroutine of the session, for Close
	stop     context.CancelFunc
	closing  chan struct{}

	mu         sync.Mutex
	conn       *conn         // the established connection, nil while disconnected
	usable     *conn         // conn once requests may use it (after the hook when requests are held)
	ready      chan struct{} // closed while usable != nil
	closed     bool
	replay     func(ctx context.Context) error
	dpid       uint64
	reconnects int
}

// replayKey marks the context of the OnReconnect hook: its requests use the connection being
// replayed into even while other requests are held.
type replayKey struct{}

// Dial connects to the bridge and starts the session. It retries a missing or refusing socket with
// backoff until ctx (or RequestTimeout, when ctx has no deadline) ends, but fails at once when the
// bridge does not speak OpenFlow 1.3 (an error wrapping openflow.ErrVersion). Later losses of the connection are
// repaired in the background.
func Dial(ctx context.Context, cfg Config) (*Session, error) {
	if cfg.Socket == "" {
		return nil, errors.New("ofswitch: Config.Socket is empty")
	}
	cfg.defaults()
	log := cfg.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	s := &Session{
		cfg:     cfg,
		log:     log.WithName("ofswitch").WithValues("bridge", cfg.Bridge),
		ready:   make(chan struct{}),
		closing: make(chan struct{}),
	}
	s.xid.Store(1 << 20) // away from the small xids ovs-ofctl uses: easier to tell apart in OVS logs
	dctx, cancel := s.bound(ctx)
	defer cancel()
	c, dpid, err := s.dial(dctx, true)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", cfg.Bridge, err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.establish(c, dpid, true)
	s.log.V(1).Info("OpenFlow 1.3 session up", "socket", cfg.Socket, "datapathID", fmt.Sprintf("%016x", dpid))
	s.wg.Add(1)
	go s.run(runCtx, c)
	return s, nil
}

// OnReconnect sets the hook called after every re-established connection (not the first): the place
// to replay flows into an ovs-vswitchd that restarted with empty tables. The hook runs in its own
// goroutine as soon as the connection is up; its context ends when that connection drops or the
// session closes. A failing hook is logged and retried with backoff while the connection lasts, and
// runs again after the next reconnection. Requests wait for it only with HoldRequestsDuringReplay.
// The hook must not call Close.
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
	return s.reconnects
}

// Close ends the session: requests in flight fail with an error wrapping ErrClosed, and every
// goroutine of the session has exited when Close returns.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	close(s.closing)
	c := s.conn
	s.mu.Unlock()
	s.stop()
	if c != nil {
		c.kill(ErrClosed)
	}
	s.wg.Wait()
	return nil
}

// ---- connection life cycle ----

// establish makes c the session's connection, unless it died already; with release, requests may use
// it at once.
func (s *Session) establish(c *conn, dpid uint64, release bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.isDead() || s.closed {
		return
	}
	s.conn, s.dpid = c, dpid
	if release {
		s.releaseLocked(c)
	}
}

func (s *Session) release(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked(c)
}

func (s *Session) releaseLocked(c *conn) {
	if s.conn == c && s.usable == nil {
		s.usable = c
		close(s.ready)
	}
}

// lost is called once by a dying connection.
func (s *Session) lost(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == c {
		s.conn = nil
	}
	if s.usable == c {
		s.usable = nil
		s.ready = make(chan struct{})
	}
}

// run re-establishes the connection whenever it drops, until Close.
func (s *Session) run(ctx context.Context, c *conn) {
	defer s.wg.Done()
	var hookDone chan struct{}
	defer func() {
		if hookDone != nil {
			<-hookDone
		}
	}()
	for {
		select {
		case <-c.dead:
		case <-ctx.Done():
			c.kill(ErrClosed)
			return
		}
		if ctx.Err() != nil {
			return
		}
		s.log.Info("OpenFlow connection lost; reconnecting", "err", c.err)
		if hookDone != nil {
			<-hookDone // its context ended with the connection
			hookDone = nil
		}
		var dpid uint64
		var err error
		c, dpid, err = s.dial(ctx, false)
		if err != nil {
			return // closed
		}
		s.mu.Lock()
		s.reconnects++
		replay := s.replay
		s.mu.Unlock()
		hold := replay != nil && s.cfg.HoldRequestsDuringReplay
		s.establish(c, dpid, !hold)
		s.log.Info("OpenFlow connection re-established", "datapathID", fmt.Sprintf("%016x", dpid))
		if replay != nil {
			hookDone = make(chan struct{})
			s.wg.Add(1)
			go func(c *conn, done chan struct{}) {
				defer s.wg.Done()
				defer close(done)
				if s.runReplay(ctx, c, replay) && hold {
					s.release(c)
				}
			}(c, hookDone)
		}
	}
}

// dial connects with exponential backoff until it succeeds or ctx ends. With failFast, a switch that
// does not speak OpenFlow 1.3 ends the attempts at once.
func (s *Session) dial(ctx context.Context, failFast bool) (*conn, uint64, error) {
	backoff := s.cfg.ReconnectMin
	for {
		attempt, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
		c, dpid, err := s.connect(attempt)
		cancel()
		if err == nil {
			return c, dpid, nil
		}
		if failFast && errors.Is(err, openflow.ErrVersion) {
			return nil, 0, err
		}
		if errors.Is(err, openflow.ErrVersion) {
			s.log.Error(err, "reconnect refused", "retryIn", backoff)
		} else {
			s.log.V(2).Info("connect failed", "err", err, "retryIn", backoff)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, 0, fmt.Errorf("connect %s: %w (last error: %v)", s.cfg.Socket, ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(backoff*2, s.cfg.ReconnectMax)
	}
}

// connect dials the socket once and does hello and features, then starts the connection's goroutines.
func (s *Session) connect(ctx context.Context) (*conn, uint64, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", s.cfg.Socket)
	if err != nil {
		return nil, 0, fmt.Errorf("connect %s: %w", s.cfg.Socket, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = nc.Close()
		}
	}()
	if dl, has := ctx.Deadline(); has {
		_ = nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	if _, err := nc.Write(openflow.Hello13(s.nextXID())); err != nil {
		return nil, 0, fmt.Errorf("hello: %w", err)
	}
	r := bufio.NewReaderSize(nc, readBufSize)
	msg, err := openflow.ReadMessage(r)
	if err != nil {
		return nil, 0, fmt.Errorf("hello: %w", err)
	}
	switch msg[1] {
	case openflow.TypeHello:
		if err := openflow.CheckHello(msg); err != nil {
			return nil, 0, err
		}
	case openflow.TypeError:
		return nil, 0, fmt.Errorf("%w: hello refused: %w", openflow.ErrVersion, openflow.ParseError(msg[openflow.HeaderLen:]))
	default:
		return nil, 0, fmt.Errorf("hello: the switch sent message type %d first", msg[1])
	}
	fxid := s.nextXID()
	if _, err := nc.Write(openflow.HeaderOnly(openflow.TypeFeaturesRequest, fxid)); err != nil {
		return nil, 0, fmt.Errorf("features request: %w", err)
	}
	var dpid uint64
	for dpid == 0 {
		msg, err = openflow.ReadMessage(r)
		if err != nil {
			return nil, 0, fmt.Errorf("features reply: %w", err)
		}
		switch {
		case msg[1] == openflow.TypeError:
			e := openflow.ParseError(msg[openflow.HeaderLen:])
			if e.Type == 0 { // OFPET_HELLO_FAILED: the switch did not accept our hello
				return nil, 0, fmt.Errorf("%w: hello refused: %w", openflow.ErrVersion, e)
			}
			return nil, 0, fmt.Errorf("features request: %w", e)
		case msg[1] == openflow.TypeFeaturesReply && openflow.XID(msg) == fxid:
			if len(msg) < 16 {
				return nil, 0, fmt.Errorf("features reply of %d bytes has no datapath ID", len(msg))
			}
			dpid, _ = openflow.FeaturesDatapathID(msg)
			if dpid == 0 {
				return nil, 0, errors.New("features reply with datapath ID 0")
			}
		case msg[1] == openflow.TypeEchoRequest:
			msg[1] = openflow.TypeEchoReply
			if _, err := nc.Write(msg); err != nil {
				return nil, 0, fmt.Errorf("echo reply: %w", err)
			}
		}
	}
	if !stop() {
		return nil, 0, ctx.Err()
	}
	if s.cfg.OnPacketIn != nil {
		if _, err := nc.Write(openflow.EncodeSetAsync(s.nextXID())); err != nil {
			return nil, 0, fmt.Errorf("set async: %w", err)
		}
	}
	_ = nc.SetDeadline(time.Time{})
	c := newConn(s, nc)
	c.start(r)
	ok = true
	return c, dpid, nil
}

// runReplay runs the hook until it succeeds, the connection drops or the session closes.
func (s *Session) runReplay(ctx context.Context, c *conn, replay func(context.Context) error) bool {
	hctx, cancel := context.WithCancel(context.WithValue(ctx, replayKey{}, c))
	defer cancel()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case <-c.dead:
			cancel()
		case <-hctx.Done():
		}
	}()
	backoff := s.cfg.ReconnectMin
	for {
		err := replay(hctx)
		if err == nil {
			s.log.V(1).Info("replay after reconnect done")
			return true
		}
		if hctx.Err() != nil {
			s.log.Info("replay after reconnect cut short", "err", err)
			return false
		}
		s.log.Error(err, "replay after reconnect failed; retrying", "retryIn", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-hctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
		backoff = min(backoff*2, s.cfg.ReconnectMax)
	}
}

func (s *Session) nextXID() uint32 { return s.xid.Add(1) }

// reserveXIDs returns the first of n consecutive xids.
func (s *Session) reserveXIDs(n uint32) uint32 { return s.xid.Add(n) - n + 1 }

// current returns the connection a request may use, waiting for one up to ctx.
func (s *Session) current(ctx context.Context) (*conn, error) {
	if hc, ok := ctx.Value(replayKey{}).(*conn); ok {
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		if hc.isDead() {
			return nil, hc.deathErr()
		}
		return hc, nil
	}
	for {
		s.mu.Lock()
		c, ready, closed := s.usable, s.ready, s.closed
		s.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		if c != nil {
			return c, nil
		}
		select {
		case <-ready:
		case <-s.closing:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the OpenFlow connection: %w", ctx.Err())
		}
	}
}

// bound applies RequestTimeout to a context without a deadline.
func (s *Session) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.cfg.RequestTimeout)
}

func (s *Session) errorf(what string, err error) error {
	return fmt.Errorf("bridge %s: %s: %w", s.cfg.Bridge, what, err)
}
