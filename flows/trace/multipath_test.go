package trace

import (
	"testing"

	"github.com/ofsdn/ofsdn/flows/openflow"
)

// TestJhashBytesIsLookup3 checks the hash against Bob Jenkins' published lookup3 values (hashlittle,
// which jhash_bytes equals on a little-endian host for these lengths).
func TestJhashBytesIsLookup3(t *testing.T) {
	for _, tc := range []struct {
		in    string
		basis uint32
		want  uint32
	}{
		{"", 0, 0xdeadbeef},
		{"", 0xdeadbeef, 0xbd5b7dde},
		{"Four score and seven years ago", 0, 0x17770551},
		{"Four score and seven years ago", 1, 0xcd628161},
	} {
		if got := jhashBytes([]byte(tc.in), tc.basis); got != tc.want {
			t.Errorf("jhash(%q, %#x) = %#x, want %#x", tc.in, tc.basis, got, tc.want)
		}
	}
}

func TestMultipathRefusesWhatItCannotModel(t *testing.T) {
	s := &state{f: map[openflow.Field]uint64{openflow.FieldIPSrc: 0x0a800005}}
	dst := openflow.Bits(openflow.FieldReg7, 0, 15)
	for _, a := range []openflow.Multipath{
		{Fields: openflow.HashSymmetricL4, Algorithm: openflow.MultipathModuloN, Links: 16, Dst: dst},
		{Fields: openflow.HashNWSrc, Algorithm: openflow.MultipathHRW, Links: 16, Dst: dst},
		{Fields: openflow.HashNWSrc, Algorithm: openflow.MultipathModuloN, Links: 0, Dst: dst},
	} {
		if _, err := s.multipath(a); err == nil {
			t.Errorf("%s: no error", a)
		}
	}
	a := openflow.Multipath{Fields: openflow.HashNWSrc, Algorithm: openflow.MultipathModuloN, Links: 7, Dst: dst}
	v, err := s.multipath(a)
	if err != nil || v >= 7 {
		t.Errorf("%s = %d, %v", a, v, err)
	}
}
