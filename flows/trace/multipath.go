package trace

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/ofsdn/ofsdn/flows/openflow"
)

// multipath computes what ovs-vswitchd's NXAST_MULTIPATH writes into its destination: the hash of the
// fields (lib/flow.c flow_hash_fields) turned into a link (lib/multipath.c). Only what an exact answer
// can be given for is modelled; anything else is an error, never a guess.
func (s *state) multipath(a openflow.Multipath) (uint64, error) {
	if a.Links == 0 || a.Links > 1<<16 {
		return 0, fmt.Errorf("%s: %d links, want 1..65536", a, a.Links)
	}
	var hash uint32
	switch a.Fields {
	case openflow.HashNWSrc, openflow.HashNWDst:
		f := openflow.FieldIPSrc
		if a.Fields == openflow.HashNWDst {
			f = openflow.FieldIPDst
		}
		var b [4]byte // the address as OVS holds it: network byte order
		binary.BigEndian.PutUint32(b[:], uint32(s.f[f]))
		hash = jhashBytes(b[:], uint32(a.Basis))
	case openflow.HashEthSrc:
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], s.f[openflow.FieldEthSrc])
		hash = jhashBytes(b[2:], uint32(a.Basis))
	default:
		return 0, fmt.Errorf("action %s: hashing %s is not modelled by the offline evaluator", a, a.Fields)
	}
	switch a.Algorithm {
	case openflow.MultipathModuloN:
		return uint64(hash % a.Links), nil
	default:
		return 0, fmt.Errorf("action %s: algorithm %s is not modelled by the offline evaluator", a, a.Algorithm)
	}
}

// jhashBytes is Open vSwitch's jhash_bytes (lib/jhash.c, Bob Jenkins' lookup3) as an x86 host
// computes it: the bytes are read as little-endian 32-bit words. The hash is visible on the wire (it
// picks the endpoint a multipath action writes), so it must be bit-exact, not merely a good hash.
func jhashBytes(p []byte, basis uint32) uint32 {
	a := 0xdeadbeef + uint32(len(p)) + basis
	b, c := a, a
	for len(p) >= 12 {
		a += binary.LittleEndian.Uint32(p[0:])
		b += binary.LittleEndian.Uint32(p[4:])
		c += binary.LittleEndian.Uint32(p[8:])
		a, b, c = jhashMix(a, b, c)
		p = p[12:]
	}
	if len(p) > 0 {
		var tail [12]byte
		copy(tail[:], p)
		a += binary.LittleEndian.Uint32(tail[0:])
		b += binary.LittleEndian.Uint32(tail[4:])
		c += binary.LittleEndian.Uint32(tail[8:])
		_, _, c = jhashFinal(a, b, c)
	}
	return c
}

func jhashMix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

func jhashFinal(a, b, c uint32) (uint32, uint32, uint32) {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return a, b, c
}
