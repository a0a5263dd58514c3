package openflow

import (
	"bytes"
	"testing"
)

// The actions laid out by hand (appendCommonAction) are byte for byte what libOpenflow encodes.
func TestCommonActionLayoutIsLibOpenflows(t *testing.T) {
	for _, a := range []Action{
		Conjunction{ID: 1, Clause: 1, NClauses: 2}, Conjunction{ID: 0xfedcba98, Clause: 3, NClauses: 3}, Conjunction{ID: 7, Clause: 64, NClauses: 64},
		Load{Dst: Whole(FieldReg0), Value: 0xb}, Load{Dst: Bits(FieldEthDst, 32, 47), Value: 0x0a58}, Load{Dst: Bits(FieldReg3, 1, 1), Value: 1},
		Load{Dst: Whole(FieldTunID), Value: 0xffffffffffff}, Load{Dst: Whole(FieldCtMark), Value: 2},
		Move{Src: Whole(FieldIPDst), Dst: Bits(FieldEthDst, 0, 31)}, Move{Src: Whole(FieldReg0), Dst: Bits(FieldTunID, 0, 31)},
		Move{Src: Whole(FieldARPSHA), Dst: Whole(FieldARPTHA)},
		Output{Port: 3}, Output{Port: PortInPort}, Output{Port: PortController, MaxLen: 128}, Output{Port: 65000, MaxLen: 9},
		ToGroup{ID: 42}, Resubmit{Table: 41},
	} {
		done := false
		if _, done, _ = appendCommonAction(nil, a); !done {
			t.Errorf("%s: not laid out by hand", a)
			continue
		}
		want, err := toLibAction(a)
		if err != nil {
			t.Fatal(err)
		}
		wb, err := want.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendActions(nil, []Action{a})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, wb) {
			t.Errorf("%s: % x, libOpenflow % x", a, got, wb)
		}
	}
	for _, bad := range []Action{
		Conjunction{ID: 1, Clause: 3, NClauses: 2},
		Load{Dst: Bits(FieldReg0, 0, 3), Value: 16},
		Load{Dst: SubField{Field: FieldReg0, Start: 20, End: 40}},
		Move{Src: Whole(FieldReg0), Dst: Bits(FieldEthDst, 0, 15)},
	} {
		if _, err := appendActions(nil, []Action{bad}); err == nil {
			t.Errorf("%s was encoded", bad)
		}
	}
}
