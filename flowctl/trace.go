package flowctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/flows/trace"
)

const traceUsage = `usage: flowctl trace SRC DST [--port N] [--proto tcp|udp|sctp|icmp] [--endpoint IP[:PORT]] [-o text|json]
       flowctl trace --dump FILE [--dump FILE...] SRC DST ...

Follows the first packet of a new connection from SRC to DST through every bridge it crosses and says
why it is delivered or dropped: each table by name, the flow matched and its owner, and a verdict.
SRC and DST are namespace/pod, namespace/pod@net1 (the pod's interface net1 on a Network),
svc/namespace/name (DST only), a node name, or an IP address (an address outside the cluster as SRC
reaches a node's NodePort: DST is then the node, --port the NodePort). From namespace/pod@net1 an IP
DST is an address on that pod's Network (or on a Network it exchanges traffic with), never a cluster
pod's: addresses overlap across Networks.

  flowctl trace blue/a blue/c --port 8080
  flowctl trace lab/x@net1 lab/y@net1         # on the Network of x's net1
  flowctl trace lab/x@net1 10.200.2.5 --proto icmp

Live, flowctl asks each node's ovs-vswitchd (ofproto/trace, through the node's agent); with --dump it
evaluates saved 'flowctl dump -o json' files of the nodes instead, the same way, without OVS.
`

// TraceOptions is a parsed flowctl trace command line.
type TraceOptions struct {
	Src, Dst string
	Proto    string
	Port     uint16 // 0: the service's port, else 80
	SrcPort  uint16
	// Endpoint picks the service endpoint to follow (IP or IP:port); empty: the first bucket's.
	Endpoint string
	// SpoofIP makes a pod SRC send from another address (what anti-spoofing is there for).
	SpoofIP netip.Addr
	Output  string
	Dumps   []string
}

// RunTrace is `flowctl trace`.
func RunTrace(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newCmdLine("trace", traceUsage, stdout, stderr)
	fs := c.fs
	var nf nodeFlags
	nf.register(fs, false)
	var o TraceOptions
	port := fs.Uint("port", 0, "destination port (default: the service's port, else 80)")
	srcPort := fs.Uint("src-port", 40000, "source port")
	proto := &choice{value: "tcp", allowed: []string{"tcp", "udp", "sctp", "icmp"}}
	fs.Var(proto, "proto", "`protocol`: tcp, udp, sctp or icmp")
	fs.StringVar(&o.Endpoint, "endpoint", "", "the service endpoint to follow, IP or IP:PORT (default: the select group's first bucket)")
	output := c.outputFlag()
	fs.Func("src-ip", "a pod SRC sends from this `address` instead of its own (see what anti-spoofing does)", func(s string) error {
		ip, err := netip.ParseAddr(s)
		if err != nil || !ip.Is4() {
			return fmt.Errorf("%q is not an IPv4 address", s)
		}
		o.SpoofIP = ip
		return nil
	})
	fs.Func("dump", "a node's 'flowctl dump -o json' `file` to evaluate offline (repeat for each node)", func(s string) error {
		o.Dumps = append(o.Dumps, s)
		return nil
	})
	positional, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(positional) != 2 {
		return c.usageErrorf("trace wants SRC and DST, got %d arguments", len(positional))
	}
	if *port > 65535 || *srcPort == 0 || *srcPort > 65535 {
		return c.usageErrorf("ports are 1-65535")
	}
	o.Output, o.Proto = output.value, proto.value
	o.Src, o.Dst, o.Port, o.SrcPort = positional[0], positional[1], uint16(*port), uint16(*srcPort)
	var w world
	if len(o.Dumps) > 0 {
		ow, err := newOfflineWorld(o.Dumps)
		if err != nil {
			return err
		}
		w = ow
	} else if lw, err := newLiveWorld(nf); err == nil {
		w = lw
	} else if local, lerr := newLocalWorld(ctx, nf); lerr == nil {
		// No API server to ask: this node's agent alone answers a trace that stays on this node.
		fmt.Fprintf(stderr, "flowctl: %v; tracing on this node only\n", err)
		w = local
	} else {
		return fmt.Errorf("%w (and on this node: %v)", err, lerr)
	}
	res, err := Trace(ctx, w, o)
	if err != nil {
		return err
	}
	if o.Output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		return enc.Encode(res)
	}
	return res.WriteText(stdout)
}

// TraceResult is a trace's answer.
type TraceResult struct {
	Proto   string      `json:"proto"`
	From    string      `json:"from"`
	To      string      `json:"to"`
	Offline bool        `json:"offline"`
	Service *ServiceHop `json:"service,omitempty"`
	// Notes say what the trace assumed about the packet before any bridge saw it.
	Notes   []string `json:"notes,omitempty"`
	Hops    []Hop    `json:"hops"`
	Verdict Verdict  `json:"verdict"`
}

// Hop is the packet's way through one node: its host (a NodePort's forwarding) or its bridge.
type Hop struct {
	Node   string        `json:"node"`
	Via    string        `json:"via"`
	Packet *trace.Packet `json:"packet,omitempty"`
	CtNext []string      `json:"ctNext,omitempty"`
	Steps  []HopStep     `json:"steps,omitempty"`
	Leaves string        `json:"leaves,omitempty"`
	Notes  []string      `json:"notes,omitempty"`
	// OFProtoTrace is ovs-vswitchd's own answer (the last run), for a live trace.
	OFProtoTrace string `json:"ofprotoTrace,omitempty"`
}

// HopStep is one table a packet went through.
type HopStep struct {
	Pass      int      `json:"pass"`
	CtState   string   `json:"ctState,omitempty"` // the conntrack flags a recirculated pass resumed with
	Depth     int      `json:"depth"`
	Table     uint8    `json:"table"`
	TableName string   `json:"tableName"`
	Priority  uint16   `json:"priority"`
	Match     string   `json:"match"`
	Owner     string   `json:"owner"`
	Cookie    string   `json:"cookie"`
	Actions   []string `json:"actions"`
	Miss      bool     `json:"miss,omitempty"`
	Bucket    *int     `json:"bucket,omitempty"`
	// Sampled is the drop cause of a sampled drop flow, as in flowctl dump's JSON; Actions keep the
	// flow's controller action as Open vSwitch has it.
	Sampled string `json:"sampled,omitempty"`
	// Shown is how text (flowctl trace, the console) shows a sampled drop's actions: "drop (sampled:
	// CAUSE, meter M)", as flowctl dump does, not as "sent to the controller". Empty for other flows.
	Shown string `json:"-"`
}

// ServiceHop is the service a trace went through and the endpoint it followed.
type ServiceHop struct {
	Service   string   `json:"service"` // namespace/name
	Owner     string   `json:"owner"`   // svc/namespace/name:port
	Frontend  string   `json:"frontend"`
	Endpoints []string `json:"endpoints"` // every endpoint the load balancer has (with its share of buckets)
	Chosen    string   `json:"chosen,omitempty"`
	Group     uint32   `json:"group,omitempty"`
	Bucket    *int     `json:"bucket,omitempty"`
	Rejected  bool     `json:"rejected,omitempty"`
}

// Verdict kinds.
const (
	VerdictDelivered   = "delivered"
	VerdictDropped     = "dropped"
	VerdictRejected    = "rejected"
	VerdictLeftCluster = "left-cluster"
	VerdictHost        = "host"
)

// Verdict is the trace's conclusion in one line.
type Verdict struct {
	Kind     string   `json:"kind"`
	Text     string   `json:"text"`
	Node     string   `json:"node,omitempty"`
	Table    *uint8   `json:"table,omitempty"`
	Owner    string   `json:"owner,omitempty"`
	Pod      string   `json:"pod,omitempty"`
	Policies []string `json:"policies,omitempty"`
	// EgressIP is the address the packet leaves the cluster from, when it is a namespace's egress IP;
	// Firewall the EgressNetworkPolicy rule that drops it ("ns/name rule 2").
	EgressIP string `json:"egressIP,omitempty"`
	Firewall string `json:"firewall,omitempty"`
	// AdminRules are the ClusterNetworkPolicy rules that decided (tier, policy, direction, rule, action).
	AdminRules []string `json:"adminRules,omitempty"`
}

// endpointSpec is a resolved SRC or DST.
type endpointSpec struct {
	kind string // pod, attachment (a pod's interface on a Network), node, service, ip
	pod  string // namespace/name; namespace/name@net1 for an attachment
	node string
	ip   netip.Addr
	svc  string // namespace/name
	// network is an attachment's Network, or the Network an ip DST is on (traced from an attachment).
	network string
	mac     string // an attachment's (the agent's record)
}

func (e endpointSpec) String() string {
	switch e.kind {
	case "pod":
		return fmt.Sprintf("pod %s (%s) on %s", e.pod, e.ip, e.node)
	case "attachment":
		return fmt.Sprintf("pod %s (%s on Network %s) on %s", e.pod, e.ip, e.network, e.node)
	case "node":
		return fmt.Sprintf("node %s (%s)", e.node, e.ip)
	case "service":
		return "service " + e.svc
	}
	if e.network != "" {
		return fmt.Sprintf("%s on Network %s", e.ip, e.network)
	}
	return e.ip.String()
}

// resolve reads a SRC or DST argument.
func resolve(ctx context.Context, w world, arg string) (endpointSpec, error) {
	if rest, ok := strings.CutPrefix(arg, "svc/"); ok {
		if ns, name, ok := strings.Cut(rest, "/"); ok && ns != "" && name != "" && !strings.Contains(name, "/") {
			return endpointSpec{kind: "service", svc: ns + "/" + name}, nil
		}
		return endpointSpec{}, fmt.Errorf("%q: a service is svc/NAMESPACE/NAME", arg)
	}
	if ns, rest, ok := strings.Cut(arg, "/"); ok && strings.Contains(rest, "@") {
		name, iface, _ := strings.Cut(rest, "@")
		if ns == "" || name == "" || iface == "" || strings.Contains(name, "/") || strings.ContainsAny(iface, "/@") {
			return endpointSpec{}, fmt.Errorf("%q: a pod's interface on a Network is NAMESPACE/NAME@INTERFACE", arg)
		}
		node, a, err := w.attachment(ctx, ns, name, iface)
		if err != nil {
			return endpointSpec{}, err
		}
		return attachmentSpec(node, a), nil
	}
	if ns, name, ok := strings.Cut(arg, "/"); ok {
		if ns == "" || name == "" || strings.Contains(name, "/") {
			return endpointSpec{}, fmt.Errorf("%q: a pod is NAMESPACE/NAME", arg)
		}
		node, ip, err := w.pod(ctx, ns, name)
		if err != nil {
			return endpointSpec{}, err
		}
		return endpointSpec{kind: "pod", pod: arg, node: node, ip: ip}, nil
	}
	if ip, err := netip.ParseAddr(arg); err == nil {
		if !ip.Is4() {
			return endpointSpec{}, fmt.Errorf("%s: ofsdn carries IPv4 only", arg)
		}
		key, node, ok, err := w.podByIP(ctx, ip)
		if err != nil {
			return endpointSpec{}, err
		}
		if ok {
			return endpointSpec{kind: "pod", pod: key, node: node, ip: ip}, nil
		}
		name, ok, err := w.nodeByIP(ctx, ip)
		if err != nil {
			return endpointSpec{}, err
		}
		if ok {
			return endpointSpec{kind: "node", node: name, ip: ip}, nil
		}
		return endpointSpec{kind: "ip", ip: ip}, nil
	}
	ip, ok, err := w.nodeByName(ctx, arg)
	if err != nil {
		return endpointSpec{}, err
	}
	if !ok {
		return endpointSpec{}, fmt.Errorf("%q is no node; SRC and DST are NAMESPACE/POD, NAMESPACE/POD@INTERFACE, svc/NAMESPACE/NAME, a node name or an IP", arg)
	}
	return endpointSpec{kind: "node", node: arg, ip: ip}, nil
}

// findService looks a service up in a node's view.
func findService(n *traceNode, key string) (debugapi.Service, bool) {
	for _, s := range n.info.Services {
		if s.Namespace+"/"+s.Name == key {
			return s, true
		}
	}
	return debugapi.Service{}, false
}

func serviceByClusterIP(n *traceNode, ip netip.Addr) (debugapi.Service, bool) {
	for _, s := range n.info.Services {
		if s.ClusterIP == ip {
			return s, true
		}
	}
	return debugapi.Service{}, false
}

// servicePort picks a service's port by number (ClusterIP port or, for NodePorts, the nodePort).
func servicePort(s debugapi.Service, proto string, port uint16, nodePort bool) (debugapi.ServicePort, error) {
	var have []string
	for _, p := range s.Ports {
		if p.Protocol != proto {
			continue
		}
		n := p.Port
		if nodePort {
			n = p.NodePort
		}
		if n != 0 {
			have = append(have, strconv.Itoa(int(n)))
		}
		if n != 0 && (port == 0 || n == port) {
			return p, nil
		}
	}
	what := "port"
	if nodePort {
		what = "NodePort"
	}
	return debugapi.ServicePort{}, fmt.Errorf("service %s/%s has no %s %s/%d (its %s %s ports: %s)", s.Namespace, s.Name, what, proto, port, proto, what, strings.Join(have, ", "))
}

// macOfIP is the MAC ofsdn gives a pod: 0a:58 and its address.
func macOfIP(ip netip.Addr) trace.MAC {
	a := ip.As4()
	return trace.MAC{0x0a, 0x58, a[0], a[1], a[2], a[3]}
}

func parseMAC(s string) (trace.MAC, error) {
	var m trace.MAC
	err := m.UnmarshalText([]byte(s))
	return m, err
}

func inNets(ip netip.Addr, nets []netip.Prefix) bool {
	for _, n := range nets {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

// Trace answers a trace question in a world.
func Trace(ctx context.Context, w world, o TraceOptions) (*TraceResult, error) {
	if _, err := trace.ProtoNumber(o.Proto); err != nil {
		return nil, err
	}
	src, err := resolve(ctx, w, o.Src)
	if err != nil {
		return nil, fmt.Errorf("SRC: %w", err)
	}
	var dst endpointSpec
	if ip, perr := netip.ParseAddr(o.Dst); perr == nil && ip.Is4() && src.kind == "attachment" {
		// An address on the source's Network: the same address may be a cluster pod's, or another Network's.
		sn, err := w.node(ctx, src.node)
		if err != nil {
			return nil, err
		}
		dst = addressOnNetwork(ctx, w, sn, src.network, ip, true)
	} else if dst, err = resolve(ctx, w, o.Dst); err != nil {
		return nil, fmt.Errorf("DST: %w", err)
	}
	if src.kind == "service" {
		return nil, errors.New("SRC: a service sends nothing; trace from one of its endpoints instead")
	}
	if o.SpoofIP.IsValid() && src.kind != "pod" && src.kind != "attachment" {
		return nil, errors.New("--src-ip is for a pod SRC")
	}
	res := &TraceResult{Proto: o.Proto, Offline: !w.live(), From: src.String(), To: dst.String()}

	// Where the packet first meets a bridge, and as what.
	startNode := src.node
	if src.kind == "ip" {
		if dst.kind != "node" {
			return nil, fmt.Errorf("SRC %s is outside the cluster: it reaches pods only through a node's NodePort (DST a node, --port the NodePort)", src.ip)
		}
		startNode = dst.node
	}
	n, err := w.node(ctx, startNode)
	if err != nil {
		return nil, err
	}
	tun0MAC, err := parseMAC(func() string { p, _ := n.port(pipeline.PortNameTun0); return p.MAC }())
	if err != nil {
		tun0MAC = trace.MAC{0x0a, 0x58, 0, 0, 0, 1} // not matched by any flow; OVSDB did not say
	}
	var svc *debugapi.Service
	var svcPort debugapi.ServicePort
	dstIP, dstPort := dst.ip, o.Port
	switch dst.kind {
	case "service":
		s, ok := findService(n, dst.svc)
		if !ok {
			return nil, fmt.Errorf("DST: node %s load-balances no service %s (a headless service has no ClusterIP)", n.info.Name, dst.svc)
		}
		svc = &s
	case "ip":
		if s, ok := serviceByClusterIP(n, dst.ip); ok && src.kind != "attachment" {
			svc = &s
			res.To = fmt.Sprintf("service %s/%s (%s)", s.Namespace, s.Name, dst.ip)
		}
	}
	if svc != nil && src.kind != "ip" {
		if svcPort, err = servicePort(*svc, o.Proto, o.Port, false); err != nil {
			return nil, fmt.Errorf("DST: %w", err)
		}
		dstIP, dstPort = svc.ClusterIP, svcPort.Port
	}
	if dstPort == 0 {
		dstPort = 80
	}
	p := trace.Packet{Proto: o.Proto, IPDst: dstIP, SrcPort: o.SrcPort, DstPort: dstPort}
	if o.Proto == "icmp" {
		p.SrcPort, p.DstPort = 0, 0
	}
	via := ""
	switch src.kind {
	case "pod":
		port, ok := n.podPort(src.pod)
		if !ok {
			return nil, fmt.Errorf("SRC: pod %s has no port on node %s's bridge (OVSDB), so its packets never reach br0", src.pod, n.info.Name)
		}
		mac, err := n.podMAC(src.pod)
		if err != nil {
			return nil, fmt.Errorf("SRC: %w", err)
		}
		p.InPort, p.EthSrc, p.IPSrc = uint32(port.OFPort), mac, src.ip
		if o.SpoofIP.IsValid() {
			p.IPSrc = o.SpoofIP
			res.From += " sending as " + o.SpoofIP.String()
		}
		// A pod reaches its subnet and the cluster network on-link (ARP for the address), the rest
		// through its gateway, whose MAC is tun0's.
		p.EthDst = tun0MAC
		if inNets(dstIP, n.info.ClusterNetworks) && dstIP != n.info.Gateway {
			p.EthDst = macOfIP(dstIP)
		}
		via = fmt.Sprintf("in_port %d (%s, pod %s)", p.InPort, port.Name, src.pod)
	case "attachment":
		if via, err = attachmentPacket(ctx, w, n, src, dst, &p, o.SpoofIP, res); err != nil {
			return nil, err
		}
	case "node":
		if dst.kind == "attachment" {
			res.Verdict = Verdict{Kind: VerdictHost, Node: n.info.Name,
				Text: fmt.Sprintf("node %s has no way onto Network %s: a Network is reached only by its pods and those of the Networks it exchanges traffic with", n.info.Name, dst.network)}
			return res, nil
		}
		if !inNets(dstIP, n.info.ClusterNetworks) && !(svc != nil || inNet(dstIP, n.info.ServiceNetwork)) {
			res.Verdict = Verdict{Kind: VerdictHost, Node: n.info.Name,
				Text: fmt.Sprintf("node %s reaches %s through its own network, not through br0", n.info.Name, dstIP)}
			return res, nil
		}
		p.InPort, p.EthSrc, p.IPSrc = n.roleNumber(pipeline.RoleHost), tun0MAC, n.info.Gateway
		p.EthDst = macOfIP(dstIP)
		if svc != nil {
			p.EthDst = trace.MAC(pipeline.ServiceMAC) // the host routes services via br0's hairpin address
		}
		via = fmt.Sprintf("in_port %d (tun0, the host of node %s)", p.InPort, n.info.Name)
	case "ip":
		// A client outside the cluster at a NodePort: the host forwards it into br0 (nf_tables).
		s, sp, err := nodePortService(n, o.Proto, o.Port)
		if err != nil {
			return nil, fmt.Errorf("DST: %w", err)
		}
		svc, svcPort = &s, sp
		p.IPSrc, p.IPDst, p.DstPort = src.ip, n.info.NodePortAddress, sp.NodePort
		masq := "keeps the client's address (externalTrafficPolicy Local)"
		if !s.ExternalLocal {
			p.IPSrc = n.info.Gateway
			masq = fmt.Sprintf("masquerades the source to the gateway %s (externalTrafficPolicy Cluster)", n.info.Gateway)
		}
		p.InPort, p.EthSrc, p.EthDst = n.roleNumber(pipeline.RoleHost), tun0MAC, trace.MAC(pipeline.ServiceMAC)
		res.Hops = append(res.Hops, Hop{Node: n.info.Name, Via: "host", Notes: []string{fmt.Sprintf(
			"%s:%d → %s:%d is NodePort %s/%d of service %s/%s: the host DNATs it to %s:%d and %s, into br0 through tun0",
			src.ip, o.SrcPort, dst.ip, sp.NodePort, o.Proto, sp.NodePort, s.Namespace, s.Name, n.info.NodePortAddress, sp.NodePort, masq)}})
		via = fmt.Sprintf("in_port %d (tun0, from the host's NodePort forwarding)", p.InPort)
	}
	if svc != nil {
		res.Service = &ServiceHop{Service: svc.Namespace + "/" + svc.Name, Owner: svcPort.Owner,
			Frontend: fmt.Sprintf("%s:%d/%s", p.IPDst, p.DstPort, o.Proto)}
	}
	want, err := parseEndpoint(o.Endpoint)
	if err != nil {
		return nil, err
	}
	return res, follow(ctx, w, n, p, via, want, res)
}

func inNet(ip netip.Addr, p netip.Prefix) bool { return p.IsValid() && p.Contains(ip) }

// podPort is a pod's port on the bridge, from OVSDB.
func (n *traceNode) podPort(key string) (debugapi.Port, bool) {
	for _, p := range n.info.Ports {
		if p.Pod == key && p.OFPort > 0 {
			return p, true
		}
	}
	return debugapi.Port{}, false
}

// podMAC is a pod's MAC as the agent knows it.
func (n *traceNode) podMAC(key string) (trace.MAC, error) {
	for _, p := range n.info.Pods {
		if p.Namespace+"/"+p.Name == key {
			return parseMAC(p.MAC)
		}
	}
	return nil, fmt.Errorf("node %s's agent renders no pod %s (its namespace has no VNID yet?)", n.info.Name, key)
}

// nodePortService finds the service a node serves a NodePort for.
func nodePortService(n *traceNode, proto string, port uint16) (debugapi.Service, debugapi.ServicePort, error) {
	if port == 0 {
		return debugapi.Service{}, debugapi.ServicePort{}, errors.New("a client outside the cluster needs --port: the NodePort it connects to")
	}
	for _, s := range n.info.Services {
		for _, p := range s.Ports {
			if p.Protocol == proto && p.NodePort == port {
				return s, p, nil
			}
		}
	}
	return debugapi.Service{}, debugapi.ServicePort{}, fmt.Errorf("node %s serves no NodePort %s/%d: the connection reaches its host, not br0", n.info.Name, proto, port)
}

// wantedEndpoint is --endpoint.
type wantedEndpoint struct {
	ip   netip.Addr
	port uint16
}

func parseEndpoint(s string) (*wantedEndpoint, error) {
	if s == "" {
		return nil, nil
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return &wantedEndpoint{ip: ap.Addr(), port: ap.Port()}, nil
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return nil, fmt.Errorf("--endpoint %q: want IP or IP:PORT", s)
	}
	return &wantedEndpoint{ip: ip}, nil
}

// bucketEndpoint reads the endpoint a service bucket loads (reg4, reg5).
func bucketEndpoint(b openflow.Bucket) (netip.AddrPort, bool) {
	var ip, port uint64
	var haveIP bool
	for _, a := range b.Actions {
		if l, ok := a.(openflow.Load); ok {
			switch l.Dst.Field {
			case pipeline.RegEndpointIP:
				ip, haveIP = l.Value, true
			case pipeline.RegEndpointPort:
				port = l.Value
			}
		}
	}
	if !haveIP {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)}), uint16(port)), true
}

// maxHops bounds a trace across nodes (a loop between nodes would be a pipeline bug).
const maxHops = 6

// follow traces hop by hop from the first bridge until the packet is delivered, dropped or leaves.
func follow(ctx context.Context, w world, n *traceNode, p trace.Packet, via string, want *wantedEndpoint, res *TraceResult) error {
	for hop := 0; ; hop++ {
		if hop >= maxHops {
			return fmt.Errorf("the packet crossed %d bridges without an end: a loop between nodes?", maxHops)
		}
		var chooseErr error
		choose := func(id uint32) []int {
			g, ok := n.bridge.Group(id)
			if !ok {
				chooseErr = fmt.Errorf("node %s: group %d is not on the bridge", n.info.Name, id)
				return nil
			}
			var out, all []int
			for i, b := range g.Buckets {
				ep, ok := bucketEndpoint(b)
				if !ok {
					continue
				}
				all = append(all, i)
				if want != nil && ep.Addr() == want.ip && (want.port == 0 || want.port == ep.Port()) {
					out = append(out, i)
				}
			}
			if want != nil && len(out) == 0 {
				chooseErr = fmt.Errorf("--endpoint %s is none of group %d's endpoints (%s)", want.ip, id, strings.Join(groupEndpoints(g), ", "))
			}
			if want == nil {
				return all[:min(1, len(all))]
			}
			return out
		}
		path, flags, err := trace.Run(ctx, n.tracer, p, choose)
		if chooseErr != nil {
			return chooseErr
		}
		if err != nil {
			return fmt.Errorf("node %s: %w", n.info.Name, err)
		}
		pkt := p
		h := Hop{Node: n.info.Name, Via: via, Packet: &pkt, OFProtoTrace: path.Raw}
		for _, f := range flags {
			h.CtNext = append(h.CtNext, f.String())
		}
		h.Steps = describeSteps(n, path)
		noteService(n, path, res)
		next, nextVia, done := outcome(ctx, w, n, path, &h, res)
		res.Hops = append(res.Hops, h)
		if done != nil {
			return done
		}
		if next == nil {
			return nil
		}
		n, p, via = next.node, next.packet, nextVia
	}
}

// nextHop is where a packet goes on after leaving a bridge by the tunnel.
type nextHop struct {
	node   *traceNode
	packet trace.Packet
}

func describeSteps(n *traceNode, path *trace.Path) []HopStep {
	var out []HopStep
	for i, pass := range path.Passes {
		for j, s := range pass.Steps {
			st := HopStep{Pass: i, Depth: s.Depth, Table: uint8(s.Table), TableName: pipeline.TableName(s.Table), Priority: s.Priority,
				Match: s.Match, Owner: n.ownerOf(s.Cookie), Cookie: reconcile.Cookie(s.Cookie).String(), Actions: s.Actions, Miss: s.Miss}
			if j == 0 && i > 0 {
				st.CtState = pass.CtState
			}
			if f, ok := n.flowOf(s); ok {
				if cause, shown, ok := sampledDropText(f); ok {
					st.Sampled, st.Shown = string(cause), shown
				}
			}
			if s.Bucket >= 0 {
				b := s.Bucket
				st.Bucket = &b
			}
			out = append(out, st)
		}
	}
	return out
}

func groupEndpoints(g openflow.GroupEntry) []string {
	count := map[netip.AddrPort]int{}
	var order []netip.AddrPort
	for _, b := range g.Buckets {
		if ep, ok := bucketEndpoint(b); ok {
			if count[ep] == 0 {
				order = append(order, ep)
			}
			count[ep]++
		}
	}
	slices.SortFunc(order, func(a, b netip.AddrPort) int { return a.Compare(b) })
	out := make([]string, len(order))
	for i, ep := range order {
		out[i] = fmt.Sprintf("%s (%d/%d buckets)", ep, count[ep], len(g.Buckets))
	}
	return out
}

// noteService records the service's load balancing: its endpoints, the one followed, a reject.
func noteService(n *traceNode, path *trace.Path, res *TraceResult) {
	if res.Service == nil || res.Service.Chosen != "" || res.Service.Rejected {
		return
	}
	for _, pass := range path.Passes {
		for _, s := range pass.Steps {
			obj, ok := n.objectOf(s.Cookie)
			if !ok || obj.Kind != pipeline.KindService {
				continue
			}
			owner := obj.Owner().String()
			if res.Service.Owner == "" {
				res.Service.Owner = owner
			}
			for _, a := range s.Actions {
				if id, ok := strings.CutPrefix(a, "group:"); ok {
					gid, _ := strconv.ParseUint(id, 10, 32)
					if g, ok := n.bridge.Group(uint32(gid)); ok {
						res.Service.Group, res.Service.Endpoints = g.ID, groupEndpoints(g)
					}
					if s.Bucket >= 0 {
						b := s.Bucket
						res.Service.Bucket = &b
					}
				}
				if !strings.HasPrefix(a, "ct(") || !strings.Contains(a, "nat(dst=") {
					continue
				}
				target := a[strings.Index(a, "nat(dst=")+len("nat(dst="):]
				target, _, _ = strings.Cut(target, ")")
				if s.Table == pipeline.TableServices {
					res.Service.Rejected = true // DNATed to the gateway's reject ports
				} else {
					res.Service.Chosen = target
				}
			}
		}
	}
	if len(res.Service.Endpoints) == 0 {
		// No group (sessionAffinity chooses by client address, or one endpoint): the view's endpoints.
		for _, s := range n.info.Services {
			for _, sp := range s.Ports {
				if sp.Owner == res.Service.Owner {
					for _, e := range sp.Endpoints {
						if e.Ready {
							res.Service.Endpoints = append(res.Service.Endpoints, netip.AddrPortFrom(e.IP, e.Port).String())
						}
					}
				}
			}
		}
		sort.Strings(res.Service.Endpoints)
	}
}

// outcome reads where a bridge sent the packet: on to another node (next), or a verdict.
func outcome(ctx context.Context, w world, n *traceNode, path *trace.Path, h *Hop, res *TraceResult) (*nextHop, string, error) {
	info := n.info
	if path.StoppedAtGroup != 0 {
		res.Verdict = Verdict{Kind: VerdictDropped, Node: info.Name, Text: fmt.Sprintf("stopped at select group %d on node %s: it has no bucket to follow", path.StoppedAtGroup, info.Name)}
		return nil, "", nil
	}
	if path.Dropped() {
		res.Verdict = dropVerdict(n, path, res.Proto)
		return nil, "", nil
	}
	if len(path.Outputs) > 1 {
		var ports []string
		for _, o := range path.Outputs {
			ports = append(ports, portName(n, o.Port))
		}
		h.Leaves = "copies leave by " + strings.Join(ports, ", ")
		res.Verdict = Verdict{Kind: VerdictDelivered, Node: info.Name, Text: "flooded to " + strings.Join(ports, ", ") + " on node " + info.Name}
		return nil, "", nil
	}
	out := path.Outputs[0]
	role := n.portRole(out.Port)
	exit, ok := exits[role]
	if !ok {
		return nil, "", fmt.Errorf("node %s: the packet leaves by %s, a port of role %q, which flowctl cannot follow", info.Name, portName(n, out.Port), role)
	}
	return exit(ctx, w, exitHop{n: n, path: path, out: out, hop: h, res: res})
}

// exitHop is a packet leaving a bridge by one port.
type exitHop struct {
	n    *traceNode
	path *trace.Path
	out  trace.Output
	hop  *Hop
	res  *TraceResult
}

// exits says, for every role a port of br0 can have (pipeline.Ports), what becomes of a packet that
// leaves by it: the next node and the packet as it arrives there, or a verdict.
var exits = map[pipeline.PortRole]func(context.Context, world, exitHop) (*nextHop, string, error){
	pipeline.RoleTunnel: exitTunnel,
	pipeline.RoleUplink: exitUplink,
	pipeline.RoleHost:   exitHost,
	pipeline.RolePod:    exitPod,
}

// exitTunnel follows VXLAN to the node whose address is the tunnel's destination.
func exitTunnel(ctx context.Context, w world, x exitHop) (*nextHop, string, error) {
	info, f := x.n.info, x.out.Fields
	peer := ""
	for _, r := range info.RemoteNodes {
		if r.NodeIP == f.TunDst {
			peer = r.Name
		}
	}
	x.hop.Leaves = fmt.Sprintf("leaves by %s to node %s (%s) with tun_id %#x", pipeline.PortNameVXLAN, peer, f.TunDst, f.TunID)
	if peer == "" {
		if next, from, ok, err := exitToEgressIP(ctx, w, x); ok || err != nil {
			return next, from, err
		}
		x.res.Verdict = Verdict{Kind: VerdictDropped, Node: info.Name, Text: fmt.Sprintf("sent through the tunnel to %s, which is no node node %s knows", f.TunDst, info.Name)}
		return nil, "", nil
	}
	next, err := w.node(ctx, peer)
	if err != nil {
		return nil, "", err
	}
	p := arriving(next, pipeline.RoleTunnel, f, x.res.Proto)
	p.TunID, p.TunSrc, p.TunDst = f.TunID, info.NodeIP, f.TunDst
	return &nextHop{node: next, packet: p}, fmt.Sprintf("in_port %d (%s, tun_id %#x from %s, node %s)", p.InPort, pipeline.PortNameVXLAN, f.TunID, info.NodeIP, info.Name), nil
}

// exitUplink follows an unencapsulated frame (encapsulation none) across the uplink segment to the
// node whose uplink MAC it is addressed to: the uplink bridges switch it by MAC into that node's br0.
func exitUplink(ctx context.Context, w world, x exitHop) (*nextHop, string, error) {
	info, f := x.n.info, x.out.Fields
	dst, _ := parseMAC(f.EthDst)
	peer := ""
	var peerIP netip.Addr
	for _, r := range info.RemoteNodes {
		if bytes.Equal(pipeline.UplinkMAC(r.NodeIP), dst) {
			peer, peerIP = r.Name, r.NodeIP
		}
	}
	if peer == "" {
		x.hop.Leaves = fmt.Sprintf("leaves by %s, unencapsulated, to %s", pipeline.PortNameUplink, f.EthDst)
		x.res.Verdict = Verdict{Kind: VerdictDropped, Node: info.Name,
			Text: fmt.Sprintf("sent out of the uplink port to %s, the uplink MAC of no node node %s knows", f.EthDst, info.Name)}
		return nil, "", nil
	}
	x.hop.Leaves = fmt.Sprintf("leaves by %s to node %s (%s), unencapsulated, from uplink MAC %s to %s", pipeline.PortNameUplink, peer, peerIP, f.EthSrc, f.EthDst)
	next, err := w.node(ctx, peer)
	if err != nil {
		return nil, "", err
	}
	if len(next.info.Ports) > 0 {
		if _, ok := next.port(pipeline.PortNameUplink); !ok {
			x.res.Verdict = Verdict{Kind: VerdictDropped, Node: peer,
				Text: fmt.Sprintf("node %s's bridge has no uplink port (it takes VXLAN only): the frame from node %s never reaches it", peer, info.Name)}
			return nil, "", nil
		}
	}
	p := arriving(next, pipeline.RoleUplink, f, x.res.Proto)
	return &nextHop{node: next, packet: p}, fmt.Sprintf("in_port %d (%s, unencapsulated from node %s's uplink MAC %s)", p.InPort, pipeline.PortNameUplink, info.Name, f.EthSrc), nil
}

// arriving is the packet that left a bridge with fields f as it enters the next node's bridge by its
// port of a role.
func arriving(next *traceNode, role pipeline.PortRole, f trace.Fields, proto string) trace.Packet {
	src, _ := parseMAC(f.EthSrc)
	dst, _ := parseMAC(f.EthDst)
	p := trace.Packet{InPort: next.roleNumber(role), EthSrc: src, EthDst: dst, Proto: proto, IPSrc: f.IPSrc, IPDst: f.IPDst, SrcPort: f.SrcPort, DstPort: f.DstPort}
	if p.Proto == "icmp" {
		p.SrcPort, p.DstPort = 0, 0
	}
	return p
}

// exitHost reads what the node's host does with a packet br0 hands it through tun0.
func exitHost(ctx context.Context, w world, x exitHop) (*nextHop, string, error) {
	info, f, res := x.n.info, x.out.Fields, x.res
	x.hop.Leaves = fmt.Sprintf("leaves by %s to the host of node %s, towards %s:%d", pipeline.PortNameTun0, info.Name, f.IPDst, f.DstPort)
	switch {
	case f.IPDst == info.Gateway && f.DstPort >= pipeline.RejectPortMin && f.DstPort <= pipeline.RejectPortMax && res.Service != nil && res.Service.Rejected:
		res.Verdict = Verdict{Kind: VerdictRejected, Node: info.Name, Owner: res.Service.Owner,
			Text: fmt.Sprintf("service %s has no ready endpoint: the host of node %s refuses the connection", res.Service.Service, info.Name)}
	case f.IPDst == info.Gateway || f.IPDst == info.NodeIP:
		res.Verdict = Verdict{Kind: VerdictHost, Node: info.Name, Text: fmt.Sprintf("delivered to the host of node %s", info.Name)}
	case inNets(f.IPDst, info.ClusterNetworks) || inNet(f.IPDst, info.ServiceNetwork):
		res.Verdict = Verdict{Kind: VerdictHost, Node: info.Name, Text: fmt.Sprintf("handed to the host of node %s for %s, an address br0 does not route", info.Name, f.IPDst)}
	case heldEgressIP(info, f.EthSrc).IsValid():
		eip := heldEgressIP(info, f.EthSrc)
		target := f.IPDst.String()
		if name, ok, _ := w.nodeByIP(ctx, f.IPDst); ok {
			target = "node " + name + " (" + f.IPDst.String() + ")"
		}
		res.Verdict = Verdict{Kind: VerdictLeftCluster, Node: info.Name, EgressIP: eip.String(),
			Text: fmt.Sprintf("leaves the cluster from node %s to %s with egress IP %s%s: the host SNATs it from %s to %s", info.Name, target, eip,
				egressNamespaceText(info, eip), f.IPSrc, eip)}
	default:
		target := f.IPDst.String()
		if name, ok, _ := w.nodeByIP(ctx, f.IPDst); ok {
			target = "node " + name + " (" + f.IPDst.String() + ")"
		}
		snat := fmt.Sprintf("SNATs it from %s to %s", f.IPSrc, info.NodeIP)
		if !inNets(f.IPSrc, info.ClusterNetworks) {
			snat = fmt.Sprintf("sends it from %s", f.IPSrc)
		}
		res.Verdict = Verdict{Kind: VerdictLeftCluster, Node: info.Name,
			Text: fmt.Sprintf("leaves the cluster network from node %s to %s: the host %s", info.Name, target, snat)}
	}
	return nil, "", nil
}

// exitPod delivers to the pod whose port it is (or names the port, when OVSDB ties it to no pod).
func exitPod(_ context.Context, _ world, x exitHop) (*nextHop, string, error) {
	info, port := x.n.info, x.out.Port
	pod := ""
	for _, pt := range info.Ports {
		if uint32(pt.OFPort) == port {
			pod = pt.Pod
		}
	}
	x.hop.Leaves = fmt.Sprintf("leaves by %s", portName(x.n, port))
	if pod == "" {
		x.res.Verdict = Verdict{Kind: VerdictDelivered, Node: info.Name, Text: fmt.Sprintf("delivered to %s on node %s", portName(x.n, port), info.Name)}
		return nil, "", nil
	}
	if a, ok := x.n.attachmentOnPort(port); ok {
		x.res.Verdict = Verdict{Kind: VerdictDelivered, Node: info.Name, Pod: a.Key(),
			Text: fmt.Sprintf("delivered to pod %s (Network %s) via node %s", a.Key(), a.Network, info.Name)}
		return nil, "", nil
	}
	policies := allowingPolicies(x.n, x.path)
	text := fmt.Sprintf("delivered to %s via node %s", pod, info.Name)
	if len(policies) > 0 {
		text += fmt.Sprintf(" (allowed by NetworkPolicy %s)", strings.Join(policies, ", "))
	}
	admin := adminDecisions(x.res, x.path)
	if len(admin) > 0 {
		text += " (decided by " + strings.Join(admin, "; ") + ")"
	}
	x.res.Verdict = Verdict{Kind: VerdictDelivered, Node: info.Name, Pod: pod, Text: text, Policies: policies, AdminRules: admin}
	return nil, "", nil
}

// portName names an OpenFlow port of a node's bridge.
func portName(n *traceNode, port uint32) string {
	for _, p := range n.info.Ports {
		if uint32(p.OFPort) == port {
			if p.Pod != "" {
				return fmt.Sprintf("port %d (%s, pod %s)", port, p.Name, p.Pod)
			}
			return fmt.Sprintf("port %d (%s)", port, p.Name)
		}
	}
	return fmt.Sprintf("port %d", port)
}

// allowingPolicies are the NetworkPolicies whose flows let the packet through.
func allowingPolicies(n *traceNode, path *trace.Path) []string {
	var out []string
	for _, pass := range path.Passes {
		for _, s := range pass.Steps {
			if obj, ok := n.objectOf(s.Cookie); ok && obj.Kind == pipeline.KindNetworkPolicy {
				name := obj.Key()
				if !slices.Contains(out, name) {
					out = append(out, name)
				}
			}
		}
	}
	return out
}

// policiesSelecting lists the NetworkPolicies whose rules select a local pod's port in a policy table
// (reg2 in ingress-isolation, in_port in egress-policy): the ones that isolate it.
func policiesSelecting(n *traceNode, table openflow.TableID, port uint32) []string {
	field := pipeline.RegOutPort
	if table == pipeline.TableEgressPolicy {
		field = openflow.FieldInPort
	}
	var out []string
	for _, f := range n.flows {
		if f.Table != table {
			continue
		}
		mf, ok := f.Match.Get(field)
		if !ok || mf.Masked || uint32(mf.Value) != port {
			continue
		}
		if obj, ok := n.objectOf(f.Cookie); ok && obj.Kind == pipeline.KindNetworkPolicy {
			name := obj.Key()
			if !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	sort.Strings(out)
	return out
}

// isolatingPolicies are the policies the agent says isolate the pod on port in a direction (agents
// before drop attribution do not say: none).
func isolatingPolicies(info *debugapi.NodeInfo, port uint32, ingress bool) []string {
	for _, p := range info.Pods {
		if p.OFPort == port {
			if ingress {
				return p.IngressPolicies
			}
			return p.EgressPolicies
		}
	}
	return nil
}

// tenantName names a VNID by its namespaces.
func tenantName(info *debugapi.NodeInfo, vnid uint32) string {
	var names []string
	for ns, v := range info.VNIDs {
		if v == vnid {
			names = append(names, ns)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return fmt.Sprintf("VNID %d", vnid)
	}
	return fmt.Sprintf("VNID %d (%s)", vnid, strings.Join(names, ", "))
}

// dropVerdict explains where and why a packet died.
func dropVerdict(n *traceNode, path *trace.Path, proto string) Verdict {
	info := n.info
	last, _ := path.Last()
	table := uint8(last.Table)
	owner := n.ownerOf(last.Cookie)
	obj, _ := n.objectOf(last.Cookie)
	v := Verdict{Kind: VerdictDropped, Node: info.Name, Table: &table, Owner: owner}
	where := fmt.Sprintf("dropped at table %d %s", last.Table, pipeline.TableName(last.Table))
	f := path.Final
	l4 := func() string {
		if f.DstPort == 0 {
			return "it"
		}
		return fmt.Sprintf("%s/%d", proto, f.DstPort)
	}
	ref, byAdmin := pipeline.AdminRuleOfActions(last.Actions)
	if text, ok := networkDropVerdict(n, path, where); ok && !last.Miss {
		v.Text = text
		if a, ok := n.attachmentOnPort(f.InPort); ok && last.Table == pipeline.TablePodIngress {
			v.Pod = a.Key()
		}
		return v
	}
	switch {
	case last.Miss:
		v.Text = where + ": no flow matched"
	case byAdmin:
		v.AdminRules = []string{ref.String()}
		v.Text = fmt.Sprintf("%s by %s", where, ref)
	case last.Table == pipeline.TableIngressIsolation && info.Mode == string(pipeline.ModeMultitenant) && last.Priority == 0:
		v.Text = fmt.Sprintf("%s: tenant %s may not reach %s", where, tenantName(info, f.Regs[0]), tenantName(info, f.Regs[1]))
	case (last.Table == pipeline.TableIngressIsolation || last.Table == pipeline.TableEgressPolicy) && obj.Kind == pipeline.KindPod:
		port := f.Regs[2]
		dir := "rule"
		if last.Table == pipeline.TableEgressPolicy {
			port, dir = f.InPort, "egress rule"
		}
		v.Policies = policiesSelecting(n, last.Table, port)
		v.Pod = obj.Key()
		isolating := isolatingPolicies(info, port, last.Table == pipeline.TableIngressIsolation)
		for _, p := range isolating {
			if !slices.Contains(v.Policies, p) {
				v.Policies = append(v.Policies, p)
			}
		}
		sort.Strings(v.Policies)
		switch {
		case len(isolating) > 0:
			// A default deny: name the policies that isolate the pod (a deny-all has no flow of its own).
			v.Text = fmt.Sprintf("%s by the NetworkPolicy isolation of pod %s: isolated by NetworkPolicy %s (no %s allows %s)", where, v.Pod,
				strings.Join(isolating, ", "), dir, l4())
		case len(v.Policies) == 0:
			v.Text = fmt.Sprintf("%s by the NetworkPolicy isolation of pod %s (no policy on this node allows %s)", where, v.Pod, l4())
		default:
			v.Text = fmt.Sprintf("%s by NetworkPolicy %s (no %s allows %s)", where, strings.Join(v.Policies, ", "), dir, l4())
		}
	case last.Table == pipeline.TablePodIngress:
		v.Text = fmt.Sprintf("%s: in_port %d sent it as %s / %s, which is no pod's own (anti-spoofing)", where, f.InPort, f.EthSrc, f.IPSrc)
		for _, p := range info.Ports {
			if uint32(p.OFPort) == f.InPort && p.Pod != "" {
				v.Text = fmt.Sprintf("%s: pod %s sent it from %s / %s, not its own address (anti-spoofing)", where, p.Pod, f.EthSrc, f.IPSrc)
			}
		}
	case last.Table == pipeline.TableTunnelIngress:
		v.Text = fmt.Sprintf("%s: tunnel source %s is no node this node knows, or the inner source %s is neither in that node's subnet nor its own address", where, f.TunSrc, f.IPSrc)
	case owner == pipeline.TunnelGuardOwner.String():
		v.Text = fmt.Sprintf("%s by the tunnel guard: no pod may send to the tunnel port %s of %s, which is not a pod (it would inject into the overlay)", where, l4(), f.IPDst)
	case last.Table == pipeline.TableRouting:
		v.Text = fmt.Sprintf("%s: no node hosts %s", where, f.IPDst)
	case last.Table == pipeline.TableEgressFirewall && obj.Kind == pipeline.KindEgressNetworkPolicy:
		v.Firewall = obj.Key()
		rule := "it cannot be enforced as written (several policies in the namespace, or a rule that does not parse): everything leaving the cluster is dropped"
		if i, ok := pipeline.EgressRuleOf(last.Priority); ok {
			v.Firewall = fmt.Sprintf("%s rule %d", obj.Key(), i)
			rule = fmt.Sprintf("rule %d", i)
			if r, ok := egressRule(info, obj.Namespace, i); ok {
				rule += " (" + r.String() + ")"
			}
			rule += ", the first rule matching " + f.IPDst.String()
		}
		v.Text = fmt.Sprintf("%s by EgressNetworkPolicy %s: %s", where, obj.Key(), rule)
	case last.Table == pipeline.TableEgressIP && obj.Kind == pipeline.KindNetNamespace:
		v.Text = fmt.Sprintf("%s: namespace %s has egress IPs but none can be used (see its NetNamespace status): its traffic leaving the cluster is dropped", where, obj.Name)
	case last.Table == pipeline.TableEgressOut:
		v.Text = fmt.Sprintf("%s: another node's egress traffic for %s, an egress IP node %s does not hold (never sent from the node's own address)", where, f.TunDst, info.Name)
	case last.Table == pipeline.TableEgressReturn:
		v.Text = fmt.Sprintf("%s: from %s outside the cluster, and no reply of a connection a pod here opened through an egress IP", where, f.IPSrc)
	case last.Table == pipeline.TableServices && obj.Kind == pipeline.KindService:
		v.Text = fmt.Sprintf("%s: service %s:%s has no endpoint on node %s for this traffic (traffic policy Local)", where, obj.Key(), obj.Port, info.Name)
	default:
		v.Text = fmt.Sprintf("%s by the flow of %s (priority %d %s)", where, owner, last.Priority, last.Match)
	}
	return v
}

// WriteText prints the trace for people: each node's tables, then the verdict.
func (r *TraceResult) WriteText(w io.Writer) error {
	mode := ""
	if r.Offline {
		mode = " (offline, from dumps)"
	}
	fmt.Fprintf(w, "trace %s from %s to %s%s\n", r.Proto, r.From, r.To, mode)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	if s := r.Service; s != nil {
		fmt.Fprintf(w, "service %s at %s (%s)\n", s.Service, s.Frontend, s.Owner)
		switch {
		case s.Rejected:
			fmt.Fprintln(w, "  no ready endpoint: rejected")
		case len(s.Endpoints) > 0:
			fmt.Fprintf(w, "  endpoints: %s\n", strings.Join(s.Endpoints, ", "))
		}
		if s.Chosen != "" {
			how := "chosen by the client's address (sessionAffinity)"
			if s.Bucket != nil {
				how = fmt.Sprintf("bucket %d of select group %d; the datapath picks by hash, --endpoint follows another", *s.Bucket, s.Group)
			}
			fmt.Fprintf(w, "  following endpoint %s (%s)\n", s.Chosen, how)
		}
	}
	for _, h := range r.Hops {
		fmt.Fprintf(w, "\nnode %s, %s\n", h.Node, h.Via)
		if h.Packet != nil {
			fmt.Fprintf(w, "  packet: %s\n", h.Packet.OVSFlow())
		}
		for _, n := range h.Notes {
			fmt.Fprintf(w, "  %s\n", n)
		}
		for _, s := range h.Steps {
			if s.CtState != "" {
				fmt.Fprintf(w, "  -- conntrack: resumed as %s\n", s.CtState)
			}
			indent := strings.Repeat("  ", s.Depth)
			if s.Miss {
				fmt.Fprintf(w, "  %s%3d %-17s no match: drop\n", indent, s.Table, s.TableName)
				continue
			}
			match := s.Match
			if match == "" {
				match = "*"
			}
			fmt.Fprintf(w, "  %s%3d %-17s priority %-5d %s\n", indent, s.Table, s.TableName, s.Priority, match)
			acts := strings.Join(s.Actions, ",")
			switch {
			case s.Shown != "":
				acts = s.Shown
			case acts == "":
				acts = "drop"
			}
			if s.Bucket != nil {
				acts += fmt.Sprintf(" (bucket %d)", *s.Bucket)
			}
			fmt.Fprintf(w, "  %s      owner %s: %s\n", indent, s.Owner, acts)
			if ref, ok := pipeline.AdminRuleOfActions(s.Actions); ok {
				fmt.Fprintf(w, "  %s      decided by %s\n", indent, ref)
			}
		}
		if h.Leaves != "" {
			fmt.Fprintf(w, "  => %s\n", h.Leaves)
		}
	}
	fmt.Fprintf(w, "\nverdict: %s\n", r.Verdict.Text)
	return nil
}

// exitToEgressIP follows VXLAN sent to an egress IP (flows/pipeline/egress.go) to the node that holds
// it now; ok is false when the tunnel's destination is no egress IP this node knows.
func exitToEgressIP(ctx context.Context, w world, x exitHop) (*nextHop, string, bool, error) {
	info, f := x.n.info, x.out.Fields
	if info.Egress == nil {
		return nil, "", false, nil
	}
	known := false
	for _, ns := range info.Egress.Namespaces {
		known = known || slices.Contains(ns.IPs, f.TunDst)
	}
	if !known {
		return nil, "", false, nil
	}
	names, err := w.nodeNames(ctx)
	if err != nil {
		return nil, "", true, err
	}
	for _, name := range names {
		next, err := w.node(ctx, name)
		if err != nil || next.info.Egress == nil || !slices.Contains(next.info.Egress.Held, f.TunDst) {
			continue
		}
		x.hop.Leaves = fmt.Sprintf("leaves by %s to egress IP %s%s, held by node %s, with tun_id %#x", pipeline.PortNameVXLAN, f.TunDst,
			egressNamespaceText(info, f.TunDst), name, f.TunID)
		p := arriving(next, pipeline.RoleTunnel, f, x.res.Proto)
		p.TunID, p.TunSrc, p.TunDst = f.TunID, info.NodeIP, f.TunDst
		return &nextHop{node: next, packet: p}, fmt.Sprintf("in_port %d (%s, tun_id %#x from %s, node %s, for egress IP %s)", p.InPort,
			pipeline.PortNameVXLAN, f.TunID, info.NodeIP, info.Name, f.TunDst), true, nil
	}
	x.hop.Leaves = fmt.Sprintf("leaves by %s to egress IP %s%s, held by no node", pipeline.PortNameVXLAN, f.TunDst, egressNamespaceText(info, f.TunDst))
	x.res.Verdict = Verdict{Kind: VerdictDropped, Node: info.Name, EgressIP: f.TunDst.String(),
		Text: fmt.Sprintf("sent to egress IP %s%s, which no node holds now: the namespace's connections through it are dropped until one does", f.TunDst,
			egressNamespaceText(info, f.TunDst))}
	return nil, "", true, nil
}

// heldEgressIP is the egress IP this node holds whose egress MAC (pipeline.EgressMAC) is mac, if any.
func heldEgressIP(info *debugapi.NodeInfo, mac string) netip.Addr {
	if info.Egress == nil {
		return netip.Addr{}
	}
	m, err := parseMAC(mac)
	if err != nil {
		return netip.Addr{}
	}
	for _, ip := range info.Egress.Held {
		if bytes.Equal(pipeline.EgressMAC(ip), m) {
			return ip
		}
	}
	return netip.Addr{}
}

// egressNamespaceText names the namespaces whose egress IP ip is: " (namespace x)", or "".
func egressNamespaceText(info *debugapi.NodeInfo, ip netip.Addr) string {
	if info.Egress == nil {
		return ""
	}
	var names []string
	for _, ns := range info.Egress.Namespaces {
		if slices.Contains(ns.IPs, ip) {
			names = append(names, ns.Name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return " (namespace " + strings.Join(names, ", ") + ")"
}

// egressRule is rule i of a namespace's firewall as the node renders it.
func egressRule(info *debugapi.NodeInfo, namespace string, i int) (debugapi.EgressRule, bool) {
	if info.Egress == nil {
		return debugapi.EgressRule{}, false
	}
	for _, ns := range info.Egress.Namespaces {
		if ns.Name == namespace && i < len(ns.Rules) {
			return ns.Rules[i], true
		}
	}
	return debugapi.EgressRule{}, false
}
