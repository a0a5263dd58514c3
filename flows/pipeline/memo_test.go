package pipeline

import (
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"regexp"
	"strings"
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// The memo's guarantees, held by reflection: a key function reads every field of its input (so a field
// added and forgotten in the key fails here), and a render keyed on part of the node state reads
// nothing else of it (so a render that starts reading another field without its key following fails).

var (
	anyIndex   = regexp.MustCompile(`\[[0-9]+\]`)
	addrType   = reflect.TypeFor[netip.Addr]()
	prefixType = reflect.TypeFor[netip.Prefix]()
	macType    = reflect.TypeFor[net.HardwareAddr]()
)

func isLeaf(t reflect.Type) bool {
	switch t {
	case addrType, prefixType, macType:
		return true
	}
	switch t.Kind() {
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// walk calls visit for every leaf of v, for every slice (its length is a leaf too) and every pointer
// (whether it is nil), with its path.
// Slices of structs recurse into their elements: "Pods[0].IP", "RemoteNodes[].Subnet" when exclude
// patterns use [] for any element.
func walk(v reflect.Value, path string, visit func(path string, leaf reflect.Value)) {
	t := v.Type()
	switch {
	case isLeaf(t):
		visit(path, v)
	case t.Kind() == reflect.Struct:
		for i := range t.NumField() {
			name := t.Field(i).Name
			if path != "" {
				name = path + "." + name
			}
			walk(v.Field(i), name, visit)
		}
	case t.Kind() == reflect.Slice:
		visit(path+"#len", v)
		for i := range v.Len() {
			walk(v.Index(i), fmt.Sprintf("%s[%d]", path, i), visit)
		}
	case t.Kind() == reflect.Pointer:
		visit(path+"#nil", v) // whether it is nil is a leaf too
		if !v.IsNil() {
			walk(v.Elem(), path, visit)
		}
	default:
		panic(fmt.Sprintf("memo test: %s has a field kind it does not know (%s): teach walk", path, t))
	}
}

// fill gives every leaf of v a non-zero value and every slice one element.
func fill(v reflect.Value, n int) {
	t := v.Type()
	switch t {
	case addrType:
		v.Set(reflect.ValueOf(netip.AddrFrom4([4]byte{10, 1, byte(n), 1})))
		return
	case prefixType:
		v.Set(reflect.ValueOf(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(n), 0, 0}), 16)))
		return
	case macType:
		v.Set(reflect.ValueOf(net.HardwareAddr{0x0a, 0x58, 1, 2, 3, byte(n)}))
		return
	}
	switch t.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprint("s", n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(n%100 + 1))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(n%100 + 1))
	case reflect.Struct:
		for i := range t.NumField() {
			fill(v.Field(i), n+i)
		}
	case reflect.Slice:
		s := reflect.MakeSlice(t, 1, 1)
		fill(s.Index(0), n+1)
		v.Set(s)
	case reflect.Pointer:
		p := reflect.New(t.Elem())
		fill(p.Elem(), n+1)
		v.Set(p)
	}
}

// mutate changes a leaf, or a slice's length, or whether a pointer is nil, to another value.
func mutate(v reflect.Value, path string) {
	t := v.Type()
	if strings.HasSuffix(path, "#nil") {
		if v.IsNil() {
			fill(v, 77)
		} else {
			v.SetZero()
		}
		return
	}
	if strings.HasSuffix(path, "#len") {
		e := reflect.New(t.Elem()).Elem()
		fill(e, 77)
		v.Set(reflect.Append(v, e))
		return
	}
	switch t {
	case addrType:
		a := v.Interface().(netip.Addr)
		if !a.IsValid() {
			a = netip.AddrFrom4([4]byte{10, 9, 9, 9})
		}
		v.Set(reflect.ValueOf(a.Next()))
		return
	case prefixType:
		p := v.Interface().(netip.Prefix)
		if !p.IsValid() || p.Bits() >= 32 {
			p = netip.MustParsePrefix("10.200.0.0/16")
		}
		v.Set(reflect.ValueOf(netip.PrefixFrom(p.Addr(), p.Bits()+1).Masked()))
		return
	case macType:
		m := append(net.HardwareAddr(nil), v.Interface().(net.HardwareAddr)...)
		if len(m) == 0 {
			m = net.HardwareAddr{0x0a, 0x58, 0, 0, 0, 0}
		}
		m[len(m)-1]++
		v.Set(reflect.ValueOf(m))
		return
	}
	switch t.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(v.Int() + 1)
	default:
		v.SetUint(v.Uint() + 1)
	}
}

// variants returns, for each leaf and slice of the value fresh() makes, that value with just it changed.
func variants[T any](fresh func() T) (paths []string, out []T) {
	var n int
	x := fresh()
	walk(reflect.ValueOf(&x).Elem(), "", func(string, reflect.Value) { n++ })
	for i := range n {
		y := fresh()
		j := 0
		walk(reflect.ValueOf(&y).Elem(), "", func(path string, leaf reflect.Value) {
			if j == i {
				mutate(leaf, path)
				paths = append(paths, path)
			}
			j++
		})
		out = append(out, y)
	}
	return paths, out
}

// excluded says whether a path is one of patterns: "Pods" covers "Pods#len" and "Pods[3].IP"; "[]"
// stands for any index.
func excluded(path string, patterns []string) bool {
	norm := strings.TrimSuffix(strings.TrimSuffix(anyIndex.ReplaceAllString(path, "[]"), "#len"), "#nil")
	for _, p := range patterns {
		if norm == p || strings.HasPrefix(norm, p+".") || strings.HasPrefix(norm, p+"[]") {
			return true
		}
	}
	return false
}

func filled[T any]() T {
	var x T
	fill(reflect.ValueOf(&x).Elem(), 1)
	return x
}

// TestMemoKeysReadEveryField: changing any field of a memoised input changes its key, but for the
// fields a key leaves out on purpose (each of them said why).
func TestMemoKeysReadEveryField(t *testing.T) {
	t.Run("PodState", func(t *testing.T) {
		checkKeyReadsEveryField(t, func(x PodState) digest { return keyOf(x.writeKey) }, nil)
	})
	t.Run("RemoteNode", func(t *testing.T) {
		checkKeyReadsEveryField(t, func(x RemoteNode) digest { return keyOf(x.writeKey) }, nil)
	})
	t.Run("ServiceState", func(t *testing.T) {
		checkKeyReadsEveryField(t, func(x ServiceState) digest { return keyOf(x.writeKey) },
			[]string{"Ports"}) // each port is an owner of its own, keyed with its port
	})
	t.Run("ServicePort", func(t *testing.T) {
		checkKeyReadsEveryField(t, func(x ServicePort) digest { return keyOf(x.writeKey) }, nil)
	})
	t.Run("PolicyState", func(t *testing.T) {
		checkKeyReadsEveryField(t, func(x PolicyState) digest { return keyOf(x.writeKey) }, nil)
	})
	t.Run("AdminPolicyState", func(t *testing.T) {
		checkKeyReadsEveryField(t, func(x AdminPolicyState) digest { return keyOf(x.writeKey) }, nil)
	})
	t.Run("NetworkState", func(t *testing.T) {
		checkKeyReadsEveryField(t, func(x NetworkState) digest { return keyOf(x.writeKey) }, nil)
	})
	t.Run("AttachmentState", func(t *testing.T) {
		checkKeyReadsEveryField(t, func(x AttachmentState) digest { return keyOf(x.writeKey) }, nil)
	})
	t.Run("NodeState", func(t *testing.T) {
		checkKeyReadsEveryField(t, func(x NodeState) digest { return x.nodeKey() }, nodeKeyLeavesOut)
	})
}

// checkKeyReadsEveryField changes each field of a filled T in turn (but those skip names) and fails
// when key does not change with it.
func checkKeyReadsEveryField[T any](t *testing.T, key func(T) digest, skip []string) {
	t.Helper()
	paths, vs := variants(filled[T])
	base := key(filled[T]())
	for i, v := range vs {
		if excluded(paths[i], skip) {
			continue
		}
		if key(v) == base {
			t.Errorf("%T: changing %s leaves its memo key unchanged: the key function does not read it", v, paths[i])
		}
	}
}

// nodeKeyLeavesOut are the node state's per-owner collections, which have keys of their own; of the
// remote nodes the node key reads the subnets (the tunnel guard matches every gateway). Egress owners
// are rendered afresh every time (egress.go), from Egress, which no node-wide owner reads.
var nodeKeyLeavesOut = []string{"Pods", "Services", "Policies", "AdminPolicies", "RemoteNodes[].Name", "RemoteNodes[].NodeIP",
	"RemoteNodes[].OnSegment", "RemoteNodes[].Pods", "Networks", "Attachments", "Egress"}

// TestRenderDependsOnlyOnKeys: a memoised render is a function of its key. Each field of a real node
// state is changed in turn; whenever an owner's key stays the same, its render must too: a render that
// reads a field its key leaves out fails here.
func TestRenderDependsOnlyOnKeys(t *testing.T) {
	fresh := func() NodeState { // a new state every time: variants changes one leaf of each
		s := sampleNodeState()
		s.Mode, s.Encapsulation, s.Uplink = ModeNetworkPolicy, EncapNone, true
		s.RemoteNodes[0].OnSegment = true
		s.RemoteNodes[0].Pods = []RemotePod{{IP: netip.MustParseAddr("10.128.2.7"), VNID: 11}}
		return s
	}
	base := fresh()
	paths, vs := variants(fresh)
	type keyed struct {
		name   string
		key    func(s NodeState) digest
		render func(s NodeState) string
	}
	owners := []keyed{
		{"a remote node", func(s NodeState) digest {
			return s.RemoteNodes[0].memoKey(&s)
		}, func(s NodeState) string { return flowLines(RenderRemoteNode(s, s.RemoteNodes[0])) }},
		{"a service port", func(s NodeState) digest { return servicePortKey(&s, &s.Services[0], &s.Services[0].Ports[0]) },
			func(s NodeState) string {
				st, err := renderServicePort(s, s.Services[0], s.Services[0].Ports[0], newIDAllocator())
				return fmt.Sprint(flowLines(st.Flows), st.Groups, err)
			}},
	}
	for i := range base.Networks {
		owners = append(owners, keyed{"network " + base.Networks[i].Name, func(s NodeState) digest {
			if i >= len(s.Networks) {
				return digest{}
			}
			return s.Networks[i].memoKey(s.NetworkPeers(&s.Networks[i]))
		}, func(s NodeState) string {
			if i >= len(s.Networks) {
				return ""
			}
			return flowLines(RenderNetwork(s.Networks[i], s.NetworkPeers(&s.Networks[i])))
		}})
	}
	owners = append(owners, keyed{"an attachment", func(s NodeState) digest { return s.Attachments[0].memoKey() },
		func(s NodeState) string { return flowLines(RenderAttachment(s.Attachments[0])) }})
	for name, render := range map[string]func(NodeState) []Flow{"pipeline": renderPipeline, "local": renderLocal,
		"tunnel-guard": renderTunnelGuard, "services-base": renderServicesBase} {
		owners = append(owners, keyed{name, func(s NodeState) digest { return s.nodeKey() },
			func(s NodeState) string { return flowLines(render(s)) }})
	}
	for _, o := range owners {
		baseKey, want := o.key(base), o.render(base)
		for i, s := range vs {
			if len(s.RemoteNodes) == 0 || len(s.Services) == 0 || len(s.Services[0].Ports) == 0 || len(s.Attachments) == 0 {
				continue
			}
			if o.key(s) == baseKey && o.render(s) != want {
				t.Errorf("%s renders differently when %s changes, and its key does not", o.name, paths[i])
			}
		}
	}
}

// TestRendererReusesByKey: an unchanged input keeps its owner's very slices; a changed one gets a
// fresh render.
func TestRendererReusesByKey(t *testing.T) {
	s := sampleNodeState()
	s.Mode = ModeNetworkPolicy
	var r Renderer
	first, _, err := r.Render(s)
	if err != nil {
		t.Fatal(err)
	}
	second, _, err := r.Render(s)
	if err != nil {
		t.Fatal(err)
	}
	same := func(a, b reconcile.OwnerState) bool {
		return len(a.Flows) > 0 && len(a.Flows) == len(b.Flows) && &a.Flows[0] == &b.Flows[0]
	}
	for o, st := range first {
		if len(st.Flows) > 0 && !same(st, second[o]) {
			t.Errorf("%s rendered again with nothing changed", o)
		}
	}
	s.Pods = append([]PodState(nil), s.Pods...)
	s.Pods[0].VNID++
	third, _, err := r.Render(s)
	if err != nil {
		t.Fatal(err)
	}
	changed := PodOwner(s.Pods[0].Namespace, s.Pods[0].Name)
	for o, st := range second {
		if got := same(st, third[o]); got == (o == changed) && len(st.Flows) > 0 {
			t.Errorf("%s reused: %v, want %v", o, got, o != changed)
		}
	}
}
