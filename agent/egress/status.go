package egress

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	networklisters "github.com/ofsdn/ofsdn/client/listers/network/v1"
	"github.com/ofsdn/ofsdn/internal/loop"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
)

// StatusWriter records in each NetNamespace's status which of its egress IPs this node holds
// (status.egressIPs[].node), after the claim was carried out, and takes its name off those it let go.
// It writes only its own node's name; a conflicting write (the controller, another holder) is retried
// on the object as the API holds it.
type StatusWriter struct {
	node   string
	client networkclient.Interface
	lister networklisters.NetNamespaceLister
	log    klog.Logger
	loop   *loop.Loop

	mu      sync.Mutex
	held    []netip.Addr
	started bool // Held was called: until then this node's records are left as they are
}

// NewStatusWriter makes the writer; Run starts it.
func NewStatusWriter(node string, client networkclient.Interface, lister networklisters.NetNamespaceLister, log klog.Logger) *StatusWriter {
	w := &StatusWriter{node: node, client: client, lister: lister, log: log.WithName("egress-status")}
	w.loop = loop.New(loop.Config{Name: "egress-status", Period: time.Minute, Log: w.log, BackoffMin: 100 * time.Millisecond, BackoffMax: 10 * time.Second}, w.pass)
	return w
}

// Held tells the writer what the node holds now.
func (w *StatusWriter) Held(held []netip.Addr) {
	w.mu.Lock()
	w.held, w.started = slices.Clone(held), true
	w.mu.Unlock()
	w.loop.Kick()
}

// Kick asks for a pass (the NetNamespaces changed).
func (w *StatusWriter) Kick() { w.loop.Kick() }

// Run writes until ctx ends.
func (w *StatusWriter) Run(ctx context.Context) { w.loop.Run(ctx) }

func (w *StatusWriter) pass(ctx context.Context) (time.Duration, error) {
	w.mu.Lock()
	held, started := slices.Clone(w.held), w.started
	w.mu.Unlock()
	if !started {
		return 0, nil
	}
	nns, err := w.lister.List(labels.Everything())
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, nn := range nns {
		if upd, ok := withHolder(nn, w.node, held); ok {
			if err := w.write(ctx, upd); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return 0, errors.Join(errs...)
}

// write updates the status, re-reading the object once on a conflict.
func (w *StatusWriter) write(ctx context.Context, upd *networkv1.NetNamespace) error {
	_, err := w.client.NetworkV1().NetNamespaces().UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		cur, gerr := w.client.NetworkV1().NetNamespaces().Get(ctx, upd.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		w.mu.Lock()
		held := slices.Clone(w.held)
		w.mu.Unlock()
		again, ok := withHolder(cur, w.node, held)
		if !ok {
			return nil
		}
		_, err = w.client.NetworkV1().NetNamespaces().UpdateStatus(ctx, again, metav1.UpdateOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("egress: record the holder in NetNamespace %s: %w", upd.Name, err)
	}
	w.log.V(2).Info("recorded egress IP holders", "namespace", upd.Name, "held", held(upd, w.node))
	return nil
}

func held(nn *networkv1.NetNamespace, node string) []networkv1.EgressIP {
	var out []networkv1.EgressIP
	for _, e := range nn.Status.EgressIPs {
		if e.Node == node {
			out = append(out, e.IP)
		}
	}
	return out
}

// withHolder returns nn with node recorded as the holder of the namespace's egress IPs it holds and
// taken off the others, and whether that changed anything.
func withHolder(nn *networkv1.NetNamespace, node string, holds []netip.Addr) (*networkv1.NetNamespace, bool) {
	mine := map[networkv1.EgressIP]bool{}
	for _, a := range holds {
		mine[networkv1.EgressIP(a.String())] = true
	}
	// The statuses are edited on a copy of their own; the object is copied only when they changed (a
	// pass looks at every NetNamespace, and most need nothing).
	statuses := slices.Clone(nn.Status.EgressIPs)
	changed := false
	have := map[networkv1.EgressIP]bool{}
	for i := range statuses {
		e := &statuses[i]
		have[e.IP] = true
		switch {
		case mine[e.IP] && e.Node != node:
			e.Node, changed = node, true
		case !mine[e.IP] && e.Node == node:
			e.Node, changed = "", true
		}
	}
	for _, a := range nn.EgressIPs {
		if mine[a] && !have[a] {
			statuses = append(statuses, networkv1.EgressIPStatus{IP: a, Node: node})
			changed = true
		}
	}
	if !changed {
		return nn, false
	}
	upd := nn.DeepCopy()
	upd.Status.EgressIPs = statuses
	return upd, true
}
