package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/nodenet"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	networklisters "github.com/ofsdn/ofsdn/client/listers/network/v1"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/unixctl"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// Egress as the agent runs it (Node): the Inputs its view snapshots, the informers' handlers that fill
// them, the Job with its way into br0's flows and the node's side through nodenet, the status writer,
// the DNS resolver, and the Warning Events of unheld IPs (EgressIPUnheld). It knows the rest of the
// agent through View (the generation the flow loop syncs to, the node's address) and Sync (the flow
// loop).

// View is the agent's view as egress uses it.
type View interface {
	// Change runs f, a change of the Inputs the view's snapshots read, under the view's lock, and
	// returns the view's generation that holds it.
	Change(f func()) (generation uint64)
	// NodeIP is the node's address (its HostSubnet's hostIP), invalid until known.
	NodeIP() netip.Addr
}

// Sync is the flow loop: Trigger asks for a sync, SyncThrough returns once the generation's owners
// are on the bridge.
type Sync interface {
	Trigger()
	SyncThrough(ctx context.Context, gen uint64, owners ...reconcile.Owner) error
}

// NodeConfig configures egress on a node.
type NodeConfig struct {
	NodeName  string
	HostNetNS string // the node's network namespace; "" the agent's own
	StateDir  string // holds egress-held.json
	// Interval and DeadAfter are the membership's (zero: the defaults); its port is the Inputs'.
	Interval, DeadAfter time.Duration
	// DNSServer (HOST:PORT) resolves EgressNetworkPolicy DNS names; "" the node's resolv.conf.
	DNSServer string
	// OVS is ovs-vswitchd's control socket on the userspace datapath (tunnels' next hops), nil on the
	// kernel's.
	OVS    *unixctl.Client
	Logger klog.Logger
}

// NodeDeps are what egress talks to.
type NodeDeps struct {
	Inputs *Inputs // the ones View's snapshots read
	View   View
	Sync   Sync
	// Net writes the holder into NetNamespace status; NetNamespaces reads them (the informer's lister).
	Net           networkclient.Interface
	NetNamespaces networklisters.NetNamespaceLister
	// Events records EgressIPUnheld; nil: only logged.
	Events record.EventRecorder
}

// Node is egress on this node, built whole: Handlers feed it, Restore and Run run it.
type Node struct {
	inputs *Inputs
	view   View
	sync   Sync
	job    *Job
	status *StatusWriter
	dns    *Resolver
}

// NewNode builds egress on a node; it does no I/O.
func NewNode(cfg NodeConfig, deps NodeDeps) *Node {
	n := &Node{inputs: deps.Inputs, view: deps.View, sync: deps.Sync}
	n.status = NewStatusWriter(cfg.NodeName, deps.Net, deps.NetNamespaces, cfg.Logger)
	host := host{view: deps.View, ovs: cfg.OVS, cfg: nodenet.EgressConfig{HostNetNS: cfg.HostNetNS, Tun0: pipeline.PortNameTun0,
		MAC: pipeline.EgressMAC, MACPrefix: pipeline.EgressMACPrefix, Logger: cfg.Logger.WithName("nodenet")}}
	n.job = New(Config{NodeName: cfg.NodeName, Port: int(deps.Inputs.port), Interval: cfg.Interval, DeadAfter: cfg.DeadAfter,
		StateFile: filepath.Join(cfg.StateDir, "egress-held.json"), Announcements: nodenet.Announcements, Logger: cfg.Logger},
		deps.Inputs, flows{n}, host, reporter{status: n.status, inputs: deps.Inputs, events: deps.Events, node: cfg.NodeName, log: cfg.Logger.WithName("egress")})
	n.dns = NewResolver(DNSLookup(cfg.DNSServer), deps.Inputs.DNSNames, n.Resolved, cfg.Logger)
	return n
}

// Handlers are the informers' handlers: NetNamespaces (egress IPs, their holders), HostSubnets (the
// nodes that may hold them), EgressNetworkPolicies and the ClusterNetwork (the service network).
func (n *Node) Handlers() (netNamespaces, hostSubnets, policies, clusterNetworks cache.ResourceEventHandlerFuncs) {
	return k8sobj.Handlers(n.netNamespace), k8sobj.Handlers(n.hostSubnet), k8sobj.Handlers(n.policy), k8sobj.Handlers(n.clusterNetwork)
}

// Resolved takes the firewalls' DNS names' addresses (the resolver's answer) into the Inputs.
func (n *Node) Resolved(m map[string][]netip.Addr) { n.apply(func(e *Inputs) { e.resolved = m }) }

// Restore takes back the egress IPs this node held before a restart (Job.Restore).
func (n *Node) Restore(ctx context.Context) error { return n.job.Restore(ctx) }

// Run runs the membership, the status writer and the resolver until ctx ends.
func (n *Node) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, run := range []func(context.Context){n.job.Run, n.status.Run, n.dns.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run(ctx)
		}()
	}
	wg.Wait()
}

// PodFlows is what attachments wait on: a pod's flows, and its namespace's egress flows, so no packet
// of a new pod leaves before its egress IP and firewall apply (attach.Flows).
func (n *Node) PodFlows() PodFlows { return PodFlows{sync: n.sync, inputs: n.inputs} }

// PodFlows is Node.PodFlows.
type PodFlows struct {
	sync   Sync
	inputs *Inputs
}

// SyncThrough adds the egress owners of each pod's namespace to owners.
func (f PodFlows) SyncThrough(ctx context.Context, gen uint64, owners ...reconcile.Owner) error {
	all := slices.Clone(owners)
	for _, o := range owners {
		if obj, ok := pipeline.ObjectOf(o); ok && obj.Kind == pipeline.KindPod && obj.Interface == "" {
			all = append(all, f.inputs.Owners(obj.Namespace)...)
		}
	}
	return f.sync.SyncThrough(ctx, gen, all...)
}

// apply changes the Inputs and derives them again, asks for a sync and tells the membership, the
// status writer and the resolver to look again.
func (n *Node) apply(f func(e *Inputs)) {
	n.view.Change(func() {
		e := n.inputs
		e.mu.Lock()
		defer e.mu.Unlock()
		f(e)
		e.derive()
	})
	n.sync.Trigger()
	n.job.Kick()
	n.status.Kick()
	n.dns.Kick()
}

func (n *Node) netNamespace(obj any, deleted bool) {
	nn, ok := obj.(*networkv1.NetNamespace)
	if !ok {
		return
	}
	n.apply(func(e *Inputs) {
		if deleted {
			delete(e.netns, nn.Name)
		} else {
			e.netns[nn.Name] = nn
		}
	})
}

func (n *Node) hostSubnet(obj any, deleted bool) {
	hs, ok := obj.(*networkv1.HostSubnet)
	if !ok {
		return
	}
	n.apply(func(e *Inputs) {
		if deleted {
			delete(e.subnets, hs.Name)
		} else {
			e.subnets[hs.Name] = hs
		}
	})
}

func (n *Node) policy(obj any, deleted bool) {
	p, ok := obj.(*networkv1.EgressNetworkPolicy)
	if !ok {
		return
	}
	key := p.Namespace + "/" + p.Name
	n.apply(func(e *Inputs) {
		if deleted {
			delete(e.policies, key)
		} else {
			e.policies[key] = p
		}
	})
}

func (n *Node) clusterNetwork(obj any, deleted bool) {
	cn, ok := obj.(*networkv1.ClusterNetwork)
	if !ok || deleted || cn.Name != networkv1.ClusterNetworkName {
		return
	}
	n.apply(func(e *Inputs) { e.spec = cn.Spec })
}

// flows is the membership's way into br0's flows (Flows): the held IPs into the view, then the sync.
type flows struct{ n *Node }

func (f flows) SetHeld(ctx context.Context, held []netip.Addr) error {
	gen := f.n.view.Change(func() {
		e := f.n.inputs
		e.mu.Lock()
		e.held = slices.Clone(held)
		e.mu.Unlock()
	})
	return f.n.sync.SyncThrough(ctx, gen, pipeline.EgressOwner)
}

// host is the node's side of holding an egress IP, through nodenet (Host).
type host struct {
	view View
	cfg  nodenet.EgressConfig
	// ovs is ovs-vswitchd's control socket on the userspace datapath, nil on the kernel's.
	ovs *unixctl.Client
}

func (h host) NodeIP() netip.Addr                 { return h.view.NodeIP() }
func (h host) EnsureSNAT(held []netip.Addr) error { return nodenet.EnsureEgressSNAT(h.cfg, held) }
func (h host) AddAddress(ip netip.Addr) error {
	return nodenet.AddEgressAddress(h.cfg.HostNetNS, h.NodeIP(), ip)
}
func (h host) DelAddress(ip netip.Addr) error {
	return nodenet.DelEgressAddress(h.cfg.HostNetNS, h.NodeIP(), ip)
}
func (h host) Announce(ip netip.Addr) error {
	return nodenet.AnnounceAddress(h.cfg.HostNetNS, h.NodeIP(), ip)
}
func (h host) UplinkAddresses() ([]netip.Addr, error) {
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
func (h host) ListenUDP(addr netip.AddrPort) (*net.UDPConn, error) {
	return nodenet.ListenUDP(h.cfg.HostNetNS, addr)
}
func (h host) UplinkMAC() (net.HardwareAddr, error) {
	name, err := nodenet.Uplink(h.cfg.HostNetNS, h.NodeIP())
	if err != nil {
		return nil, err
	}
	return nodenet.LinkMAC(h.cfg.HostNetNS, name)
}

// SetTunnelNeighbor sets ovs-vswitchd's tunnel next hop for ip (userspace datapath only: the kernel
// datapath's tunnels use the kernel's neighbour table, which every gratuitous ARP updates).
func (h host) SetTunnelNeighbor(ip netip.Addr, mac net.HardwareAddr) error {
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

// reporter tells the API (Reporter): the holder in NetNamespace status, and a Warning Event on the
// NetNamespace of an IP no live node may hold.
type reporter struct {
	status *StatusWriter
	inputs *Inputs
	events record.EventRecorder
	node   string
	log    klog.Logger
}

func (r reporter) Held(held []netip.Addr) { r.status.Held(held) }

func (r reporter) Unheld(ips []netip.Addr) {
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
