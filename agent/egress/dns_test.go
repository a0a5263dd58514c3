package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/net/dns/dnsmessage"
)

// answerFor builds a DNS response: records are "name CNAME target ttl" or "name A addr ttl".
func answerFor(t *testing.T, id uint16, q dnsmessage.Question, rcode dnsmessage.RCode, records ...string) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, Response: true, RCode: rcode})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		t.Fatal(err)
	}
	if err := b.Question(q); err != nil {
		t.Fatal(err)
	}
	if err := b.StartAnswers(); err != nil {
		t.Fatal(err)
	}
	for _, r := range records {
		f := strings.Fields(r)
		var ttl uint32
		switch f[3] {
		case "1":
			ttl = 1
		case "60":
			ttl = 60
		case "300":
			ttl = 300
		}
		h := dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(f[0]), Class: dnsmessage.ClassINET, TTL: ttl}
		var err error
		switch f[1] {
		case "CNAME":
			err = b.CNAMEResource(h, dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName(f[2])})
		case "A":
			err = b.AResource(h, dnsmessage.AResource{A: netip.MustParseAddr(f[2]).As4()})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	out, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// dnsServer answers A queries on loopback from a table of records per name.
func dnsServer(t *testing.T, records map[string][]string) string {
	t.Helper()
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			var m dnsmessage.Message
			if m.Unpack(buf[:n]) != nil || len(m.Questions) != 1 {
				continue
			}
			q := m.Questions[0]
			recs, ok := records[q.Name.String()]
			rcode := dnsmessage.RCodeSuccess
			if !ok {
				rcode = dnsmessage.RCodeNameError
			}
			// A stray answer first (wrong ID): the client must wait for its own.
			_, _ = c.WriteTo(answerFor(t, m.ID+1, q, dnsmessage.RCodeSuccess, q.Name.String()+" A 198.51.100.66 60"), from)
			_, _ = c.WriteTo(answerFor(t, m.ID, q, rcode, recs...), from)
		}
	}()
	return c.LocalAddr().String()
}

func TestDNSLookup(t *testing.T) {
	srv := dnsServer(t, map[string][]string{
		"www.example.": {"www.example. CNAME edge.example. 300", "edge.example. A 198.51.100.7 60", "edge.example. A 198.51.100.8 60",
			"other.example. A 198.51.100.99 1"},
		"short.example.": {"short.example. A 198.51.100.9 1"},
	})
	lookup := DNSLookup(srv)
	tests := []struct {
		name  string
		addrs string
		ttl   time.Duration
		err   bool
	}{
		{"www.example", "198.51.100.7,198.51.100.8", time.Minute, false}, // through the CNAME; an unrelated record ignored
		{"short.example.", "198.51.100.9", time.Second, false},
		{"missing.example", "", 0, true},
	}
	for _, tc := range tests {
		a, err := lookup(t.Context(), tc.name)
		if (err != nil) != tc.err {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var got []string
		for _, x := range a.Addrs {
			got = append(got, x.String())
		}
		if strings.Join(got, ",") != tc.addrs || a.TTL != tc.ttl {
			t.Errorf("%s: %v ttl %v, want %s ttl %v", tc.name, got, a.TTL, tc.addrs, tc.ttl)
		}
	}
}

func TestSystemNameserver(t *testing.T) {
	p := t.TempDir() + "/resolv.conf"
	if err := writeFile(p, "# comment\nsearch example\nnameserver 192.0.2.53\nnameserver 192.0.2.54\n"); err != nil {
		t.Fatal(err)
	}
	if got, err := systemNameserver(p); err != nil || got != "192.0.2.53:53" {
		t.Errorf("got %q %v", got, err)
	}
	if err := writeFile(p, "search example\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := systemNameserver(p); err == nil {
		t.Error("no nameserver: no error")
	}
}

// TestResolver: names are resolved when new and again when their TTL (clamped to MinTTL..MaxTTL) runs
// out, not before; a failed lookup keeps the last answer; a name no rule uses is forgotten; the map
// goes out only when something changed.
func TestResolver(t *testing.T) {
	now := time.Unix(1000, 0)
	answers := map[string]Answer{"a.example": {Addrs: []netip.Addr{netip.MustParseAddr("198.51.100.2"), netip.MustParseAddr("198.51.100.1")}, TTL: 10 * time.Second},
		"b.example": {Addrs: []netip.Addr{netip.MustParseAddr("198.51.100.3")}, TTL: 0}}
	var lookups []string
	failing := false
	lookup := func(_ context.Context, n string) (Answer, error) {
		lookups = append(lookups, n)
		if failing {
			return Answer{}, errors.New("no answer")
		}
		return answers[n], nil
	}
	names := []string{"a.example", "b.example"}
	var got []map[string][]netip.Addr
	r := NewResolver(lookup, func() []string { return names }, func(m map[string][]netip.Addr) { got = append(got, m) }, logr.Discard())
	r.now = func() time.Time { return now }
	pass := func() time.Duration {
		t.Helper()
		again, _ := r.pass(t.Context())
		return again
	}
	if again := pass(); again != MinTTL {
		t.Errorf("next pass in %v, want %v (b's TTL 0 clamped)", again, MinTTL)
	}
	if len(got) != 1 || !slices.Equal(got[0]["a.example"], []netip.Addr{netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")}) {
		t.Fatalf("first answers %v", got)
	}
	lookups = nil
	now = now.Add(MinTTL)
	pass()
	if !slices.Equal(lookups, []string{"b.example"}) || len(got) != 1 {
		t.Errorf("at MinTTL: looked up %v, %d maps out; want only b, nothing new", lookups, len(got))
	}
	// b changes; a expires at 10 s.
	answers["b.example"] = Answer{Addrs: []netip.Addr{netip.MustParseAddr("198.51.100.4")}, TTL: time.Hour}
	lookups = nil
	now = now.Add(8 * time.Second)
	pass()
	if !slices.Equal(lookups, []string{"a.example", "b.example"}) || len(got) != 2 || got[1]["b.example"][0] != netip.MustParseAddr("198.51.100.4") {
		t.Errorf("at 10 s: looked up %v, maps %v", lookups, got)
	}
	// Failing lookups keep the answers.
	failing = true
	now = now.Add(time.Hour)
	if _, err := r.pass(t.Context()); err == nil {
		t.Error("failed lookups: no error")
	}
	if len(got) != 2 {
		t.Errorf("failed lookups changed the answers: %v", got[len(got)-1])
	}
	// A name no rule uses any more goes.
	failing = false
	names = []string{"b.example"}
	pass()
	if last := got[len(got)-1]; len(last) != 1 || last["a.example"] != nil {
		t.Errorf("after a was dropped: %v", last)
	}
}

// A name that never resolved and that no rule uses any more is forgotten too: its retry is not due
// for ever, which would run the loop every 10 ms for nothing.
func TestResolverForgetsUnresolvedNames(t *testing.T) {
	now := time.Unix(1000, 0)
	lookup := func(context.Context, string) (Answer, error) { return Answer{}, errors.New("no answer") }
	names := []string{"gone.example"}
	r := NewResolver(lookup, func() []string { return names }, func(map[string][]netip.Addr) {}, logr.Discard())
	r.now = func() time.Time { return now }
	if _, err := r.pass(t.Context()); err == nil {
		t.Fatal("failed lookup: no error")
	}
	names = nil
	now = now.Add(time.Hour)
	if again, err := r.pass(t.Context()); again != 0 || err != nil {
		t.Errorf("no names left: next pass in %v (err %v), want none asked", again, err)
	}
}

func writeFile(p, s string) error { return os.WriteFile(p, []byte(s), 0o644) }
