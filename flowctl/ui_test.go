package flowctl

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkfake "github.com/ofsdn/ofsdn/client/clientset/versioned/fake"
	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The console's handlers on fake clientsets, fake agents and the offline dumps of trace_test.go's two
// nodes: what each page shows, how it says what it could not read, and that nothing it reads — an
// agent that never answers, an object the API server would not have accepted — hangs or breaks it.

// uiAgent is a node's debug API, as the console sees it.
type uiAgent struct {
	info *debugapi.NodeInfo
	diff *debugapi.Diff
	err  error
	hang bool // answers only when the caller gives up
}

func (f *uiAgent) Node(ctx context.Context) (*debugapi.NodeInfo, error) {
	if f.hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return f.info, f.err
}
func (f *uiAgent) Diff(ctx context.Context) (*debugapi.Diff, error) {
	if f.diff == nil {
		return nil, errors.New("no diff in this fake")
	}
	return f.diff, f.err
}
func (f *uiAgent) Desired(context.Context) (*debugapi.Desired, error) {
	return nil, errors.New("not in this fake")
}
func (f *uiAgent) Dump(context.Context) (*debugapi.Dump, error) {
	return nil, errors.New("not in this fake")
}
func (f *uiAgent) Trace(context.Context, debugapi.TraceRequest) (*debugapi.TraceResponse, error) {
	return nil, errors.New("not in this fake")
}

// uiFixture is a two-node multitenant cluster: blue (a, a2 on n1; c on n2), red (b on n1), default
// (g on n1), green asking to join blue; a Network alpha admitting team=blue; NetworkPolicies and a
// ClusterNetworkPolicy.
type uiFixture struct {
	kube   *kubefake.Clientset
	net    *networkfake.Clientset
	agents map[string]*uiAgent
	dumps  []string
	src    uiSources
}

func readDumpInfo(t *testing.T, path string) *debugapi.NodeInfo {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d Dump
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	return d.Node
}

func readyNode(name, ip string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
}

func runningPod(ns, name, node, ip string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip}}
}

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

var cnpGVR = schema.GroupVersionResource{Group: cnpGroup, Version: "v1beta1", Resource: "clusternetworkpolicies"}

func newUIFixture(t *testing.T) *uiFixture {
	t.Helper()
	f := &uiFixture{dumps: twoNodes(t, pipeline.ModeMultitenant, pipeline.EncapVXLAN)}
	tcp := corev1.ProtocolTCP
	port80 := intstr.FromInt32(80)
	f.kube = kubefake.NewClientset(
		namespace("blue", map[string]string{"team": "blue"}), namespace("red", map[string]string{"team": "red"}),
		namespace("default", nil), namespace("green", nil), namespace("fresh", nil),
		readyNode("n1", "198.51.100.11"), readyNode("n2", "198.51.100.12"),
		runningPod("blue", "a", "n1", "10.128.0.3", map[string]string{"app": "web"}),
		runningPod("blue", "a2", "n1", "10.128.0.4", map[string]string{"app": "client"}),
		runningPod("blue", "c", "n2", "10.128.2.3", map[string]string{"app": "web"}),
		runningPod("red", "b", "n1", "10.128.0.5", map[string]string{"app": "other"}),
		runningPod("default", "g", "n1", "10.128.0.6", nil),
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "blue", Name: "web-80"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port80}}}}}},
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "red", Name: "deny-all"}, Spec: networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}},
		&corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "red.1"}, Type: corev1.EventTypeWarning, Reason: "InvalidChangeNetwork",
			Message:        `change-network "join:nowhere": namespace "nowhere" has no NetNamespace; nothing changed`,
			InvolvedObject: corev1.ObjectReference{Kind: "NetNamespace", Name: "red"}, LastTimestamp: metav1.NewTime(time.Now().Add(-2 * time.Minute))},
	)
	f.net = networkfake.NewSimpleClientset(
		&networkv1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: networkv1.ClusterNetworkSpec{
			ClusterCIDRs: []networkv1.CIDR{"10.128.0.0/14"}, HostSubnetLength: 9, ServiceNetwork: "172.30.0.0/16",
			PluginMode: networkv1.PluginModeMultitenant, Encapsulation: networkv1.EncapsulationVXLAN, VXLANPort: 4789, MTU: 1450},
			Status: networkv1.ClusterNetworkStatus{AllocatedSubnets: 2, TotalSubnets: 512,
				Conditions: []metav1.Condition{{Type: "Valid", Status: metav1.ConditionTrue, Reason: "Accepted"}}}},
		&networkv1.HostSubnet{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Host: "n1", HostIP: "198.51.100.11", Subnet: "10.128.0.0/23"},
		&networkv1.HostSubnet{ObjectMeta: metav1.ObjectMeta{Name: "n2"}, Host: "n2", HostIP: "198.51.100.12", Subnet: "10.128.2.0/23"},
		&networkv1.NetNamespace{ObjectMeta: metav1.ObjectMeta{Name: "blue"}, NetName: "blue", NetID: 12},
		&networkv1.NetNamespace{ObjectMeta: metav1.ObjectMeta{Name: "red"}, NetName: "red", NetID: 14},
		&networkv1.NetNamespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}, NetName: "default", NetID: 0},
		&networkv1.NetNamespace{ObjectMeta: metav1.ObjectMeta{Name: "green", Annotations: map[string]string{networkv1.ChangeNetworkAnnotation: "join:blue"}},
			NetName: "green", NetID: 16},
		&networkv1.NetNamespace{ObjectMeta: metav1.ObjectMeta{Name: "gone"}, NetName: "gone", NetID: 18},
		&networkv1.Network{ObjectMeta: metav1.ObjectMeta{Name: "alpha"}, Spec: networkv1.NetworkSpec{CIDR: "10.200.0.0/16", HostSubnetLength: 8,
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}, CrossTalk: []string{"gamma"}},
			Status: networkv1.NetworkStatus{VNI: 16773121, Attachments: 1, Conditions: []metav1.Condition{
				{Type: "Valid", Status: metav1.ConditionTrue, Reason: "Accepted"},
				{Type: "CrossTalk", Status: metav1.ConditionFalse, Reason: "UnknownNetwork", Message: "gamma: no such Network"}}}},
		&networkv1.NetworkSubnet{ObjectMeta: metav1.ObjectMeta{Name: "alpha.n1"}, Network: "alpha", Node: "n1", HostIP: "198.51.100.11", Subnet: "10.200.1.0/24",
			Status: networkv1.NetworkSubnetStatus{Attachments: 1}},
	)
	disco := f.kube.Discovery().(*fakediscovery.FakeDiscovery)
	disco.Resources = []*metav1.APIResourceList{{GroupVersion: cnpGVR.GroupVersion().String(), APIResources: []metav1.APIResource{{Name: "clusternetworkpolicies"}}}}
	cnp := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": cnpGVR.GroupVersion().String(), "kind": "ClusterNetworkPolicy", "metadata": map[string]any{"name": "no-red-to-blue"},
		"spec": map[string]any{"tier": "Admin", "priority": int64(10),
			"subject": map[string]any{"namespaces": map[string]any{"matchLabels": map[string]any{"team": "blue"}}},
			"ingress": []any{map[string]any{"name": "deny-red", "action": "Deny",
				"from":      []any{map[string]any{"namespaces": map[string]any{"matchLabels": map[string]any{"team": "red"}}}},
				"protocols": []any{map[string]any{"tcp": map[string]any{"destinationPort": map[string]any{"number": int64(8080)}}}}}}}}}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{cnpGVR: "ClusterNetworkPolicyList"}, cnp)

	f.agents = map[string]*uiAgent{}
	for _, d := range f.dumps {
		info := readDumpInfo(t, d)
		info.Attachments = []debugapi.Attachment{{Namespace: "blue", Name: "a", Interface: "net1", Network: "alpha", Carrying: true, MAC: "0a:58:0a:c8:01:02"}}
		f.agents[info.Name] = &uiAgent{info: info, diff: &debugapi.Diff{Node: info.Name, DesiredFlows: 40, InstalledFlows: 40}}
	}
	f.src = uiSources{kube: f.kube, net: f.net, dyn: dyn, disco: disco, server: "https://api.test:6443",
		agent: func(node string) (debugapi.Backend, error) {
			a, ok := f.agents[node]
			if !ok {
				return nil, fmt.Errorf("no agent for node %s in this fixture", node)
			}
			return a, nil
		},
		world: func() (world, error) {
			w, err := newOfflineWorld(f.dumps)
			return w, err
		},
		drops: noDrops{},
	}
	return f
}

func (f *uiFixture) server(t *testing.T, limits uiLimits) *uiServer {
	t.Helper()
	s, err := newUIServer(f.src, limits, nil, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var testUILimits = uiLimits{api: 5 * time.Second, agent: 2 * time.Second, trace: 30 * time.Second, heartbeat: time.Second}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// text is a page's text without tags and with collapsed spaces, for checks that read as a person does.
func text(html string) string {
	s := regexp.MustCompile(`(?s)<script.*?</script>|<[^>]*>`).ReplaceAllString(html, " ")
	s = strings.NewReplacer("&lt;", "<", "&gt;", ">", "&#34;", `"`, "&quot;", `"`, "&#39;", "'", "&amp;", "&").Replace(s)
	return strings.Join(strings.Fields(s), " ")
}

func TestUIPages(t *testing.T) {
	f := newUIFixture(t)
	h := f.server(t, testUILimits).Handler()
	cases := []struct {
		path   string
		status int
		says   []string
		not    []string
	}{
		{"/", 200, []string{"2 / 2 agents answering", "5 tenants (NetNamespaces) on 5 NETIDs, 1 global", "1 Networks", "2 NetworkPolicies",
			"tenant green: request \"join:blue\" not carried out yet", "Network alpha: CrossTalk is False (UnknownNetwork): gamma: no such Network",
			"2 NetworkPolicies exist, but the cluster runs in multitenant mode: not enforced", "Plugin mode multitenant", "10.128.0.0/14",
			"2 of 512 allocated", "Valid: True"}, []string{"could not be read"}},
		{"/networks", 200, []string{"alpha", "10.200.0.0/16", "16773121", "namespaces team=blue: blue", "asked: gamma", "CrossTalk: False"}, nil},
		{"/networks/alpha", 200, []string{"10.200.1.0/24", "198.51.100.11", "blue/a@net1", "yes", "gamma: no such Network"}, nil},
		{"/networks/nope", 404, []string{"reading Network nope", "not found"}, nil},
		{"/tenants", 200, []string{"multitenant mode NETIDs isolate tenants", "0 global default", "12 isolated blue 3", "14 isolated red",
			"InvalidChangeNetwork", "namespace \"nowhere\" has no NetNamespace", "2m ago", "pending request join:blue",
			"Namespaces without a NetNamespace yet (the controller has not given them a NETID; their pods cannot start): fresh",
			"NetNamespaces whose namespace is gone (the controller removes them): gone"}, nil},
		{"/nodes", 200, []string{"n1 Ready 198.51.100.11 10.128.0.0/23 answers", "n2 Ready 198.51.100.12 10.128.2.0/23 answers",
			fmt.Sprintf("this flowctl reads pipeline version %d", pipeline.PipelineVersion), "vxlan0"}, []string{"Needs attention"}},
		{"/nodes/n1", 200, []string{"Bridge br0", "Round 7", "blue/a 10.128.0.3", "n2 198.51.100.12 10.128.2.0/23", "Drift", "none — 40 flows",
			"red 14"}, nil},
		{"/nodes/n9", 404, []string{"reading node n9"}, nil},
		{"/policies", 200, []string{"no-red-to-blue Admin tier priority 10", "every pod of namespaces team=blue: blue",
			"Deny deny-red : namespaces team=red: red ports: tcp/8080", "policy.networking.k8s.io/v1beta1",
			"The cluster runs in multitenant mode: NetworkPolicies are not enforced (tenants are isolated by NETID instead)",
			"blue/web-80 Ingress", "Selects pods app=web in blue: blue/a blue/c", "namespaces team=blue: blue ports: tcp/80",
			"red/deny-all", "denies all ingress", "Selects pods (all) in red: red/b"}, nil},
		{"/trace", 200, []string{"Source", "Destination", "Protocol"}, []string{"Verdict"}},
		{"/drops", 200, []string{"Drops are not available from this cluster's agents", "their debug API has no drop stream"}, []string{"<table"}},
		{"/static/console.css", 200, []string{"--accent"}, nil},
		{"/nowhere", 404, []string{"There is no page at /nowhere"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			code, body := get(t, h, tc.path)
			page := text(body)
			if code != tc.status {
				t.Errorf("HTTP %d, want %d", code, tc.status)
			}
			for _, s := range tc.says {
				if !strings.Contains(page, s) {
					t.Errorf("the page does not say %q:\n%s", s, page)
				}
			}
			for _, s := range tc.not {
				if strings.Contains(body, s) {
					t.Errorf("the page says %q:\n%s", s, page)
				}
			}
		})
	}
}

func TestUITrace(t *testing.T) {
	f := newUIFixture(t)
	h := f.server(t, testUILimits).Handler()
	cases := []struct {
		query  string
		status int
		says   []string
	}{
		{"src=blue%2Fa&dst=red%2Fb&port=8080", 200, []string{"dropped", "dropped at table 80 ingress-isolation: tenant VNID 12 (blue) may not reach VNID 14 (red)",
			"flowctl trace blue/a red/b --port 8080", "Node n1 , in_port 3 (vetha, pod blue/a)", "20 pod-ingress 100", "pod/blue/a",
			"80 ingress-isolation 0 * pipeline/base drop (sampled: tenant-isolation, meter 1) — the verdict's flow"}},
		{"src=blue%2Fa&dst=blue%2Fc&port=8080", 200, []string{"delivered", "delivered to blue/c via node n2", "Node n2",
			"leaves by vxlan0 to node n2"}},
		{"src=blue%2Fa2&dst=svc%2Fblue%2Fweb&endpoint=10.128.2.3", 200, []string{"Service blue/web", "Following 10.128.2.3:8080"}},
		{"src=&dst=red%2Fb&proto=gre&port=99999", 400, []string{"say where the packet comes from", "tcp, udp, sctp or icmp", "a port is 1-65535"}},
		{"src=blue%2Fnope&dst=red%2Fb", 200, []string{"The trace failed", "SRC: pod blue/nope is in none of the dumps"}},
	}
	for _, tc := range cases {
		t.Run(tc.query, func(t *testing.T) {
			code, body := get(t, h, "/trace?"+tc.query)
			if code != tc.status {
				t.Errorf("HTTP %d, want %d", code, tc.status)
			}
			page := text(body)
			for _, s := range tc.says {
				if !strings.Contains(page, s) {
					t.Errorf("the page does not say %q:\n%s", s, page)
				}
			}
		})
	}
}

// An agent that never answers shows as such on its node, and the page still comes, once the agent's
// time is up; one that fails says why; the others are shown as usual.
func TestUIAgentsThatDoNotAnswer(t *testing.T) {
	f := newUIFixture(t)
	f.agents["n2"].hang = true
	f.agents["n1"].err = &debugapi.ResponseError{URL: "node n1 /debug/ofsdn/v1/node", Status: 503, Body: "error trying to reach service: dial tcp 198.51.100.11:9103: connect: connection refused"}
	limits := testUILimits
	limits.agent = 300 * time.Millisecond
	h := f.server(t, limits).Handler()
	for _, path := range []string{"/nodes", "/", "/nodes/n2", "/networks/alpha"} {
		done := make(chan struct{})
		var code int
		var body string
		go func() { defer close(done); code, body = get(t, h, path) }()
		select {
		case <-done:
		case <-time.After(time.Minute): // far beyond the agent's 300 ms: the page is stuck
			t.Fatalf("%s: no page after a minute with an agent that does not answer", path)
		}
		page := text(body)
		if code != 200 {
			t.Errorf("%s: HTTP %d", path, code)
		}
		for _, s := range []string{"the agent did not answer within 300ms"} {
			if !strings.Contains(page, s) {
				t.Errorf("%s does not say %q:\n%s", path, s, page)
			}
		}
		if path == "/nodes" && !strings.Contains(page, "n1 Ready 198.51.100.11 10.128.0.0/23 not answering the agent is starting or the node proxy cannot reach it (HTTP 503)") {
			t.Errorf("/nodes does not say why n1's agent fails:\n%s", page)
		}
	}
}

// What the API server refuses is said on the page with a hint, and the rest of the page is shown.
func TestUIReadFailures(t *testing.T) {
	f := newUIFixture(t)
	f.net.PrependReactor("list", "networks", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: networkv1.GroupName, Resource: "networks"}, "", errors.New(`User "dev" cannot list resource "networks"`))
	})
	f.net.PrependReactor("get", "clusternetworks", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: networkv1.GroupName, Resource: "clusternetworks"}, "default")
	})
	f.kube.PrependReactor("list", "networkpolicies", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	h := f.server(t, testUILimits).Handler()
	for path, says := range map[string][]string{
		"/networks": {"could not be read", "listing Networks (network.ofsdn.io)", `User "dev" cannot list resource "networks"`, "your kubeconfig's user may not read this",
			"No Networks"},
		"/":         {"reading the ClusterNetwork default", "is the resource's CRD installed", "listing NetworkPolicies: connection refused", "2 / 2 agents answering"},
		"/policies": {"listing NetworkPolicies: connection refused", "no-red-to-blue"},
	} {
		code, body := get(t, h, path)
		page := text(body)
		if code != 200 {
			t.Errorf("%s: HTTP %d", path, code)
		}
		for _, s := range says {
			if !strings.Contains(page, s) {
				t.Errorf("%s does not say %q:\n%s", path, s, page)
			}
		}
	}
}

// Objects the API server's validation would refuse, or that a newer version carries, are shown as
// what they are: no panic, no page lost.
func TestUIOddObjects(t *testing.T) {
	f := newUIFixture(t)
	ctx := context.Background()
	bad := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: "Sideways"}}}
	mustCreate := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := f.net.NetworkV1().Networks().Create(ctx, &networkv1.Network{ObjectMeta: metav1.ObjectMeta{Name: "odd"}, Spec: networkv1.NetworkSpec{NamespaceSelector: bad}}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = f.net.NetworkV1().NetNamespaces().Create(ctx, &networkv1.NetNamespace{ObjectMeta: metav1.ObjectMeta{Name: "blue2",
		Annotations: map[string]string{networkv1.ChangeNetworkAnnotation: "merge-with:everything"}}, NetID: 12}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = f.kube.NetworkingV1().NetworkPolicies("blue").Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "odd"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: bad, Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{}, {PodSelector: &bad}}}}}},
		metav1.CreateOptions{})
	mustCreate(err)
	_, err = f.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = f.src.dyn.Resource(cnpGVR).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": cnpGVR.GroupVersion().String(), "kind": "ClusterNetworkPolicy", "metadata": map[string]any{"name": "odd"},
		"spec": map[string]any{"tier": "Sideways", "priority": "high", "subject": map[string]any{}}}}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = f.src.dyn.Resource(cnpGVR).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": cnpGVR.GroupVersion().String(), "kind": "ClusterNetworkPolicy", "metadata": map[string]any{"name": "future"},
		"spec": map[string]any{"tier": "Baseline", "priority": int64(5), "subject": map[string]any{"pods": map[string]any{}},
			"egress": []any{map[string]any{"action": "Deny", "to": []any{map[string]any{"fqdn": "x"}}, "protocols": []any{map[string]any{"quic": map[string]any{}}}}}}}},
		metav1.CreateOptions{})
	mustCreate(err)
	h := f.server(t, testUILimits).Handler()
	for path, says := range map[string][]string{
		"/networks":   {"odd", "does not parse", "none yet"},
		"/tenants":    {"12 shared by 2 blue blue2", "malformed request merge-with:everything", "want join:<namespace>, isolate or global"},
		"/policies":   {"blue/odd", "does not parse", "an empty peer (selects nothing)", "odd unreadable cannot read this object", "future Baseline tier priority 5", "a peer the console does not understand", "a protocol the console does not understand"},
		"/nodes":      {"bare unknown", "no HostSubnet: the node has no pod subnet", "no agent for node bare in this fixture"},
		"/nodes/bare": {"no agent for node bare"},
	} {
		code, body := get(t, h, path)
		page := text(body)
		if code != 200 {
			t.Errorf("%s: HTTP %d:\n%s", path, code, page)
		}
		for _, s := range says {
			if !strings.Contains(page, s) {
				t.Errorf("%s does not say %q:\n%s", path, s, page)
			}
		}
	}
}

// The guard: only loopback names, only reads, and headers that keep other sites out.
func TestUIGuard(t *testing.T) {
	f := newUIFixture(t)
	s, err := newUIServer(f.src, testUILimits, []string{"127.0.0.1:9180", "localhost:9180"}, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	do := func(method, host string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(method, "/tenants", nil)
		req.Host = host
		h.ServeHTTP(rec, req)
		return rec
	}
	cases := []struct {
		method, host string
		status       int
	}{
		{http.MethodGet, "127.0.0.1:9180", 200}, {http.MethodGet, "LOCALHOST:9180", 200}, {http.MethodHead, "localhost:9180", 200},
		{http.MethodGet, "evil.example:9180", 403}, {http.MethodGet, "127.0.0.1:9181", 403},
		{http.MethodPost, "127.0.0.1:9180", 405}, {http.MethodDelete, "127.0.0.1:9180", 405},
	}
	for _, tc := range cases {
		rec := do(tc.method, tc.host)
		if rec.Code != tc.status {
			t.Errorf("%s Host %s: HTTP %d, want %d", tc.method, tc.host, rec.Code, tc.status)
		}
		if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") || !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("%s Host %s: Content-Security-Policy %q", tc.method, tc.host, csp)
		}
		if rec.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s Host %s: no nosniff", tc.method, tc.host)
		}
	}
	if rec := do(http.MethodHead, "localhost:9180"); rec.Body.Len() != 0 {
		t.Errorf("HEAD answered a body of %d bytes", rec.Body.Len())
	}
}

// noDrops is the drop source of a cluster whose agents have no drop stream (what agentDrops answers
// then, drops_test.go).
type noDrops struct{}

func (noDrops) Recent(context.Context, DropFilter) (DropBatch, error) {
	return DropBatch{}, ErrDropsUnavailable
}
func (noDrops) Follow(context.Context, DropFilter, func(DropRecord) error) error {
	return ErrDropsUnavailable
}

// matchDrop says whether a record passes the filter, as the agents filter (debugapi.DropQuery.Match)
// and agentDrops narrows to a node.
func matchDrop(f DropFilter, d DropRecord, now time.Time) bool {
	q := debugapi.DropQuery{Namespace: f.Namespace, Pod: f.Pod, Since: f.Since}
	return (f.Node == "" || d.Node == f.Node) && q.Match(debugapi.Drop{Time: d.Time, Src: d.Src, Dst: d.Dst}, now)
}

// recordedDrops is a drop source that replays records: the drops view and its stream are tested on it.
type recordedDrops struct {
	records []DropRecord
	live    chan DropRecord
	mu      sync.Mutex
	filters []DropFilter
}

func (r *recordedDrops) Recent(_ context.Context, f DropFilter) (DropBatch, error) {
	r.mu.Lock()
	r.filters = append(r.filters, f)
	r.mu.Unlock()
	var b DropBatch
	for _, d := range r.records {
		if matchDrop(f, d, time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)) {
			b.Drops = append(b.Drops, d)
		}
	}
	b.Unanswered = map[string]string{"n3": "the agent did not answer within 5s"}
	return b, nil
}

func (r *recordedDrops) Follow(ctx context.Context, f DropFilter, each func(DropRecord) error) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case d, ok := <-r.live:
			if !ok {
				return errors.New("the agents closed the stream")
			}
			if matchDrop(f, d, d.Time) {
				if err := each(d); err != nil {
					return err
				}
			}
		}
	}
}

var testDrops = []DropRecord{
	{Time: time.Date(2026, 11, 27, 11, 59, 58, 0, time.UTC), Node: "n1", Src: "red/b", Dst: "blue/a", Proto: "tcp", Port: 8080,
		Verdict: "tenant isolation", Object: "NetNamespaces red (14) → blue (12)", Table: "80 ingress-isolation"},
	{Time: time.Date(2026, 11, 27, 11, 50, 0, 0, time.UTC), Node: "n2", Src: "blue/a2", Dst: "10.128.2.9", Proto: "udp", Port: 53,
		Verdict: "anti-spoofing", Object: "pod blue/a2", Table: "20 pod-ingress"},
}

func TestUIDrops(t *testing.T) {
	f := newUIFixture(t)
	rec := &recordedDrops{records: testDrops, live: make(chan DropRecord, 1)}
	f.src.drops = rec
	srv := httptest.NewServer(f.server(t, testUILimits).Handler())
	defer srv.Close()
	h := f.server(t, testUILimits).Handler()

	code, body := get(t, h, "/drops?namespace=red&since=5m")
	page := text(body)
	for _, s := range []string{"1 drop shown", "n1 red/b blue/a tcp/8080 tenant isolation NetNamespaces red (14) → blue (12) 80 ingress-isolation",
		"n3: the agent did not answer within 5s"} {
		if !strings.Contains(page, s) {
			t.Errorf("drops page does not say %q:\n%s", s, page)
		}
	}
	if code != 200 || strings.Contains(page, "blue/a2") || !strings.Contains(body, `data-drops-stream="/drops/stream?namespace=red&amp;since=5m"`) {
		t.Errorf("HTTP %d; filtered page:\n%s", code, body)
	}
	if code, body := get(t, h, "/drops?since=yesterday"); code != 400 || !strings.Contains(text(body), `since: "yesterday" is not a duration`) {
		t.Errorf("bad since: HTTP %d:\n%s", code, text(body))
	}

	// The stream: a record that matches arrives as an event; the end of the source is told.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/drops/stream?namespace=blue", nil)
	req.Host = "127.0.0.1"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("stream: HTTP %d, %s", resp.StatusCode, ct)
	}
	rec.live <- testDrops[1]
	close(rec.live)
	events := readEvents(t, resp.Body, 2)
	var d DropRecord
	if events[0].name != "drop" || json.Unmarshal([]byte(events[0].data), &d) != nil || d != testDrops[1] {
		t.Errorf("first event %+v, want the drop %+v", events[0], testDrops[1])
	}
	if events[1].name != "failed" || !strings.Contains(events[1].data, "the agents closed the stream") {
		t.Errorf("second event %+v, want the end of the stream", events[1])
	}

	// Without a drop stream the stream says so and ends.
	f.src.drops = noDrops{}
	srv2 := httptest.NewServer(f.server(t, testUILimits).Handler())
	defer srv2.Close()
	resp2, err := http.Get(srv2.URL + "/drops/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	if ev := readEvents(t, resp2.Body, 1); ev[0].name != "failed" || !strings.Contains(ev[0].data, "not available from this cluster's agents") {
		t.Errorf("stream without drops: %+v", ev)
	}
}

type sseEvent struct{ name, data string }

func readEvents(t *testing.T, r io.Reader, n int) []sseEvent {
	t.Helper()
	var out []sseEvent
	sc := bufio.NewScanner(r)
	var cur sseEvent
	for sc.Scan() && len(out) < n {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
		case line == "" && cur.name != "":
			out = append(out, cur)
			cur = sseEvent{}
		}
	}
	if len(out) < n {
		t.Fatalf("stream ended after %d events (%v), want %d", len(out), sc.Err(), n)
	}
	return out
}

// The style sheet's palette: every text colour on each background it is used on meets WCAG AA
// (4.5:1), in the light palette and the dark one. The pairs are the ones console.css documents.
func TestUIPaletteContrast(t *testing.T) {
	css, err := uiFiles.ReadFile("ui/static/console.css")
	if err != nil {
		t.Fatal(err)
	}
	body := string(css)
	dark := strings.Index(body, "@media (prefers-color-scheme: dark)")
	if dark < 0 {
		t.Fatal("console.css has no dark palette")
	}
	palettes := map[string]map[string]string{"light": cssVars(body[:dark]), "dark": cssVars(body[dark:])}
	pairs := [][2]string{{"text", "bg"}, {"text", "surface"}, {"muted", "bg"}, {"muted", "surface"}, {"accent", "bg"}, {"accent", "surface"},
		{"surface", "accent"}, {"top-text", "top-bg"}, {"top-muted", "top-bg"}, {"ok-fg", "ok-bg"}, {"bad-fg", "bad-bg"}, {"bad-fg", "surface"},
		{"warn-fg", "warn-bg"}, {"info-fg", "info-bg"}, {"text", "code-bg"}}
	for name, vars := range palettes {
		for _, p := range pairs {
			fg, bg := vars[p[0]], vars[p[1]]
			if fg == "" || bg == "" {
				t.Errorf("%s palette: --%s or --%s missing", name, p[0], p[1])
				continue
			}
			if r := contrast(t, fg, bg); r < 4.5 {
				t.Errorf("%s palette: --%s %s on --%s %s: contrast %.2f:1, WCAG AA needs 4.5:1", name, p[0], fg, p[1], bg, r)
			}
		}
	}
}

func cssVars(s string) map[string]string {
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`--([a-z-]+):\s*(#[0-9a-fA-F]{6})`).FindAllStringSubmatch(s, -1) {
		out[m[1]] = m[2]
	}
	return out
}

func contrast(t *testing.T, a, b string) float64 {
	lum := func(hex string) float64 {
		var c [3]float64
		for i := range c {
			v, err := strconv.ParseUint(hex[1+2*i:3+2*i], 16, 8)
			if err != nil {
				t.Fatalf("colour %s: %v", hex, err)
			}
			x := float64(v) / 255
			if x <= 0.04045 {
				c[i] = x / 12.92
			} else {
				c[i] = math.Pow((x+0.055)/1.055, 2.4)
			}
		}
		return 0.2126*c[0] + 0.7152*c[1] + 0.0722*c[2]
	}
	x, y := lum(a), lum(b)
	return (math.Max(x, y) + 0.05) / (math.Min(x, y) + 0.05)
}

// What a node shows when its agent cannot be read: the node proxy's refusals said in words.
func TestUIAgentError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		says string
	}{
		{&debugapi.ResponseError{Status: 503, Body: "no endpoints"}, "the agent is starting or the node proxy cannot reach it (HTTP 503): no endpoints"},
		{&debugapi.ResponseError{Status: 403, Body: `nodes "n1" is forbidden`}, "may not read this node's agent (the node proxy needs get on nodes/proxy)"},
		{&debugapi.ResponseError{Status: 401, Body: "Unauthorized"}, "unauthorized (HTTP 401)"},
		{&debugapi.ResponseError{Status: 500, Body: strings.Repeat("x", 1000)}, "HTTP 500: " + strings.Repeat("x", 300) + "…"},
		{fmt.Errorf("debug API of node n1: %w", errors.New("dial tcp: connection refused")), "debug API of node n1: dial tcp: connection refused"},
	} {
		if got := agentError(tc.err); !strings.Contains(got, tc.says) {
			t.Errorf("%v: %q, want it to say %q", tc.err, got, tc.says)
		}
	}
}

// syncBuffer is a buffer written by a command's goroutine and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRunUI: flowctl ui serves the console at the address it prints until its context ends; on a
// loopback address it answers loopback names only, and on any other it warns that whoever reaches it
// reads the cluster with the user's credentials (README, "flowctl ui").
func TestRunUI(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: not-used}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		address string
		warns   bool
		other   int // the answer to a Host that is not loopback's
	}{{"127.0.0.1:0", false, 403}, {"0.0.0.0:0", true, 200}} {
		t.Run(tc.address, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var stdout, stderr syncBuffer
			done := make(chan error, 1)
			go func() {
				done <- RunUI(ctx, []string{"--kubeconfig", kubeconfig, "--address", tc.address}, &stdout, &stderr)
			}()
			addr := regexp.MustCompile(`at http://(\S+)/ `)
			var m []string
			for deadline := time.Now().Add(time.Minute); m == nil; time.Sleep(10 * time.Millisecond) {
				if m = addr.FindStringSubmatch(stdout.String()); m == nil && time.Now().After(deadline) {
					t.Fatalf("no address printed: %q %q", stdout.String(), stderr.String())
				}
			}
			port := m[1][strings.LastIndex(m[1], ":"):]
			for host, want := range map[string]int{"127.0.0.1" + port: 200, "evil.example" + port: tc.other} {
				req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1"+port+"/static/console.css", nil)
				req.Host = host
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Errorf("Host %s: HTTP %d, want %d", host, resp.StatusCode, want)
				}
			}
			if warned := strings.Contains(stderr.String(), "whoever reaches it reads the cluster with your credentials"); warned != tc.warns {
				t.Errorf("warned %v, want %v: %q", warned, tc.warns, stderr.String())
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("RunUI after its context ended: %v", err)
			}
		})
	}
}

// TestUIDropsIntroNamesEveryCause: the Drops page's introduction lists every cause of the drop
// registry (flows/pipeline/drops.go) in its words, whether the agents have drops or not and whether
// the filter parses: the tunnel guard, the egress firewall and Networks' causes included.
func TestUIDropsIntroNamesEveryCause(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		src        DropSource
	}{
		{"drops", "/drops", &recordedDrops{records: testDrops}},
		{"no drop stream", "/drops", noDrops{}},
		{"bad filter", "/drops?since=yesterday", &recordedDrops{records: testDrops}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newUIFixture(t)
			f.src.drops = tc.src
			_, body := get(t, f.server(t, testUILimits).Handler(), tc.path)
			start := strings.Index(body, "Packets the datapath dropped")
			if start < 0 {
				t.Fatalf("no introduction:\n%s", body)
			}
			intro := text(body[start : start+strings.Index(body[start:], "</p>")])
			for _, c := range pipeline.DropCauses {
				if !strings.Contains(intro, c.Words) {
					t.Errorf("the introduction does not name %s (%q): %s", c.Cause, c.Words, intro)
				}
			}
		})
	}
}
