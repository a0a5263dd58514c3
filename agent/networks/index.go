// Package networks is the agent's view of Networks (network.ofsdn.io): which Networks exist, each node's
// subnet of them, which namespaces each admits, and what a pod asks for in its
// k8s.v1.cni.cncf.io/networks annotation. It turns them into the pipeline's NetworkStates and
// AttachmentStates (flows/pipeline/networks.go renders them) and into what the CNI side needs to attach
// a pod (Placement), and says, in words an operator can act on, why a pod cannot attach.
//
// The Index is plain data with no lock and no I/O: the agent keeps one in its node view and edits it
// from its informers under the view's lock (Watch, watch.go, through View). PodRequests answers the CNI
// side's questions about a pod's Networks. Reporter (report.go) carries what the node did back to the
// API: NetworkSubnet status and the pods' network-status annotations.
package networks

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Network is a Network as the agent reads it.
type Network struct {
	Name string
	VNI  uint32 // status.vni: 0 until the controller assigned one
	CIDR netip.Prefix
	MTU  int // 0: the cluster network's
	// CrossTalk is status.crossTalk: the networks it exchanges traffic with.
	CrossTalk []string
	// Deleting: deleted, waiting for its attachments to go (no new ones).
	Deleting bool
	selector labels.Selector
}

// Subnet is one node's subnet of a Network.
type Subnet struct {
	Network, Node string
	HostIP        netip.Addr
	Subnet        netip.Prefix
}

// Index holds the Networks, their nodes' subnets and the namespaces' labels.
type Index struct {
	nets map[string]*Network
	// subnets by network, then node; byName maps a NetworkSubnet's name to its network and node.
	subnets map[string]map[string]Subnet
	byName  map[string]Subnet
	nsLabel map[string]labels.Set
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{nets: map[string]*Network{}, subnets: map[string]map[string]Subnet{}, byName: map[string]Subnet{}, nsLabel: map[string]labels.Set{}}
}

// SetNetwork files a Network; one the agent cannot use (a malformed CIDR or selector) is removed and the
// error says why, so its pods lose their traffic rather than get the wrong network's.
func (x *Index) SetNetwork(n *networkv1.Network) error {
	cidr, err := netip.ParsePrefix(string(n.Spec.CIDR))
	if err == nil && (!cidr.Addr().Is4() || cidr != cidr.Masked()) {
		err = fmt.Errorf("want an IPv4 network address, like %s", cidr.Masked())
	}
	if err != nil {
		delete(x.nets, n.Name)
		return fmt.Errorf("network %s: cidr %q: %w", n.Name, n.Spec.CIDR, err)
	}
	sel, err := metav1.LabelSelectorAsSelector(&n.Spec.NamespaceSelector)
	if err != nil {
		delete(x.nets, n.Name)
		return fmt.Errorf("network %s: namespaceSelector: %w", n.Name, err)
	}
	vni := n.Status.VNI
	if vni != 0 && !pipeline.IsNetworkVNI(vni) {
		delete(x.nets, n.Name)
		return fmt.Errorf("network %s: status.vni %d outside the networks' range %d-%d", n.Name, vni, networkv1.MinNetworkVNI, networkv1.MaxNetworkVNI)
	}
	talk := slices.Clone(n.Status.CrossTalk)
	sort.Strings(talk)
	x.nets[n.Name] = &Network{Name: n.Name, VNI: vni, CIDR: cidr, MTU: int(n.Spec.MTU), CrossTalk: slices.Compact(talk),
		Deleting: n.DeletionTimestamp != nil, selector: sel}
	return nil
}

// DeleteNetwork forgets a Network.
func (x *Index) DeleteNetwork(name string) { delete(x.nets, name) }

// SetSubnet files a NetworkSubnet; a malformed one is removed and the error says why.
func (x *Index) SetSubnet(s *networkv1.NetworkSubnet) error {
	x.DeleteSubnet(s.Name)
	subnet, err := netip.ParsePrefix(string(s.Subnet))
	if err == nil && (!subnet.Addr().Is4() || subnet.Bits() > 30) {
		err = errors.New("want an IPv4 prefix of /30 or larger")
	}
	if err != nil {
		return fmt.Errorf("NetworkSubnet %s: subnet %q: %w", s.Name, s.Subnet, err)
	}
	host, err := netip.ParseAddr(s.HostIP)
	if err != nil || !host.Is4() {
		return fmt.Errorf("NetworkSubnet %s: hostIP %q is no IPv4 address", s.Name, s.HostIP)
	}
	sub := Subnet{Network: s.Network, Node: s.Node, HostIP: host, Subnet: subnet.Masked()}
	if x.subnets[s.Network] == nil {
		x.subnets[s.Network] = map[string]Subnet{}
	}
	x.subnets[s.Network][s.Node] = sub
	x.byName[s.Name] = sub
	return nil
}

// DeleteSubnet forgets a NetworkSubnet by name.
func (x *Index) DeleteSubnet(name string) {
	s, ok := x.byName[name]
	if !ok {
		return
	}
	delete(x.byName, name)
	if m := x.subnets[s.Network]; m != nil && m[s.Node] == s {
		delete(m, s.Node)
		if len(m) == 0 {
			delete(x.subnets, s.Network)
		}
	}
}

// SetNamespace files a namespace's labels; it reports whether admission may have changed.
func (x *Index) SetNamespace(name string, l map[string]string) bool {
	if old, ok := x.nsLabel[name]; ok && maps.Equal(old, labels.Set(l)) {
		return false
	}
	x.nsLabel[name] = maps.Clone(labels.Set(l))
	return len(x.nets) > 0
}

// DeleteNamespace forgets a namespace.
func (x *Index) DeleteNamespace(name string) { delete(x.nsLabel, name) }

// Network returns a Network by name.
func (x *Index) Network(name string) (Network, bool) {
	n, ok := x.nets[name]
	if !ok {
		return Network{}, false
	}
	return *n, true
}

// Names lists the Networks by name.
func (x *Index) Names() []string { return slices.Sorted(maps.Keys(x.nets)) }

// SubnetsOf lists the Networks a node has a subnet of.
func (x *Index) SubnetsOf(node string) []string {
	var out []string
	for network, m := range x.subnets {
		if _, ok := m[node]; ok {
			out = append(out, network)
		}
	}
	sort.Strings(out)
	return out
}

// ErrNotAdmitted says a Network does not admit a pod's namespace.
var ErrNotAdmitted = errors.New("not admitted")

// ErrUnavailable says a Network cannot take attachments on this node now (no VNI or subnet yet, being
// deleted, unknown): the CNI error says which.
var ErrUnavailable = errors.New("network unavailable")

// Placement is what a pod needs to attach to a Network on this node.
type Placement struct {
	Network string
	VNI     uint32
	CIDR    netip.Prefix // reached on-link
	Subnet  netip.Prefix // this node's: addresses come from it
	Gateway netip.Addr   // this node's gateway on the network, for Routes
	// Routes are the cross-talk peers' CIDRs, reached through Gateway.
	Routes []netip.Prefix
	MTU    int // 0: the cluster network's
}

// Placement says how a pod of namespace attaches to network on node, or why it cannot: ErrNotAdmitted
// or ErrUnavailable, wrapped in a message an operator can act on.
func (x *Index) Placement(network, namespace, node string) (Placement, error) {
	n, ok := x.nets[network]
	switch {
	case !ok:
		return Placement{}, fmt.Errorf("%w: Network %q does not exist", ErrUnavailable, network)
	case n.Deleting:
		return Placement{}, fmt.Errorf("%w: Network %q is being deleted", ErrUnavailable, network)
	case n.VNI == 0:
		return Placement{}, fmt.Errorf("%w: Network %q has no VNI yet (is ofsdn-controller running? see the Network's conditions)", ErrUnavailable, network)
	case !n.selector.Matches(x.nsLabel[namespace]):
		return Placement{}, fmt.Errorf("%w: Network %q does not admit namespace %q (its namespaceSelector is %s)", ErrNotAdmitted, network, namespace, n.selector)
	}
	sub, ok := x.subnets[network][node]
	if !ok {
		return Placement{}, fmt.Errorf("%w: Network %q has no subnet on node %s yet (its CIDR %s may be too small for the nodes: see the Network's SubnetsAvailable condition)",
			ErrUnavailable, network, node, n.CIDR)
	}
	p := Placement{Network: network, VNI: n.VNI, CIDR: n.CIDR, Subnet: sub.Subnet, Gateway: pipeline.Gateway(sub.Subnet), MTU: n.MTU}
	states := x.States(node)
	for i := range states {
		if states[i].Name == network {
			st := pipeline.NodeState{Networks: states}
			for _, peer := range st.NetworkPeers(&st.Networks[i]) {
				p.Routes = append(p.Routes, peer.CIDR)
			}
		}
	}
	return p, nil
}

// States are the Networks as node renders them: those with a VNI, this node's subnet and the other
// nodes' (a Network being deleted keeps its flows until its last attachment goes).
func (x *Index) States(node string) []pipeline.NetworkState {
	out := make([]pipeline.NetworkState, 0, len(x.nets))
	for _, n := range x.nets {
		if n.VNI == 0 {
			continue
		}
		st := pipeline.NetworkState{Name: n.Name, VNI: n.VNI, CIDR: n.CIDR, CrossTalk: slices.Clone(n.CrossTalk)}
		for name, s := range x.subnets[n.Name] {
			if name == node {
				st.LocalSubnet = s.Subnet
				continue
			}
			st.Remotes = append(st.Remotes, pipeline.NetworkRemote{Node: name, NodeIP: s.HostIP, Subnet: s.Subnet})
		}
		out = append(out, st)
	}
	pipeline.SortNetworks(out)
	return out
}

// Attachment is a local pod's interface on a Network, as the CNI side filed it.
type Attachment = pipeline.AttachmentState

// Carrying returns the attachments that carry traffic: their Network renders on this node (it has a
// VNI), and admits their namespace. An attachment of a namespace the Network no longer admits keeps its
// interface and address but gets no flows. Each gets its Network's VNI.
func (x *Index) Carrying(atts []Attachment) []Attachment {
	out := make([]Attachment, 0, len(atts))
	for _, a := range atts {
		if x.WhyNotCarrying(a) != "" {
			continue
		}
		a.VNI = x.nets[a.Network].VNI
		out = append(out, a)
	}
	return out
}

// WhyNotCarrying says why Carrying leaves an attachment out, in words for an operator ("" when it
// keeps it).
func (x *Index) WhyNotCarrying(a Attachment) string {
	n, ok := x.nets[a.Network]
	switch {
	case !ok:
		return fmt.Sprintf("Network %s does not exist here (deleted, or its spec is invalid)", a.Network)
	case n.VNI == 0:
		return fmt.Sprintf("Network %s has no VNI yet", a.Network)
	case !n.selector.Matches(x.nsLabel[a.Namespace]):
		return fmt.Sprintf("Network %s does not admit namespace %s (its namespaceSelector is %s)", a.Network, a.Namespace, n.selector)
	}
	return ""
}
