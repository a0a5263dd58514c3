package agent

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"sync"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	"github.com/ofsdn/ofsdn/agent/adminpolicy"
	"github.com/ofsdn/ofsdn/agent/attach"
	"github.com/ofsdn/ofsdn/agent/egress"
	"github.com/ofsdn/ofsdn/agent/hostnet"
	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/networks"
	"github.com/ofsdn/ofsdn/agent/nodeapi"
	"github.com/ofsdn/ofsdn/agent/nodenet"
	"github.com/ofsdn/ofsdn/agent/policy"
	"github.com/ofsdn/ofsdn/agent/services"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// nodeView is the agent's picture of everything its flows depend on. Informer handlers and the CNI
// server write it; flowSync reads consistent snapshots of it.
type nodeView struct {
	mu          sync.Mutex
	nodeName    string
	mode        pipeline.Mode
	clusterNets []netip.Prefix
	nodeIP      netip.Addr
	localSubnet netip.Prefix
	mtu         int                            // the pods' MTU, once the node is set up
	remote      map[string]pipeline.RemoteNode // by node name
	vnids       map[string]uint32              // namespace → VNID
	pods        map[string]attach.Pod          // by namespace/name
	// Services and EndpointSlices by namespace/name, as the informer cache holds them (read-only).
	services  map[string]*corev1.Service
	slices    map[string]*discoveryv1.EndpointSlice
	converted services.Cache // the last conversion of each service, reused while its objects stay
	// hostPorts of the pods bound to this node, by namespace/name (pod informer).
	hostPorts map[string]hostnet.HostPortPod
	// policyChanges are the NetworkPolicies, pods and namespaces the informers changed since the last
	// snapshot, which hands them to the flow loop's policy index (agent/policy): resolution happens
	// there, not under this lock.
	policyChanges policy.Changes
	// adminChanges are the same for ClusterNetworkPolicy (agent/adminpolicy), nodes included.
	adminChanges adminpolicy.Changes
	// Encapsulation (uplink.go): the ClusterNetwork's; the uplink bridge br0 is patched into ("" none);
	// the peers (by node name) on its segment; tun0's MAC.
	encap  pipeline.Encapsulation
	uplink string
	// tunnelPort is the ClusterNetwork's vxlanPort; vxlan0Port the one vxlan0 was made with (0 until
	// then). Both are guarded against pods (flows/pipeline/guard.go).
	tunnelPort, vxlan0Port uint16
	onSegment              map[string]bool
	gatewayMAC             net.HardwareAddr
	// remotePods are the other nodes' pods (pod informer), whose addresses give the source VNID of
	// traffic that arrives unencapsulated in multitenant mode.
	remotePods map[string]remotePod
	// egress are egress IPs' and firewalls' inputs and derived state (agent/egress), under a lock of
	// their own; egress.Node changes them through Change.
	egress *egress.Inputs
	// networks are the Networks, their node subnets and the namespaces' labels (agent/networks);
	// netAttachments the pods' interfaces on them, by attach.NetAttachmentKey.
	networks       *networks.Index
	netAttachments map[string]attach.NetAttachment
	// generation counts changes, so a sync knows whether it saw the latest state.
	generation uint64
}

// remotePod is another node's pod: where it runs, its namespace and address.
type remotePod struct {
	Node, Namespace string
	IP              netip.Addr
}

// newNodeView is an empty view of node nodeName; egress are the egress inputs its snapshots read.
func newNodeView(nodeName string, egressInputs *egress.Inputs) *nodeView {
	return &nodeView{nodeName: nodeName, mode: pipeline.ModeSubnet, remote: map[string]pipeline.RemoteNode{},
		vnids: map[string]uint32{}, pods: map[string]attach.Pod{}, services: map[string]*corev1.Service{},
		slices: map[string]*discoveryv1.EndpointSlice{}, hostPorts: map[string]hostnet.HostPortPod{}, converted: services.Cache{},
		encap: pipeline.EncapVXLAN, remotePods: map[string]remotePod{}, networks: networks.NewIndex(), netAttachments: map[string]attach.NetAttachment{},
		egress: egressInputs}
}

// The view as attachments see it (attach.Node).

func (v *nodeView) Name() string { return v.nodeName }

func (v *nodeView) Subnet() (netip.Prefix, []netip.Prefix, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.localSubnet, slices.Clone(v.clusterNets), v.mtu
}

func (v *nodeView) Attached(key string) (attach.Pod, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	p, ok := v.pods[key]
	return p, ok
}

func (v *nodeView) Attach(p attach.Pod) uint64 {
	return v.update(func(v *nodeView) { v.pods[k8sobj.PodKey(p.Namespace, p.Name)] = p })
}

func (v *nodeView) Detach(key, sandbox string) uint64 {
	return v.update(func(v *nodeView) {
		if p, ok := v.pods[key]; ok && p.SandboxID == sandbox {
			delete(v.pods, key)
		}
	})
}

func (v *nodeView) AttachNetwork(a attach.NetAttachment) uint64 {
	return v.update(func(v *nodeView) { v.netAttachments[a.Key()] = a })
}

func (v *nodeView) DetachNetwork(key, sandbox string) uint64 {
	return v.update(func(v *nodeView) {
		if a, ok := v.netAttachments[key]; ok && a.SandboxID == sandbox {
			delete(v.netAttachments, key)
		}
	})
}

func (v *nodeView) NetAttachments(podKey, sandbox string) []attach.NetAttachment {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []attach.NetAttachment
	for _, a := range v.netAttachments {
		if a.SandboxID == sandbox && k8sobj.PodKey(a.Namespace, a.Name) == podKey {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IfName < out[j].IfName })
	return out
}

func (v *nodeView) AllNetAttachments() []attach.NetAttachment {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Collect(maps.Values(v.netAttachments))
}

// netAttachmentStatuses lists the attachments with why each carries no traffic, for the debug API.
func (v *nodeView) netAttachmentStatuses() []nodeapi.NetAttachment {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]nodeapi.NetAttachment, 0, len(v.netAttachments))
	for _, a := range v.netAttachments {
		why := v.networks.WhyNotCarrying(networks.Attachment{Namespace: a.Namespace, Name: a.Name, Interface: a.IfName, Network: a.Network})
		out = append(out, nodeapi.NetAttachment{NetAttachment: a, WhyNot: why})
	}
	return out
}

// UpdateNetworks runs f on the view's Networks (networks.View).
func (v *nodeView) UpdateNetworks(f func(ix *networks.Index)) {
	v.update(func(v *nodeView) { f(v.networks) })
}

// Placement says how a pod of namespace attaches to a Network on this node (attach.Networks).
func (v *nodeView) Placement(network, namespace string) (networks.Placement, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.networks.Placement(network, namespace, v.nodeName)
}

// AttachmentCounts counts the attached pod interfaces per Network this node has a subnet of (0
// included), for networks.Reporter.
func (v *nodeView) AttachmentCounts() map[string]int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := map[string]int64{}
	for _, name := range v.networks.SubnetsOf(v.nodeName) {
		out[name] = 0
	}
	for _, a := range v.netAttachments {
		if _, ok := out[a.Network]; ok {
			out[a.Network]++
		}
	}
	return out
}

// PodNetworkStatuses are the network-status annotations of the local pods with a Network interface,
// for networks.Reporter: eth0 (the cluster network, the default), then the Network interfaces by name.
func (v *nodeView) PodNetworkStatuses() map[string][]nadv1.NetworkStatus {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := map[string][]nadv1.NetworkStatus{}
	for _, a := range v.netAttachments {
		key := k8sobj.PodKey(a.Namespace, a.Name)
		pod, ok := v.pods[key]
		if !ok || pod.SandboxID != a.SandboxID {
			continue // a meta-plugin's attachment of a pod whose eth0 is another plugin's: Multus reports it
		}
		if _, ok := out[key]; !ok {
			out[key] = []nadv1.NetworkStatus{{Name: networks.ClusterNetworkName, Interface: "eth0", IPs: []string{pod.IP.String()},
				Mac: pod.MAC.String(), Mtu: v.mtu, Default: true, Gateway: []string{pipeline.Gateway(v.localSubnet).String()}}}
		}
		name := a.NAD
		if name == "" {
			name = a.Network
		}
		out[key] = append(out[key], nadv1.NetworkStatus{Name: name, Interface: a.IfName, IPs: []string{a.IP.String()}, Mac: a.MAC.String(), Mtu: a.MTU})
	}
	for _, st := range out {
		sort.Slice(st[1:], func(i, j int) bool { return st[1+i].Interface < st[1+j].Interface })
	}
	return out
}

// SetService and SetEndpointSlice file the informers' objects by namespace/name, nil deleting
// (services.View).

func (v *nodeView) SetService(key string, svc *corev1.Service) {
	v.update(func(v *nodeView) {
		if svc == nil {
			delete(v.services, key)
			return
		}
		v.services[key] = svc
	})
}

func (v *nodeView) SetEndpointSlice(key string, es *discoveryv1.EndpointSlice) {
	v.update(func(v *nodeView) {
		if es == nil {
			delete(v.slices, key)
			return
		}
		v.slices[key] = es
	})
}

// Reads of the view for the rest of the agent: each takes the lock and copies.

// addressing is the node's address, subnet and cluster networks.
func (v *nodeView) addressing() (nodeIP netip.Addr, subnet netip.Prefix, clusterNets []netip.Prefix) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.nodeIP, v.localSubnet, slices.Clone(v.clusterNets)
}

// NodeIP is the node's address (egress.View).
func (v *nodeView) NodeIP() netip.Addr {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.nodeIP
}

// Change runs f, a change of state the snapshots read but others keep (egress.Inputs), under the
// view's lock and returns the generation that holds it (egress.View).
func (v *nodeView) Change(f func()) uint64 { return v.update(func(*nodeView) { f() }) }

// Peers is the encapsulation, the node's address and the other nodes by address.
func (v *nodeView) Peers() (pipeline.Encapsulation, netip.Addr, map[netip.Addr][]string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	peers := make(map[netip.Addr][]string, len(v.remote))
	for name, n := range v.remote {
		if name != v.nodeName && n.NodeIP.IsValid() {
			peers[n.NodeIP] = append(peers[n.NodeIP], name)
		}
	}
	return v.encap, v.nodeIP, peers
}

// SetUplink and Peers are the view as the uplink job sees it (hostnet.UplinkView).

func (v *nodeView) SetUplink(bridge string, onSegment map[string]bool, gatewayMAC net.HardwareAddr) (changed bool) {
	v.update(func(v *nodeView) {
		if v.uplink != bridge || !maps.Equal(v.onSegment, onSegment) || (len(gatewayMAC) > 0 && !slices.Equal(v.gatewayMAC, gatewayMAC)) {
			changed = true
			v.uplink, v.onSegment = bridge, onSegment
			if len(gatewayMAC) > 0 {
				v.gatewayMAC = gatewayMAC
			}
		}
	})
	return changed
}

// sizes counts the attached pods, the services and the other nodes.
func (v *nodeView) sizes() (pods, services, remoteNodes int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for name := range v.remote {
		if name != v.nodeName {
			remoteNodes++
		}
	}
	return len(v.pods), len(v.services), remoteNodes
}

// namespaceVNIDs copies the VNID of every namespace.
func (v *nodeView) namespaceVNIDs() map[string]uint32 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return maps.Clone(v.vnids)
}

// update applies f and returns the view's new generation: a sync of that generation or later includes f.
func (v *nodeView) update(f func(v *nodeView)) uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	f(v)
	v.generation++
	return v.generation
}

// peers lists the remote nodes' addresses.
func (v *nodeView) peers() []netip.Addr {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]netip.Addr, 0, len(v.remote))
	for name, n := range v.remote {
		if name != v.nodeName {
			out = append(out, n.NodeIP)
		}
	}
	return out
}

// errNotReady wraps the reasons a node cannot render yet.
var errNotReady = errors.New("node not ready")

// ready reports whether the node knows enough to render: its subnet, its IP and the cluster network.
func (v *nodeView) Ready() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case len(v.clusterNets) == 0:
		return fmt.Errorf("%w: ClusterNetwork %q not known yet", errNotReady, "default")
	case !v.localSubnet.IsValid():
		return fmt.Errorf("%w: no HostSubnet for node %s yet", errNotReady, v.nodeName)
	case !v.nodeIP.IsValid():
		return fmt.Errorf("%w: node %s has no InternalIP in its HostSubnet yet", errNotReady, v.nodeName)
	}
	return nil
}

// nodeAddresses are the addresses each node's hostNetwork pods have as policy peers: its InternalIP
// (the HostSubnet's hostIP) and its tun0 gateway, the source of what its host sends into the overlay.
func (v *nodeView) nodeAddresses() map[string][]netip.Addr {
	out := make(map[string][]netip.Addr, len(v.remote)+1)
	add := func(name string, ip netip.Addr, subnet netip.Prefix) {
		var a []netip.Addr
		if ip.IsValid() {
			a = append(a, ip)
		}
		if subnet.IsValid() {
			a = append(a, pipeline.Gateway(subnet))
		}
		if len(a) > 0 {
			out[name] = a
		}
	}
	for name, n := range v.remote {
		if name != v.nodeName {
			add(name, n.NodeIP, n.Subnet)
		}
	}
	add(v.nodeName, v.nodeIP, v.localSubnet)
	return out
}

// resolvedHostPorts returns the hostPorts to publish and the conflicts to report.
func (v *nodeView) resolvedHostPorts() ([]nodenet.HostPort, []hostnet.HostPortConflict) {
	v.mu.Lock()
	defer v.mu.Unlock()
	podIP := func(key string) (netip.Addr, bool) {
		p, ok := v.pods[key]
		return p.IP, ok
	}
	return hostnet.ResolveHostPorts(podIP, v.hostPorts)
}

// SetHostPorts files a local pod's hostPorts (nil: none) and says whether that changed anything
// (hostnet.HostPortView).
func (v *nodeView) SetHostPorts(key string, p *hostnet.HostPortPod) (changed bool) {
	v.update(func(v *nodeView) {
		prev, had := v.hostPorts[key]
		switch {
		case p == nil && had:
			delete(v.hostPorts, key)
			changed = true
		case p != nil && (!had || !reflect.DeepEqual(prev.Ports, p.Ports)):
			v.hostPorts[key] = *p
			changed = true
		}
	})
	return changed
}

// healthChecks returns the health check node ports this node serves, with their local ready endpoints.
func (v *nodeView) healthChecks() []services.HealthCheck {
	v.mu.Lock()
	defer v.mu.Unlock()
	return services.HealthChecks(v.services, v.slices, v.nodeName)
}

// viewSnapshot is a copy of what the flow loop renders: nothing in it is shared with the view.
type viewSnapshot struct {
	// state lacks its Policies and the pods' isolation: the flow loop resolves them from policies.
	state pipeline.NodeState
	// waiting are the pods left out because their namespace has no VNID yet.
	waiting    []string
	generation uint64
	policies   policyInput
}

// policyInput is what policy resolution takes from the view: the informers' changes since the last
// snapshot, the attached pods and every node's addresses (its hostNetwork pods' addresses as peers).
type policyInput struct {
	changes   policy.Changes
	local     map[string]policy.Attachment // every mode: ClusterNetworkPolicy is enforced in all
	nodeAddrs map[string][]netip.Addr
	admin     adminpolicy.Changes
}

// RecordPolicyChange files an informer's NetworkPolicy change for the next snapshot (latest per
// object wins) and says whether policies are enforced (policy.View).
func (v *nodeView) RecordPolicyChange(f func(c *policy.Changes)) (enforced bool) {
	v.update(func(v *nodeView) {
		c := &v.policyChanges
		if c.Pods == nil {
			c.Pods, c.Namespaces, c.Policies = map[string]*policy.Pod{}, map[string]policy.NamespaceChange{}, map[string]*networkingv1.NetworkPolicy{}
		}
		f(c)
		enforced = v.mode == pipeline.ModeNetworkPolicy
	})
	return enforced
}

// RecordAdminChange files an informer's ClusterNetworkPolicy change for the next snapshot
// (adminpolicy.View).
func (v *nodeView) RecordAdminChange(f func(c *adminpolicy.Changes)) {
	v.update(func(v *nodeView) {
		if v.adminChanges.Pods == nil {
			v.adminChanges = adminpolicy.NewChanges()
		}
		f(&v.adminChanges)
	})
}

// snapshot copies the state to render. Pods whose namespace has no VNID yet are left out (they get no
// connectivity rather than the wrong tenant's) and listed as waiting. It leaves the policy changes in
// the view; takeSnapshot, the flow loop's, moves them into the snapshot.
func (v *nodeView) snapshot() viewSnapshot {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.snapshotLocked()
}

// takeSnapshot is snapshot for the flow loop: the policy changes move into it, so that each reaches
// the loop's policy index exactly once, with the generation it belongs to.
func (v *nodeView) takeSnapshot() viewSnapshot {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.snapshotLocked()
	s.policies.changes, v.policyChanges = v.policyChanges, policy.Changes{}
	s.policies.admin, v.adminChanges = v.adminChanges, adminpolicy.Changes{}
	return s
}

func (v *nodeView) snapshotLocked() viewSnapshot {
	var pending []string
	st := pipeline.NodeState{Mode: v.mode, NodeName: v.nodeName, NodeIP: v.nodeIP, LocalSubnet: v.localSubnet,
		ClusterNetworks: append([]netip.Prefix(nil), v.clusterNets...),
		Encapsulation:   v.encap, Uplink: v.uplink != "", GatewayMAC: v.gatewayMAC}
	for _, p := range []uint16{v.tunnelPort, v.vxlan0Port} {
		if p != 0 && !slices.Contains(st.TunnelPorts, p) {
			st.TunnelPorts = append(st.TunnelPorts, p)
		}
	}
	for _, p := range v.pods {
		vnid, ok := v.vnids[p.Namespace]
		if !ok {
			pending = append(pending, k8sobj.PodKey(p.Namespace, p.Name))
			continue
		}
		if v.mode != pipeline.ModeMultitenant {
			vnid = pipeline.GlobalVNID // flat modes: VNIDs are allocated but carry no isolation
		}
		st.Pods = append(st.Pods, pipeline.PodState{Namespace: p.Namespace, Name: p.Name, IP: p.IP, MAC: p.MAC, OFPort: p.OFPort, VNID: vnid})
	}
	// Traffic arriving unencapsulated names its source by address only: multitenant mode needs every
	// remote pod's VNID (pods whose namespace has none yet are left out: their traffic is dropped).
	var podsOf map[string][]pipeline.RemotePod
	if v.mode == pipeline.ModeMultitenant && v.uplink != "" {
		podsOf = map[string][]pipeline.RemotePod{}
		for _, p := range v.remotePods {
			if vnid, ok := v.vnids[p.Namespace]; ok {
				podsOf[p.Node] = append(podsOf[p.Node], pipeline.RemotePod{IP: p.IP, VNID: vnid})
			}
		}
	}
	for name, n := range v.remote {
		if name != v.nodeName {
			n.OnSegment = v.onSegment[name]
			if pods := podsOf[name]; len(pods) > 0 {
				sort.Slice(pods, func(i, j int) bool { return pods[i].IP.Less(pods[j].IP) })
				n.Pods = pods
			}
			st.RemoteNodes = append(st.RemoteNodes, n)
		}
	}
	st.Services = services.States(v.services, v.slices, v.nodeName, v.vnids, v.converted)
	v.egress.Fill(&st)
	st.NodePortAddresses = []netip.Addr{pipeline.ServiceNodePortIP}
	in := policyInput{local: make(map[string]policy.Attachment, len(v.pods))}
	for key, p := range v.pods {
		if p.OFPort != 0 {
			in.local[key] = policy.Attachment{OFPort: p.OFPort, IP: p.IP}
		}
	}
	if v.mode == pipeline.ModeNetworkPolicy {
		in.nodeAddrs = v.nodeAddresses()
	}
	// Networks, and the pods' interfaces on them that carry traffic (their namespace admitted).
	st.Networks = v.networks.States(v.nodeName)
	atts := make([]networks.Attachment, 0, len(v.netAttachments))
	for _, a := range v.netAttachments {
		atts = append(atts, networks.Attachment{Namespace: a.Namespace, Name: a.Name, Interface: a.IfName, Network: a.Network,
			IP: a.IP, MAC: a.MAC, OFPort: a.OFPort})
	}
	st.Attachments = v.networks.Carrying(atts)
	sort.Slice(st.Attachments, func(i, j int) bool { return st.Attachments[i].OFPort < st.Attachments[j].OFPort })
	sort.Slice(st.Pods, func(i, j int) bool { return st.Pods[i].OFPort < st.Pods[j].OFPort })
	sort.Slice(st.RemoteNodes, func(i, j int) bool { return st.RemoteNodes[i].Name < st.RemoteNodes[j].Name })
	sort.Strings(pending)
	return viewSnapshot{state: st, waiting: pending, generation: v.generation, policies: in}
}
