package testpod

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// ClientResult is what each source address got from Clients: the answering endpoints
// (Reply.Endpoint, or "error: …") and the addresses the servers saw (without the port), with counts.
type ClientResult struct {
	Endpoints map[string]int `json:"endpoints"`
	Seen      map[string]int `json:"seen"`
}

// Clients makes count connections from each source address (count×len(sources) in all, parallel at
// a time, a source's connections racing each other), connection i of a source to dsts[i mod
// len(dsts)], and reports per source. An invalid source lets the kernel choose.
func Clients(ctx context.Context, proto string, dsts []string, sources []netip.Addr, count, parallel int, timeout time.Duration) map[string]*ClientResult {
	type job struct {
		src netip.Addr
		dst string
	}
	out := make(map[string]*ClientResult, len(sources))
	for _, s := range sources {
		out[s.String()] = &ClientResult{Endpoints: map[string]int{}, Seen: map[string]int{}}
	}
	var mu sync.Mutex
	work := make(chan job)
	var wg sync.WaitGroup
	for range max(parallel, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				cctx, cancel := context.WithTimeout(ctx, timeout)
				rep, err := ProbeFrom(cctx, proto, j.src, j.dst)
				cancel()
				key, seen := rep.Endpoint(), ""
				if err != nil {
					key = "error: " + err.Error()
				} else if ap, perr := netip.ParseAddrPort(rep.Seen); perr == nil {
					seen = ap.Addr().String()
				}
				mu.Lock()
				r := out[j.src.String()]
				r.Endpoints[key]++
				if seen != "" {
					r.Seen[seen]++
				}
				mu.Unlock()
			}
		}()
	}
	// Round-robin over the sources, so each source's connections are spread over the run.
	for i := 0; i < count && ctx.Err() == nil; i++ {
		for _, s := range sources {
			work <- job{s, dsts[i%len(dsts)]}
		}
	}
	close(work)
	wg.Wait()
	return out
}

// ProbeFrom is ProbeTCP (no payload) or ProbeUDP from a given source address; an invalid one lets the
// kernel choose.
func ProbeFrom(ctx context.Context, proto string, src netip.Addr, addr string) (Reply, error) {
	d := net.Dialer{}
	switch {
	case !src.IsValid():
	case proto == "udp":
		d.LocalAddr = &net.UDPAddr{IP: src.AsSlice()}
	default:
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	}
	switch proto {
	case "tcp":
		return probeTCP(ctx, &d, addr, 0)
	case "udp":
		return probeUDP(ctx, &d, addr)
	}
	return Reply{}, fmt.Errorf("probe %q: want tcp or udp", proto)
}
