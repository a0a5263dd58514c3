package pipeline

// One memo mechanism. The Renderer reuses an owner's last render when the key of what that render was
// made from is unchanged: every memoised input type has one key function, keys are comparable values,
// and reuse is one ==. An unchanged owner keeps its very slices, so the agent's comparison with what is
// installed is a pointer check, not a walk through its flows.
//
// A key is a digest of a canonical encoding of the input: every field, in declaration order, lengths
// before contents. The digest is two 64-bit maphash sums with seeds drawn at random for the process:
// an accidental collision is one in 2^128, and nobody outside the process can aim at one. memo_test.go
// changes every field of every memoised input, found by reflection, and fails when the key does not
// change: a field added to an input and forgotten in its key function fails it.

import (
	"hash/maphash"
	"net"
	"net/netip"

	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// digest is a memo key: the digest of an input's canonical encoding.
type digest [2]uint64

var keySeeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

// keyWriter encodes an input canonically into the two hashes of its digest.
type keyWriter struct{ h [2]maphash.Hash }

func (w *keyWriter) init() {
	w.h[0].SetSeed(keySeeds[0])
	w.h[1].SetSeed(keySeeds[1])
}

func (w *keyWriter) bytes(b []byte) {
	w.u64(uint64(len(b)))
	_, _ = w.h[0].Write(b)
	_, _ = w.h[1].Write(b)
}

func (w *keyWriter) str(s string) {
	w.u64(uint64(len(s)))
	_, _ = w.h[0].WriteString(s)
	_, _ = w.h[1].WriteString(s)
}

func (w *keyWriter) u64(v uint64) {
	var b [8]byte
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
	_, _ = w.h[0].Write(b[:])
	_, _ = w.h[1].Write(b[:])
}

func (w *keyWriter) boolean(v bool) {
	if v {
		w.u64(1)
	} else {
		w.u64(0)
	}
}

func (w *keyWriter) addr(a netip.Addr) {
	switch {
	case !a.IsValid():
		w.u64(0)
	case a.Is4():
		b := a.As4()
		w.u64(4)
		_, _ = w.h[0].Write(b[:])
		_, _ = w.h[1].Write(b[:])
	default:
		b := a.As16()
		w.u64(6)
		_, _ = w.h[0].Write(b[:])
		_, _ = w.h[1].Write(b[:])
		w.str(a.Zone())
	}
}

func (w *keyWriter) prefix(p netip.Prefix) {
	w.addr(p.Addr())
	w.u64(uint64(p.Bits() + 1)) // an invalid prefix has -1 bits
}

func (w *keyWriter) mac(m net.HardwareAddr) { w.bytes(m) }

func (w *keyWriter) sum() digest { return digest{w.h[0].Sum64(), w.h[1].Sum64()} }

// keyOf runs a key function on a fresh writer. (The hot paths call their key functions on a writer
// of their own, on the stack: a function value makes the writer escape to the heap.)
func keyOf(write func(w *keyWriter)) digest {
	var w keyWriter
	w.init()
	write(&w)
	return w.sum()
}

// memoKey is the key of a pod's owner: the pod, and whether its isolation flows are rendered.
func (p PodState) memoKey(isolation bool) digest {
	var w keyWriter
	w.init()
	p.writeKey(&w)
	w.boolean(isolation)
	return w.sum()
}

// memoKey is the key of a remote node's owner: the node, and what of this node its flows read.
func (n RemoteNode) memoKey(s *NodeState) digest {
	var w keyWriter
	w.init()
	s.writeRemoteNodeContext(&w)
	n.writeKey(&w)
	return w.sum()
}

// memoKey is the key of a policy's owner.
func (p *PolicyState) memoKey() digest {
	var w keyWriter
	w.init()
	p.writeKey(&w)
	return w.sum()
}

// nodeKey is the key of the node-wide owners.
func (s *NodeState) nodeKey() digest {
	var w keyWriter
	w.init()
	s.writeNodeKey(&w)
	return w.sum()
}

// The key functions, one per memoised input type.

func (p PodState) writeKey(w *keyWriter) {
	w.str(p.Namespace)
	w.str(p.Name)
	w.addr(p.IP)
	w.mac(p.MAC)
	w.u64(uint64(p.OFPort))
	w.u64(uint64(p.VNID))
	w.boolean(p.IngressIsolated)
	w.boolean(p.EgressIsolated)
}

func (n RemoteNode) writeKey(w *keyWriter) {
	w.str(n.Name)
	w.addr(n.NodeIP)
	w.prefix(n.Subnet)
	w.boolean(n.OnSegment)
	w.u64(uint64(len(n.Pods)))
	for _, p := range n.Pods {
		w.addr(p.IP)
		w.u64(uint64(p.VNID))
	}
}

// writeKey of a service leaves its ports out: each port is an owner of its own, keyed with its port.
func (s ServiceState) writeKey(w *keyWriter) {
	w.str(s.Namespace)
	w.str(s.Name)
	w.addr(s.ClusterIP)
	w.u64(uint64(s.AffinityTimeout))
	w.boolean(s.ExternalLocal)
	w.boolean(s.InternalLocal)
}

func (p ServicePort) writeKey(w *keyWriter) {
	w.str(p.Name)
	w.u64(uint64(p.Protocol))
	w.u64(uint64(p.Port))
	w.u64(uint64(p.NodePort))
	w.u64(uint64(len(p.Endpoints)))
	for _, e := range p.Endpoints {
		w.addr(e.IP)
		w.u64(uint64(e.Port))
		w.boolean(e.Ready)
		w.boolean(e.Serving)
		w.boolean(e.Terminating)
		w.str(e.NodeName)
		w.boolean(e.Local)
		w.u64(uint64(e.VNID))
	}
}

func (p *PolicyState) writeKey(w *keyWriter) {
	w.str(p.Namespace)
	w.str(p.Name)
	w.boolean(p.Ingress)
	w.boolean(p.Egress)
	writePolicyPods(w, p.Pods)
	for _, rules := range [][]PolicyRule{p.IngressRules, p.EgressRules} {
		w.u64(uint64(len(rules)))
		for i := range rules {
			writePolicyRule(w, &rules[i])
		}
	}
}

// writeKey of a ClusterNetworkPolicy: its rules' priorities are written next to it by the renderer.
func (p *AdminPolicyState) writeKey(w *keyWriter) {
	w.str(p.Name)
	w.u64(uint64(p.Tier))
	w.u64(uint64(uint32(p.Priority)))
	writePolicyPods(w, p.Pods)
	for _, rules := range [][]AdminRule{p.Ingress, p.Egress} {
		w.u64(uint64(len(rules)))
		for i := range rules {
			w.str(rules[i].Name)
			w.u64(uint64(rules[i].Action))
			writePolicyRule(w, &rules[i].PolicyRule)
		}
	}
}

// writePolicyPods writes the local pods a NetworkPolicy or a ClusterNetworkPolicy selects.
func writePolicyPods(w *keyWriter, pods []PolicyPod) {
	w.u64(uint64(len(pods)))
	for _, pod := range pods {
		w.u64(uint64(pod.OFPort))
		writeNamedPorts(w, pod.NamedPorts)
	}
}

func writePolicyRule(w *keyWriter, r *PolicyRule) {
	w.boolean(r.AllPeers)
	w.u64(uint64(len(r.Peers)))
	for _, peer := range r.Peers {
		w.prefix(peer.Net)
		w.u64(uint64(len(peer.Except)))
		for _, ex := range peer.Except {
			w.prefix(ex)
		}
		writeNamedPorts(w, peer.NamedPorts)
	}
	w.u64(uint64(len(r.Ports)))
	for _, pp := range r.Ports {
		w.u64(uint64(pp.Protocol))
		w.u64(uint64(pp.Port))
		w.u64(uint64(pp.EndPort))
		w.str(pp.Name)
	}
}

func writeNamedPorts(w *keyWriter, ports []NamedPort) {
	w.u64(uint64(len(ports)))
	for _, np := range ports {
		w.str(np.Name)
		w.u64(uint64(np.Protocol))
		w.u64(uint64(np.Port))
	}
}

// writeNodeKey is the key of what the node-wide owners (the pipeline's plumbing, the local subnet, the
// tunnel guard, the services' base flows) and every remote node's flows render from: the node state
// but for the per-owner collections, which have keys of their own (the remote nodes' subnets are in:
// the tunnel guard matches every gateway).
func (s *NodeState) writeNodeKey(w *keyWriter) {
	w.str(string(s.Mode))
	w.str(s.NodeName)
	w.addr(s.NodeIP)
	w.prefix(s.LocalSubnet)
	w.u64(uint64(len(s.ClusterNetworks)))
	for _, cn := range s.ClusterNetworks {
		w.prefix(cn)
	}
	w.u64(uint64(len(s.RemoteNodes)))
	for _, n := range s.RemoteNodes {
		w.prefix(n.Subnet)
	}
	w.u64(uint64(len(s.NodePortAddresses)))
	for _, a := range s.NodePortAddresses {
		w.addr(a)
	}
	w.str(string(s.Encapsulation))
	w.boolean(s.Uplink)
	w.mac(s.GatewayMAC)
	w.u64(uint64(len(s.TunnelPorts)))
	for _, p := range s.TunnelPorts {
		w.u64(uint64(p))
	}
}

// memo is an owner's last render and the key of what it was rendered from.
type memo struct {
	key digest
	out reconcile.OwnerState
}

// memos are a renderer's memos of one kind of owner. Each Render builds the next set from the owners it
// rendered, so owners that went are forgotten.
type memos map[reconcile.Owner]memo

// render returns the last render of o when key is the key it was made from, else render's with its
// drops sampled (drops.go); either way the result is remembered in next.
func (m memos) render(next memos, o reconcile.Owner, key digest, render func() reconcile.OwnerState) reconcile.OwnerState {
	if old, ok := m[o]; ok && old.key == key {
		next[o] = old
		return old.out
	}
	out := render()
	sampleDrops(out.Flows)
	next[o] = memo{key: key, out: out}
	return out
}
