package openflow

import (
	"bytes"
	"testing"
)

// The conjunction action laid out by hand is byte for byte what libOpenflow encodes.
func TestConjunctionLayoutIsLibOpenflows(t *testing.T) {
	for _, c := range []Conjunction{{ID: 1, Clause: 1, NClauses: 2}, {ID: 0xfedcba98, Clause: 3, NClauses: 3}, {ID: 7, Clause: 64, NClauses: 64}} {
		want, err := toLibAction(c)
		if err != nil {
			t.Fatal(err)
		}
		wb, err := want.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendActions(nil, []Action{c})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, wb) {
			t.Errorf("%s: % x, libOpenflow % x", c, got, wb)
		}
	}
	if _, err := appendActions(nil, []Action{Conjunction{ID: 1, Clause: 3, NClauses: 2}}); err == nil {
		t.Error("clause 3/2 was encoded")
	}
}
