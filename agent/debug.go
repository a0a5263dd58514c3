package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/ofsdn/ofsdn/agent/attach"
	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/nodeauth"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/flows/trace"
	"github.com/ofsdn/ofsdn/ofswitch"
	"github.com/ofsdn/ofsdn/ovsdb"
	"github.com/ofsdn/ofsdn/unixctl"
)

// The agent's observability: the metrics and health server, and the read-only debug API flowctl asks
// (debugapi/), served on a root-only unix socket and, for flowctl through the API server's node proxy,
// on a TCP port of the node. Both TCP servers speak TLS and go through one nodeauth.Guard: whatever
// they serve, now or later (a drop stream), answers only callers the API server authenticates and
// authorizes; only the probes' paths are open (agent/nodeauth says what each path needs, and why a
// token in a header of its own rather than the API server's identity). The unix socket's file mode
// (root only) is its authorization.

// Rate of the node API's reviews (Deps.Reviews): a client of their own, so a flood of bad tokens slows
// only other callers of the node API, never the agent's own requests.
const (
	reviewQPS   = 20
	reviewBurst = 40
)

// DefaultDebugSocket is where the agent serves its debug API on the node: beside the bridge's OpenFlow
// management socket and owner index, so flowctl --rundir finds all three.
func DefaultDebugSocket(ovsRunDir, bridge string) string {
	return filepath.Join(ovsRunDir, bridge+".ofsdn.sock")
}

// serveObservability binds the metrics and debug listeners and serves them until ctx ends. It is the
// first start-up step: liveness answers while the rest starts, and a port taken is a clear error.
func (a *Agent) serveObservability(ctx context.Context) error {
	logErr := func(what string) func(error) {
		return func(err error) { a.log.Error(err, "serving "+what) }
	}
	var tlsConfig *tls.Config
	var guard *nodeauth.Guard
	if a.cfg.MetricsAddress != "" || a.cfg.DebugAddress != "" {
		cert, err := a.servingCert()
		if err != nil {
			return err
		}
		tlsConfig = cert.TLSConfig()
		reviews := a.deps.Reviews
		if reviews == nil {
			reviews = a.deps.Kube
		}
		guard = nodeauth.NewGuard(a.cfg.NodeName, reviews, a.log.WithName("node-api"))
	}
	if a.cfg.MetricsAddress != "" {
		ln, err := net.Listen("tcp", a.cfg.MetricsAddress)
		if err != nil {
			return fmt.Errorf("metrics and health: %w", err)
		}
		a.metricsAddr = ln.Addr().String()
		serveHTTP(ctx, ln, tlsConfig, guard.Wrap(a.metricsHandler()), logErr("metrics"))
		a.log.Info("serving /metrics, /healthz and /readyz over TLS", "address", ln.Addr().String(), "profiling", a.cfg.Profiling)
	}
	api := debugapi.Handler(debugBackend{a}, a.log.WithName("debug-api"))
	if a.cfg.DebugSocket != "" && a.cfg.DebugSocket != "-" {
		ln, err := listenUnix(a.cfg.DebugSocket)
		if err != nil {
			return fmt.Errorf("debug API: %w", err)
		}
		serveHTTP(ctx, ln, nil, api, logErr("the debug API"))
		context.AfterFunc(ctx, func() { _ = os.Remove(a.cfg.DebugSocket) })
	}
	if a.cfg.DebugAddress != "" {
		ln, err := net.Listen("tcp", a.cfg.DebugAddress)
		if err != nil {
			return fmt.Errorf("debug API: %w", err)
		}
		a.debugAddr = ln.Addr().String()
		serveHTTP(ctx, ln, tlsConfig, guard.Wrap(api), logErr("the debug API"))
		a.log.Info("serving the read-only debug API over TLS", "address", ln.Addr().String(), "socket", a.cfg.DebugSocket)
	}
	return nil
}

// servingCert is the operator's certificate, else the agent's own for the node's name and the
// addresses it serves on.
func (a *Agent) servingCert() (*nodeauth.ServingCert, error) {
	if a.cfg.TLSCertFile != "" || a.cfg.TLSKeyFile != "" {
		return nodeauth.CertFiles(a.cfg.TLSCertFile, a.cfg.TLSKeyFile)
	}
	var ips []net.IP
	for _, addr := range []string{a.cfg.DebugAddress, a.cfg.MetricsAddress} {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() && !slices.ContainsFunc(ips, ip.Equal) {
				ips = append(ips, ip)
			}
		}
	}
	cert, err := nodeauth.SelfSignedCert(filepath.Join(a.cfg.StateDir, "pki"), a.cfg.NodeName, ips)
	if err != nil {
		return nil, fmt.Errorf("node API: %w", err)
	}
	return cert, nil
}

// listenUnix listens on a socket only root may open, replacing a stale one.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// setSession gives health and the state gauges the bridge's sessions once they exist.
func (h *health) setSession(sess *ofswitch.Session, r *reconcile.Reconciler, db *ovsdb.Client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sess, h.recon, h.db = sess, r, db
	h.openflowUp = sess.Connected
	if db != nil {
		h.ovsdbUp = db.Connected
	}
}

// parts returns what setSession gave (nil before).
func (h *health) parts() (*ofswitch.Session, *reconcile.Reconciler, *ovsdb.Client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sess, h.recon, h.db
}

// counts reads the state gauges.
func (a *Agent) counts() nodeCounts {
	n := nodeCounts{Flows: map[reconcile.Category]int{}, Groups: map[reconcile.Category]int{}}
	sess, r, db := a.health.parts()
	if r != nil {
		for cat, c := range r.Counts() {
			n.Flows[cat], n.Groups[cat] = c.Flows, c.Groups
		}
	}
	if sess != nil {
		n.OpenFlowUp, n.OpenFlowConnections = sess.Connected(), 1+sess.Reconnects()
	}
	if db != nil {
		n.OVSDBUp = db.Connected()
	}
	n.Pods, n.Services, n.RemoteNodes = a.view.sizes()
	n.Ready = a.health.Ready() == nil
	return n
}

// repairedOwners lists the owners a resync repaired with what it sent each, for the log.
func repairedOwners(m map[reconcile.Owner]reconcile.SyncStats) []string {
	out := make([]string, 0, len(m))
	for _, o := range reconcile.SortedOwnerKeys(m) {
		st := m[o]
		var parts []string
		for _, c := range []struct {
			n    int
			what string
		}{{st.FlowAdds, "+%d flows"}, {st.FlowModifies, "~%d flows"}, {st.FlowDeletes, "-%d flows"},
			{st.GroupAdds, "+%d groups"}, {st.GroupModifies, "~%d groups"}, {st.GroupDeletes, "-%d groups"}} {
			if c.n > 0 {
				parts = append(parts, fmt.Sprintf(c.what, c.n))
			}
		}
		out = append(out, o.String()+" ("+strings.Join(parts, ", ")+")")
	}
	return out
}

// debugBackend answers the debug API from the agent.
type debugBackend struct{ a *Agent }

func (d debugBackend) running() (*ofswitch.Session, *reconcile.Reconciler, error) {
	sess, r, _ := d.a.health.parts()
	if sess == nil || r == nil {
		return nil, nil, fmt.Errorf("%w: the agent has not opened the bridge (start-up step: %s)", debugapi.ErrUnavailable, d.a.health.currentStep())
	}
	return sess, r, nil
}

func (d debugBackend) Node(ctx context.Context) (*debugapi.NodeInfo, error) {
	a := d.a
	if err := a.view.Ready(); err != nil {
		return nil, fmt.Errorf("%w: %v", debugapi.ErrUnavailable, err)
	}
	st := a.view.snapshot().state
	if last, ok := a.fs.lastSynced(); ok {
		st = last.state // what br0 holds, policies resolved
	}
	info := &debugapi.NodeInfo{Name: st.NodeName, Bridge: a.cfg.Bridge, NodeIP: st.NodeIP, Subnet: st.LocalSubnet,
		Gateway: pipeline.Gateway(st.LocalSubnet), Mode: string(st.Mode), ClusterNetworks: st.ClusterNetworks,
		Round: a.round, PipelineVersion: pipeline.PipelineVersion, NodePortAddress: pipeline.ServiceNodePortIP,
		VNIDs: a.view.namespaceVNIDs()}
	if cn, err := a.netInformers.Network().V1().ClusterNetworks().Lister().Get(networkv1.ClusterNetworkName); err == nil {
		if sn, err := netip.ParsePrefix(string(cn.Spec.ServiceNetwork)); err == nil {
			info.ServiceNetwork = sn
		}
	}
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
	if _, r, _ := a.health.parts(); r != nil {
		for _, o := range r.Owners() {
			info.Owners = append(info.Owners, o.String())
		}
	}
	if a.deps.DB != nil {
		ports, err := a.deps.DB.ListPorts(ctx, a.cfg.Bridge)
		if err != nil {
			return nil, fmt.Errorf("ports of %s: %w", a.cfg.Bridge, err)
		}
		for _, p := range ports {
			info.Ports = append(info.Ports, portInfo(p))
		}
	}
	info.Networks, info.Attachments = networksInfo(st, a.view.netAttachmentStatuses())
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
func networksInfo(st pipeline.NodeState, view []netAttachmentStatus) ([]debugapi.Network, []debugapi.Attachment) {
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
				IP: a.IP, MAC: a.MAC.String(), OFPort: a.OFPort, Reason: s.whyNot}
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

func (d debugBackend) Desired(context.Context) (*debugapi.Desired, error) {
	_, r, err := d.running()
	if err != nil {
		return nil, err
	}
	desired := r.Desired()
	out := &debugapi.Desired{Node: d.a.cfg.NodeName, Round: r.Round()}
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

func (d debugBackend) Diff(ctx context.Context) (*debugapi.Diff, error) {
	_, r, err := d.running()
	if err != nil {
		return nil, err
	}
	rep, err := r.Drift(ctx)
	if err != nil {
		return nil, err
	}
	out := &debugapi.Diff{Node: d.a.cfg.NodeName, Bridge: d.a.cfg.Bridge, Round: rep.Round, DesiredFlows: rep.DesiredFlows,
		DesiredGroups: rep.DesiredGroups, InstalledFlows: rep.InstalledFlows, InstalledGroups: rep.InstalledGroups,
		Entries: []debugapi.DiffEntry{}}
	for _, e := range rep.Entries {
		out.Entries = append(out.Entries, debugapi.DiffEntry{Owner: e.Owner.String(), Kind: e.Kind, State: e.State,
			Desired: e.Desired, Installed: e.Installed, Why: e.Why})
	}
	return out, nil
}

func (d debugBackend) Dump(ctx context.Context) (*debugapi.Dump, error) {
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
	out := &debugapi.Dump{Node: d.a.cfg.NodeName, Bridge: d.a.cfg.Bridge, Flows: flows, Groups: groups}
	for _, o := range r.Owners() {
		out.Owners = append(out.Owners, o.String())
	}
	return out, nil
}

func (d debugBackend) Trace(ctx context.Context, req debugapi.TraceRequest) (*debugapi.TraceResponse, error) {
	for _, flags := range req.CtNext {
		if _, err := trace.ParseCtFlags(flags.String()); err != nil {
			return nil, err
		}
	}
	args := trace.OVSArgs(d.a.cfg.Bridge, req.Packet, req.CtNext)
	out, err := unixctl.New(d.a.cfg.OVSRunDir, "ovs-vswitchd").Call(ctx, "ofproto/trace", args...)
	if err != nil {
		return nil, err
	}
	return &debugapi.TraceResponse{Node: d.a.cfg.NodeName, Args: slices.Clone(args), Output: out}, nil
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
