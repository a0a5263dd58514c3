package nodeapi

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"

	"github.com/ofsdn/ofsdn/agent/attach"
	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/flows/trace"
	"github.com/ofsdn/ofsdn/ofswitch"
	"github.com/ofsdn/ofsdn/ovsdb"
	"github.com/ofsdn/ofsdn/unixctl"
)

// Agent is what the debug API reads of the agent.
type Agent interface {
	// Bridge is the bridge's OpenFlow session and reconciler, nil until the agent opened the bridge;
	// step is the start-up step the agent is at.
	Bridge() (sess *ofswitch.Session, r *reconcile.Reconciler, step string)
	// State is what br0 holds (the flow loop's last synced state, policies resolved), else the view's
	// own before the first sync; an error while the node cannot render (no subnet yet).
	State() (pipeline.NodeState, error)
	// VNIDs are the namespaces' VNIDs; ServiceNetwork is the ClusterNetwork's (invalid: not known).
	VNIDs() map[string]uint32
	ServiceNetwork() netip.Prefix
	// NetAttachments are the pods' interfaces on Networks, with why each carries no traffic.
	NetAttachments() []NetAttachment
}

// NetAttachment is a pod's interface on a Network and, when it carries no traffic, why ("" when its
// Network renders and admits it).
type NetAttachment struct {
	attach.NetAttachment
	WhyNot string
}

// PortDB lists the bridge's ports (ovsdb.Client).
type PortDB interface {
	ListPorts(ctx context.Context, bridge string) ([]ovsdb.PortInfo, error)
}

// backend answers the debug API from the agent.
type backend struct {
	cfg  Config
	deps Deps
}

// streamingBackend is backend with the drop stream (debugapi.DropStreamer).
type streamingBackend struct{ backend }

func (b streamingBackend) Drops(ctx context.Context, q debugapi.DropQuery, each func(debugapi.Drop) error) error {
	return b.deps.Drops.Drops(ctx, q, each)
}

func (d backend) running() (*ofswitch.Session, *reconcile.Reconciler, error) {
	sess, r, step := d.deps.Agent.Bridge()
	if sess == nil || r == nil {
		return nil, nil, fmt.Errorf("%w: the agent has not opened the bridge (start-up step: %s)", debugapi.ErrUnavailable, step)
	}
	return sess, r, nil
}

func (d backend) Node(ctx context.Context) (*debugapi.NodeInfo, error) {
	st, err := d.deps.Agent.State()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", debugapi.ErrUnavailable, err)
	}
	_, r, _ := d.deps.Agent.Bridge()
	info := &debugapi.NodeInfo{Name: st.NodeName, Bridge: d.cfg.Bridge, NodeIP: st.NodeIP, Subnet: st.LocalSubnet,
		Gateway: pipeline.Gateway(st.LocalSubnet), Mode: string(st.Mode), ClusterNetworks: st.ClusterNetworks,
		PipelineVersion: pipeline.PipelineVersion, NodePortAddress: pipeline.ServiceNodePortIP,
		VNIDs: d.deps.Agent.VNIDs(), ServiceNetwork: d.deps.Agent.ServiceNetwork()}
	info.Egress = egressInfo(st.Egress)
	for _, p := range st.Pods {
		info.Pods = append(info.Pods, debugapi.Pod{Namespace: p.Namespace, Name: p.Name, IP: p.IP, MAC: p.MAC.String(), OFPort: p.OFPort, VNID: p.VNID,
			IngressPolicies: pipeline.IsolatingPolicies(st.Policies, p.OFPort, true), EgressPolicies: pipeline.IsolatingPolicies(st.Policies, p.OFPort, false)})
	}
	for _, n := range st.RemoteNodes {
		info.RemoteNodes = append(info.RemoteNodes, debugapi.RemoteNode{Name: n.Name, NodeIP: n.NodeIP, Subnet: n.Subnet})
	}
	for _, s := range st.Services {
		svc := debugapi.Service{Namespace: s.Namespace, Name: s.Name, ClusterIP: s.ClusterIP, Affinity: s.AffinityTimeout > 0,
			ExternalLocal: s.ExternalLocal, InternalLocal: s.InternalLocal}
		for _, p := range s.Ports {
			sp := debugapi.ServicePort{Name: p.Name, Protocol: openflow.ProtoName(p.Protocol), Port: p.Port, NodePort: p.NodePort,
				Owner: pipeline.ServicePortOwner(s, p).String()}
			for _, e := range p.Endpoints {
				sp.Endpoints = append(sp.Endpoints, debugapi.Endpoint{IP: e.IP, Port: e.Port, Ready: e.Ready && !e.Terminating, Node: e.NodeName})
			}
			svc.Ports = append(svc.Ports, sp)
		}
		info.Services = append(info.Services, svc)
	}
	sort.Slice(info.Services, func(i, j int) bool {
		return info.Services[i].Namespace+"/"+info.Services[i].Name < info.Services[j].Namespace+"/"+info.Services[j].Name
	})
	if r != nil {
		info.Round = r.Round()
		for _, o := range r.Owners() {
			info.Owners = append(info.Owners, o.String())
		}
	}
	if d.deps.Ports != nil {
		ports, err := d.deps.Ports.ListPorts(ctx, d.cfg.Bridge)
		if err != nil {
			return nil, fmt.Errorf("ports of %s: %w", d.cfg.Bridge, err)
		}
		for _, p := range ports {
			info.Ports = append(info.Ports, portInfo(p))
		}
	}
	info.Networks, info.Attachments = networksInfo(st, d.deps.Agent.NetAttachments())
	return info, nil
}

// portInfo is a port of the bridge as OVSDB records it. A pod's interface on a Network is named
// namespace/name@net1, never namespace/name: that is the pod's cluster-network interface, the one
// flowctl sends a pod's packets from.
func portInfo(p ovsdb.PortInfo) debugapi.Port {
	port := debugapi.Port{Name: p.Name, Type: p.Type, OFPort: p.OFPort, MAC: p.MAC, Error: p.Error}
	ids := p.ExternalIDs
	if ns, name := ids[attach.ExtPodNamespace], ids[attach.ExtPodName]; ns != "" && name != "" {
		port.Pod, port.Interface = k8sobj.PodKey(ns, name), ids[attach.ExtIfName]
		if network := ids[attach.ExtNetwork]; network != "" {
			port.Network, port.Pod = network, ""
			if port.Interface != "" {
				port.Pod = attach.NetAttachmentKey(ns, name, port.Interface)
			}
		}
	}
	if ip, err := netip.ParseAddr(ids[attach.ExtIP]); err == nil {
		port.IP = ip
	}
	return port
}

// networksInfo is what the debug API says of Networks: st's (the last synced state: what br0 holds),
// and every pod interface on them, of st and of the view. An attachment carries traffic when its
// flows are in st (as pipeline.Render keeps them); any other says why not, so an interface that is
// attached but not admitted shows as such.
func networksInfo(st pipeline.NodeState, view []NetAttachment) ([]debugapi.Network, []debugapi.Attachment) {
	var nets []debugapi.Network
	rendered := map[string]uint32{} // network → VNI, for those Render gives flows
	for i := range st.Networks {
		n := &st.Networks[i]
		if pipeline.IsNetworkVNI(n.VNI) && n.CIDR.IsValid() {
			rendered[n.Name] = n.VNI
		}
		d := debugapi.Network{Name: n.Name, VNI: n.VNI, CIDR: n.CIDR, Subnet: n.LocalSubnet}
		if n.LocalSubnet.IsValid() {
			d.Gateway = pipeline.Gateway(n.LocalSubnet)
		}
		for _, r := range n.Remotes {
			d.Remotes = append(d.Remotes, debugapi.NetworkRemote{Node: r.Node, NodeIP: r.NodeIP, Subnet: r.Subnet})
		}
		for _, p := range st.NetworkPeers(n) {
			d.CrossTalk = append(d.CrossTalk, p.Name)
		}
		nets = append(nets, d)
	}
	atts := map[string]debugapi.Attachment{}
	for _, a := range st.Attachments {
		if vni, ok := rendered[a.Network]; ok && vni == a.VNI && a.OFPort != 0 && a.IP.IsValid() {
			key := attach.NetAttachmentKey(a.Namespace, a.Name, a.Interface)
			atts[key] = debugapi.Attachment{Namespace: a.Namespace, Name: a.Name, Interface: a.Interface, Network: a.Network,
				IP: a.IP, MAC: a.MAC.String(), OFPort: a.OFPort, VNI: a.VNI, Carrying: true}
		}
	}
	for _, s := range view {
		a := s.NetAttachment
		d, carrying := atts[a.Key()]
		if !carrying || d.Network != a.Network || d.OFPort != a.OFPort {
			d = debugapi.Attachment{Namespace: a.Namespace, Name: a.Name, Interface: a.IfName, Network: a.Network,
				IP: a.IP, MAC: a.MAC.String(), OFPort: a.OFPort, Reason: s.WhyNot}
			switch {
			case d.Reason != "":
			case a.OFPort == 0:
				d.Reason = "its port on the bridge has no OpenFlow number yet"
			default:
				d.Reason = "its flows are not on br0 yet (the flow loop has not synced it)"
			}
		}
		d.Prefix = a.Prefix
		atts[a.Key()] = d
	}
	out := slices.Collect(maps.Values(atts))
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return nets, out
}

func (d backend) Desired(context.Context) (*debugapi.Desired, error) {
	_, r, err := d.running()
	if err != nil {
		return nil, err
	}
	desired := r.Desired()
	out := &debugapi.Desired{Node: d.cfg.NodeName, Round: r.Round()}
	for _, o := range reconcile.SortedOwnerKeys(desired) {
		st := desired[o]
		od := debugapi.OwnerDesired{Owner: o.String(), Cookie: reconcile.MakeCookie(r.Round(), o).String()}
		for _, f := range st.Flows {
			raw, err := openflow.EncodeFlowStats(f)
			if err != nil {
				return nil, fmt.Errorf("owner %s: %w", o, err)
			}
			od.Flows = append(od.Flows, debugapi.Entry{Text: f.String(), Raw: raw})
		}
		for _, g := range st.Groups {
			raw, err := openflow.EncodeGroupDesc(g)
			if err != nil {
				return nil, fmt.Errorf("owner %s: %w", o, err)
			}
			od.Groups = append(od.Groups, debugapi.Entry{Text: g.String(), Raw: raw})
		}
		out.Owners = append(out.Owners, od)
	}
	return out, nil
}

func (d backend) Diff(ctx context.Context) (*debugapi.Diff, error) {
	_, r, err := d.running()
	if err != nil {
		return nil, err
	}
	rep, err := r.Drift(ctx)
	if err != nil {
		return nil, err
	}
	out := &debugapi.Diff{Node: d.cfg.NodeName, Bridge: d.cfg.Bridge, Round: rep.Round, DesiredFlows: rep.DesiredFlows,
		DesiredGroups: rep.DesiredGroups, InstalledFlows: rep.InstalledFlows, InstalledGroups: rep.InstalledGroups,
		Entries: []debugapi.DiffEntry{}}
	for _, e := range rep.Entries {
		out.Entries = append(out.Entries, debugapi.DiffEntry{Owner: e.Owner.String(), Kind: e.Kind, State: e.State,
			Desired: e.Desired, Installed: e.Installed, Why: e.Why})
	}
	return out, nil
}

func (d backend) Dump(ctx context.Context) (*debugapi.Dump, error) {
	sess, r, err := d.running()
	if err != nil {
		return nil, err
	}
	sw := ofswitch.FlowsSwitch(sess)
	flows, err := sw.DumpFlows(ctx, 0, 0)
	if err != nil {
		return nil, err
	}
	groups, err := sw.DumpGroups(ctx)
	if err != nil {
		return nil, err
	}
	out := &debugapi.Dump{Node: d.cfg.NodeName, Bridge: d.cfg.Bridge, Flows: flows, Groups: groups}
	for _, o := range r.Owners() {
		out.Owners = append(out.Owners, o.String())
	}
	return out, nil
}

func (d backend) Trace(ctx context.Context, req debugapi.TraceRequest) (*debugapi.TraceResponse, error) {
	for _, flags := range req.CtNext {
		if _, err := trace.ParseCtFlags(flags.String()); err != nil {
			return nil, err
		}
	}
	args := trace.OVSArgs(d.cfg.Bridge, req.Packet, req.CtNext)
	out, err := unixctl.New(d.cfg.OVSRunDir, "ovs-vswitchd").Call(ctx, "ofproto/trace", args...)
	if err != nil {
		return nil, err
	}
	return &debugapi.TraceResponse{Node: d.cfg.NodeName, Args: slices.Clone(args), Output: out}, nil
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
