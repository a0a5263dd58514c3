package flowctl

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	policyv1beta1 "github.com/ofsdn/ofsdn/apis/policy/v1beta1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The console's pages over API objects: the overview, Networks, tenants and policies. Each reads what
// it shows with the page's time limit and reports what it could not read as a problem on the page;
// what it did read, it shows. Nothing here trusts an object to be well formed: a selector that does
// not parse, an annotation that is no request, a policy the API server's validation would not have
// let through, are shown as what they are.

// clusterObjects are the API objects pages share, read once per page.
type clusterObjects struct {
	cn          *networkv1.ClusterNetwork
	namespaces  []corev1.Namespace
	pods        []corev1.Pod
	nodes       []corev1.Node
	netns       []networkv1.NetNamespace
	hostSubnets []networkv1.HostSubnet
	networks    []networkv1.Network
	subnets     []networkv1.NetworkSubnet
}

// objectsNeeded says which lists a page reads.
type objectsNeeded struct {
	cn, namespaces, pods, nodes, netns, hostSubnets, networks bool
}

func (s *uiServer) readObjects(ctx context.Context, p *uiPage, need objectsNeeded) *clusterObjects {
	ctx, cancel := s.apiCtx(ctx)
	defer cancel()
	o := &clusterObjects{}
	list := metav1.ListOptions{}
	if need.cn {
		cn, err := s.src.net.NetworkV1().ClusterNetworks().Get(ctx, networkv1.ClusterNetworkName, metav1.GetOptions{})
		if err != nil {
			p.problem("reading the ClusterNetwork "+networkv1.ClusterNetworkName, err)
		} else {
			o.cn = cn
		}
	}
	if need.namespaces {
		if l, err := s.src.kube.CoreV1().Namespaces().List(ctx, list); err != nil {
			p.problem("listing namespaces", err)
		} else {
			o.namespaces = l.Items
		}
	}
	if need.pods {
		if l, err := s.src.kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, list); err != nil {
			p.problem("listing pods", err)
		} else {
			o.pods = l.Items
		}
	}
	if need.nodes {
		if l, err := s.src.kube.CoreV1().Nodes().List(ctx, list); err != nil {
			p.problem("listing nodes", err)
		} else {
			o.nodes = l.Items
		}
	}
	if need.netns {
		if l, err := s.src.net.NetworkV1().NetNamespaces().List(ctx, list); err != nil {
			p.problem("listing NetNamespaces (network.ofsdn.io)", err)
		} else {
			o.netns = l.Items
		}
	}
	if need.hostSubnets {
		if l, err := s.src.net.NetworkV1().HostSubnets().List(ctx, list); err != nil {
			p.problem("listing HostSubnets (network.ofsdn.io)", err)
		} else {
			o.hostSubnets = l.Items
		}
	}
	if need.networks {
		if l, err := s.src.net.NetworkV1().Networks().List(ctx, list); err != nil {
			p.problem("listing Networks (network.ofsdn.io)", err)
		} else {
			o.networks = l.Items
		}
		if l, err := s.src.net.NetworkV1().NetworkSubnets().List(ctx, list); err != nil {
			p.problem("listing NetworkSubnets (network.ofsdn.io)", err)
		} else {
			o.subnets = l.Items
		}
	}
	sort.Slice(o.namespaces, func(i, j int) bool { return o.namespaces[i].Name < o.namespaces[j].Name })
	sort.Slice(o.nodes, func(i, j int) bool { return o.nodes[i].Name < o.nodes[j].Name })
	sort.Slice(o.networks, func(i, j int) bool { return o.networks[i].Name < o.networks[j].Name })
	sort.Slice(o.pods, func(i, j int) bool {
		if o.pods[i].Namespace != o.pods[j].Namespace {
			return o.pods[i].Namespace < o.pods[j].Namespace
		}
		return o.pods[i].Name < o.pods[j].Name
	})
	return o
}

// mode is the cluster's plugin mode, "" when unknown.
func (o *clusterObjects) mode() networkv1.PluginMode {
	if o.cn == nil {
		return ""
	}
	return o.cn.Spec.PluginMode
}

// namespaceLabels maps each namespace to its labels.
func (o *clusterObjects) namespaceLabels() map[string]labels.Set {
	m := make(map[string]labels.Set, len(o.namespaces))
	for _, ns := range o.namespaces {
		m[ns.Name] = labels.Set(ns.Labels)
	}
	return m
}

// uiSelection is a selector, said in words, and what it selects now.
type uiSelection struct {
	Text  string
	Items []string
	More  int    // how many more it selects than Items lists
	Err   string // the selector does not parse: it selects nothing
}

// maxListed is how many selected objects a page names before it says "and N more".
const maxListed = 40

func (u *uiSelection) add(item string) {
	if len(u.Items) < maxListed {
		u.Items = append(u.Items, item)
	} else {
		u.More++
	}
}

// selectorText says a label selector in words; empty is everything.
func selectorText(sel *metav1.LabelSelector, everything string) string {
	if sel == nil || (len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0) {
		return everything
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err == nil {
		return s.String()
	}
	// As written, for a selector that does not parse.
	var parts []string
	for k, v := range sel.MatchLabels {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	for _, e := range sel.MatchExpressions {
		parts = append(parts, strings.TrimSpace(fmt.Sprintf("%s %s %s", e.Key, e.Operator, strings.Join(e.Values, ","))))
	}
	return strings.Join(parts, ",")
}

// selectNamespaces resolves a namespace selector.
func selectNamespaces(o *clusterObjects, sel *metav1.LabelSelector) uiSelection {
	u := uiSelection{Text: "namespaces " + selectorText(sel, "(all)")}
	if sel == nil {
		sel = &metav1.LabelSelector{}
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		u.Err = err.Error()
		return u
	}
	for _, ns := range o.namespaces {
		if s.Matches(labels.Set(ns.Labels)) {
			u.add(ns.Name)
		}
	}
	return u
}

// selectPods resolves pods by a pod selector within the namespaces nsOK admits.
func selectPods(o *clusterObjects, text string, podSel *metav1.LabelSelector, nsOK func(string) bool) uiSelection {
	u := uiSelection{Text: text}
	if podSel == nil {
		podSel = &metav1.LabelSelector{}
	}
	s, err := metav1.LabelSelectorAsSelector(podSel)
	if err != nil {
		u.Err = err.Error()
		return u
	}
	for _, p := range o.pods {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if nsOK(p.Namespace) && s.Matches(labels.Set(p.Labels)) {
			u.add(p.Namespace + "/" + p.Name)
		}
	}
	return u
}

// namespaceMatcher is a namespace selector as a predicate (nil selector: every namespace).
func namespaceMatcher(o *clusterObjects, sel *metav1.LabelSelector) (func(string) bool, error) {
	if sel == nil {
		return func(string) bool { return true }, nil
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return nil, err
	}
	nsLabels := o.namespaceLabels()
	return func(ns string) bool { return s.Matches(nsLabels[ns]) }, nil
}

// ---- overview ----

type uiOverview struct {
	ClusterNetwork *networkv1.ClusterNetwork
	Conditions     []uiCondition
	Nodes, Ready   int
	Agents         int // answering
	NetIDs         int // distinct NETIDs
	Tenants        int // NetNamespaces
	Global         int
	Networks       int
	Policies       int
	Attention      []string
}

func (s *uiServer) overview(ctx context.Context, _ *http.Request, p *uiPage) {
	p.Title, p.Refresh = "Overview", 10
	o := s.readObjects(ctx, p, objectsNeeded{cn: true, namespaces: true, nodes: true, netns: true, hostSubnets: true, networks: true})
	v := &uiOverview{ClusterNetwork: o.cn, Nodes: len(o.nodes), Tenants: len(o.netns), Networks: len(o.networks)}
	if o.cn != nil {
		v.Conditions = conditionViews(o.cn.Status.Conditions)
		for _, c := range v.Conditions {
			if c.Class == "bad" {
				v.Attention = append(v.Attention, fmt.Sprintf("ClusterNetwork %s is %s: %s", c.Type, c.Status, c.Message))
			}
		}
	}
	ids := map[uint32]bool{}
	for _, nn := range o.netns {
		ids[nn.NetID] = true
		if nn.NetID == networkv1.GlobalVNID {
			v.Global++
		}
		if req, ok := nn.Annotations[networkv1.ChangeNetworkAnnotation]; ok {
			v.Attention = append(v.Attention, fmt.Sprintf("tenant %s: request %q not carried out yet", nn.Name, req))
		}
	}
	v.NetIDs = len(ids)
	nodes := s.nodeRows(ctx, o)
	for _, n := range nodes.Rows {
		if n.Ready {
			v.Ready++
		}
		if n.Agent.OK() {
			v.Agents++
		}
	}
	v.Attention = append(v.Attention, nodes.Attention...)
	for _, n := range o.networks {
		for _, c := range conditionViews(n.Status.Conditions, networkv1.ConditionInUse) {
			if c.Class == "bad" {
				v.Attention = append(v.Attention, fmt.Sprintf("Network %s: %s is %s (%s): %s", n.Name, c.Type, c.Status, c.Reason, c.Message))
			}
		}
	}
	pctx, cancel := s.apiCtx(ctx)
	defer cancel()
	if l, err := s.src.kube.NetworkingV1().NetworkPolicies(metav1.NamespaceAll).List(pctx, metav1.ListOptions{}); err != nil {
		p.problem("listing NetworkPolicies", err)
	} else {
		v.Policies = len(l.Items)
	}
	if o.cn != nil && o.cn.Spec.PluginMode != networkv1.PluginModeNetworkPolicy && v.Policies > 0 {
		what := fmt.Sprintf("%d NetworkPolicies exist", v.Policies)
		if v.Policies == 1 {
			what = "1 NetworkPolicy exists"
		}
		v.Attention = append(v.Attention, what+", but the cluster runs in "+string(o.cn.Spec.PluginMode)+" mode: not enforced")
	}
	p.Data = v
}

// ---- Networks ----

type uiNetwork struct {
	Name             string
	CIDR             string
	HostSubnetLength int32
	VNI              uint32 // status.vni, the one in use
	SpecVNI          uint32
	MTU              int32
	Admitted         uiSelection
	CrossTalkSpec    []string
	CrossTalk        []string
	Attachments      int64
	Conditions       []uiCondition
	Deleting         bool
	Subnets          []uiNetworkSubnet
	// Interfaces are the pods' interfaces on it, from the agents (detail page only).
	Interfaces []uiAttachment
	Created    time.Time
}

type uiNetworkSubnet struct {
	Node, HostIP, Subnet string
	Attachments          int64
}

type uiAttachment struct {
	Pod, Interface, Node, IP, MAC string
	Carrying                      bool
	Reason                        string
}

func networkView(o *clusterObjects, n *networkv1.Network) uiNetwork {
	v := uiNetwork{Name: n.Name, CIDR: string(n.Spec.CIDR), HostSubnetLength: n.Spec.HostSubnetLength, VNI: n.Status.VNI,
		SpecVNI: n.Spec.VNI, MTU: n.Spec.MTU, CrossTalkSpec: n.Spec.CrossTalk, CrossTalk: n.Status.CrossTalk,
		Attachments: n.Status.Attachments, Conditions: conditionViews(n.Status.Conditions, networkv1.ConditionInUse),
		Deleting: n.DeletionTimestamp != nil, Created: n.CreationTimestamp.Time}
	sel := n.Spec.NamespaceSelector
	v.Admitted = selectNamespaces(o, &sel)
	for _, s := range o.subnets {
		if s.Network == n.Name {
			v.Subnets = append(v.Subnets, uiNetworkSubnet{Node: s.Node, HostIP: s.HostIP, Subnet: string(s.Subnet), Attachments: s.Status.Attachments})
		}
	}
	sort.Slice(v.Subnets, func(i, j int) bool { return v.Subnets[i].Node < v.Subnets[j].Node })
	return v
}

func (s *uiServer) networks(ctx context.Context, _ *http.Request, p *uiPage) {
	p.Title, p.Refresh = "Networks", 15
	o := s.readObjects(ctx, p, objectsNeeded{namespaces: true, networks: true})
	rows := make([]uiNetwork, 0, len(o.networks))
	for i := range o.networks {
		rows = append(rows, networkView(o, &o.networks[i]))
	}
	p.Data = rows
}

func (s *uiServer) network(ctx context.Context, r *http.Request, p *uiPage) {
	name := r.PathValue("name")
	p.Title, p.Section, p.Refresh = "Network "+name, "networks", 15
	o := s.readObjects(ctx, p, objectsNeeded{namespaces: true, networks: true, nodes: true})
	i := slices.IndexFunc(o.networks, func(n networkv1.Network) bool { return n.Name == name })
	if i < 0 {
		if len(p.Problems) == 0 {
			p.status = http.StatusNotFound
			p.problem("reading Network "+name, apierrors.NewNotFound(schema.GroupResource{Group: networkv1.GroupName, Resource: "networks"}, name))
		}
		return
	}
	v := networkView(o, &o.networks[i])
	var names []string
	for _, n := range o.nodes {
		names = append(names, n.Name)
	}
	infos := askAgents(ctx, s, names, nodeInfo)
	for _, node := range names {
		a := infos[node]
		if !a.OK() {
			p.Problems = append(p.Problems, uiProblem{What: "reading node " + node + "'s agent for this Network's interfaces", Err: a.Err})
			continue
		}
		for _, at := range a.Value.Attachments {
			if at.Network == name {
				v.Interfaces = append(v.Interfaces, uiAttachment{Pod: at.Namespace + "/" + at.Name, Interface: at.Interface, Node: node,
					IP: addrString(at.IP), MAC: at.MAC, Carrying: at.Carrying, Reason: at.Reason})
			}
		}
	}
	sort.Slice(v.Interfaces, func(i, j int) bool {
		return v.Interfaces[i].Pod+v.Interfaces[i].Interface < v.Interfaces[j].Pod+v.Interfaces[j].Interface
	})
	p.Data = v
}

// ---- tenants ----

type uiTenants struct {
	Mode     networkv1.PluginMode
	Isolates bool // the mode enforces NETIDs
	Groups   []uiTenantGroup
	// Waiting are namespaces the controller has given no NetNamespace yet; Orphans NetNamespaces
	// whose namespace is gone.
	Waiting, Orphans []string
}

// uiTenantGroup is one NETID and the namespaces that share it.
type uiTenantGroup struct {
	NetID      uint32
	Global     bool
	Namespaces []uiTenant
}

type uiTenant struct {
	Name string
	Pods int
	// Request is a change-network request not carried out yet; RequestProblem says why the controller
	// will refuse it, if it will.
	Request, RequestProblem string
	// Last is the controller's last word on this NetNamespace (an Event: NETID changed, or a request
	// refused).
	Last *uiEvent
}

type uiEvent struct {
	Type, Reason, Message string
	When                  time.Time
}

func (s *uiServer) tenants(ctx context.Context, _ *http.Request, p *uiPage) {
	p.Title, p.Refresh = "Tenants", 15
	o := s.readObjects(ctx, p, objectsNeeded{cn: true, namespaces: true, pods: true, netns: true})
	v := &uiTenants{Mode: o.mode(), Isolates: o.mode() == networkv1.PluginModeMultitenant}
	pods := map[string]int{}
	for _, pod := range o.pods {
		if !pod.Spec.HostNetwork && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
			pods[pod.Namespace]++
		}
	}
	events := s.netNamespaceEvents(ctx, p)
	groups := map[uint32]*uiTenantGroup{}
	have := map[string]bool{}
	for _, nn := range o.netns {
		have[nn.Name] = true
		g := groups[nn.NetID]
		if g == nil {
			g = &uiTenantGroup{NetID: nn.NetID, Global: nn.NetID == networkv1.GlobalVNID}
			groups[nn.NetID] = g
		}
		t := uiTenant{Name: nn.Name, Pods: pods[nn.Name], Last: events[nn.Name]}
		if req, ok := nn.Annotations[networkv1.ChangeNetworkAnnotation]; ok {
			t.Request = req
			if _, err := networkv1.ParseChangeNetwork(req); err != nil {
				t.RequestProblem = err.Error()
			}
		}
		g.Namespaces = append(g.Namespaces, t)
	}
	for _, g := range groups {
		sort.Slice(g.Namespaces, func(i, j int) bool { return g.Namespaces[i].Name < g.Namespaces[j].Name })
		v.Groups = append(v.Groups, *g)
	}
	sort.Slice(v.Groups, func(i, j int) bool { return v.Groups[i].NetID < v.Groups[j].NetID })
	nsExists := map[string]bool{}
	for _, ns := range o.namespaces {
		nsExists[ns.Name] = true
		if !have[ns.Name] && o.netns != nil {
			v.Waiting = append(v.Waiting, ns.Name)
		}
	}
	if o.namespaces != nil {
		for _, nn := range o.netns {
			if !nsExists[nn.Name] {
				v.Orphans = append(v.Orphans, nn.Name)
			}
		}
	}
	p.Data = v
}

// netNamespaceEvents is the latest Event about each NetNamespace (the controller's account of
// change-network requests).
func (s *uiServer) netNamespaceEvents(ctx context.Context, p *uiPage) map[string]*uiEvent {
	ctx, cancel := s.apiCtx(ctx)
	defer cancel()
	l, err := s.src.kube.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=NetNamespace"})
	if err != nil {
		p.problem("listing Events of NetNamespaces", err)
		return nil
	}
	out := map[string]*uiEvent{}
	for _, e := range l.Items {
		if e.InvolvedObject.Kind != "NetNamespace" {
			continue
		}
		when := e.LastTimestamp.Time
		if when.IsZero() {
			when = e.EventTime.Time
		}
		if when.IsZero() {
			when = e.CreationTimestamp.Time
		}
		if prev := out[e.InvolvedObject.Name]; prev == nil || when.After(prev.When) {
			out[e.InvolvedObject.Name] = &uiEvent{Type: e.Type, Reason: e.Reason, Message: e.Message, When: when}
		}
	}
	return out
}

// ---- policies ----

type uiPolicies struct {
	Mode      networkv1.PluginMode
	Enforced  bool // NetworkPolicies are enforced in this mode
	Network   []uiNetworkPolicy
	CNPServed string // the group/version ClusterNetworkPolicies are read from; "" when the cluster has none
	Cluster   []uiClusterPolicy
}

type uiNetworkPolicy struct {
	Namespace, Name string
	Types           []string
	Selected        uiSelection
	Ingress         []uiRule
	Egress          []uiRule
	// DenyIngress and DenyEgress: the policy isolates its pods in that direction and allows nothing.
	DenyIngress, DenyEgress bool
}

// uiRule is one rule: whom it is about (peers) and which ports; Action for ClusterNetworkPolicy.
type uiRule struct {
	Name   string
	Action string
	Peers  []uiSelection
	Ports  []string
}

func (s *uiServer) policies(ctx context.Context, _ *http.Request, p *uiPage) {
	p.Title, p.Refresh = "Policies", 15
	o := s.readObjects(ctx, p, objectsNeeded{cn: true, namespaces: true, pods: true})
	v := &uiPolicies{Mode: o.mode(), Enforced: o.mode() == networkv1.PluginModeNetworkPolicy}
	lctx, cancel := s.apiCtx(ctx)
	defer cancel()
	if l, err := s.src.kube.NetworkingV1().NetworkPolicies(metav1.NamespaceAll).List(lctx, metav1.ListOptions{}); err != nil {
		p.problem("listing NetworkPolicies", err)
	} else {
		for i := range l.Items {
			v.Network = append(v.Network, networkPolicyView(o, &l.Items[i]))
		}
		sort.Slice(v.Network, func(i, j int) bool {
			a, b := v.Network[i], v.Network[j]
			return a.Namespace < b.Namespace || a.Namespace == b.Namespace && a.Name < b.Name
		})
	}
	v.CNPServed, v.Cluster = s.clusterPolicies(lctx, o, p)
	p.Data = v
}

func networkPolicyView(o *clusterObjects, np *networkingv1.NetworkPolicy) uiNetworkPolicy {
	v := uiNetworkPolicy{Namespace: np.Namespace, Name: np.Name}
	inNS := func(ns string) bool { return ns == np.Namespace }
	v.Selected = selectPods(o, "pods "+selectorText(&np.Spec.PodSelector, "(all)")+" in "+np.Namespace, &np.Spec.PodSelector, inNS)
	ingress, egress := policyTypes(np)
	if ingress {
		v.Types = append(v.Types, "Ingress")
		v.DenyIngress = len(np.Spec.Ingress) == 0
		for _, r := range np.Spec.Ingress {
			v.Ingress = append(v.Ingress, uiRule{Peers: netpolPeers(o, np.Namespace, r.From), Ports: netpolPorts(r.Ports)})
		}
	}
	if egress {
		v.Types = append(v.Types, "Egress")
		v.DenyEgress = len(np.Spec.Egress) == 0
		for _, r := range np.Spec.Egress {
			v.Egress = append(v.Egress, uiRule{Peers: netpolPeers(o, np.Namespace, r.To), Ports: netpolPorts(r.Ports)})
		}
	}
	return v
}

// policyTypes are the directions a policy isolates, defaulted as the API says.
func policyTypes(np *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(np.Spec.PolicyTypes) == 0 {
		return true, len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

func netpolPeers(o *clusterObjects, ns string, peers []networkingv1.NetworkPolicyPeer) []uiSelection {
	if len(peers) == 0 {
		return []uiSelection{{Text: "everyone (pods, nodes and addresses outside the cluster)"}}
	}
	var out []uiSelection
	for _, peer := range peers {
		switch {
		case peer.IPBlock != nil:
			text := "addresses " + peer.IPBlock.CIDR
			if len(peer.IPBlock.Except) > 0 {
				text += " except " + strings.Join(peer.IPBlock.Except, ", ")
			}
			out = append(out, uiSelection{Text: text})
		case peer.NamespaceSelector != nil && peer.PodSelector == nil:
			out = append(out, selectNamespaces(o, peer.NamespaceSelector))
		case peer.NamespaceSelector != nil:
			match, err := namespaceMatcher(o, peer.NamespaceSelector)
			text := "pods " + selectorText(peer.PodSelector, "(all)") + " in namespaces " + selectorText(peer.NamespaceSelector, "(all)")
			if err != nil {
				out = append(out, uiSelection{Text: text, Err: err.Error()})
				continue
			}
			out = append(out, selectPods(o, text, peer.PodSelector, match))
		case peer.PodSelector != nil:
			out = append(out, selectPods(o, "pods "+selectorText(peer.PodSelector, "(all)")+" in "+ns, peer.PodSelector, func(n string) bool { return n == ns }))
		default:
			out = append(out, uiSelection{Text: "an empty peer (selects nothing)"})
		}
	}
	return out
}

func netpolPorts(ports []networkingv1.NetworkPolicyPort) []string {
	if len(ports) == 0 {
		return []string{"every port"}
	}
	var out []string
	for _, p := range ports {
		proto := "tcp"
		if p.Protocol != nil {
			proto = strings.ToLower(string(*p.Protocol))
		}
		switch {
		case p.Port == nil:
			out = append(out, proto+" (every port)")
		case p.EndPort != nil:
			out = append(out, fmt.Sprintf("%s/%s-%d", proto, p.Port.String(), *p.EndPort))
		default:
			out = append(out, proto+"/"+p.Port.String())
		}
	}
	return out
}

// ---- ClusterNetworkPolicy (sigs.k8s.io/network-policy-api) ----

// The console reads ClusterNetworkPolicies through the dynamic client, in the version the cluster
// serves (v1beta1 and v1alpha2 share one schema), into ofsdn's own reading of the API
// (apis/policy/v1beta1): the module's types would move ofsdn's k8s.io modules to a newer minor than its
// control plane.

const cnpGroup = policyv1beta1.Group

var cnpVersions = []string{"v1beta1", "v1alpha2"}

type uiClusterPolicy struct {
	Name       string
	Tier       string
	Priority   int32
	Subject    uiSelection
	Ingress    []uiRule
	Egress     []uiRule
	Conditions []uiCondition
	Err        string // the object could not be read
}

// cnpVersion finds the version of ClusterNetworkPolicy the cluster serves ("" when none).
func (s *uiServer) cnpVersion() (string, error) {
	if s.src.disco == nil || s.src.dyn == nil {
		return "", nil
	}
	for _, v := range cnpVersions {
		rl, err := s.src.disco.ServerResourcesForGroupVersion(cnpGroup + "/" + v)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return "", err
		}
		for _, r := range rl.APIResources {
			if r.Name == "clusternetworkpolicies" {
				return v, nil
			}
		}
	}
	return "", nil
}

func (s *uiServer) clusterPolicies(ctx context.Context, o *clusterObjects, p *uiPage) (string, []uiClusterPolicy) {
	version, err := s.cnpVersion()
	if err != nil {
		p.problem("asking the API server whether it serves ClusterNetworkPolicies", err)
		return "", nil
	}
	if version == "" {
		return "", nil
	}
	gvr := schema.GroupVersionResource{Group: cnpGroup, Version: version, Resource: "clusternetworkpolicies"}
	l, err := s.src.dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
	if err != nil {
		p.problem("listing ClusterNetworkPolicies ("+cnpGroup+"/"+version+")", err)
		return gvr.GroupVersion().String(), nil
	}
	var out []uiClusterPolicy
	for _, item := range l.Items {
		v := uiClusterPolicy{Name: item.GetName()}
		obj, err := policyv1beta1.FromUnstructured(&item)
		if err != nil {
			v.Err = "cannot read this object: " + err.Error()
			out = append(out, v)
			continue
		}
		v.Tier, v.Priority = string(obj.Spec.Tier), obj.Spec.Priority
		v.Conditions = conditionViews(obj.Status.Conditions)
		v.Subject = cnpSubjectView(o, obj.Spec.Subject)
		for _, r := range obj.Spec.Ingress {
			from := make([]policyv1beta1.EgressPeer, len(r.From))
			for i, p := range r.From {
				from[i] = policyv1beta1.EgressPeer{Namespaces: p.Namespaces, Pods: p.Pods}
			}
			v.Ingress = append(v.Ingress, uiRule{Name: r.Name, Action: string(r.Action), Peers: cnpPeers(o, from), Ports: cnpPorts(r.Protocols)})
		}
		for _, r := range obj.Spec.Egress {
			v.Egress = append(v.Egress, uiRule{Name: r.Name, Action: string(r.Action), Peers: cnpPeers(o, r.To), Ports: cnpPorts(r.Protocols)})
		}
		out = append(out, v)
	}
	// Evaluation order: the Admin tier, then Baseline; lower priority numbers first.
	tierRank := func(t string) int {
		switch t {
		case string(policyv1beta1.AdminTier):
			return 0
		case string(policyv1beta1.BaselineTier):
			return 1
		}
		return 2
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if tierRank(a.Tier) != tierRank(b.Tier) {
			return tierRank(a.Tier) < tierRank(b.Tier)
		}
		if a.Priority != b.Priority {
			return a.Priority < b.Priority
		}
		return a.Name < b.Name
	})
	return gvr.GroupVersion().String(), out
}

func cnpPodsView(o *clusterObjects, pods *policyv1beta1.NamespacedPod) uiSelection {
	text := "pods " + selectorText(&pods.PodSelector, "(all)") + " in namespaces " + selectorText(&pods.NamespaceSelector, "(all)")
	match, err := namespaceMatcher(o, &pods.NamespaceSelector)
	if err != nil {
		return uiSelection{Text: text, Err: err.Error()}
	}
	return selectPods(o, text, &pods.PodSelector, match)
}

func cnpSubjectView(o *clusterObjects, s policyv1beta1.Subject) uiSelection {
	switch {
	case s.Namespaces != nil:
		u := selectNamespaces(o, s.Namespaces)
		u.Text = "every pod of " + u.Text
		return u
	case s.Pods != nil:
		return cnpPodsView(o, s.Pods)
	}
	return uiSelection{Text: "no subject the console understands (selects nothing it can show)"}
}

func cnpPeers(o *clusterObjects, peers []policyv1beta1.EgressPeer) []uiSelection {
	var out []uiSelection
	for _, p := range peers {
		switch {
		case p.Namespaces != nil:
			out = append(out, selectNamespaces(o, p.Namespaces))
		case p.Pods != nil:
			out = append(out, cnpPodsView(o, p.Pods))
		case p.Nodes != nil:
			out = append(out, uiSelection{Text: "nodes " + selectorText(p.Nodes, "(all)")})
		case len(p.Networks) > 0:
			out = append(out, uiSelection{Text: "addresses " + strings.Join(p.Networks, ", ")})
		case len(p.DomainNames) > 0:
			out = append(out, uiSelection{Text: "domain names " + strings.Join(p.DomainNames, ", ")})
		default:
			out = append(out, uiSelection{Text: "a peer the console does not understand (the API says: matches nothing, fail closed)"})
		}
	}
	if len(out) == 0 {
		out = append(out, uiSelection{Text: "no peer (matches nothing)"})
	}
	return out
}

func cnpPorts(protos []policyv1beta1.Protocol) []string {
	if len(protos) == 0 {
		return []string{"every port"}
	}
	port := func(proto string, p *policyv1beta1.Port) string {
		switch {
		case p == nil:
			return proto + " (every port)"
		case p.Range != nil:
			return fmt.Sprintf("%s/%d-%d", proto, p.Range.Start, p.Range.End)
		}
		return fmt.Sprintf("%s/%d", proto, p.Number)
	}
	var out []string
	for _, pr := range protos {
		switch {
		case pr.TCP != nil:
			out = append(out, port("tcp", pr.TCP.DestinationPort))
		case pr.UDP != nil:
			out = append(out, port("udp", pr.UDP.DestinationPort))
		case pr.SCTP != nil:
			out = append(out, port("sctp", pr.SCTP.DestinationPort))
		case pr.DestinationNamedPort != "":
			out = append(out, "named port "+pr.DestinationNamedPort)
		default:
			out = append(out, "a protocol the console does not understand")
		}
	}
	return out
}
