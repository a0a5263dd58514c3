package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/agent/attach"
	pt "github.com/ofsdn/ofsdn/agent/policy/policytest"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/policy"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/fakeswitch"
	"github.com/ofsdn/ofsdn/internal/proc"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// recordedEvent is an Event a test recorder saw.
type recordedEvent struct {
	Kind, Namespace, Name, Type, Reason, Message string
}

// eventLog records Events with the object they are about (client-go's FakeRecorder drops it).
type eventLog struct {
	mu     sync.Mutex
	events []recordedEvent
}

func (l *eventLog) Event(obj runtime.Object, eventType, reason, message string) {
	ref, _ := obj.(*corev1.ObjectReference)
	if ref == nil {
		ref = &corev1.ObjectReference{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, recordedEvent{ref.Kind, ref.Namespace, ref.Name, eventType, reason, message})
}

func (l *eventLog) Eventf(obj runtime.Object, eventType, reason, format string, args ...any) {
	l.Event(obj, eventType, reason, fmt.Sprintf(format, args...))
}

func (l *eventLog) AnnotatedEventf(obj runtime.Object, _ map[string]string, eventType, reason, format string, args ...any) {
	l.Eventf(obj, eventType, reason, format, args...)
}

func (l *eventLog) with(reason string) []recordedEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []recordedEvent
	for _, e := range l.events {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// policyAgent is an agent made by New against fake API clients (startAgent), its flows on a switch.
type policyAgent struct {
	*Agent
	sw     *fakeswitch.Switch // nil when on another switch
	api    *fakeAPI
	events *eventLog
}

// newPolicyAgent starts the agent's informers on fake clients holding objs, the node n1
// (192.0.2.11, 10.128.0.0/23), n2 (192.0.2.12, 10.128.2.0/23), and the namespaces' NetNamespaces; its
// flows go to an in-memory switch.
func newPolicyAgent(t testing.TB, mode networkv1.PluginMode, objs ...runtime.Object) *policyAgent {
	sw := fakeswitch.New()
	pa := newPolicyAgentOn(t, sw, mode, objs...)
	pa.sw = sw
	return pa
}

// newPolicyAgentOn is newPolicyAgent with its flows on sw.
func newPolicyAgentOn(t testing.TB, sw reconcile.Switch, mode networkv1.PluginMode, objs ...runtime.Object) *policyAgent {
	all := append([]runtime.Object{clusterNetwork(networkv1.ClusterNetworkName, mode, "10.128.0.0/14"),
		hostSubnet("n1", testNode, "192.0.2.11", "10.128.0.0/23"), hostSubnet("n2", "n2", "192.0.2.12", "10.128.2.0/23")}, objs...)
	for i, o := range objs {
		if ns, ok := o.(*corev1.Namespace); ok {
			all = append(all, netNamespace(ns.Name, uint32(100+i)))
		}
	}
	a, api := startAgent(t, all...)
	pa := &policyAgent{Agent: a, api: api, events: api.events}
	a.recon = reconcile.New(sw, reconcile.Config{Round: 1, PipelineVersion: pipeline.PipelineVersion, VersionOf: pipeline.VersionOf})
	a.fs.useBridge(a.recon)
	proc.Eventually(t, waitTimeout, "the node's subnet and cluster network", func() bool { return a.view.Ready() == nil })
	go a.hostFwd.run(api.ctx)
	return pa
}

// attach puts a pod on the bridge as a CNI ADD does.
func (pa *policyAgent) attach(ns, name, ip string, ofport uint32) uint64 {
	return attachPod(pa.Agent, ns, name, ip, ofport)
}

// flowsOf is an owner's flows on the switch, as ovs-ofctl prints them (without cookies).
func (pa *policyAgent) flowsOf(o reconcile.Owner) []string {
	var out []string
	raw, _ := pa.sw.DumpFlows(context.Background(), uint64(reconcile.MakeCookie(0, o)), uint64(reconcile.CookieIdentityMask))
	for _, r := range raw {
		if f, err := openflow.DecodeFlowStats(r); err == nil {
			out = append(out, f.String())
		}
	}
	slices.Sort(out)
	return out
}

// eventually syncs until ok holds: informer events reach the view asynchronously.
func (pa *policyAgent) eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := pa.fs.syncNow(context.Background()); err != nil {
			t.Fatal(err)
		}
		if ok() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func anyContains(lines []string, s string) bool {
	return slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, s) })
}

func apiPod(ns, name, node, ip string, labels map[string]string, ports ...corev1.ContainerPort) *corev1.Pod {
	return pt.Pod(ns, name, node, ip, labels, ports...)
}

func apiNamespace(name string, labels map[string]string) *corev1.Namespace {
	l := pt.Labels("kubernetes.io/metadata.name", name)
	for k, v := range labels {
		l[k] = v
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
}

// TestAgentEnforcesPoliciesLive: through New's informers on fake API clients and the flow sync, a
// policy's flows follow the API live — a peer relabelled in and out, a namespace relabelled, the policy
// changed and deleted — and only in networkpolicy mode: switching the ClusterNetwork's mode away and
// back removes and restores them, isolation included.
func TestAgentEnforcesPoliciesLive(t *testing.T) {
	ctx := context.Background()
	web := apiPod("x", "web", "n1", "10.128.0.10", pt.Labels("app", "web"), pt.Named("http", corev1.ProtocolTCP, 8080))
	client := apiPod("x", "client", "n2", "10.128.2.20", pt.Labels("app", "client"))
	other := apiPod("y", "other", "n2", "10.128.2.30", pt.Labels("app", "client"))
	np := pt.Policy("x", "web", pt.Labels("app", "web"), func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{pt.PodPeer(pt.Labels("app", "client")), pt.NsPeer(pt.Labels("team", "blue"))},
			Ports: []networkingv1.NetworkPolicyPort{pt.NamedPort(corev1.ProtocolTCP, "http")},
		}}
	})
	pa := newPolicyAgent(t, networkv1.PluginModeNetworkPolicy, apiNamespace("x", nil), apiNamespace("y", nil), web, client, other, np)
	if _, err := pa.fs.syncThrough(ctx, pa.attach("x", "web", "10.128.0.10", 10)); err != nil {
		t.Fatal(err)
	}
	owner := pipeline.NetPolOwner("x", "web")
	isolated := func() bool { return anyContains(pa.flowsOf(pipeline.PodOwner("x", "web")), "priority=500,ip,reg2=0xa") }
	pa.eventually(t, "policy rendered, web isolated", func() bool {
		fl := pa.flowsOf(owner)
		return anyContains(fl, "nw_src=10.128.2.20") && anyContains(fl, "tp_dst=8080") && !anyContains(fl, "10.128.2.30") && isolated()
	})

	// y/other comes in when namespace y is labelled team=blue; goes again when unlabelled.
	if _, err := pa.api.kube.CoreV1().Namespaces().Update(ctx, apiNamespace("y", pt.Labels("team", "blue")), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pa.eventually(t, "namespace relabelled in", func() bool { return anyContains(pa.flowsOf(owner), "nw_src=10.128.2.30") })
	// x/client is relabelled out of the podSelector peer.
	client.Labels = pt.Labels("app", "gone")
	if _, err := pa.api.kube.CoreV1().Pods("x").Update(ctx, client, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pa.eventually(t, "peer relabelled out", func() bool { return !anyContains(pa.flowsOf(owner), "nw_src=10.128.2.20") })

	// The mode switches away: no policy flows, no isolation. And back.
	if _, err := pa.api.net.NetworkV1().ClusterNetworks().Update(ctx, clusterNetwork(networkv1.ClusterNetworkName, networkv1.PluginModeSubnet, "10.128.0.0/14"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pa.eventually(t, "subnet mode drops policies", func() bool { return len(pa.flowsOf(owner)) == 0 && !isolated() })
	if _, err := pa.api.net.NetworkV1().ClusterNetworks().Update(ctx, clusterNetwork(networkv1.ClusterNetworkName, networkv1.PluginModeNetworkPolicy, "10.128.0.0/14"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pa.eventually(t, "networkpolicy mode restores them", func() bool { return anyContains(pa.flowsOf(owner), "nw_src=10.128.2.30") && isolated() })

	// The policy changes to an ipBlock, then goes: web is no longer isolated.
	np.Spec.Ingress[0].From = []networkingv1.NetworkPolicyPeer{pt.BlockPeer("198.51.100.0/24")}
	if _, err := pa.api.kube.NetworkingV1().NetworkPolicies("x").Update(ctx, np, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pa.eventually(t, "policy changed", func() bool {
		fl := pa.flowsOf(owner)
		return anyContains(fl, "nw_src=198.51.100.0/24") && !anyContains(fl, "10.128.2.30")
	})
	if err := pa.api.kube.NetworkingV1().NetworkPolicies("x").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pa.eventually(t, "policy deleted", func() bool { return len(pa.flowsOf(owner)) == 0 && !isolated() })
}

// TestAgentReportsPolicyProblems: a policy that renders only in part (a named port no pod has) renders
// the rest, and is told once as a Warning Event on the NetworkPolicy, however many syncs follow; a
// policy whose flows the switch refuses keeps failing alone (FlowsNotInstalled on the NetworkPolicy)
// while another policy and the pods keep syncing.
func TestAgentReportsPolicyProblems(t *testing.T) {
	ctx := context.Background()
	partial := pt.Policy("x", "partial", nil, func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{pt.NamedPort(corev1.ProtocolTCP, "nope"), pt.TCPPort(80)}}}
	})
	refused := pt.Policy("x", "refused", nil, func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{pt.BlockPeer("203.0.113.0/24")}}}
	})
	pa := newPolicyAgent(t, networkv1.PluginModeNetworkPolicy, apiNamespace("x", nil),
		apiPod("x", "a", "n1", "10.128.0.10", pt.Labels("app", "a")), partial, refused)
	pa.sw.Refuse = func(f openflow.Flow) error {
		if strings.Contains(f.String(), "203.0.113.0/24") {
			return errors.New("fake: refused")
		}
		return nil
	}
	if _, err := pa.fs.syncThrough(ctx, pa.attach("x", "a", "10.128.0.10", 10)); err != nil {
		t.Fatal(err)
	}
	pa.eventually(t, "the partial policy renders its numbered port", func() bool {
		return anyContains(pa.flowsOf(pipeline.NetPolOwner("x", "partial")), "tp_dst=80")
	})
	for range 3 {
		pa.attach("x", "b", "10.128.0.11", 11) // other changes keep syncing
		if _, err := pa.fs.syncNow(ctx); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(pa.events.with(policy.ReasonNotFullyEnforced)) == 0 || len(pa.events.with("FlowsNotInstalled")) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("events: %+v", pa.events.events)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // let further (wrong) Events arrive
	got := pa.events.with(policy.ReasonNotFullyEnforced)
	if len(got) != 1 || got[0].Kind != "NetworkPolicy" || got[0].Namespace != "x" || got[0].Name != "partial" || got[0].Type != corev1.EventTypeWarning ||
		!strings.Contains(got[0].Message, `container port named "nope"`) {
		t.Errorf("problem Events %+v; want one Warning on x/partial naming the port", got)
	}
	failed := pa.events.with("FlowsNotInstalled")
	if len(failed) != 1 || failed[0].Kind != "NetworkPolicy" || failed[0].Name != "refused" {
		t.Errorf("failure Events %+v; want one on NetworkPolicy x/refused", failed)
	}
	if f := pa.fs.failingOwners(); len(f) != 1 || f[pipeline.NetPolOwner("x", "refused")] == nil {
		t.Errorf("failing owners %v; want x/refused alone", f)
	}
	if !anyContains(pa.flowsOf(pipeline.PodOwner("x", "b")), "nw_dst=10.128.0.11") {
		t.Error("pod x/b's flows were not installed while a policy failed")
	}
}

// TestTrimForAgent: the informers' caches keep what the agent reads and nothing else, and trimming is
// idempotent.
func TestTrimForAgent(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "a", UID: "u1", ResourceVersion: "7", Labels: pt.Labels("app", "a"),
			Annotations:   map[string]string{"big": strings.Repeat("x", 1000)},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}, CreationTimestamp: metav1.Unix(100, 0)},
		Spec: corev1.PodSpec{NodeName: "n1", HostNetwork: true, Volumes: []corev1.Volume{{Name: "v"}},
			Containers: []corev1.Container{
				{Name: "c", Image: "img", Env: []corev1.EnvVar{{Name: "E", Value: "v"}},
					Ports: []corev1.ContainerPort{{Name: "http", Protocol: corev1.ProtocolTCP, ContainerPort: 80, HostPort: 8080, HostIP: "192.0.2.11"}}},
				{Name: "sidecar", Image: "img"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.128.0.10", PodIPs: []corev1.PodIP{{IP: "10.128.0.10"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady}}, ContainerStatuses: []corev1.ContainerStatus{{Name: "c"}}},
	}
	want := &k8sobj.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "a", UID: "u1", ResourceVersion: "7", Labels: pt.Labels("app", "a"), CreationTimestamp: metav1.Unix(100, 0)},
		NodeName:   "n1", HostNetwork: true, Phase: corev1.PodRunning, IPs: []string{"10.128.0.10"},
		Ports: []corev1.ContainerPort{{Name: "http", Protocol: corev1.ProtocolTCP, ContainerPort: 80, HostPort: 8080, HostIP: "192.0.2.11"}},
	}
	got, err := k8sobj.Trim(pod)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := k8sobj.Trim(got)
	for _, g := range []any{got, again, got.(*k8sobj.Pod).DeepCopyObject()} {
		if !equalObjects(g, want) {
			t.Errorf("trimmed pod\n%+v\nwant\n%+v", g, want)
		}
	}
	np := pt.Policy("x", "p", nil, nil)
	np.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	np.Annotations = map[string]string{corev1.LastAppliedConfigAnnotation: "{...}", "keep": "1"}
	out, _ := k8sobj.Trim(np)
	if p := out.(*networkingv1.NetworkPolicy); p.ManagedFields != nil || len(p.Annotations) != 1 {
		t.Errorf("policy keeps managedFields %v and annotations %v", p.ManagedFields, p.Annotations)
	}
}

func equalObjects(a, b any) bool { return fmt.Sprintf("%#v", a) == fmt.Sprintf("%#v", b) }

// TestRestoreLooksUpPodsInTheAgentPodCache: restore's cache lookup reads the cluster-wide informer's
// k8sobj.Pods: a pod of this node is found with its UID and its static pod's UID (mirror); a pod bound
// elsewhere, or unknown, is left to the API server.
func TestRestoreLooksUpPodsInTheAgentPodCache(t *testing.T) {
	here := apiPod("x", "here", "n1", "10.128.0.10", nil)
	here.UID, here.Annotations = "uid-here", map[string]string{k8sobj.MirrorAnnotation: "uid-static"}
	there := apiPod("x", "there", "n2", "10.128.2.10", nil)
	pa := newPolicyAgent(t, networkv1.PluginModeSubnet, apiNamespace("x", nil), here, there)
	lookup := attach.APIPods{Cache: pa.kubeInformers.Core().V1().Pods().Informer().GetStore(), NodeName: "n1"}
	if uid, mirror, ok := lookup.Cached("x", "here"); !ok || uid != "uid-here" || mirror != "uid-static" {
		t.Errorf("x/here: %q %q %v", uid, mirror, ok)
	}
	for _, name := range []string{"there", "absent"} {
		if _, _, ok := lookup.Cached("x", name); ok {
			t.Errorf("x/%s found in this node's cache", name)
		}
	}
}
