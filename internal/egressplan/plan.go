// Package egressplan is the model of egress IPs and egress firewalls that the controller and the agents
// share, so that they judge the same API objects the same way: which egress IPs are usable and which
// nodes may hold each (Build), the order in which nodes are chosen to hold one (Rank, Choose), and what an
// EgressNetworkPolicy's rules mean (ParsePolicy). It is pure: objects in, decisions out.
package egressplan

import (
	"cmp"
	"hash/fnv"
	"net/netip"
	"slices"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
)

// Node is what a HostSubnet offers: its address, and the egress IPs it may hold by name (manual) or by
// range (automatic).
type Node struct {
	Name        string
	IP          netip.Addr
	EgressIPs   []netip.Addr
	EgressCIDRs []netip.Prefix
}

// Namespace is a NetNamespace's egress IPs, in the order it lists them.
type Namespace struct {
	Name      string
	EgressIPs []netip.Addr
}

// IP is one egress IP as the plan judges it.
type IP struct {
	Addr netip.Addr
	// Namespaces claiming it, sorted; more than one is a conflict.
	Namespaces []string
	// Eligible are the nodes that may hold it, sorted by name.
	Eligible []string
	// Reason is "" for a usable IP, else the NetNamespace condition reason that says why it is not
	// (networkv1.ReasonEgressIP*); traffic that would use it is dropped.
	Reason string
}

// Usable reports whether the IP can be held at all.
func (ip *IP) Usable() bool { return ip.Reason == "" }

// Plan is the cluster's egress IPs.
type Plan struct {
	// IPs by address.
	IPs map[netip.Addr]*IP
	// Namespaces are the egress IPs of every namespace that has some, in the NetNamespace's order.
	Namespaces map[string][]netip.Addr
}

// Build judges every namespace's egress IPs against the nodes and the addresses inside the cluster
// (the cluster and service networks; nodes' own addresses are added from nodes). An IP is unusable when
// two namespaces claim it (neither gets it, as in openshift-sdn), when it lies inside the cluster, or
// when no node may hold it.
func Build(namespaces []Namespace, nodes []Node, inside []netip.Prefix) Plan {
	p := Plan{IPs: map[netip.Addr]*IP{}, Namespaces: map[string][]netip.Addr{}}
	nodeIPs := map[netip.Addr]bool{}
	for _, n := range nodes {
		nodeIPs[n.IP] = true
	}
	for _, ns := range namespaces {
		var ips []netip.Addr
		for _, a := range ns.EgressIPs {
			if !a.Is4() || slices.Contains(ips, a) {
				continue
			}
			ips = append(ips, a)
			ip := p.IPs[a]
			if ip == nil {
				ip = &IP{Addr: a}
				p.IPs[a] = ip
			}
			if !slices.Contains(ip.Namespaces, ns.Name) {
				ip.Namespaces = append(ip.Namespaces, ns.Name)
			}
		}
		if len(ips) > 0 {
			p.Namespaces[ns.Name] = ips
		}
	}
	for a, ip := range p.IPs {
		slices.Sort(ip.Namespaces)
		for _, n := range nodes {
			if n.IP != a && mayHold(n, a) {
				ip.Eligible = append(ip.Eligible, n.Name)
			}
		}
		slices.Sort(ip.Eligible)
		ip.Eligible = slices.Compact(ip.Eligible)
		insideCluster := nodeIPs[a]
		for _, pfx := range inside {
			insideCluster = insideCluster || pfx.Contains(a)
		}
		switch {
		case len(ip.Namespaces) > 1:
			ip.Reason = networkv1.ReasonEgressIPConflict
		case insideCluster:
			ip.Reason = networkv1.ReasonEgressIPInsideCluster
		case len(ip.Eligible) == 0:
			ip.Reason = networkv1.ReasonEgressIPNoEligibleNode
		}
	}
	return p
}

func mayHold(n Node, a netip.Addr) bool {
	if slices.Contains(n.EgressIPs, a) {
		return true
	}
	for _, c := range n.EgressCIDRs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}

// Usable returns a namespace's usable egress IPs in its order.
func (p Plan) Usable(namespace string) []netip.Addr {
	var out []netip.Addr
	for _, a := range p.Namespaces[namespace] {
		if p.IPs[a].Usable() {
			out = append(out, a)
		}
	}
	return out
}

// score is a node's rendezvous weight for an IP: FNV-1a of the IP's four bytes and the node's name,
// through SplitMix64's finalizer (FNV alone barely moves its high bits for names that differ in their
// last byte: node-10 and node-11 won a quarter of all IPs each among 12 nodes). Part of the protocol
// between agents (they must agree without talking): never change it.
func score(ip netip.Addr, node string) uint64 {
	h := fnv.New64a()
	b := ip.As4()
	_, _ = h.Write(b[:])
	_, _ = h.Write([]byte(node))
	x := h.Sum64()
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// Rank orders nodes by their rendezvous weight for ip, best first (ties by name): the same list on every
// agent, and removing a node moves only the IPs that node was first for.
func Rank(ip netip.Addr, nodes []string) []string {
	out := slices.Clone(nodes)
	slices.SortFunc(out, func(a, b string) int {
		if c := cmp.Compare(score(ip, b), score(ip, a)); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	return out
}

// Choose picks the node to hold ip among eligible ones that live reports up: current when it is (a
// holder keeps its IPs while it lives, so a node that comes back takes nothing back), else preferred
// when it is (the controller's placement), else the first of Rank. "" when none is.
func Choose(ip netip.Addr, eligible []string, live func(string) bool, current, preferred string) string {
	for _, n := range []string{current, preferred} {
		if n != "" && live(n) && slices.Contains(eligible, n) {
			return n
		}
	}
	for _, n := range Rank(ip, eligible) {
		if live(n) {
			return n
		}
	}
	return ""
}

// FromAPI builds the plan of the cluster's egress IPs from HostSubnets, NetNamespaces and the cluster
// network (the controller, the agents and flowctl read them from their listers).
func FromAPI(hss []*networkv1.HostSubnet, nns []*networkv1.NetNamespace, spec networkv1.ClusterNetworkSpec) Plan {
	var inside []netip.Prefix
	for _, c := range append(slices.Clone(spec.ClusterCIDRs), spec.ServiceNetwork) {
		if p, err := netip.ParsePrefix(string(c)); err == nil {
			inside = append(inside, p.Masked())
		}
	}
	nodes := make([]Node, 0, len(hss))
	for _, hs := range hss {
		n := Node{Name: hs.Host}
		n.IP, _ = netip.ParseAddr(hs.HostIP)
		for _, a := range hs.EgressIPs {
			if ip, err := netip.ParseAddr(string(a)); err == nil {
				n.EgressIPs = append(n.EgressIPs, ip)
			}
		}
		for _, s := range hs.EgressCIDRs {
			if p, err := netip.ParsePrefix(string(s)); err == nil && p.Addr().Is4() {
				n.EgressCIDRs = append(n.EgressCIDRs, p.Masked())
			}
		}
		nodes = append(nodes, n)
	}
	namespaces := make([]Namespace, 0, len(nns))
	for _, nn := range nns {
		if len(nn.EgressIPs) == 0 {
			continue
		}
		ns := Namespace{Name: nn.Name}
		for _, a := range nn.EgressIPs {
			if ip, err := netip.ParseAddr(string(a)); err == nil {
				ns.EgressIPs = append(ns.EgressIPs, ip)
			}
		}
		namespaces = append(namespaces, ns)
	}
	return Build(namespaces, nodes, inside)
}
