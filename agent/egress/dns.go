package egress

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ofsdn/ofsdn/internal/loop"
	"golang.org/x/net/dns/dnsmessage"
	"k8s.io/klog/v2"
)

// EgressNetworkPolicy rules may name a destination by DNS name, as openshift-sdn's did: the agent
// resolves each name, the rule matches the addresses it got, and the name is resolved again when the
// answer's TTL runs out (at least MinTTL, at most MaxTTL later). A failed lookup keeps the last answer
// until one succeeds. What this cannot do: a pod that resolves the name differently (another resolver,
// a round-robin answer the agent did not get) reaches addresses the rule does not know — an Allow rule
// then does not allow them (a later Deny applies), a Deny rule does not deny them. README: Egress
// firewall.

// TTL bounds of DNS names' re-resolution.
const (
	MinTTL = 2 * time.Second
	MaxTTL = 30 * time.Minute
)

// Answer is what a name resolved to.
type Answer struct {
	Addrs []netip.Addr
	TTL   time.Duration
}

// Lookup resolves a name's A records.
type Lookup func(ctx context.Context, name string) (Answer, error)

// Resolver keeps the firewalls' DNS names resolved.
type Resolver struct {
	lookup  Lookup
	names   func() []string
	changed func(map[string][]netip.Addr)
	log     klog.Logger
	loop    *loop.Loop
	now     func() time.Time

	mu      sync.Mutex
	answers map[string][]netip.Addr
	due     map[string]time.Time
}

// NewResolver keeps names() resolved with lookup and tells changed the full map when an answer changed.
func NewResolver(lookup Lookup, names func() []string, changed func(map[string][]netip.Addr), log klog.Logger) *Resolver {
	r := &Resolver{lookup: lookup, names: names, changed: changed, log: log.WithName("egress-dns"), now: time.Now,
		answers: map[string][]netip.Addr{}, due: map[string]time.Time{}}
	r.loop = loop.New(loop.Config{Name: "egress-dns", Period: MaxTTL, Log: r.log, BackoffMin: time.Second, BackoffMax: 30 * time.Second}, r.pass)
	return r
}

// Kick asks for a pass (the names may have changed).
func (r *Resolver) Kick() { r.loop.Kick() }

// Run resolves until ctx ends.
func (r *Resolver) Run(ctx context.Context) { r.loop.Run(ctx) }

// pass resolves the names that are new or due, forgets those no rule names, and asks to run again when
// the next one is due.
func (r *Resolver) pass(ctx context.Context) (time.Duration, error) {
	names := r.names()
	now := r.now()
	r.mu.Lock()
	changed := false
	for n := range r.due { // every name tried, answered or not
		if !slices.Contains(names, n) {
			delete(r.answers, n)
			delete(r.due, n)
			changed = true
		}
	}
	var todo []string
	for _, n := range names {
		if due, ok := r.due[n]; !ok || !now.Before(due) {
			todo = append(todo, n)
		}
	}
	r.mu.Unlock()
	var errs []error
	for _, n := range todo {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		a, err := r.lookup(lctx, n)
		cancel()
		r.mu.Lock()
		if err != nil {
			errs = append(errs, fmt.Errorf("resolve %s: %w", n, err))
			r.due[n] = now.Add(MinTTL) // keep the last answer; try again soon
		} else {
			ttl := min(max(a.TTL, MinTTL), MaxTTL)
			r.due[n] = now.Add(ttl)
			addrs := slices.Clone(a.Addrs)
			slices.SortFunc(addrs, netip.Addr.Compare)
			addrs = slices.Compact(addrs)
			if !slices.Equal(addrs, r.answers[n]) {
				r.log.Info("DNS name of an egress firewall rule resolved", "name", n, "addresses", addrs, "ttl", ttl)
				r.answers[n] = addrs
				changed = true
			}
		}
		r.mu.Unlock()
	}
	r.mu.Lock()
	var next time.Time
	for _, d := range r.due {
		if next.IsZero() || d.Before(next) {
			next = d
		}
	}
	snapshot := make(map[string][]netip.Addr, len(r.answers))
	for n, a := range r.answers {
		snapshot[n] = slices.Clone(a)
	}
	r.mu.Unlock()
	if changed {
		r.changed(snapshot)
	}
	var again time.Duration
	if !next.IsZero() {
		again = max(next.Sub(r.now()), 10*time.Millisecond)
	}
	return again, errors.Join(errs...)
}

// DNSLookup asks server (HOST:PORT) for name's A records over UDP, following CNAMEs within the answer.
// An empty server is the first nameserver of /etc/resolv.conf (the node's).
func DNSLookup(server string) Lookup {
	return func(ctx context.Context, name string) (Answer, error) {
		srv := server
		if srv == "" {
			var err error
			if srv, err = systemNameserver("/etc/resolv.conf"); err != nil {
				return Answer{}, err
			}
		}
		return queryA(ctx, srv, name)
	}
}

func systemNameserver(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("no DNS server: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil {
				return netip.AddrPortFrom(a, 53).String(), nil
			}
		}
	}
	return "", fmt.Errorf("no nameserver in %s", path)
}

func queryA(ctx context.Context, server, name string) (Answer, error) {
	fqdn := strings.TrimSuffix(name, ".") + "."
	qname, err := dnsmessage.NewName(fqdn)
	if err != nil {
		return Answer{}, err
	}
	id := uint16(rand.Uint32())
	q := dnsmessage.Message{Header: dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: qname, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}}}
	req, err := q.Pack()
	if err != nil {
		return Answer{}, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", server)
	if err != nil {
		return Answer{}, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write(req); err != nil {
		return Answer{}, err
	}
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return Answer{}, err
		}
		var m dnsmessage.Message
		if err := m.Unpack(buf[:n]); err != nil || m.ID != id || !m.Response {
			continue // not our answer
		}
		return parseA(m, fqdn)
	}
}

// parseA collects the A records for name, through the CNAMEs of the answer section, and the smallest
// TTL among the records used.
func parseA(m dnsmessage.Message, name string) (Answer, error) {
	if m.RCode != dnsmessage.RCodeSuccess {
		return Answer{}, fmt.Errorf("DNS answer for %s: %s", name, m.RCode)
	}
	want := map[string]bool{strings.ToLower(name): true}
	var a Answer
	ttl := uint32(0)
	set := false
	use := func(t uint32) {
		if !set || t < ttl {
			ttl, set = t, true
		}
	}
	// CNAMEs first (they may come in any order), then the addresses of any name in the chain.
	for changed := true; changed; {
		changed = false
		for _, rr := range m.Answers {
			if c, ok := rr.Body.(*dnsmessage.CNAMEResource); ok && want[strings.ToLower(rr.Header.Name.String())] && !want[strings.ToLower(c.CNAME.String())] {
				want[strings.ToLower(c.CNAME.String())] = true
				use(rr.Header.TTL)
				changed = true
			}
		}
	}
	for _, rr := range m.Answers {
		if r, ok := rr.Body.(*dnsmessage.AResource); ok && want[strings.ToLower(rr.Header.Name.String())] {
			a.Addrs = append(a.Addrs, netip.AddrFrom4(r.A))
			use(rr.Header.TTL)
		}
	}
	a.TTL = time.Duration(ttl) * time.Second
	return a, nil
}
