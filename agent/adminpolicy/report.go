package adminpolicy

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	cnp "github.com/ofsdn/ofsdn/apis/policy/v1beta1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// Report is one sync's word on each ClusterNetworkPolicy that selects a pod of this node: its
// problems (none: enforced as written).
type Report map[string][]Problem

// ReportInterval: a node tells a policy's standing again this often while it lasts, so the Event the
// controller reads outlives the API server's Event TTL (1 h by default).
const ReportInterval = 20 * time.Minute

// Reporter turns reports into Events on the policies: a Warning NotEnforced naming this node and every
// problem when the problems change (or again after ReportInterval), a Normal Enforced when a policy
// that had problems here has none. It runs on the flow loop; the recorder does not block.
type Reporter struct {
	node     string
	recorder record.EventRecorder // nil: log lines only
	log      klog.Logger
	clock    func() time.Time
	told     map[string]told
}

type told struct {
	message string // "" enforced
	at      time.Time
}

// NewReporter reports node's word through recorder; clock nil: time.Now.
func NewReporter(node string, recorder record.EventRecorder, log klog.Logger, clock func() time.Time) *Reporter {
	if clock == nil {
		clock = time.Now
	}
	return &Reporter{node: node, recorder: recorder, log: log, clock: clock}
}

// Report takes one sync's report and records the Events it calls for.
func (r *Reporter) Report(rep Report) {
	now := r.clock()
	next := make(map[string]told, len(rep))
	ref := func(name string) *corev1.ObjectReference {
		return &corev1.ObjectReference{Kind: cnp.Kind, APIVersion: cnp.Group + "/" + cnp.Version, Name: name}
	}
	for _, name := range slices.Sorted(maps.Keys(rep)) {
		msg := problemMessage(r.node, rep[name])
		prev, had := r.told[name]
		switch {
		case msg == "":
			next[name] = told{at: now}
			if had && prev.message != "" {
				r.log.Info("ClusterNetworkPolicy enforced as written", "policy", name)
				r.event(ref(name), corev1.EventTypeNormal, cnp.EventReasonEnforced, fmt.Sprintf("node %s enforces it as written", r.node))
			}
		case had && prev.message == msg && now.Sub(prev.at) < ReportInterval:
			next[name] = prev
		default:
			next[name] = told{message: msg, at: now}
			r.log.Info("ClusterNetworkPolicy not enforced as written", "policy", name, "problems", msg)
			r.event(ref(name), corev1.EventTypeWarning, cnp.EventReasonNotEnforced, msg)
		}
	}
	for name, prev := range r.told {
		if _, still := rep[name]; !still && prev.message != "" {
			r.event(ref(name), corev1.EventTypeNormal, cnp.EventReasonEnforced, fmt.Sprintf("node %s no longer has a pod it selects", r.node))
		}
	}
	r.told = next
}

func (r *Reporter) event(ref *corev1.ObjectReference, typ, reason, msg string) {
	if r.recorder != nil {
		r.recorder.Event(ref, typ, reason, msg)
	}
}

// problemMessage is the Event message for a node's problems ("" for none): "node N: reason: message;
// ...", problems sorted so that the same problems read the same.
func problemMessage(node string, ps []Problem) string {
	if len(ps) == 0 {
		return ""
	}
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Reason, b.Reason), cmp.Compare(a.Message, b.Message))
	})
	ps = slices.Compact(ps)
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = p.Reason + ": " + p.Message
	}
	return "node " + node + ": " + strings.Join(parts, "; ")
}
