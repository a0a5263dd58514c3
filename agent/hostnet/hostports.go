package hostnet

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/nodenet"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// Pods' hostPorts: kubelet leaves hostPort to the network plugin when a CNI plugin networks the pod.
// The agent's pod informer files each local pod's hostPorts in its view (WatchHostPorts); each host
// sync resolves which pod holds each port (ResolveHostPorts) into nodenet's forwards, and
// HostPortConflicts tells each pod that did not get its port, once.

// HostPortPod is what the agent keeps of a local pod that publishes hostPorts.
type HostPortPod struct {
	Created time.Time
	Ports   []corev1.ContainerPort // those with a hostPort
}

// HostPortView is the agent's view as WatchHostPorts uses it.
type HostPortView interface {
	// Name is the node's name.
	Name() string
	// SetHostPorts files the hostPorts of the pod under key (nil: it publishes none) and says whether
	// that changed what the view held.
	SetHostPorts(key string, p *HostPortPod) (changed bool)
}

// WatchHostPorts follows the pods bound to this node for their hostPorts.
type WatchHostPorts struct {
	View HostPortView
	Sync k8sobj.Sync
}

// Handlers are the (cluster-wide) pod informer's handlers.
func (w *WatchHostPorts) Handlers() cache.ResourceEventHandlerFuncs { return k8sobj.Handlers(w.pod) }

func (w *WatchHostPorts) pod(obj any, deleted bool) {
	pod, ok := obj.(*k8sobj.Pod)
	if !ok {
		return
	}
	var p *HostPortPod
	// The informer holds every pod of the cluster: only this node's publish hostPorts here.
	if !deleted && pod.NodeName == w.View.Name() && pod.Phase != corev1.PodSucceeded && pod.Phase != corev1.PodFailed && !pod.HostNetwork {
		for _, port := range pod.Ports {
			if port.HostPort > 0 {
				if p == nil {
					p = &HostPortPod{Created: pod.CreationTimestamp.Time}
				}
				p.Ports = append(p.Ports, port)
			}
		}
	}
	if w.View.SetHostPorts(k8sobj.PodKey(pod.Namespace, pod.Name), p) {
		w.Sync.Trigger()
	}
}

// HostPortConflict is a hostPort a pod asked for that an older pod holds.
type HostPortConflict struct {
	Pod, Holder string
	Port        corev1.ContainerPort
}

// ResolveHostPorts resolves the local pods' hostPorts: oldest pod first, so a port never changes hands
// while its holder lives; a later pod asking for a held port (same protocol and port, on an
// overlapping host IP) is reported, not given it. Pods not attached yet (podIP knows no address) wait.
func ResolveHostPorts(podIP func(key string) (netip.Addr, bool), hp map[string]HostPortPod) ([]nodenet.HostPort, []HostPortConflict) {
	keys := make([]string, 0, len(hp))
	for k := range hp {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(hp[a].Created.Compare(hp[b].Created), cmp.Compare(a, b)) })
	type claim struct {
		proto uint8
		port  uint16
	}
	holders := map[claim][]struct {
		ip  netip.Addr
		pod string
	}{}
	var out []nodenet.HostPort
	var conflicts []HostPortConflict
	for _, key := range keys {
		ip, attached := podIP(key)
		if !attached {
			continue
		}
		for _, p := range hp[key].Ports {
			proto, ok := k8sobj.ProtocolNumber(p.Protocol)
			if !ok || p.HostPort <= 0 || p.HostPort > 65535 || p.ContainerPort <= 0 || p.ContainerPort > 65535 {
				continue
			}
			hostIP, _ := netip.ParseAddr(p.HostIP)
			c := claim{proto, uint16(p.HostPort)}
			holder := ""
			for _, h := range holders[c] {
				if !h.ip.IsValid() || h.ip.IsUnspecified() || !hostIP.IsValid() || hostIP.IsUnspecified() || h.ip == hostIP {
					holder = h.pod
					break
				}
			}
			if holder != "" {
				if holder != key {
					conflicts = append(conflicts, HostPortConflict{Pod: key, Holder: holder, Port: p})
				}
				continue
			}
			holders[c] = append(holders[c], struct {
				ip  netip.Addr
				pod string
			}{hostIP, key})
			out = append(out, nodenet.HostPort{Protocol: proto, HostIP: hostIP, HostPort: uint16(p.HostPort), PodIP: ip,
				PodPort: uint16(p.ContainerPort), Pod: key})
		}
	}
	return out, conflicts
}

// HostPortConflicts tells each conflict once: a Warning Event (HostPortConflict) on the pod that did
// not get its port.
type HostPortConflicts struct {
	recorder record.EventRecorder // nil: only logged
	log      klog.Logger
	told     map[HostPortConflict]bool
}

// NewHostPortConflicts reports through recorder (nil: only logs).
func NewHostPortConflicts(recorder record.EventRecorder, log klog.Logger) *HostPortConflicts {
	return &HostPortConflicts{recorder: recorder, log: log}
}

// Report takes one host sync's conflicts and tells the new ones.
func (r *HostPortConflicts) Report(conflicts []HostPortConflict) {
	now := map[HostPortConflict]bool{}
	for _, c := range conflicts {
		now[c] = true
		if r.told[c] {
			continue
		}
		msg := fmt.Sprintf("hostPort %s/%d is held by pod %s on this node; this pod's port is not published", c.Port.Protocol, c.Port.HostPort, c.Holder)
		r.log.Info("hostPort conflict", "pod", c.Pod, "holder", c.Holder, "protocol", c.Port.Protocol, "hostPort", c.Port.HostPort)
		if r.recorder != nil {
			ns, name, _ := cache.SplitMetaNamespaceKey(c.Pod)
			ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: name}
			r.recorder.Event(ref, corev1.EventTypeWarning, "HostPortConflict", msg)
		}
	}
	r.told = now
}
