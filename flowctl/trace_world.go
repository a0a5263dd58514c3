package flowctl

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"

	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/flows/trace"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// A trace asks its questions of a world: live, the cluster's API server (where pods and nodes are)
// and every node's agent (its view, its bridge's flows, ofproto/trace on its ovs-vswitchd); offline,
// saved JSON dumps of the nodes, with the same questions answered by the pure-Go evaluator.
type world interface {
	// node returns a node's view, flows and tracer.
	node(ctx context.Context, name string) (*traceNode, error)
	// pod finds a pod by name: its node and address.
	pod(ctx context.Context, namespace, name string) (node string, ip netip.Addr, err error)
	// attachment finds a pod's interface on a Network: its node and the node's agent's record of it.
	attachment(ctx context.Context, namespace, name, iface string) (node string, a debugapi.Attachment, err error)
	// podByIP finds the pod with an address on the cluster network (ok false: none).
	podByIP(ctx context.Context, ip netip.Addr) (key, node string, ok bool, err error)
	// nodeAddr resolves a node's name to its address, or an address to a node's name.
	nodeByName(ctx context.Context, name string) (netip.Addr, bool, error)
	nodeByIP(ctx context.Context, ip netip.Addr) (string, bool, error)
	// nodeNames lists the nodes (to find the holder of an egress IP).
	nodeNames(ctx context.Context) ([]string, error)
	live() bool
}

// traceNode is what a trace knows of one node.
type traceNode struct {
	info   *debugapi.NodeInfo
	tracer trace.Tracer
	bridge *trace.Bridge // the bridge's flows and groups (choosing buckets, naming policies)
	flows  []openflow.Flow
	owners *reconcile.OwnerIndex
}

// ownerOf names the owner of a cookie on this node.
func (n *traceNode) ownerOf(cookie uint64) string {
	if cookie == 0 {
		return "-"
	}
	return n.owners.Name(reconcile.Cookie(cookie))
}

// objectOf is the API object a cookie's owner renders, when the node names one owner for the cookie.
func (n *traceNode) objectOf(cookie uint64) (pipeline.Object, bool) {
	if cookie == 0 {
		return pipeline.Object{}, false
	}
	owners := n.owners.Lookup(reconcile.Cookie(cookie))
	if len(owners) != 1 {
		return pipeline.Object{}, false // unknown, or a hash collision: name no object rather than a wrong one
	}
	return pipeline.ObjectOf(owners[0])
}

// flowOf is the node's flow a trace step went through: the one of its table, priority, cookie and
// match, else the only one of its table, priority and cookie (a live trace's match is ovs-vswitchd's
// text, which may order fields otherwise). ok is false for a miss or a flow the node does not have.
func (n *traceNode) flowOf(s trace.Step) (openflow.Flow, bool) {
	if s.Miss {
		return openflow.Flow{}, false
	}
	var only openflow.Flow
	count := 0
	for _, f := range n.flows {
		if f.Table != s.Table || f.Priority != s.Priority || f.Cookie != s.Cookie {
			continue
		}
		if f.Match.String() == s.Match {
			return f, true
		}
		only = f
		count++
	}
	return only, count == 1
}

// port finds a port of the bridge by name.
func (n *traceNode) port(name string) (debugapi.Port, bool) {
	for _, p := range n.info.Ports {
		if p.Name == name {
			return p, true
		}
	}
	return debugapi.Port{}, false
}

// portNumber is a named port's OpenFlow number, or def when OVSDB does not list it.
func (n *traceNode) portNumber(name string, def uint32) uint32 {
	if p, ok := n.port(name); ok && p.OFPort > 0 {
		return uint32(p.OFPort)
	}
	return def
}

// portRole is the role of a port of the node's bridge: by its name when OVSDB lists it, else by its
// number in the pipeline's registry; any other port is a pod's.
func (n *traceNode) portRole(number uint32) pipeline.PortRole {
	for _, p := range n.info.Ports {
		if uint32(p.OFPort) == number {
			if bp, ok := pipeline.PortNamed(p.Name); ok {
				return bp.Role
			}
			return pipeline.RolePod
		}
	}
	if bp, ok := pipeline.LookupPort(number); ok {
		return bp.Role
	}
	return pipeline.RolePod
}

// roleNumber is the OpenFlow number of the node's port of a role (not RolePod): OVSDB's, else the
// number the registry requests.
func (n *traceNode) roleNumber(role pipeline.PortRole) uint32 {
	bp, _ := pipeline.PortOfRole(role)
	return n.portNumber(bp.Name, bp.Number)
}

func newTraceNode(info *debugapi.NodeInfo, rawFlows, rawGroups [][]byte, owners []string) (*traceNode, error) {
	n := &traceNode{info: info, owners: ownerIndex(owners)}
	var groups []openflow.GroupEntry
	for _, b := range rawFlows {
		f, err := openflow.DecodeFlowStats(b)
		if err != nil {
			return nil, fmt.Errorf("node %s: a flow does not decode: %w", info.Name, err)
		}
		n.flows = append(n.flows, f)
	}
	for _, b := range rawGroups {
		g, err := openflow.DecodeGroupDesc(b)
		if err != nil {
			return nil, fmt.Errorf("node %s: a group does not decode: %w", info.Name, err)
		}
		groups = append(groups, g)
	}
	n.bridge = trace.NewBridge(n.flows, groups)
	return n, nil
}

// liveTracer traces on a node through its agent.
type liveTracer struct{ agent debugapi.Backend }

func (l liveTracer) Trace(ctx context.Context, p trace.Packet, ctNext []trace.CtFlags) (*trace.Path, error) {
	resp, err := l.agent.Trace(ctx, debugapi.TraceRequest{Packet: p, CtNext: ctNext})
	if err != nil {
		return nil, err
	}
	return trace.Parse(resp.Output)
}

// liveWorld is a running cluster.
type liveWorld struct {
	kube   kubernetes.Interface
	cfg    *rest.Config
	nf     nodeFlags
	mu     sync.Mutex
	nodes  map[string]*traceNode
	agents map[string]debugapi.Backend
}

func newLiveWorld(nf nodeFlags) (*liveWorld, error) {
	cfg, err := restConfig(nf.kubeconfig)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return liveWorldOf(cfg, kube, nf), nil
}

// liveWorldOf is a fresh live world on a client that exists already (flowctl ui makes one per trace,
// so every trace reads the nodes as they are now).
func liveWorldOf(cfg *rest.Config, kube kubernetes.Interface, nf nodeFlags) *liveWorld {
	return &liveWorld{kube: kube, cfg: cfg, nf: nf, nodes: map[string]*traceNode{}, agents: map[string]debugapi.Backend{}}
}

func (w *liveWorld) live() bool { return true }

// agent is a node's agent: through the local socket when it is this node's, else the node proxy.
func (w *liveWorld) agent(ctx context.Context, name string) (debugapi.Backend, error) {
	if a, ok := w.agents[name]; ok {
		return a, nil
	}
	if local, err := w.nf.local(); err == nil {
		if info, err := local.Node(ctx); err == nil && info.Name == name {
			w.agents[name] = local
			return local, nil
		}
	}
	a, err := w.nf.remote(w.cfg, name)
	if err != nil {
		return nil, err
	}
	w.agents[name] = a
	return a, nil
}

func (w *liveWorld) node(ctx context.Context, name string) (*traceNode, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n, ok := w.nodes[name]; ok {
		return n, nil
	}
	agent, err := w.agent(ctx, name)
	if err != nil {
		return nil, err
	}
	info, err := agent.Node(ctx)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	dump, err := agent.Dump(ctx)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	n, err := newTraceNode(info, dump.Flows, dump.Groups, dump.Owners)
	if err != nil {
		return nil, err
	}
	n.tracer = liveTracer{agent}
	w.nodes[name] = n
	return n, nil
}

func (w *liveWorld) pod(ctx context.Context, namespace, name string) (string, netip.Addr, error) {
	p, err := w.kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", netip.Addr{}, fmt.Errorf("pod %s/%s not found", namespace, name)
	}
	if err != nil {
		return "", netip.Addr{}, err
	}
	if p.Spec.HostNetwork {
		return "", netip.Addr{}, fmt.Errorf("pod %s/%s uses the host's network: trace its node (%s) instead", namespace, name, p.Spec.NodeName)
	}
	ip, err := netip.ParseAddr(p.Status.PodIP)
	if p.Spec.NodeName == "" || err != nil {
		return "", netip.Addr{}, fmt.Errorf("pod %s/%s has no node or address yet (phase %s)", namespace, name, p.Status.Phase)
	}
	return p.Spec.NodeName, ip, nil
}

func (w *liveWorld) attachment(ctx context.Context, namespace, name, iface string) (string, debugapi.Attachment, error) {
	p, err := w.kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", debugapi.Attachment{}, fmt.Errorf("pod %s/%s not found", namespace, name)
	}
	if err != nil {
		return "", debugapi.Attachment{}, err
	}
	if p.Spec.NodeName == "" {
		return "", debugapi.Attachment{}, fmt.Errorf("pod %s/%s has no node yet (phase %s)", namespace, name, p.Status.Phase)
	}
	n, err := w.node(ctx, p.Spec.NodeName)
	if err != nil {
		return "", debugapi.Attachment{}, err
	}
	a, err := n.attachment(namespace, name, iface)
	return p.Spec.NodeName, a, err
}

func (w *liveWorld) podByIP(ctx context.Context, ip netip.Addr) (string, string, bool, error) {
	list, err := w.kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("status.podIP", ip.String()).String()})
	if err != nil {
		return "", "", false, err
	}
	for _, p := range list.Items {
		if !p.Spec.HostNetwork && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			return p.Namespace + "/" + p.Name, p.Spec.NodeName, true, nil
		}
	}
	return "", "", false, nil
}

func nodeIP(n *corev1.Node) (netip.Addr, bool) {
	for _, t := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			if a.Type == t {
				if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Is4() {
					return ip, true
				}
			}
		}
	}
	return netip.Addr{}, false
}

func (w *liveWorld) nodeByName(ctx context.Context, name string) (netip.Addr, bool, error) {
	n, err := w.kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return netip.Addr{}, false, nil
	}
	if err != nil {
		return netip.Addr{}, false, err
	}
	ip, ok := nodeIP(n)
	return ip, ok, nil
}

func (w *liveWorld) nodeNames(ctx context.Context) ([]string, error) {
	list, err := w.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(list.Items))
	for _, n := range list.Items {
		out = append(out, n.Name)
	}
	slices.Sort(out)
	return out, nil
}

func (w *liveWorld) nodeByIP(ctx context.Context, ip netip.Addr) (string, bool, error) {
	list, err := w.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", false, err
	}
	for i := range list.Items {
		if a, ok := nodeIP(&list.Items[i]); ok && a == ip {
			return list.Items[i].Name, true, nil
		}
	}
	return "", false, nil
}

// offlineWorld is saved dumps — or, live, just this node's agent when there is no API server to ask
// (flowctl on a node without a kubeconfig): then local is set and only this node can be traced.
type offlineWorld struct {
	nodes map[string]*traceNode
	local string
}

// newLocalWorld is this node's agent alone, for a trace that stays on this node.
func newLocalWorld(ctx context.Context, nf nodeFlags) (*offlineWorld, error) {
	agent, err := nf.local()
	if err != nil {
		return nil, err
	}
	info, err := agent.Node(ctx)
	if err != nil {
		return nil, err
	}
	dump, err := agent.Dump(ctx)
	if err != nil {
		return nil, err
	}
	n, err := newTraceNode(info, dump.Flows, dump.Groups, dump.Owners)
	if err != nil {
		return nil, err
	}
	n.tracer = liveTracer{agent}
	return &offlineWorld{nodes: map[string]*traceNode{info.Name: n}, local: info.Name}, nil
}

func newOfflineWorld(files []string) (*offlineWorld, error) {
	w := &offlineWorld{nodes: map[string]*traceNode{}}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var d Dump
		if err := json.Unmarshal(data, &d); err != nil {
			return nil, fmt.Errorf("%s: not a flowctl dump -o json: %w", f, err)
		}
		if d.Node == nil || d.Node.Name == "" {
			return nil, fmt.Errorf("%s has no node section (make the dump where the agent answers: flowctl dump -o json on the node, or --node)", f)
		}
		if len(d.Flows) > 0 && d.Flows[0].Raw == nil {
			return nil, fmt.Errorf("%s: its flows carry no wire encoding (an older flowctl made it)", f)
		}
		raw := make([][]byte, len(d.Flows))
		for i, fl := range d.Flows {
			raw[i] = fl.Raw
		}
		if _, dup := w.nodes[d.Node.Name]; dup {
			return nil, fmt.Errorf("%s: node %s given twice", f, d.Node.Name)
		}
		n, err := newTraceNode(d.Node, raw, d.RawGroups, d.Owners)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		n.tracer = trace.Offline{Bridge: n.bridge}
		w.nodes[d.Node.Name] = n
	}
	return w, nil
}

func (w *offlineWorld) live() bool { return w.local != "" }

func (w *offlineWorld) node(_ context.Context, name string) (*traceNode, error) {
	if n, ok := w.nodes[name]; ok {
		return n, nil
	}
	if w.local != "" {
		return nil, fmt.Errorf("the packet goes on to node %s: reaching it needs the API server (--kubeconfig or $KUBECONFIG)", name)
	}
	return nil, fmt.Errorf("no dump of node %s given (--dump FILE for each node the packet crosses)", name)
}

func (w *offlineWorld) pod(_ context.Context, namespace, name string) (string, netip.Addr, error) {
	for _, n := range w.nodes {
		for _, p := range n.info.Pods {
			if p.Namespace == namespace && p.Name == name {
				return n.info.Name, p.IP, nil
			}
		}
	}
	if w.local != "" {
		return "", netip.Addr{}, fmt.Errorf("pod %s/%s is not on node %s: finding it needs the API server (--kubeconfig or $KUBECONFIG)", namespace, name, w.local)
	}
	return "", netip.Addr{}, fmt.Errorf("pod %s/%s is in none of the dumps", namespace, name)
}

func (w *offlineWorld) attachment(_ context.Context, namespace, name, iface string) (string, debugapi.Attachment, error) {
	var found error // the pod is on a node, without that interface: the error names those it has
	for _, n := range w.nodes {
		a, err := n.attachment(namespace, name, iface)
		if err == nil {
			return n.info.Name, a, nil
		}
		here := slices.ContainsFunc(n.info.Pods, func(p debugapi.Pod) bool { return p.Namespace == namespace && p.Name == name }) ||
			slices.ContainsFunc(n.info.Attachments, func(a debugapi.Attachment) bool { return a.Namespace == namespace && a.Name == name })
		if here && found == nil {
			found = err
		}
	}
	if found != nil {
		return "", debugapi.Attachment{}, found
	}
	if w.local != "" {
		return "", debugapi.Attachment{}, fmt.Errorf("pod %s/%s has no interface %s on node %s: finding it elsewhere needs the API server (--kubeconfig or $KUBECONFIG)",
			namespace, name, iface, w.local)
	}
	return "", debugapi.Attachment{}, fmt.Errorf("pod %s/%s has no interface %s on a Network in any of the dumps", namespace, name, iface)
}

func (w *offlineWorld) podByIP(_ context.Context, ip netip.Addr) (string, string, bool, error) {
	for _, n := range w.nodes {
		for _, p := range n.info.Pods {
			if p.IP == ip {
				return p.Namespace + "/" + p.Name, n.info.Name, true, nil
			}
		}
	}
	return "", "", false, nil
}

// allNodes lists what the dumps say about every node: their own view, and remote nodes they know.
func (w *offlineWorld) allNodes() map[string]netip.Addr {
	out := map[string]netip.Addr{}
	for _, n := range w.nodes {
		out[n.info.Name] = n.info.NodeIP
		for _, r := range n.info.RemoteNodes {
			out[r.Name] = r.NodeIP
		}
	}
	return out
}

func (w *offlineWorld) nodeByName(_ context.Context, name string) (netip.Addr, bool, error) {
	ip, ok := w.allNodes()[name]
	return ip, ok, nil
}

func (w *offlineWorld) nodeNames(_ context.Context) ([]string, error) {
	out := make([]string, 0, len(w.nodes))
	for name := range w.nodes {
		out = append(out, name)
	}
	slices.Sort(out)
	return out, nil
}

func (w *offlineWorld) nodeByIP(_ context.Context, ip netip.Addr) (string, bool, error) {
	for name, a := range w.allNodes() {
		if a == ip {
			return name, true, nil
		}
	}
	return "", false, nil
}
