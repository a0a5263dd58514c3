package networks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	"github.com/ofsdn/ofsdn/internal/loop"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// ClusterNetworkName is the cluster network's name in a pod's network-status: the conflist's.
const ClusterNetworkName = "ofsdn"

// ReportView is what the Reporter reads of the node.
type ReportView interface {
	// AttachmentCounts counts the attached pod interfaces per Network this node has a subnet of.
	AttachmentCounts() map[string]int64
	// PodNetworkStatuses are the network-status of each local pod with a Network interface (by
	// namespace/name): its eth0 first, then its Network interfaces by name.
	PodNetworkStatuses() map[string][]nadv1.NetworkStatus
}

// Reporter writes what the node did back to the API server: each of its NetworkSubnets' status.attachments
// (the controller waits for them to reach 0 before a deleted Network goes) and each attached pod's
// k8s.v1.cni.cncf.io/network-status annotation (pods with a Network interface only: a pod on the
// cluster network alone costs no write). It writes only what changed since it last wrote, retries
// failures with back-off, and forgets pods that went.
type Reporter struct {
	node string
	net  networkclient.Interface
	kube kubernetes.Interface
	view ReportView
	log  klog.Logger
	loop *loop.Loop

	mu       sync.Mutex
	counts   map[string]int64  // NetworkSubnet name → attachments written
	statuses map[string]string // pod key → annotation written
}

// reportPeriod bounds how long a write lost to a conflict or an API server outage waits.
const reportPeriod = 30 * time.Second

// NewReporter makes a node's reporter; Run runs it.
func NewReporter(node string, net networkclient.Interface, kube kubernetes.Interface, view ReportView, log klog.Logger) *Reporter {
	r := &Reporter{node: node, net: net, kube: kube, view: view, log: log.WithName("networks"), counts: map[string]int64{}, statuses: map[string]string{}}
	r.loop = loop.New(loop.Config{Name: "network-report", Period: reportPeriod, Log: r.log}, r.pass)
	return r
}

// Kick asks for a pass soon: pods attached or detached.
func (r *Reporter) Kick() {
	if r != nil {
		r.loop.Kick()
	}
}

// Run reports until ctx ends.
func (r *Reporter) Run(ctx context.Context) { r.loop.Run(ctx) }

func (r *Reporter) pass(ctx context.Context) (time.Duration, error) {
	return 0, errors.Join(r.reportCounts(ctx), r.reportStatuses(ctx))
}

func (r *Reporter) reportCounts(ctx context.Context) error {
	var errs []error
	for network, n := range r.view.AttachmentCounts() {
		name := networkv1.NetworkSubnetName(network, r.node)
		r.mu.Lock()
		written, ok := r.counts[name]
		r.mu.Unlock()
		if ok && written == n {
			continue
		}
		patch := fmt.Appendf(nil, `{"status":{"attachments":%d}}`, n)
		_, err := r.net.NetworkV1().NetworkSubnets().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
		switch {
		case apierrors.IsNotFound(err):
			continue // not (or no longer) there: nothing to report on
		case err != nil:
			errs = append(errs, fmt.Errorf("NetworkSubnet %s status: %w", name, err))
			continue
		}
		r.mu.Lock()
		r.counts[name] = n
		r.mu.Unlock()
	}
	return errors.Join(errs...)
}

func (r *Reporter) reportStatuses(ctx context.Context) error {
	want := r.view.PodNetworkStatuses()
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(want)) {
		b, err := json.Marshal(want[key])
		if err != nil {
			return err
		}
		r.mu.Lock()
		done := r.statuses[key] == string(b)
		r.mu.Unlock()
		if done {
			continue
		}
		ns, name, _ := strings.Cut(key, "/")
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{nadv1.NetworkStatusAnnot: string(b)}}})
		_, err = r.kube.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("pod %s network-status: %w", key, err))
			continue
		}
		r.mu.Lock()
		r.statuses[key] = string(b)
		r.mu.Unlock()
	}
	r.mu.Lock()
	for key := range r.statuses {
		if _, ok := want[key]; !ok {
			delete(r.statuses, key) // gone: a new pod of that name starts from nothing
		}
	}
	r.mu.Unlock()
	return errors.Join(errs...)
}
