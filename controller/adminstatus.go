package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	cnp "github.com/ofsdn/ofsdn/apis/policy/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// The status the controller writes on every ClusterNetworkPolicy: one condition, aggregated from what
// the agents report, never a row per node.
//
// Agents report through Events on the policy (agent/adminpolicy/report.go): a Warning "NotEnforced"
// from a node whose pods the policy selects, naming each problem there (a peer that fails closed,
// domainNames, a named port no pod has, flows that could not be installed), and a Normal "Enforced"
// once they are gone. Events keep the agents' permissions as they were (they write only Events) and
// cost nothing while every node enforces every policy. The controller keeps, per policy and node, the
// latest of these (the node is the Event's source host) and writes condition adminConditionType:
// True when no node reports a problem, False naming the nodes and their problems, grouped by problem.
// An agent repeats a standing problem every 20 minutes, so its Event outlives the API server's Event
// TTL; Events from before the policy was created, and from nodes that are gone, are ignored.
const (
	// adminConditionType is the condition on a ClusterNetworkPolicy's status.
	adminConditionType = "Enforced"
	// Its reasons.
	adminReasonEnforced    = "Enforced"
	adminReasonNotEnforced = "NotEnforcedOnSomeNodes"
	// maxConditionMessage stays inside the API's limit for a condition message (32768).
	maxConditionMessage = 30000
	// eventPolicyIndex indexes the Events by the name of the policy they are about: a sync reads its
	// policy's, not every ClusterNetworkPolicy's.
	eventPolicyIndex = "policy"
)

// adminStatus aggregates the agents' reports into each ClusterNetworkPolicy's status.
type adminStatus struct {
	dyn      dynamic.Interface
	disc     discovery.DiscoveryInterface
	log      klog.Logger
	policies cache.GenericLister
	events   cache.Indexer // by eventPolicyIndex
	nodes    corelisters.NodeLister
	synced   []cache.InformerSynced
	q        workqueue.TypedRateLimitingInterface[string]
	start    []interface{ Start(stopCh <-chan struct{}) }
	clock    func() time.Time
}

// newAdminStatus wires the aggregation on informers of its own: the policies (dynamic client), the
// Events about ClusterNetworkPolicies only (a field selector: not every Event of the cluster), and the
// nodes (from nodeInformers, shared with the controller).
func newAdminStatus(kube kubernetes.Interface, dyn dynamic.Interface, nodeInformers informers.SharedInformerFactory, log klog.Logger) (*adminStatus, error) {
	s := &adminStatus{dyn: dyn, disc: kube.Discovery(), log: log.WithName("cnp-status"), clock: time.Now,
		q: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "cnp-status"})}
	polFactory := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	evFactory := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("involvedObject.kind", cnp.Kind).String()
	}))
	pol := polFactory.ForResource(cnp.Resource)
	ev := evFactory.Core().V1().Events()
	nodes := nodeInformers.Core().V1().Nodes()
	if err := ev.Informer().AddIndexers(cache.Indexers{eventPolicyIndex: func(obj any) ([]string, error) {
		if e, ok := obj.(*corev1.Event); ok {
			return []string{e.InvolvedObject.Name}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, fmt.Errorf("cnp status: %w", err)
	}
	s.policies, s.events, s.nodes = pol.Lister(), ev.Informer().GetIndexer(), nodes.Lister()
	s.start = []interface{ Start(<-chan struct{}) }{polFactory, evFactory, nodeInformers}
	all := func() {
		for _, name := range s.policyNames() {
			s.q.Add(name)
		}
	}
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		key func(obj any) (string, bool)
	}{
		{pol.Informer(), func(obj any) (string, bool) {
			if m, err := meta.Accessor(obj); err == nil {
				return m.GetName(), true
			}
			return "", false
		}},
		{ev.Informer(), func(obj any) (string, bool) {
			if e, ok := obj.(*corev1.Event); ok {
				return e.InvolvedObject.Name, true
			}
			return "", false
		}},
	} {
		add := func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if k, ok := h.key(obj); ok {
				s.q.Add(k)
			}
		}
		reg, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: add, UpdateFunc: func(_, obj any) { add(obj) }, DeleteFunc: add})
		if err != nil {
			return nil, fmt.Errorf("cnp status: %w", err)
		}
		s.synced = append(s.synced, reg.HasSynced)
	}
	reg, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(any) { all() }})
	if err != nil {
		return nil, fmt.Errorf("cnp status: %w", err)
	}
	s.synced = append(s.synced, reg.HasSynced)
	return s, nil
}

func (s *adminStatus) policyNames() []string {
	objs, err := s.policies.List(labels.Everything())
	if err != nil {
		return nil
	}
	var out []string
	for _, o := range objs {
		if m, err := meta.Accessor(o); err == nil {
			out = append(out, m.GetName())
		}
	}
	return out
}

// Run aggregates until ctx ends; without the CRD there is nothing to do and it says so once.
func (s *adminStatus) Run(ctx context.Context) error {
	defer s.q.ShutDown()
	served, err := crdServed(s.disc)
	if err != nil {
		return err
	}
	if !served {
		s.log.Info("ClusterNetworkPolicy is not served (its CRD is not installed): no status to write")
		<-ctx.Done()
		return nil
	}
	for _, f := range s.start {
		f.Start(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), s.synced...) {
		return nil
	}
	go func() {
		<-ctx.Done()
		s.q.ShutDown()
	}()
	for {
		key, quit := s.q.Get()
		if quit {
			return nil
		}
		if err := s.sync(ctx, key); err != nil && ctx.Err() == nil {
			s.log.Error(err, "status sync failed; retrying", "policy", key)
			s.q.AddRateLimited(key)
		} else {
			s.q.Forget(key)
		}
		s.q.Done(key)
	}
}

func crdServed(d discovery.DiscoveryInterface) (bool, error) {
	list, err := d.ServerResourcesForGroupVersion(cnp.Group + "/" + cnp.Version)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discover %s/%s: %w", cnp.Group, cnp.Version, err)
	}
	return slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == cnp.Resource.Resource }), nil
}

// sync writes one policy's condition from the latest report of every node.
func (s *adminStatus) sync(ctx context.Context, name string) error {
	obj, err := s.policies.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return fmt.Errorf("policy %s is a %T", name, obj)
	}
	p, err := cnp.FromUnstructured(u)
	if err != nil {
		return err
	}
	objs, err := s.events.ByIndex(eventPolicyIndex, name)
	if err != nil {
		return err
	}
	events := make([]*corev1.Event, 0, len(objs))
	for _, o := range objs {
		if e, ok := o.(*corev1.Event); ok {
			events = append(events, e)
		}
	}
	want := aggregateAdminCondition(p, events, func(node string) bool {
		_, err := s.nodes.Get(node)
		return err == nil
	})
	if c := meta.FindStatusCondition(p.Status.Conditions, adminConditionType); c != nil && c.Status == want.Status &&
		c.Reason == want.Reason && c.Message == want.Message && c.ObservedGeneration == want.ObservedGeneration {
		return nil
	}
	want.LastTransitionTime = metav1.NewTime(s.clock())
	meta.SetStatusCondition(&p.Status.Conditions, want)
	out, err := cnp.ToUnstructured(p)
	if err != nil {
		return err
	}
	if _, err := s.dyn.Resource(cnp.Resource).UpdateStatus(ctx, out, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			s.q.AddAfter(name, 100*time.Millisecond) // the informer brings the newer object
			return nil
		}
		return fmt.Errorf("update status of ClusterNetworkPolicy %s: %w", name, err)
	}
	s.log.V(2).Info("status written", "policy", name, "status", want.Status, "reason", want.Reason)
	return nil
}

// aggregateAdminCondition is the policy's condition from the Events about it: each live node's latest
// report (by its source host; Events of an earlier policy of the same name are older than it).
func aggregateAdminCondition(p *cnp.ClusterNetworkPolicy, events []*corev1.Event, nodeExists func(string) bool) metav1.Condition {
	type report struct {
		at      time.Time
		problem string // "" enforced
	}
	latest := map[string]report{}
	created := p.CreationTimestamp.Time
	for _, e := range events {
		if e.InvolvedObject.Kind != cnp.Kind || e.InvolvedObject.Name != p.Name ||
			e.Reason != cnp.EventReasonNotEnforced && e.Reason != cnp.EventReasonEnforced {
			continue
		}
		node := e.Source.Host
		if node == "" {
			node = e.ReportingInstance
		}
		at := e.LastTimestamp.Time
		if at.IsZero() {
			at = e.EventTime.Time
		}
		if node == "" || at.Before(created) || !nodeExists(node) {
			continue
		}
		if prev, ok := latest[node]; ok && prev.at.After(at) {
			continue
		}
		r := report{at: at}
		if e.Reason == cnp.EventReasonNotEnforced {
			r.problem = strings.TrimPrefix(e.Message, "node "+node+": ")
		}
		latest[node] = r
	}
	byProblem := map[string][]string{}
	for node, r := range latest {
		if r.problem != "" {
			byProblem[r.problem] = append(byProblem[r.problem], node)
		}
	}
	c := metav1.Condition{Type: adminConditionType, ObservedGeneration: p.Generation}
	if len(byProblem) == 0 {
		c.Status, c.Reason = metav1.ConditionTrue, adminReasonEnforced
		c.Message = "enforced as written on every node that hosts a pod it selects"
		return c
	}
	var parts []string
	for _, problem := range slices.Sorted(maps.Keys(byProblem)) {
		nodes := byProblem[problem]
		slices.Sort(nodes)
		parts = append(parts, fmt.Sprintf("on %s: %s", strings.Join(nodes, ", "), problem))
	}
	c.Status, c.Reason = metav1.ConditionFalse, adminReasonNotEnforced
	c.Message = "not enforced as written " + strings.Join(parts, " | ")
	if len(c.Message) > maxConditionMessage {
		c.Message = c.Message[:maxConditionMessage] + " …"
	}
	return c
}
