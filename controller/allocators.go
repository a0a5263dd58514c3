package controller

import (
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"sort"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
)

// ErrExhausted says an allocator has nothing left to hand out.
var ErrExhausted = errors.New("exhausted")

// SubnetAllocator hands out host subnets of a fixed size from the cluster CIDRs, in order. It is plain
// data (the controller serialises access): rebuilt from the HostSubnets that exist on every start.
type SubnetAllocator struct {
	cidrs    []netip.Prefix
	hostBits int
	used     map[netip.Prefix]bool
	// next is where the search for a free subnet resumes (index across all CIDRs), so a just-released
	// subnet is not handed out again at once.
	next int64
}

// NewSubnetAllocator carves /(32-hostBits) subnets out of cidrs.
func NewSubnetAllocator(cidrs []netip.Prefix, hostBits int) (*SubnetAllocator, error) {
	if len(cidrs) == 0 {
		return nil, errors.New("subnet allocator: no cluster CIDRs")
	}
	for _, c := range cidrs {
		if !c.Addr().Is4() || c != c.Masked() {
			return nil, fmt.Errorf("subnet allocator: %s is not a canonical IPv4 CIDR", c)
		}
		if c.Bits()+hostBits > 32 || hostBits < 2 {
			return nil, fmt.Errorf("subnet allocator: host subnet length %d does not fit %s", hostBits, c)
		}
	}
	return &SubnetAllocator{cidrs: cidrs, hostBits: hostBits, used: map[netip.Prefix]bool{}}, nil
}

// count is how many host subnets one CIDR holds.
func (a *SubnetAllocator) count(c netip.Prefix) int64 { return 1 << (32 - a.hostBits - c.Bits()) }

// Total is how many host subnets all CIDRs hold.
func (a *SubnetAllocator) Total() int64 {
	var n int64
	for _, c := range a.cidrs {
		n += a.count(c)
	}
	return n
}

// Used is how many are allocated.
func (a *SubnetAllocator) Used() int64 { return int64(len(a.used)) }

func (a *SubnetAllocator) nth(i int64) netip.Prefix {
	for _, c := range a.cidrs {
		if n := a.count(c); i >= n {
			i -= n
			continue
		}
		base := new(big.Int).SetBytes(c.Addr().AsSlice())
		base.Add(base, new(big.Int).Lsh(big.NewInt(i), uint(a.hostBits)))
		b := base.FillBytes(make([]byte, 4))
		return netip.PrefixFrom(netip.AddrFrom4([4]byte(b)), 32-a.hostBits)
	}
	return netip.Prefix{}
}

// Contains reports whether p is one of the allocator's host subnets.
func (a *SubnetAllocator) Contains(p netip.Prefix) bool {
	if p.Bits() != 32-a.hostBits || p != p.Masked() {
		return false
	}
	for _, c := range a.cidrs {
		if c.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// MarkAllocated records an existing allocation (at start, from the HostSubnets). It refuses a subnet the
// CIDRs do not hold, and one already taken.
func (a *SubnetAllocator) MarkAllocated(p netip.Prefix) error {
	if !a.Contains(p) {
		return fmt.Errorf("subnet %s is not a /%d inside %v", p, 32-a.hostBits, a.cidrs)
	}
	if a.used[p] {
		return fmt.Errorf("subnet %s is allocated twice", p)
	}
	a.used[p] = true
	return nil
}

// Allocate hands out a free subnet.
func (a *SubnetAllocator) Allocate() (netip.Prefix, error) {
	total := a.Total()
	for k := int64(0); k < total; k++ {
		i := (a.next + k) % total
		p := a.nth(i)
		if !a.used[p] {
			a.used[p] = true
			a.next = (i + 1) % total
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("all %d host subnets of %v are allocated: %w", total, a.cidrs, ErrExhausted)
}

// Release frees a subnet; releasing a free one is no error.
func (a *SubnetAllocator) Release(p netip.Prefix) { delete(a.used, p) }

// VNIDAllocator hands out VNIDs MinVNID..MaxVNID and counts the namespaces that share each one (after a
// join), so a VNID is free again only when its last namespace leaves it. VNID 0 (global) is never
// allocated or counted. Networks' VNIs come from one of their own (newVNIDAllocator(MinNetworkVNI,
// MaxNetworkVNI)), with one user each.
type VNIDAllocator struct {
	refs   map[uint32]int
	next   uint32
	lo, hi uint32 // the range handed out
}

// NewVNIDAllocator returns an empty allocator.
func NewVNIDAllocator() *VNIDAllocator { return newVNIDAllocator(networkv1.MinVNID, networkv1.MaxVNID) }

// newVNIDAllocator hands out and accepts lo..hi only: Networks' VNIs (MinNetworkVNI-MaxNetworkVNI), and
// tests that run out of VNIDs without 16 million namespaces.
func newVNIDAllocator(lo, hi uint32) *VNIDAllocator {
	return &VNIDAllocator{refs: map[uint32]int{}, next: lo, lo: lo, hi: hi}
}

// Use adds a user to a VNID of the allocator's range (an existing NetNamespace at start, or a join; a
// Network's VNI).
func (a *VNIDAllocator) Use(id uint32) error {
	if id == networkv1.GlobalVNID {
		return nil
	}
	if id < a.lo || id > a.hi {
		return fmt.Errorf("VNID %d out of range %d-%d", id, a.lo, a.hi)
	}
	a.refs[id]++
	return nil
}

// Allocate returns a VNID no namespace uses, with one user.
func (a *VNIDAllocator) Allocate() (uint32, error) {
	span := a.hi - a.lo + 1
	for k := uint32(0); k < span; k++ {
		id := a.lo + (a.next-a.lo+k)%span
		if a.refs[id] == 0 {
			a.refs[id] = 1
			a.next = id + 1
			if a.next > a.hi {
				a.next = a.lo
			}
			return id, nil
		}
	}
	return 0, fmt.Errorf("all VNIDs are in use: %w", ErrExhausted)
}

// Release removes one user of a VNID.
func (a *VNIDAllocator) Release(id uint32) {
	if id == networkv1.GlobalVNID {
		return
	}
	if a.refs[id] <= 1 {
		delete(a.refs, id)
		return
	}
	a.refs[id]--
}

// Users is how many namespaces use a VNID.
func (a *VNIDAllocator) Users(id uint32) int { return a.refs[id] }

// InUse lists the VNIDs in use, sorted (for logs and tests).
func (a *VNIDAllocator) InUse() []uint32 {
	out := make([]uint32, 0, len(a.refs))
	for id := range a.refs {
		out = append(out, id)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
