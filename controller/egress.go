package controller

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/internal/egressplan"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Egress IPs and EgressNetworkPolicies: the controller judges them (egressplan, the model the agents
// share), writes what it finds into their status, and tells each problem once as a Warning Event. It
// also makes the API-level placement of each usable egress IP (status.egressIPs[].assignedNode) among
// the Ready nodes that may hold it: the node that holds it now while that node is Ready, else the
// previous placement, else the first of egressplan's ranking. The agents move an IP themselves within a
// second when its holder dies and record the holder in status.egressIPs[].node afterwards; the
// placement follows them (a Ready holder keeps its IP), and agents start from it when no live node
// holds an IP (all agents restarting at once, say).
//
// Both syncs look at every object of their kind (a HostSubnet or a Node's readiness changes what every
// egress IP can do; one namespace's IP can conflict with another's), under one key each: the queue
// de-duplicates bursts.

// Keys of the egress queue.
const (
	egressIPsKey      = "egress-ips"
	egressPoliciesKey = "egress-policies"
)

// syncEgress runs the sync of a key of the egress queue.
func (c *Controller) syncEgress(ctx context.Context, key string) error {
	switch key {
	case egressIPsKey:
		return c.syncEgressIPs(ctx)
	case egressPoliciesKey:
		return c.syncEgressPolicies(ctx)
	}
	return nil
}

// problemText says in words why an egress IP cannot be used.
func problemText(ip *egressplan.IP) string {
	switch ip.Reason {
	case networkv1.ReasonEgressIPConflict:
		return fmt.Sprintf("%s is claimed by namespaces %s: none of them gets it", ip.Addr, strings.Join(ip.Namespaces, ", "))
	case networkv1.ReasonEgressIPInsideCluster:
		return fmt.Sprintf("%s lies inside the cluster (cluster network, service network or a node's address)", ip.Addr)
	case networkv1.ReasonEgressIPNoEligibleNode:
		return fmt.Sprintf("%s is in no HostSubnet's egressCIDRs or egressIPs: no node may hold it", ip.Addr)
	}
	return ""
}

// nodeReady reports whether a Node exists and is Ready.
func (c *Controller) nodeReady(name string) bool {
	n, err := c.nodes.Get(name)
	return err == nil && isReady(n)
}

func isReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// onNodeReadiness queues key when a Node comes, goes or turns Ready or not Ready: of a Node, the egress
// IPs depend on that alone (nodeReady), so its status heartbeats queue nothing.
func onNodeReadiness(q workqueue.TypedRateLimitingInterface[string], key string) cache.ResourceEventHandlerFuncs {
	h := onKey(q, key)
	h.UpdateFunc = func(old, obj any) {
		if o, ok := old.(*corev1.Node); ok {
			if n, ok := obj.(*corev1.Node); ok && isReady(o) == isReady(n) {
				return
			}
		}
		q.Add(key)
	}
	return h
}

// syncEgressIPs writes every NetNamespace's egress status: validity, placement, and the holder the agents
// recorded (kept as they wrote it).
func (c *Controller) syncEgressIPs(ctx context.Context) error {
	hss, err := c.subnets.List(labels.Everything())
	if err != nil {
		return err
	}
	nns, err := c.netns.List(labels.Everything())
	if err != nil {
		return err
	}
	c.mu.Lock()
	spec := c.accepted
	c.mu.Unlock()
	plan := egressplan.FromAPI(hss, nns, spec)
	// By name, so the namespaces' statuses and Events come in the same order every sync.
	slices.SortFunc(nns, func(a, b *networkv1.NetNamespace) int { return strings.Compare(a.Name, b.Name) })
	var errs []error
	for _, nn := range nns {
		upd := nn.DeepCopy()
		problems := c.desiredEgressStatus(upd, plan)
		if reflect.DeepEqual(upd.Status, nn.Status) {
			continue
		}
		for _, p := range problems {
			c.recorder.Eventf(nn, corev1.EventTypeWarning, p.reason, "%s", p.message)
			c.log.Info("egress IP problem", "namespace", nn.Name, "reason", p.reason, "message", p.message)
		}
		for _, e := range upd.Status.EgressIPs {
			if e.AssignedNode != "" && e.AssignedNode != previousAssignment(nn, e.IP) {
				c.recorder.Eventf(nn, corev1.EventTypeNormal, "EgressIPAssigned", "egress IP %s placed on node %s", e.IP, e.AssignedNode)
			}
		}
		if _, err := c.net.NetworkV1().NetNamespaces().UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil {
			if !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("update NetNamespace %s status: %w", nn.Name, err))
			}
			continue
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("egress IPs: %w", errors.Join(errs...))
	}
	return nil
}

func previousAssignment(nn *networkv1.NetNamespace, ip networkv1.EgressIP) string {
	for _, e := range nn.Status.EgressIPs {
		if e.IP == ip {
			return e.AssignedNode
		}
	}
	return ""
}

// egressProblem is a Warning Event to record: a condition that newly went False, or whose message
// changed while False.
type egressProblem struct{ reason, message string }

// desiredEgressStatus sets nn's status to what the plan says and returns the problems that are new
// compared with the status nn had.
func (c *Controller) desiredEgressStatus(nn *networkv1.NetNamespace, plan egressplan.Plan) []egressProblem {
	old := nn.Status.DeepCopy()
	if len(plan.Namespaces[nn.Name]) == 0 {
		// No egress IPs (any more): the agents' holder records of removed IPs go with them.
		nn.Status.EgressIPs = nil
		meta.RemoveStatusCondition(&nn.Status.Conditions, networkv1.ConditionEgressIPsValid)
		meta.RemoveStatusCondition(&nn.Status.Conditions, networkv1.ConditionEgressIPsAssigned)
		if len(nn.Status.Conditions) == 0 {
			nn.Status.Conditions = nil
		}
		return nil
	}
	held := map[networkv1.EgressIP]networkv1.EgressIPStatus{}
	for _, e := range old.EgressIPs {
		held[e.IP] = e
	}
	var invalid, unplaced []string
	reasons := map[string]bool{}
	entries := make([]networkv1.EgressIPStatus, 0, len(plan.Namespaces[nn.Name]))
	for _, a := range plan.Namespaces[nn.Name] {
		ip := plan.IPs[a]
		prev := held[networkv1.EgressIP(a.String())]
		e := networkv1.EgressIPStatus{IP: networkv1.EgressIP(a.String()), Node: prev.Node}
		if !ip.Usable() {
			invalid = append(invalid, problemText(ip))
			reasons[ip.Reason] = true
		} else if e.AssignedNode = egressplan.Choose(a, ip.Eligible, c.nodeReady, prev.Node, prev.AssignedNode); e.AssignedNode == "" {
			unplaced = append(unplaced, fmt.Sprintf("%s (may be held by %s)", a, strings.Join(ip.Eligible, ", ")))
		}
		entries = append(entries, e)
	}
	nn.Status.EgressIPs = entries
	valid := metav1.Condition{Type: networkv1.ConditionEgressIPsValid, Status: metav1.ConditionTrue, Reason: "Valid",
		Message: "every egress IP may be held by some node"}
	if len(invalid) > 0 {
		keys := make([]string, 0, len(reasons))
		for r := range reasons {
			keys = append(keys, r)
		}
		sort.Strings(keys)
		valid.Status, valid.Reason = metav1.ConditionFalse, keys[0]
		valid.Message = strings.Join(invalid, "; ") + ": not used"
		if len(plan.Usable(nn.Name)) == 0 {
			valid.Message += "; with no usable egress IP left, the namespace's traffic leaving the cluster is dropped"
		}
	}
	assigned := metav1.Condition{Type: networkv1.ConditionEgressIPsAssigned, Status: metav1.ConditionTrue, Reason: "Assigned",
		Message: "every valid egress IP is placed on a Ready node"}
	if len(unplaced) > 0 {
		assigned.Status, assigned.Reason = metav1.ConditionFalse, networkv1.ReasonEgressIPNoReadyNode
		assigned.Message = "no Ready node may hold " + strings.Join(unplaced, "; ") + ": the namespace's connections leaving the cluster through it are dropped"
	}
	var problems []egressProblem
	for _, cond := range []metav1.Condition{valid, assigned} {
		was := meta.FindStatusCondition(old.Conditions, cond.Type)
		if cond.Status == metav1.ConditionFalse && (was == nil || was.Status != metav1.ConditionFalse || was.Message != cond.Message) {
			problems = append(problems, egressProblem{reason: "EgressIP" + cond.Reason, message: cond.Message})
		}
		meta.SetStatusCondition(&nn.Status.Conditions, cond)
	}
	return problems
}

// syncEgressPolicies writes every EgressNetworkPolicy's Valid condition: more than one in a namespace
// (none is enforced, the namespace's traffic leaving the cluster is dropped, as openshift-sdn did), a
// rule that does not parse (likewise), or accepted.
func (c *Controller) syncEgressPolicies(ctx context.Context) error {
	policies, err := c.egressPolicies.List(labels.Everything())
	if err != nil {
		return err
	}
	byNamespace := map[string][]string{}
	for _, p := range policies {
		byNamespace[p.Namespace] = append(byNamespace[p.Namespace], p.Name)
	}
	var errs []error
	for _, p := range policies {
		cond := metav1.Condition{Type: networkv1.ConditionValid, Status: metav1.ConditionTrue, Reason: networkv1.ReasonEgressPolicyAccepted,
			Message: "enforced on every node for the namespace's pods", ObservedGeneration: p.Generation}
		if others := byNamespace[p.Namespace]; len(others) > 1 {
			slices.Sort(others)
			cond.Status, cond.Reason = metav1.ConditionFalse, networkv1.ReasonEgressPolicyConflict
			cond.Message = fmt.Sprintf("namespace %s has %d EgressNetworkPolicies (%s): none is enforced and the namespace's traffic leaving the cluster is dropped until one is left",
				p.Namespace, len(others), strings.Join(others, ", "))
		} else if _, perr := egressplan.ParsePolicy(p.Spec); perr != nil {
			cond.Status, cond.Reason = metav1.ConditionFalse, networkv1.ReasonEgressPolicyInvalid
			cond.Message = perr.Error() + ": the namespace's traffic leaving the cluster is dropped until it is fixed"
		}
		upd := p.DeepCopy()
		was := meta.FindStatusCondition(p.Status.Conditions, networkv1.ConditionValid)
		meta.SetStatusCondition(&upd.Status.Conditions, cond)
		upd.Status.ObservedGeneration = p.Generation
		if reflect.DeepEqual(upd.Status, p.Status) {
			continue
		}
		if cond.Status == metav1.ConditionFalse && (was == nil || was.Status != metav1.ConditionFalse || was.Message != cond.Message) {
			c.recorder.Eventf(p, corev1.EventTypeWarning, cond.Reason, "%s", cond.Message)
			c.log.Info("EgressNetworkPolicy not enforced", "policy", p.Namespace+"/"+p.Name, "reason", cond.Reason, "message", cond.Message)
		}
		if _, err := c.net.NetworkV1().EgressNetworkPolicies(p.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("update EgressNetworkPolicy %s/%s status: %w", p.Namespace, p.Name, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("egress policies: %w", errors.Join(errs...))
	}
	return nil
}
