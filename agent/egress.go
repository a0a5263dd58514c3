package agent

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ofsdn/ofsdn/agent/egress"
	"github.com/ofsdn/ofsdn/agent/nodenet"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/egressplan"
	"github.com/ofsdn/ofsdn/unixctl"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// Egress IPs and egress firewalls on the node (flows/pipeline/egress.go has the data path,
// agent/egress the membership that decides who holds each IP): the informers put NetNamespaces,
// HostSubnets, EgressNetworkPolicies and the cluster network here; every change derives the plan
// (egressplan) and the pipeline's EgressState at once, under the inputs' own lock, so a flow sync
// only copies it. Lock order: the view's, then the inputs'.

// egressInputs are the API objects egress depends on and what is derived from them.
type egressInputs struct {
	mu       sync.Mutex
	netns    map[string]*networkv1.NetNamespace
	subnets  map[string]*networkv1.HostSubnet
	policies map[string]*networkv1.EgressNetworkPolicy // namespace/name
	spec     networkv1.ClusterNetworkSpec
	// resolved are the addresses of the firewalls' DNS names (dnsResolver).
	resolved map[string][]netip.Addr
	// held are the egress IPs this node holds (the membership's claims).
	held []netip.Addr
	// port is the membership's UDP port, which no pod may send to (the tunnel guard's ports).
	port uint16

	plan  egressplan.Plan
	state pipeline.EgressState // without Held
	names []string             // the DNS names the firewalls use, sorted
}

func newEgressInputs() *egressInputs {
	return &egressInputs{netns: map[string]*networkv1.NetNamespace{}, subnets: map[string]*networkv1.HostSubnet{},
		policies: map[string]*networkv1.EgressNetworkPolicy{}, resolved: map[string][]netip.Addr{}}
}

// fill puts the node's egress state into a snapshot: the state, the held IPs, the membership's port
// among the guarded ones.
func (e *egressInputs) fill(st *pipeline.NodeState) {
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
func (e *egressInputs) derive() {
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

// Egress is the membership's view of the API (egress.Cluster).
func (e *egressInputs) Egress() (egressplan.Plan, map[string]netip.Addr, map[netip.Addr]string) {
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

// owners are the egress owners of a namespace's flows, for a CNI ADD to wait on.
func (e *egressInputs) owners(namespace string) []reconcile.Owner {
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

// watchEgress feeds the egress inputs from the informers.
type watchEgress struct {
	view *nodeView
	sync *flowSync
	// changed is told after every change (the membership and the status writer look again).
	changed func()
}

func (w *watchEgress) apply(f func(e *egressInputs)) {
	w.view.update(func(v *nodeView) {
		v.egress.mu.Lock()
		defer v.egress.mu.Unlock()
		f(v.egress)
		v.egress.derive()
	})
	w.sync.Trigger()
	if w.changed != nil {
		w.changed()
	}
}

func (w *watchEgress) netNamespace(obj any, deleted bool) {
	nn, ok := obj.(*networkv1.NetNamespace)
	if !ok {
		return
	}
	w.apply(func(e *egressInputs) {
		if deleted {
			delete(e.netns, nn.Name)
		} else {
			e.netns[nn.Name] = nn
		}
	})
}

func (w *watchEgress) hostSubnet(obj any, deleted bool) {
	hs, ok := obj.(*networkv1.HostSubnet)
	if !ok {
		return
	}
	w.apply(func(e *egressInputs) {
		if deleted {
			delete(e.subnets, hs.Name)
		} else {
			e.subnets[hs.Name] = hs
		}
	})
}

func (w *watchEgress) policy(obj any, deleted bool) {
	p, ok := obj.(*networkv1.EgressNetworkPolicy)
	if !ok {
		return
	}
	key := p.Namespace + "/" + p.Name
	w.apply(func(e *egressInputs) {
		if deleted {
			delete(e.policies, key)
		} else {
			e.policies[key] = p
		}
	})
}

func (w *watchEgress) clusterNetwork(obj any, deleted bool) {
	cn, ok := obj.(*networkv1.ClusterNetwork)
	if !ok || deleted || cn.Name != networkv1.ClusterNetworkName {
		return
	}
	w.apply(func(e *egressInputs) { e.spec = cn.Spec })
}

// egressFlows is the membership's way into br0's flows: the held IPs into the view, then the sync.
type egressFlows struct {
	view *nodeView
	sync *flowSync
}

func (f egressFlows) SetHeld(ctx context.Context, held []netip.Addr) error {
	gen := f.setHeld(held)
	_, err := f.sync.syncThrough(ctx, gen, pipeline.EgressOwner)
	return err
}

// setHeld puts the held IPs into the view and returns the generation that has them.
func (f egressFlows) setHeld(held []netip.Addr) uint64 {
	return f.view.update(func(v *nodeView) {
		v.egress.mu.Lock()
		v.egress.held = slices.Clone(held)
		v.egress.mu.Unlock()
	})
}

// egressAwareFlows is what attachments wait on: a pod's flows, and its namespace's egress flows, so
// no packet of a new pod leaves before its egress IP and firewall apply.
type egressAwareFlows struct {
	*flowSync
	egress *egressInputs
}

func (f egressAwareFlows) SyncThrough(ctx context.Context, gen uint64, owners ...reconcile.Owner) error {
	all := slices.Clone(owners)
	for _, o := range owners {
		if obj, ok := pipeline.ObjectOf(o); ok && obj.Kind == pipeline.KindPod && obj.Interface == "" {
			all = append(all, f.egress.owners(obj.Namespace)...)
		}
	}
	return f.flowSync.SyncThrough(ctx, gen, all...)
}

// egressHost is the node's side of holding an egress IP, through nodenet.
type egressHost struct {
	view *nodeView
	cfg  nodenet.EgressConfig
	// ovs is ovs-vswitchd's control socket on the userspace datapath, nil on the kernel's.
	ovs *unixctl.Client
}

func (h egressHost) NodeIP() netip.Addr {
	ip, _, _ := h.view.addressing()
	return ip
}
func (h egressHost) EnsureSNAT(held []netip.Addr) error { return nodenet.EnsureEgressSNAT(h.cfg, held) }
func (h egressHost) AddAddress(ip netip.Addr) error {
	return nodenet.AddEgressAddress(h.cfg.HostNetNS, h.NodeIP(), ip)
}
func (h egressHost) DelAddress(ip netip.Addr) error {
	return nodenet.DelEgressAddress(h.cfg.HostNetNS, h.NodeIP(), ip)
}
func (h egressHost) Announce(ip netip.Addr) error {
	return nodenet.AnnounceAddress(h.cfg.HostNetNS, h.NodeIP(), ip)
}
func (h egressHost) UplinkAddresses() ([]netip.Addr, error) {
	nodeIP := h.NodeIP()
	_, ps, err := nodenet.UplinkAddresses(h.cfg.HostNetNS, nodeIP)
	out := make([]netip.Addr, 0, len(ps))
	for _, p := range ps {
		if p.Addr() != nodeIP {
			out = append(out, p.Addr())
		}
	}
	return out, err
}
func (h egressHost) ListenUDP(addr netip.AddrPort) (*net.UDPConn, error) {
	return nodenet.ListenUDP(h.cfg.HostNetNS, addr)
}
func (h egressHost) UplinkMAC() (net.HardwareAddr, error) {
	name, err := nodenet.Uplink(h.cfg.HostNetNS, h.NodeIP())
	if err != nil {
		return nil, err
	}
	return nodenet.LinkMAC(h.cfg.HostNetNS, name)
}

// SetTunnelNeighbor sets ovs-vswitchd's tunnel next hop for ip (userspace datapath only: the kernel
// datapath's tunnels use the kernel's neighbour table, which every gratuitous ARP updates).
func (h egressHost) SetTunnelNeighbor(ip netip.Addr, mac net.HardwareAddr) error {
	if h.ovs == nil {
		return nil
	}
	bridge, err := nodenet.Uplink(h.cfg.HostNetNS, h.NodeIP())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return h.ovs.SetTunnelNeighbor(ctx, bridge, ip, mac)
}

// egressReporter tells the API: the holder in NetNamespace status, and a Warning Event on the
// NetNamespace of an IP no live node may hold.
type egressReporter struct {
	status *egress.StatusWriter
	inputs *egressInputs
	events record.EventRecorder
	node   string
	log    klog.Logger
}

func (r egressReporter) Held(held []netip.Addr) { r.status.Held(held) }

func (r egressReporter) Unheld(ips []netip.Addr) {
	plan, _, _ := r.inputs.Egress()
	for _, ip := range ips {
		info := plan.IPs[ip]
		if info == nil {
			continue
		}
		msg := fmt.Sprintf("no live node may hold egress IP %s (nodes that may: %s): the namespace's connections through it are dropped until one is back",
			ip, strings.Join(info.Eligible, ", "))
		r.log.Info("egress IP unheld", "ip", ip, "eligible", info.Eligible)
		for _, ns := range info.Namespaces {
			if r.events != nil {
				r.events.Eventf(&corev1.ObjectReference{Kind: "NetNamespace", APIVersion: networkv1.SchemeGroupVersion.String(), Name: ns},
					corev1.EventTypeWarning, "EgressIPUnheld", "%s (reported by %s)", msg, r.node)
			}
		}
	}
}

// newEgress builds the egress job, its status writer and the informers' handlers (New calls it once
// the view, the flow sync and the event recorder exist).
func (a *Agent) newEgress() *watchEgress {
	cfg := a.cfg
	a.view.egress.port = uint16(cmp.Or(cfg.EgressPort, egress.DefaultPort))
	lister := a.netInformers.Network().V1().NetNamespaces().Lister()
	a.egressStatus = egress.NewStatusWriter(cfg.NodeName, a.deps.Net, lister, a.log)
	host := egressHost{view: a.view, cfg: nodenet.EgressConfig{HostNetNS: cfg.HostNetNS, Tun0: pipeline.PortNameTun0,
		MAC: pipeline.EgressMAC, MACPrefix: pipeline.EgressMACPrefix, Logger: a.log.WithName("nodenet")}}
	if cfg.DatapathType == "netdev" {
		host.ovs = unixctl.New(cfg.OVSRunDir, "ovs-vswitchd")
	}
	a.egressIPs = egress.New(egress.Config{NodeName: cfg.NodeName, Port: int(a.view.egress.port), Interval: cfg.EgressInterval,
		DeadAfter: cfg.EgressDeadAfter, StateFile: filepath.Join(cfg.StateDir, "egress-held.json"), Announcements: nodenet.Announcements,
		Logger: a.log}, a.view.egress, egressFlows{view: a.view, sync: a.fs}, host,
		egressReporter{status: a.egressStatus, inputs: a.view.egress, events: a.events, node: cfg.NodeName, log: a.log.WithName("egress")})
	we := &watchEgress{view: a.view, sync: a.fs, changed: func() { a.egressIPs.Kick(); a.egressStatus.Kick(); a.egressDNS.Kick() }}
	a.egressResolved = func(m map[string][]netip.Addr) { we.apply(func(e *egressInputs) { e.resolved = m }) }
	a.egressDNS = egress.NewResolver(egress.DNSLookup(cfg.EgressDNSServer), a.view.egress.dnsNames, a.egressResolved, a.log)
	return we
}

// dnsNames are the DNS names the firewalls use.
func (e *egressInputs) dnsNames() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.names)
}

// egressInfo is the debug API's picture of a node's egress state (nil when there is none).
func egressInfo(e pipeline.EgressState) *debugapi.Egress {
	if len(e.Namespaces) == 0 && len(e.Held) == 0 {
		return nil
	}
	out := &debugapi.Egress{Held: slices.Clone(e.Held)}
	for _, ns := range e.Namespaces {
		en := debugapi.EgressNamespace{Name: ns.Name, IPs: slices.Clone(ns.IPs), NoUsableIP: ns.NoUsableIP}
		if fw := ns.Firewall; fw != nil {
			en.Policy, en.DenyAll = fw.Policy, fw.DenyAll
			for _, r := range fw.Rules {
				en.Rules = append(en.Rules, debugapi.EgressRule{Allow: r.Allow, DNSName: r.DNSName, Addresses: slices.Clone(r.Dsts)})
			}
		}
		out.Namespaces = append(out.Namespaces, en)
	}
	return out
}
