package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"sync"

	"github.com/ofsdn/ofsdn/agent/nodenet"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// localPod is a pod attached to this node's bridge.
type localPod struct {
	Namespace, Name string
	SandboxID       string
	IfName          string // the interface in the sandbox ("" when restored from a port made before it was recorded)
	NetNS           string // the sandbox's netns path, as the runtime gave it ("" likewise)
	IP              netip.Addr
	MAC             net.HardwareAddr
	OFPort          uint32
	HostVeth        string
}

func podKey(namespace, name string) string { return namespace + "/" + name }

// nodeView is the agent's picture of everything its flows depend on. Informer handlers and the CNI
// server write it; flowSync reads consistent snapshots of it.
type nodeView struct {
	mu          sync.Mutex
	nodeName    string
	mode        pipeline.Mode
	clusterNets []netip.Prefix
	nodeIP      netip.Addr
	localSubnet netip.Prefix
	remote      map[string]pipeline.RemoteNode // by node name
	vnids       map[string]uint32              // namespace → VNID
	pods        map[string]localPod            // by namespace/name
	// Services and EndpointSlices by namespace/name, as the informer cache holds them (read-only).
	services  map[string]*corev1.Service
	slices    map[string]*discoveryv1.EndpointSlice
	converted serviceCache // the last conversion of each service, reused while its objects stay
	// hostPorts of the pods bound to this node, by namespace/name (pod informer).
	hostPorts map[string]hostPortPod
	// netpol holds the cluster's NetworkPolicies, pods and namespaces and resolves the policies
	// (networkpolicy mode; netpol.go); policyProblems are its problems as of the last snapshot.
	netpol         *policyIndex
	policyProblems map[string][]policyProblem
	// Encapsulation (uplink.go): the ClusterNetwork's; the uplink bridge br0 is patched into ("" none);
	// the peers (by node name) on its segment; tun0's MAC.
	encap      pipeline.Encapsulation
	uplink     string
	onSegment  map[string]bool
	gatewayMAC net.HardwareAddr
	// remotePods are the other nodes' pods (pod informer), whose addresses give the source VNID of
	// traffic that arrives unencapsulated in multitenant mode.
	remotePods map[string]remotePod
	// generation counts changes, so a sync knows whether it saw the latest state.
	generation uint64
}

// remotePod is another node's pod: where it runs, its namespace and address.
type remotePod struct {
	Node, Namespace string
	IP              netip.Addr
}

func newNodeView(nodeName string) *nodeView {
	return &nodeView{nodeName: nodeName, mode: pipeline.ModeSubnet, remote: map[string]pipeline.RemoteNode{},
		vnids: map[string]uint32{}, pods: map[string]localPod{}, services: map[string]*corev1.Service{},
		slices: map[string]*discoveryv1.EndpointSlice{}, hostPorts: map[string]hostPortPod{}, converted: serviceCache{},
		netpol: newPolicyIndex(nodeName), encap: pipeline.EncapVXLAN, remotePods: map[string]remotePod{}}
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
func (v *nodeView) ready() error {
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

// problemsOfPolicies returns the policy problems of the last snapshot, by namespace/name.
func (v *nodeView) problemsOfPolicies() map[string][]policyProblem {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.policyProblems
}

// resolvedHostPorts returns the hostPorts to publish and the conflicts to report.
func (v *nodeView) resolvedHostPorts() ([]nodenet.HostPort, []hostPortConflict) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return hostPortsOf(v.pods, v.hostPorts)
}

// healthChecks returns the health check node ports this node serves, with their local ready endpoints.
func (v *nodeView) healthChecks() []healthCheck {
	v.mu.Lock()
	defer v.mu.Unlock()
	return healthChecksOf(v.services, v.slices, v.nodeName)
}

// snapshot returns the state to render. Pods whose namespace has no VNID yet are left out (they get
// no connectivity rather than the wrong tenant's) and listed in pending.
func (v *nodeView) snapshot() (st pipeline.NodeState, pending []string, generation uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	st = pipeline.NodeState{Mode: v.mode, NodeName: v.nodeName, NodeIP: v.nodeIP, LocalSubnet: v.localSubnet,
		ClusterNetworks: append([]netip.Prefix(nil), v.clusterNets...),
		Encapsulation:   v.encap, Uplink: v.uplink != "", GatewayMAC: v.gatewayMAC}
	for _, p := range v.pods {
		vnid, ok := v.vnids[p.Namespace]
		if !ok {
			pending = append(pending, podKey(p.Namespace, p.Name))
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
	st.Services = serviceStates(v.services, v.slices, v.nodeName, v.vnids, v.converted)
	st.NodePortAddresses = []netip.Addr{pipeline.ServiceNodePortIP}
	v.policyProblems = nil
	if v.mode == pipeline.ModeNetworkPolicy {
		v.netpol.setLocal(v.pods)
		v.netpol.setNodes(v.nodeAddresses(), v.clusterNets)
		st.Policies = v.netpol.resolve()
		v.policyProblems = v.netpol.problems()
		iso := isolation(st.Policies)
		for i := range st.Pods {
			p := &st.Pods[i]
			p.IngressIsolated, p.EgressIsolated = iso[p.OFPort][0], iso[p.OFPort][1]
		}
	}
	sort.Slice(st.Pods, func(i, j int) bool { return st.Pods[i].OFPort < st.Pods[j].OFPort })
	sort.Slice(st.RemoteNodes, func(i, j int) bool { return st.RemoteNodes[i].Name < st.RemoteNodes[j].Name })
	sort.Strings(pending)
	return st, pending, v.generation
}
