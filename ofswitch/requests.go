package ofswitch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ofsdn/ofsdn/flows/openflow"
)

// maxOtherErrors caps BundleError.Other: a bundle whose open failed has every add refused too.
const maxOtherErrors = 8

// Barrier waits until the switch has processed everything sent before it.
func (s *Session) Barrier(ctx context.Context) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	c, err := s.current(ctx)
	if err != nil {
		return s.errorf("barrier", err)
	}
	if _, err := c.roundTrip(ctx, openflow.HeaderOnly(openflow.TypeBarrierRequest, s.nextXID()), openflow.TypeBarrierReply); err != nil {
		return s.errorf("barrier", err)
	}
	return nil
}

// Bundle applies complete OpenFlow 1.3 messages (flow-mods, group-mods, ...; header included, any
// xid) atomically: the switch applies all of them or none. Bundle overwrites the xid (bytes 4..8) of
// every message in place, so the slices must not be in use by another request at the same time.
//
// Everything is written at once without a round trip per message: bundle open, one ONF bundle-add per
// message (flags ATOMIC|ORDERED), a barrier; after the barrier's reply, commit (or discard when the
// switch refused a message already). A message of more than openflow.MaxBundledMessageLen bytes is refused
// before anything is sent.
//
// When the switch rejects the bundle, Bundle returns a *BundleError naming the message it blamed (by
// index into msgs); nothing was applied and the bundle is gone. Other errors (connection lost, context
// ended) leave the bundle discarded, except once the commit was sent: then the outcome is unknown
// and the error says so.
func (s *Session) Bundle(ctx context.Context, msgs [][]byte) error {
	return s.runBundle(ctx, msgs, true)
}

// Validate has the switch check messages without applying any: it opens a bundle, adds every message
// as Bundle does, and discards the bundle once the switch has answered them all. Open vSwitch decodes
// each bundle-add as it arrives and builds the flow it would install, which is where it checks the
// matches and actions against what its datapath supports (conntrack, NAT, ...): a refused message
// comes back as a *BundleError naming it, and a switch without bundles refuses the open (Index -1).
// Nothing reaches the flow tables. What OVS checks only at commit (that the groups, meters and ports
// a flow names exist) is not checked.
func (s *Session) Validate(ctx context.Context, msgs [][]byte) error {
	return s.runBundle(ctx, msgs, false)
}

func (s *Session) runBundle(ctx context.Context, msgs [][]byte, commit bool) error {
	if len(msgs) == 0 {
		return nil
	}
	for i, m := range msgs {
		if err := openflow.CheckMessage(m, openflow.MaxBundledMessageLen); err != nil {
			return fmt.Errorf("bridge %s: bundle message %d: %w", s.cfg.Bridge, i, err)
		}
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	c, err := s.current(ctx)
	if err != nil {
		return s.errorf(fmt.Sprintf("bundle of %d messages", len(msgs)), err)
	}
	if err := s.bundle(ctx, c, msgs, commit); err != nil {
		var be *BundleError
		if errors.As(err, &be) {
			return err
		}
		return s.errorf(fmt.Sprintf("bundle of %d messages", len(msgs)), err)
	}
	return nil
}

func (s *Session) bundle(ctx context.Context, c *conn, msgs [][]byte, commit bool) error {
	n := uint32(len(msgs))
	id := s.bundleID.Add(1)
	// xids: open, one per message, barrier, then commit or discard; one range waiter catches them all.
	openX := s.reserveXIDs(n + 3)
	barrierX, endX := openX+n+1, openX+n+2
	w := c.wait(openX, endX)
	defer c.unwait(w)

	err := c.write(ctx, func(bw *bufio.Writer) error {
		var ctl [openflow.BundleControlLen]byte
		if _, err := bw.Write(openflow.AppendBundleControl(ctl[:0], id, openflow.BundleOpenRequest, openX)); err != nil {
			return err
		}
		var hdr [openflow.BundleAddLen]byte
		for i, m := range msgs {
			xid := openX + 1 + uint32(i)
			openflow.SetXID(m, xid) // the inner message carries its bundle-add's xid
			openflow.PutBundleAdd(&hdr, id, len(m), xid)
			if _, err := bw.Write(hdr[:]); err != nil {
				return err
			}
			if _, err := bw.Write(m); err != nil {
				return err
			}
		}
		var bar [openflow.HeaderLen]byte
		openflow.PutHeader(bar[:], openflow.TypeBarrierRequest, openflow.HeaderLen, barrierX)
		_, err := bw.Write(bar[:])
		return err
	})
	if err != nil {
		return err // a half-written bundle killed the connection, and the switch drops its bundles with it
	}

	// Every add has been answered once the barrier's reply is here: the switch works in order.
	var be *BundleError
	opened, openFailed := false, false
	for done := false; !done; {
		msg, err := c.next(ctx, w)
		if err != nil {
			if opened && !c.isDead() {
				s.discardLater(c, id, endX)
			}
			return fmt.Errorf("before commit, bundle discarded: %w", err)
		}
		xid := openflow.XID(msg)
		switch {
		case msg[1] == openflow.TypeError:
			e := openflow.ParseError(msg[openflow.HeaderLen:])
			if xid == openX {
				openFailed = true
			}
			be = blame(be, e, xid-openX-1, n, openFailed)
		case xid == openX && openflow.IsBundleReply(msg, openflow.BundleOpenReply):
			opened = true
		case xid == barrierX && msg[1] == openflow.TypeBarrierReply:
			done = true
		}
	}
	if be != nil {
		if opened {
			s.discard(ctx, c, w, id, endX)
		}
		return be
	}
	if !opened {
		return errors.New("the switch answered the barrier but not the bundle open")
	}
	if !commit {
		s.discard(ctx, c, w, id, endX)
		return nil
	}

	if err := c.write(ctx, func(bw *bufio.Writer) error {
		var ctl [openflow.BundleControlLen]byte
		_, err := bw.Write(openflow.AppendBundleControl(ctl[:0], id, openflow.BundleCommitRequest, endX))
		return err
	}); err != nil {
		if c.isDead() {
			return err // the switch discards the bundle of a lost connection
		}
		s.discardLater(c, id, endX)
		return fmt.Errorf("commit not sent, bundle discarded: %w", err)
	}
	for {
		msg, err := c.next(ctx, w)
		if err != nil {
			return fmt.Errorf("commit sent, outcome unknown: %w", err)
		}
		xid := openflow.XID(msg)
		switch {
		case msg[1] == openflow.TypeError:
			be = blame(be, openflow.ParseError(msg[openflow.HeaderLen:]), xid-openX-1, n, false)
			if xid == endX {
				return be // the commit failed: OVS applied nothing and removed the bundle
			}
		case xid == endX && openflow.IsBundleReply(msg, openflow.BundleCommitReply):
			if be != nil { // cannot happen with ATOMIC; never report success over an error
				return be
			}
			return nil
		}
	}
}

// blame adds an error to a bundle's (or a Send's) failure. idx is the error's xid minus the first
// message's xid: it names a message when below n. A message is blamed rather than the bundle as a
// whole, unless the bundle never opened (then every add fails for that reason).
func blame(be *BundleError, e *openflow.OFError, idx, n uint32, bundleFailed bool) *BundleError {
	index := -1
	if idx < n && !bundleFailed {
		index = int(idx)
	}
	if be == nil {
		return newBundleError(index, e)
	}
	if be.Index < 0 && index >= 0 {
		nb := newBundleError(index, e)
		nb.Other = append([]*openflow.OFError{be.Cause}, be.Other...)
		return nb
	}
	if len(be.Other) < maxOtherErrors {
		be.Other = append(be.Other, e)
	}
	return be
}

// discard asks the switch to drop a bundle and waits for its answer, which matters only for logs: a
// failed discard leaves an uncommitted bundle that OVS drops with the connection or on its timeout.
func (s *Session) discard(ctx context.Context, c *conn, w *waiter, id, xid uint32) {
	err := c.write(ctx, func(bw *bufio.Writer) error {
		var ctl [openflow.BundleControlLen]byte
		_, err := bw.Write(openflow.AppendBundleControl(ctl[:0], id, openflow.BundleDiscardRequest, xid))
		return err
	})
	for err == nil {
		var msg []byte
		msg, err = c.next(ctx, w)
		if err != nil {
			break
		}
		if openflow.XID(msg) != xid {
			continue
		}
		if msg[1] == openflow.TypeError {
			err = openflow.ParseError(msg[openflow.HeaderLen:])
		} else if openflow.IsBundleReply(msg, openflow.BundleDiscardReply) {
			return
		}
	}
	s.log.V(2).Info("bundle discard failed", "bundleID", id, "err", err)
}

// discardLater discards a bundle whose request gave up (its context ended), without waiting for the
// answer. The write has its own short deadline; if even that fails, the connection is dropped, and the
// bundle with it.
func (s *Session) discardLater(c *conn, id, xid uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.write(ctx, func(bw *bufio.Writer) error {
		var ctl [openflow.BundleControlLen]byte
		_, err := bw.Write(openflow.AppendBundleControl(ctl[:0], id, openflow.BundleDiscardRequest, xid))
		return err
	})
}

// Send writes messages outside any bundle, then a barrier, and waits for the barrier's reply. It is
// not atomic: when the switch refuses messages, the others still apply, and Send returns a
// *BundleError naming the first refused message. Like Bundle, it overwrites each message's xid.
func (s *Session) Send(ctx context.Context, msgs [][]byte) error {
	if len(msgs) == 0 {
		return nil
	}
	for i, m := range msgs {
		if err := openflow.CheckMessage(m, openflow.MaxMessageLen); err != nil {
			return fmt.Errorf("bridge %s: message %d: %w", s.cfg.Bridge, i, err)
		}
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	c, err := s.current(ctx)
	if err != nil {
		return s.errorf(fmt.Sprintf("send %d messages", len(msgs)), err)
	}
	n := uint32(len(msgs))
	first := s.reserveXIDs(n + 1)
	barrierX := first + n
	w := c.wait(first, barrierX)
	defer c.unwait(w)
	err = c.write(ctx, func(bw *bufio.Writer) error {
		for i, m := range msgs {
			openflow.SetXID(m, first+uint32(i))
			if _, err := bw.Write(m); err != nil {
				return err
			}
		}
		var bar [openflow.HeaderLen]byte
		openflow.PutHeader(bar[:], openflow.TypeBarrierRequest, openflow.HeaderLen, barrierX)
		_, err := bw.Write(bar[:])
		return err
	})
	if err != nil {
		return s.errorf(fmt.Sprintf("send %d messages", len(msgs)), err)
	}
	var be *BundleError
	for {
		msg, err := c.next(ctx, w)
		if err != nil {
			return s.errorf(fmt.Sprintf("send %d messages", len(msgs)), err)
		}
		xid := openflow.XID(msg)
		switch {
		case msg[1] == openflow.TypeError:
			be = blame(be, openflow.ParseError(msg[openflow.HeaderLen:]), xid-first, n, false)
		case xid == barrierX && msg[1] == openflow.TypeBarrierReply:
			if be != nil {
				return be
			}
			return nil
		}
	}
}

// FlowFilter selects the flows of a dump.
type FlowFilter struct {
	TableID    openflow.TableID // openflow.AllTables: every table
	Cookie     uint64
	CookieMask uint64 // 0: any cookie
}

// DumpFlows returns every ofp_flow_stats entry that matches the filter, from every reply chunk, each
// as its own unparsed slice (entries of one chunk share its memory).
func (s *Session) DumpFlows(ctx context.Context, f FlowFilter) ([][]byte, error) {
	body := openflow.FlowStatsRequest(f.TableID, f.Cookie, f.CookieMask)
	entries, err := s.multipart(ctx, openflow.MultipartFlow, body, lengthPrefixed(openflow.MinFlowStats))
	if err != nil {
		return nil, s.errorf("dump flows", err)
	}
	return entries, nil
}

// DumpGroups returns every ofp_group_desc entry, from every reply chunk, unparsed.
func (s *Session) DumpGroups(ctx context.Context) ([][]byte, error) {
	entries, err := s.multipart(ctx, openflow.MultipartGroupDesc, nil, lengthPrefixed(openflow.MinGroupDesc))
	if err != nil {
		return nil, s.errorf("dump groups", err)
	}
	return entries, nil
}

// DumpGroupStats returns every group's ofp_group_stats entry (counters per group and bucket), unparsed.
func (s *Session) DumpGroupStats(ctx context.Context) ([][]byte, error) {
	entries, err := s.multipart(ctx, openflow.MultipartGroup, openflow.GroupStatsRequest(), lengthPrefixed(openflow.MinGroupStats))
	if err != nil {
		return nil, s.errorf("dump group stats", err)
	}
	return entries, nil
}

// PortDesc describes every port of the bridge (OFPMP_PORT_DESC).
func (s *Session) PortDesc(ctx context.Context) ([]openflow.Port, error) {
	entries, err := s.multipart(ctx, openflow.MultipartPortDesc, nil, fixedSize(openflow.PortDescLen))
	if err != nil {
		return nil, s.errorf("port description", err)
	}
	ports := make([]openflow.Port, 0, len(entries))
	for _, e := range entries {
		p, err := openflow.ParsePort(e)
		if err != nil {
			return nil, s.errorf("port description", err)
		}
		ports = append(ports, p)
	}
	return ports, nil
}

type splitter func(body []byte, entries [][]byte) ([][]byte, error)

func lengthPrefixed(minLen int) splitter {
	return func(body []byte, entries [][]byte) ([][]byte, error) {
		return openflow.SplitEntries(body, minLen, entries)
	}
}

func fixedSize(size int) splitter {
	return func(body []byte, entries [][]byte) ([][]byte, error) {
		if len(body)%size != 0 {
			return entries, fmt.Errorf("multipart reply: %d bytes are not a whole number of %d-byte entries", len(body), size)
		}
		for ; len(body) > 0; body = body[size:] {
			entries = append(entries, body[:size:size])
		}
		return entries, nil
	}
}

// multipart sends a multipart request and splits the body of every reply chunk into entries.
func (s *Session) multipart(ctx context.Context, typ uint16, body []byte, split splitter) ([][]byte, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	c, err := s.current(ctx)
	if err != nil {
		return nil, err
	}
	req := openflow.MultipartRequest(typ, body, s.nextXID())
	w := c.wait(openflow.XID(req), openflow.XID(req))
	defer c.unwait(w)
	if err := c.write(ctx, func(bw *bufio.Writer) error { _, err := bw.Write(req); return err }); err != nil {
		return nil, err
	}
	var entries [][]byte
	for {
		msg, err := c.next(ctx, w)
		if err != nil {
			return nil, err
		}
		switch msg[1] {
		case openflow.TypeError:
			return nil, openflow.ParseError(msg[openflow.HeaderLen:])
		case openflow.TypeMultipartReply:
		default:
			continue
		}
		chunk, more, err := openflow.MultipartChunk(msg, typ)
		if err != nil {
			return nil, err
		}
		if entries, err = split(chunk, entries); err != nil {
			return nil, err
		}
		if !more {
			return entries, nil
		}
	}
}

// SetMeters adds each meter, or modifies it when the bridge has it already (a meter's deletion would
// take the flows that use it along). Flows may name a meter before it exists; they are metered once it
// does.
func (s *Session) SetMeters(ctx context.Context, meters []openflow.MeterBand) error {
	for _, m := range meters {
		err := s.Send(ctx, [][]byte{openflow.EncodeMeterMod(openflow.MeterAdd, m, 0)})
		if openflow.IsMeterExists(err) {
			err = s.Send(ctx, [][]byte{openflow.EncodeMeterMod(openflow.MeterModify, m, 0)})
		}
		if err != nil {
			return fmt.Errorf("meter %d: %w", m.ID, err)
		}
	}
	return nil
}
