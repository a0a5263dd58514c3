package pipeline

// sessionAffinity ClientIP: how a new client's endpoint is chosen (tables 42 and 43). Once chosen, the
// endpoint's DNAT flow learns client → endpoint into table 41, which keeps the client there until
// timeoutSeconds pass without a new connection from it, whatever happens to the other endpoints.
//
// The choice is a hash of the client's whole address, so N clients spread over M endpoints as a
// uniform hash would, whatever the addresses look like (pods with the same host index on every node,
// every node's gateway .1, consecutive addresses), and it depends on nothing but the client and the
// endpoint set, so a client's first connections agree even before the learned flow is visible (OVS
// installs it some milliseconds after the first connection), and every node chooses alike.
//
//	42  reg6=LB                    multipath(nw_src, basis 0, modulo_n, 65536) → reg7[0..15]: the low
//	                               16 bits of OVS's jhash of nw_src; resubmit 43
//	43  reg6=LB, reg7=slot/(S-1)   the endpoint holding that slot: load reg4/reg5, resubmit 42 (its DNAT)
//	43  reg7[16..23]=a (a < 32)    an empty slot: hash again with basis a+1 (shared by every service)
//	43  reg6=LB                    after 32 empty slots: the first endpoint (probability < (5/8)^32)
//
// S, the slot count, is the power of two ≥ 4n/3, so at most 3/4 and at least 3/8 of the slots hold an
// endpoint, and each endpoint holds exactly one: rejection sampling, so every endpoint is chosen with
// probability exactly 1/n (up to the fallback's < 3·10⁻⁷). An endpoint's slot comes from a hash of its
// address and port (linear probing on collisions, in a canonical order, so every node and every render
// agree): adding or removing one endpoint adds or removes its DNAT flow and its own slot flow and rarely
// moves another; only a change of S (n crossing 3/4 of a power of two) rewrites the n slot flows.
// BenchmarkServiceEndpointChangeMods measures 6.9, 4.1 and 3.3 flow-mods per change for services of 3,
// 10 and 100 endpoints (3 sits on a boundary: 3 ↔ 4 endpoints changes S), against 45, 51 and 70 when
// the slots were address bits, and 2.3 for a plain TCP service (its DNAT flow and its group).
//
// Rejected alternatives, measured: the client address's low bits (the previous scheme) put clients
// agreeing modulo the slot count on one endpoint — every node's gateway, and pods with the same host
// index on different nodes; multipath's hrw or iter_hash over n dense links is as even but indexes the
// endpoints by their position, so adding one shifts half of the index flows (n/2 flow-mods per change:
// 50 for a service of 100); a select group with selection_method=hash over ip_src needs OpenFlow 1.5
// group properties ofsdn's OpenFlow 1.3 session cannot set or read back.

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"

	. "github.com/ofsdn/ofsdn/flows/openflow"
)

// affinityAttempts is how many times a client's address is hashed before the fallback endpoint.
const affinityAttempts = 32

// maxAffinitySlots is the most slots a 16-bit hash can address.
const maxAffinitySlots = 1 << 16

var (
	affinityHash    = Bits(RegAffinityHash, 0, 15)
	affinityAttempt = Bits(RegAffinityHash, 16, 23)
)

// hashClient is the multipath action that writes the next hash of the client's address.
func hashClient(basis uint16) Multipath {
	return Multipath{Fields: HashNWSrc, Basis: basis, Algorithm: MultipathModuloN, Links: maxAffinitySlots, Dst: affinityHash}
}

// affinitySlots is the slot count for n endpoints: the power of two ≥ 4n/3.
func affinitySlots(n int) int {
	s := 1
	for 3*s < 4*n {
		s *= 2
	}
	return s
}

// affinityLayout places each endpoint in a slot of its own: its home slot (FNV-1a of its address and
// port, modulo slots), or the next free one. Endpoints are placed in the order of their home slot, then
// address and port, so the layout depends on the set alone.
func affinityLayout(eps []Endpoint, slots int) []int {
	home := func(e Endpoint) int {
		h := fnv.New32a()
		b := e.IP.As4()
		_, _ = h.Write(append(b[:], byte(e.Port>>8), byte(e.Port)))
		return int(h.Sum32() % uint32(slots))
	}
	order := make([]int, len(eps))
	homes := make([]int, len(eps))
	for i, e := range eps {
		order[i], homes[i] = i, home(e)
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(homes[a], homes[b]), eps[a].IP.Compare(eps[b].IP), cmp.Compare(eps[a].Port, eps[b].Port))
	})
	taken := make([]bool, slots)
	slot := make([]int, len(eps))
	for _, i := range order {
		s := homes[i]
		for taken[s] {
			s = (s + 1) % slots
		}
		taken[s], slot[i] = true, s
	}
	return slot
}

// affinityChoice renders a sessionAffinity load balancer's choice (see the top of this file): the hash
// in table 42 and the slots in table 43. eps are eligible, sorted and distinct.
func affinityChoice(proto uint8, lb uint32, eps []Endpoint) ([]Flow, error) {
	load := func(e Endpoint) []Action {
		ip, _ := IPv4Value(e.IP)
		return []Action{LoadReg(RegEndpointIP, uint32(ip)), LoadReg(RegEndpointPort, uint32(e.Port)), Resubmit{Table: TableServiceLB}}
	}
	entry := M(append(Proto(proto), Reg(RegServiceLB, lb))...)
	if len(eps) == 1 {
		return []Flow{F(TableServiceLB, 100, entry, load(eps[0])...)}, nil
	}
	slots := affinitySlots(len(eps))
	if slots > maxAffinitySlots {
		return nil, fmt.Errorf("sessionAffinity over %d endpoints: at most %d", len(eps), maxAffinitySlots*3/4)
	}
	flows := []Flow{F(TableServiceLB, 100, entry, hashClient(0), Resubmit{Table: TableServiceHash})}
	for i, s := range affinityLayout(eps, slots) {
		flows = append(flows, F(TableServiceHash, 200, M(Reg(RegServiceLB, lb), Masked(RegAffinityHash, uint64(s), uint64(slots-1))),
			load(eps[i])...))
	}
	return append(flows, F(TableServiceHash, 100, M(Reg(RegServiceLB, lb)), load(eps[0])...)), nil
}

// affinityRehash are the flows every sessionAffinity load balancer shares (owner pipeline/services):
// a hash that fell on an empty slot is replaced by the next one, affinityAttempts times.
func affinityRehash() []Flow {
	out := make([]Flow, 0, affinityAttempts)
	for a := range affinityAttempts {
		out = append(out, F(TableServiceHash, 150, M(RegBits(affinityAttempt, uint32(a))),
			hashClient(uint16(a+1)), Load{Dst: affinityAttempt, Value: uint64(a + 1)}, Resubmit{Table: TableServiceHash}))
	}
	return out
}
