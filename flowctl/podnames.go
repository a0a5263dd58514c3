package flowctl

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// podNames names the far end of a drop. A node's agent names only the pods it hosts, so a drop of a
// connection between nodes reads "10.128.0.2 → blue/web" on the node that dropped it; flowctl (the
// drops command and the console) names such a cluster-network address from the API server's pods:
// one list, kept, and listed again when an address of the cluster network is not in it (a pod newer
// than the list), at most once per podNamesRelist. The list again runs beside the stream, never in
// its way: the drop that missed keeps its address, and the ones after it get the name.
//
// A hostNetwork pod has its node's address, not a pod's, and finished pods (Succeeded, Failed) give
// theirs back to be reused: neither names an address. An address two pods claim (a list taken while
// one replaced the other) stays an address rather than be named wrong. Drops on a Network (its own
// address space, overlapping the cluster network's, tables 130-145 and its VNI at 10) are left as the
// agent wrote them.
type podNames struct {
	// list reads the pods and the cluster network's CIDRs (none: every address is looked up).
	list func(ctx context.Context) ([]corev1.Pod, []netip.Prefix, error)
	// every bounds how often a miss lists again; timeout bounds one list.
	every, timeout time.Duration
	now            func() time.Time
	// warn is told a list's failure (once per list, so at most once per every; never two at once).
	warn func(error)

	mu      sync.Mutex
	names   map[netip.Addr]string // "": claimed by two pods
	cluster []netip.Prefix
	listed  time.Time // when the last list began; zero: never
	listing bool
	// done, while a list runs, is closed when it ends (tests wait for it).
	done chan struct{}
}

// podNamesRelist is how often a miss may list the pods again.
const podNamesRelist = 5 * time.Second

// newPodNames reads pods through kube and the ClusterNetwork through netc (nil: not read).
func newPodNames(kube kubernetes.Interface, netc networkclient.Interface, warn func(error)) *podNames {
	if warn == nil {
		warn = func(error) {}
	}
	return &podNames{every: podNamesRelist, timeout: 10 * time.Second, now: time.Now, warn: warn,
		list: func(ctx context.Context) ([]corev1.Pod, []netip.Prefix, error) {
			// ResourceVersion 0: the API server's cache answers, not etcd.
			pods, err := kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
			if err != nil {
				return nil, nil, fmt.Errorf("list pods: %w", err)
			}
			var cidrs []netip.Prefix
			if netc != nil {
				// Not readable (forbidden, absent): every address is looked up, still rate-limited.
				if cn, err := netc.NetworkV1().ClusterNetworks().Get(ctx, networkv1.ClusterNetworkName, metav1.GetOptions{}); err == nil {
					for _, c := range cn.Spec.ClusterCIDRs {
						if p, err := netip.ParsePrefix(string(c)); err == nil {
							cidrs = append(cidrs, p.Masked())
						}
					}
				}
			}
			return pods.Items, cidrs, nil
		}}
}

// prime lists the pods if they never were, and waits for it (the first batch of drops is named
// whole); later it does nothing.
func (n *podNames) prime(ctx context.Context) {
	if n == nil {
		return
	}
	n.mu.Lock()
	if !n.listed.IsZero() && !n.listing {
		n.mu.Unlock()
		return
	}
	done := n.startLocked()
	n.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// startLocked starts a list unless one runs; it returns the running list's done.
func (n *podNames) startLocked() chan struct{} {
	if n.listing {
		return n.done
	}
	n.listing, n.listed, n.done = true, n.now(), make(chan struct{})
	done := n.done
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), n.timeout)
		defer cancel()
		pods, cidrs, err := n.list(ctx)
		if err != nil {
			n.warn(err) // while listing: one warn at a time
		}
		n.mu.Lock()
		if err == nil {
			n.names, n.cluster = indexPods(pods), cidrs
		}
		n.listing = false
		n.mu.Unlock()
		close(done)
	}()
	return done
}

// indexPods maps each running pod's addresses to its namespace/name.
func indexPods(pods []corev1.Pod) map[netip.Addr]string {
	out := map[netip.Addr]string{}
	for i := range pods {
		p := &pods[i]
		if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ips := []string{p.Status.PodIP}
		for _, ip := range p.Status.PodIPs {
			ips = append(ips, ip.IP)
		}
		name := p.Namespace + "/" + p.Name
		for _, s := range ips {
			a, err := netip.ParseAddr(s)
			if err != nil {
				continue
			}
			if have, ok := out[a]; ok && have != name {
				out[a] = "" // two pods: name neither
				continue
			}
			out[a] = name
		}
	}
	return out
}

// name is the pod of a cluster-network address, if the last list knows one (and only one). A miss in
// the cluster network starts a list, unless one began within every.
func (n *podNames) name(a netip.Addr) (string, bool) {
	if n == nil || !a.IsValid() {
		return "", false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if name := n.names[a]; name != "" {
		return name, true
	} // a miss, or two pods: a list may know better
	if len(n.cluster) > 0 && !inNets(a, n.cluster) {
		return "", false
	}
	if !n.listing && (n.listed.IsZero() || n.now().Sub(n.listed) >= n.every) {
		n.startLocked()
	}
	return "", false
}

// enrich names a drop's ends that its node gave as cluster-network addresses.
func (n *podNames) enrich(d *debugapi.Drop) {
	if n == nil {
		return
	}
	if d.Cause == string(pipeline.CauseNetworkVNI) || d.Cause == string(pipeline.CauseNetworkIsolation) ||
		(d.TableID >= uint8(pipeline.TableNetCrossTalk) && d.TableID <= uint8(pipeline.TableNetOutput)) {
		return // a Network's addresses are its own
	}
	for _, end := range []struct {
		name *string
		ip   netip.Addr
	}{{&d.Src, d.SrcIP}, {&d.Dst, d.DstIP}} {
		if strings.Contains(*end.name, "/") || !end.ip.IsValid() || *end.name != end.ip.String() {
			continue // named by its node, or not an address the name says
		}
		if name, ok := n.name(end.ip); ok {
			*end.name = name
		}
	}
}
