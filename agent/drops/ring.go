package drops

import (
	"context"
	"sync"
	"time"

	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// RingSize is how many records a node keeps: about 3 MB of records. At the meters' worst case (every
// cause flooded at once, 12 × 100 samples/s) that is the last 8 seconds; one flooded cause, the last
// 100 seconds; an ordinary trickle of blocked connections, hours. Enough for `flowctl drops` to show
// what is going on now, bounded whatever the traffic.
const RingSize = 10000

// Ring keeps the latest records and hands new ones to followers. Safe for concurrent use.
type Ring struct {
	mu        sync.Mutex
	buf       []debugapi.Drop
	next      int // where the next record goes
	full      bool
	followers map[chan debugapi.Drop]struct{}
}

// NewRing makes a ring of n records.
func NewRing(n int) *Ring {
	return &Ring{buf: make([]debugapi.Drop, n), followers: map[chan debugapi.Drop]struct{}{}}
}

// Add records d and offers it to every follower (a follower too slow to take it misses it).
func (r *Ring) Add(d debugapi.Drop) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf[r.next] = d
	r.next++
	if r.next == len(r.buf) {
		r.next, r.full = 0, true
	}
	for ch := range r.followers {
		select {
		case ch <- d:
		default:
		}
	}
}

// Recent returns the records that match q, oldest first.
func (r *Ring) Recent(q debugapi.DropQuery, now time.Time) []debugapi.Drop {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []debugapi.Drop
	take := func(ds []debugapi.Drop) {
		for _, d := range ds {
			if q.Match(d, now) {
				out = append(out, d)
			}
		}
	}
	if r.full {
		take(r.buf[r.next:])
	}
	take(r.buf[:r.next])
	return out
}

// Stream calls each with the recent records that match q and then, with q.Follow, with every new one
// until ctx ends or each fails. A follower's queue holds followQueue records; a follower that falls
// further behind misses records rather than slowing the agent.
func (r *Ring) Stream(ctx context.Context, q debugapi.DropQuery, now func() time.Time, each func(debugapi.Drop) error) error {
	var ch chan debugapi.Drop
	r.mu.Lock()
	if q.Follow {
		ch = make(chan debugapi.Drop, followQueue)
		r.followers[ch] = struct{}{}
		defer func() {
			r.mu.Lock()
			delete(r.followers, ch)
			r.mu.Unlock()
		}()
	}
	r.mu.Unlock()
	// Records added between subscribing and reading the ring would come twice: the ring's copy is
	// read after subscribing, so skip what the channel repeats by time.
	recent := r.Recent(q, now())
	for _, d := range recent {
		if err := each(d); err != nil {
			return err
		}
	}
	if !q.Follow {
		return nil
	}
	var last time.Time
	if len(recent) > 0 {
		last = recent[len(recent)-1].Time
	}
	fq := q
	fq.Since = 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case d := <-ch:
			if !d.Time.After(last) || !fq.Match(d, now()) {
				continue
			}
			if err := each(d); err != nil {
				return err
			}
		}
	}
}

// followQueue is how many records a follower may lag behind.
const followQueue = 1024

// MaxSampleRate bounds the packet-ins the agent takes, whatever reaches it: the meters pass at most
// 100/s per cause (1,200/s over the twelve causes), so this only acts where the meters are missing (a
// datapath without meter support, where the agent logs that it runs unmetered).
const MaxSampleRate = 2000

// Sampler receives packet-ins, decodes them and keeps the ring; its metrics count samples per cause.
type Sampler struct {
	Ring     *Ring
	snapshot func() *Snapshot
	in       chan []byte
	limit    *rate.Limiter
	now      func() time.Time
	samples  *prometheus.CounterVec
	lost     *prometheus.CounterVec
}

// NewSampler registers its metrics in reg; snapshot gives what to decode against (nil before the
// first sync: samples are then counted as lost).
func NewSampler(reg prometheus.Registerer, snapshot func() *Snapshot) *Sampler {
	s := &Sampler{
		Ring:     NewRing(RingSize),
		snapshot: snapshot,
		in:       make(chan []byte, 4096),
		limit:    rate.NewLimiter(MaxSampleRate, MaxSampleRate),
		now:      time.Now,
		samples: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ofsdn_agent_drop_samples_total",
			Help: "Dropped (or rejected) packets sampled by br0's drop flows, by cause. Samples, not packets: each cause's meter passes at most 100/s (flowctl dump counts every packet)."},
			[]string{"cause"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ofsdn_agent_drop_samples_lost_total",
			Help: "Packet-ins the agent did not turn into drop records, by reason (over-rate, queue-full, undecodable, not-a-drop, not-ready)."},
			[]string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(s.samples, s.lost)
	}
	return s
}

// PacketIn takes a packet-in from the OpenFlow reader; it never blocks.
func (s *Sampler) PacketIn(msg []byte) {
	if !s.limit.Allow() {
		s.lost.WithLabelValues("over-rate").Inc()
		return
	}
	select {
	case s.in <- msg:
	default:
		s.lost.WithLabelValues("queue-full").Inc()
	}
}

// Run decodes packet-ins until ctx ends.
func (s *Sampler) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case msg := <-s.in:
			s.handle(msg)
		}
	}
}

func (s *Sampler) handle(msg []byte) {
	pin, err := openflow.ParsePacketIn(msg)
	if err != nil {
		s.lost.WithLabelValues("undecodable").Inc()
		return
	}
	snap := s.snapshot()
	if snap == nil {
		s.lost.WithLabelValues("not-ready").Inc()
		return
	}
	d, ok := Decode(pin, snap, s.now())
	if !ok {
		s.lost.WithLabelValues("not-a-drop").Inc()
		return
	}
	s.samples.WithLabelValues(d.Cause).Inc()
	s.Ring.Add(d)
}

// Drops implements debugapi.DropStreamer.
func (s *Sampler) Drops(ctx context.Context, q debugapi.DropQuery, each func(debugapi.Drop) error) error {
	return s.Ring.Stream(ctx, q, s.now, each)
}
