package egress

import (
	"net/netip"
	"slices"
	"sort"
	"sync"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/egressplan"
)

// Egress IPs and egress firewalls on the node (flows/pipeline/egress.go has the data path, the Job the
// membership that decides who holds each IP): the informers (Watch) put NetNamespaces, HostSubnets,
// EgressNetworkPolicies and the cluster network into the Inputs; every change derives the plan
// (egressplan) and the pipeline's EgressState at once, under the inputs' own lock, so the agent's
// snapshot only copies it (Fill). Lock order: the agent view's, then the inputs'.

// Inputs are the API objects egress depends on and what is derived from them. The agent's view holds
// them and fills each snapshot from them; Watch and the Job's flows change them through View.Change.
type Inputs struct {
	mu       sync.Mutex
	netns    map[string]*networkv1.NetNamespace
	subnets  map[string]*networkv1.HostSubnet
	policies map[string]*networkv1.EgressNetworkPolicy // namespace/name
	spec     networkv1.ClusterNetworkSpec
	// resolved are the addresses of the firewalls' DNS names (Resolver).
	resolved map[string][]netip.Addr
	// held are the egress IPs this node holds (the membership's claims).
	held []netip.Addr
	// port is the membership's UDP port, which no pod may send to (the tunnel guard's ports).
	port uint16

	plan  egressplan.Plan
	state pipeline.EgressState // without Held
	names []string             // the DNS names the firewalls use, sorted
}

// NewInputs are empty inputs; port is the membership's UDP port, guarded against pods once anything
// egress exists.
func NewInputs(port uint16) *Inputs {
	return &Inputs{netns: map[string]*networkv1.NetNamespace{}, subnets: map[string]*networkv1.HostSubnet{},
		policies: map[string]*networkv1.EgressNetworkPolicy{}, resolved: map[string][]netip.Addr{}, port: port}
}

// Fill puts the node's egress state into a snapshot: the state, the held IPs, the membership's port
// among the guarded ones.
func (e *Inputs) Fill(st *pipeline.NodeState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st.Egress = e.state
	st.Egress.Namespaces = slices.Clone(e.state.Namespaces)
	st.Egress.Held = slices.Clone(e.held)
	if e.port != 0 && len(e.state.Namespaces) > 0 && !slices.Contains(st.TunnelPorts, e.port) {
		st.TunnelPorts = append(st.TunnelPorts, e.port)
	}
}

// derive recomputes the plan and the pipeline's state. e.mu is held.
func (e *Inputs) derive() {
	hss := make([]*networkv1.HostSubnet, 0, len(e.subnets))
	for _, hs := range e.subnets {
		hss = append(hss, hs)
	}
	nns := make([]*networkv1.NetNamespace, 0, len(e.netns))
	for _, nn := range e.netns {
		nns = append(nns, nn)
	}
	e.plan = egressplan.FromAPI(hss, nns, e.spec)
	byNamespace := map[string]*pipeline.EgressNamespace{}
	get := func(ns string) *pipeline.EgressNamespace {
		if byNamespace[ns] == nil {
			byNamespace[ns] = &pipeline.EgressNamespace{Name: ns}
		}
		return byNamespace[ns]
	}
	for ns, ips := range e.plan.Namespaces {
		en := get(ns)
		en.IPs = e.plan.Usable(ns)
		en.NoUsableIP = len(ips) > 0 && len(en.IPs) == 0
	}
	perNamespace := map[string][]*networkv1.EgressNetworkPolicy{}
	for _, p := range e.policies {
		perNamespace[p.Namespace] = append(perNamespace[p.Namespace], p)
	}
	var names []string
	for ns, ps := range perNamespace {
		sort.Slice(ps, func(i, j int) bool { return ps[i].Name < ps[j].Name })
		fw := &pipeline.EgressFirewall{Policy: ps[0].Name}
		rules, err := egressplan.ParsePolicy(ps[0].Spec)
		if len(ps) > 1 || err != nil {
			fw.DenyAll = true // as the controller reports it (MultiplePolicies, InvalidRule)
		}
		for _, r := range rules {
			er := pipeline.EgressRule{Allow: r.Allow, DNSName: r.DNSName}
			if r.DNSName != "" {
				names = append(names, r.DNSName)
				for _, a := range e.resolved[r.DNSName] {
					er.Dsts = append(er.Dsts, netip.PrefixFrom(a, 32))
				}
			} else {
				er.Dsts = []netip.Prefix{r.CIDR}
			}
			fw.Rules = append(fw.Rules, er)
		}
		get(ns).Firewall = fw
	}
	slices.Sort(names)
	e.names = slices.Compact(names)
	e.state = pipeline.EgressState{}
	if sn, err := netip.ParsePrefix(string(e.spec.ServiceNetwork)); err == nil {
		e.state.ServiceNetwork = sn.Masked()
	}
	for _, en := range byNamespace {
		e.state.Namespaces = append(e.state.Namespaces, *en)
	}
	sort.Slice(e.state.Namespaces, func(i, j int) bool { return e.state.Namespaces[i].Name < e.state.Namespaces[j].Name })
}

// Egress is the membership's view of the API (Cluster).
func (e *Inputs) Egress() (egressplan.Plan, map[string]netip.Addr, map[netip.Addr]string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	nodes := make(map[string]netip.Addr, len(e.subnets))
	for _, hs := range e.subnets {
		if ip, err := netip.ParseAddr(hs.HostIP); err == nil {
			nodes[hs.Host] = ip
		}
	}
	placed := map[netip.Addr]string{}
	for _, nn := range e.netns {
		for _, s := range nn.Status.EgressIPs {
			if ip, err := netip.ParseAddr(string(s.IP)); err == nil && s.AssignedNode != "" {
				placed[ip] = s.AssignedNode
			}
		}
	}
	return e.plan, nodes, placed
}

// Owners are the egress owners of a namespace's flows, for a CNI ADD to wait on.
func (e *Inputs) Owners(namespace string) []reconcile.Owner {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, en := range e.state.Namespaces {
		if en.Name != namespace {
			continue
		}
		out := []reconcile.Owner{pipeline.EgressNamespaceOwner(namespace)}
		if en.Firewall != nil {
			out = append(out, pipeline.EgressFirewallOwner(namespace, en.Firewall.Policy))
		}
		return out
	}
	return nil
}

// DNSNames are the DNS names the firewalls use.
func (e *Inputs) DNSNames() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.names)
}
