package pipeline

import (
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
)

// The port registry is what the classifier renders: every port's packets go to its ingress table
// (the uplink's only when addressed to our uplink MAC), any other port's to pod-ingress; numbers,
// names and roles are each the registry's once.
func TestPortRegistryMatchesTheClassifier(t *testing.T) {
	st := sampleNodeState()
	st.Encapsulation, st.Uplink = EncapNone, true
	owners, err := Render(st)
	if err != nil {
		t.Fatal(err)
	}
	dispatch := map[uint32]TableID{} // in_port → goto of the classifier's highest flow for it
	prio := map[uint32]uint16{}
	var podDefault TableID = NoTable
	for _, os := range owners {
		for _, f := range os.Flows {
			if f.Table != TableClassifier || len(f.Actions) != 1 {
				continue
			}
			g, ok := f.Actions[0].(Goto)
			if !ok {
				continue
			}
			in, ok := f.Match.Get(FieldInPort)
			if !ok {
				if f.Priority == 0 {
					podDefault = g.Table
				}
				continue
			}
			if port := uint32(in.Value); f.Priority >= prio[port] {
				dispatch[port], prio[port] = g.Table, f.Priority
			}
		}
	}
	numbers, names, roles := map[uint32]bool{}, map[string]bool{}, map[PortRole]bool{}
	for _, p := range Ports {
		if numbers[p.Number] || names[p.Name] || roles[p.Role] || p.Role == RolePod {
			t.Errorf("port %+v repeats a number, name or role (or claims the pods' role)", p)
		}
		numbers[p.Number], names[p.Name], roles[p.Role] = true, true, true
		if got, ok := dispatch[p.Number]; !ok || got != p.Ingress {
			t.Errorf("port %s (%d): the classifier sends it to table %d (rendered: %v), the registry says %d", p.Name, p.Number, got, ok, p.Ingress)
		}
		if q, ok := LookupPort(p.Number); !ok || q != p {
			t.Errorf("LookupPort(%d) = %+v, %v", p.Number, q, ok)
		}
		if q, ok := PortNamed(p.Name); !ok || q != p {
			t.Errorf("PortNamed(%q) = %+v, %v", p.Name, q, ok)
		}
		if q, ok := PortOfRole(p.Role); !ok || q != p {
			t.Errorf("PortOfRole(%q) = %+v, %v", p.Role, q, ok)
		}
	}
	if podDefault != TablePodIngress {
		t.Errorf("the classifier sends other ports (pods) to table %d, want %d", podDefault, TablePodIngress)
	}
	if _, ok := LookupPort(3); ok {
		t.Error("a pod's port number is in the registry")
	}
	if got := PortRoles(); len(got) != len(Ports)+1 || got[len(got)-1] != RolePod {
		t.Errorf("PortRoles() = %v, want every registered role and pods'", got)
	}
}
