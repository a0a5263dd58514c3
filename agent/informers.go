package agent

import (
	"fmt"
	"net/netip"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// watchNetwork feeds the node view from ofsdn's own objects. Every handler only edits plain data and
// triggers a sync; rendering and OpenFlow happen in flowSync.
type watchNetwork struct {
	view *nodeView
	sync *flowSync
	log  klog.Logger
	// newPeer, when set, is told of each remote node address as it appears (tunnel neighbour warm-up).
	newPeer func(netip.Addr)
	// uplink, when set, is asked to look again when the encapsulation or the peers change.
	uplink interface{ Kick() }
}

func (w *watchNetwork) kickUplink() {
	if w.uplink != nil {
		w.uplink.Kick()
	}
}

func (w *watchNetwork) clusterNetwork(obj any, deleted bool) {
	cn, ok := obj.(*networkv1.ClusterNetwork)
	if !ok || cn.Name != networkv1.ClusterNetworkName {
		return
	}
	if deleted {
		w.log.Info("ClusterNetwork deleted; keeping the last known configuration")
		return
	}
	var nets []netip.Prefix
	for _, c := range cn.Spec.ClusterCIDRs {
		p, err := netip.ParsePrefix(string(c))
		if err != nil {
			w.log.Error(err, "ClusterNetwork has a malformed CIDR; ignoring it", "cidr", c)
			continue
		}
		nets = append(nets, p.Masked())
	}
	mode := pipeline.Mode(cn.Spec.PluginMode)
	switch mode {
	case pipeline.ModeSubnet, pipeline.ModeMultitenant, pipeline.ModeNetworkPolicy:
	default:
		w.log.Error(fmt.Errorf("unknown pluginMode %q", cn.Spec.PluginMode), "treating the network as flat (subnet)")
		mode = pipeline.ModeSubnet
	}
	encap := pipeline.Encapsulation(cn.Spec.Encapsulation)
	switch encap {
	case pipeline.EncapVXLAN, pipeline.EncapNone:
	case "":
		encap = pipeline.EncapVXLAN // an object written before the field existed
	default:
		w.log.Error(fmt.Errorf("unknown encapsulation %q", cn.Spec.Encapsulation), "using vxlan")
		encap = pipeline.EncapVXLAN
	}
	tunnelPort := uint16(cn.Spec.VXLANPort)
	if cn.Spec.VXLANPort <= 0 || cn.Spec.VXLANPort > 65535 {
		tunnelPort = uint16(networkv1.DefaultVXLANPort)
	}
	var was pipeline.Mode
	var wasEncap pipeline.Encapsulation
	w.view.update(func(v *nodeView) {
		was, v.mode, v.clusterNets = v.mode, mode, nets
		wasEncap, v.encap = v.encap, encap
		v.tunnelPort = tunnelPort
	})
	if was != mode {
		w.log.Info("pluginMode", "mode", mode, "networkPolicyEnforced", mode == pipeline.ModeNetworkPolicy)
	}
	if wasEncap != encap {
		w.log.Info("encapsulation", "encapsulation", encap)
		w.kickUplink()
	}
	w.sync.Trigger()
}

func (w *watchNetwork) hostSubnet(obj any, deleted bool) {
	hs, ok := obj.(*networkv1.HostSubnet)
	if !ok {
		return
	}
	subnet, err1 := netip.ParsePrefix(string(hs.Subnet))
	ip, err2 := netip.ParseAddr(hs.HostIP)
	if !deleted && (err1 != nil || err2 != nil) {
		w.log.Error(fmt.Errorf("subnet %q, hostIP %q", hs.Subnet, hs.HostIP), "malformed HostSubnet ignored", "hostsubnet", hs.Name)
		return
	}
	w.view.update(func(v *nodeView) {
		if hs.Host == v.nodeName {
			if deleted {
				w.log.Info("this node's HostSubnet was deleted; keeping the current one until a new one arrives")
				return
			}
			v.localSubnet, v.nodeIP = subnet.Masked(), ip
			return
		}
		if deleted {
			delete(v.remote, hs.Host)
			return
		}
		if prev, ok := v.remote[hs.Host]; (!ok || prev.NodeIP != ip) && w.newPeer != nil {
			go w.newPeer(ip)
		}
		v.remote[hs.Host] = pipeline.RemoteNode{Name: hs.Host, NodeIP: ip, Subnet: subnet.Masked()}
	})
	w.kickUplink() // a new or moved peer: is it on the segment?
	w.sync.Trigger()
}

func (w *watchNetwork) netNamespace(obj any, deleted bool) {
	nn, ok := obj.(*networkv1.NetNamespace)
	if !ok {
		return
	}
	w.view.update(func(v *nodeView) {
		if deleted {
			delete(v.vnids, nn.NetName)
			return
		}
		v.vnids[nn.NetName] = nn.NetID
	})
	w.sync.Trigger()
}

// watchRemotePods keeps the view's remote pods from the (cluster-wide) pod informer: the address, node
// and namespace of every pod of another node. Only multitenant mode with an uplink port renders them,
// so only then does a change ask for a sync.
type watchRemotePods struct {
	view *nodeView
	sync *flowSync
}

func (w *watchRemotePods) pod(obj any, deleted bool) {
	pod, ok := obj.(*k8sobj.Pod)
	if !ok {
		return
	}
	key := k8sobj.PodKey(pod.Namespace, pod.Name)
	var rp remotePod
	keep := !deleted && pod.NodeName != "" && pod.NodeName != w.view.nodeName && !pod.HostNetwork &&
		pod.Phase != corev1.PodSucceeded && pod.Phase != corev1.PodFailed && len(pod.IPs) > 0
	if keep {
		ip, err := netip.ParseAddr(pod.IPs[0])
		if keep = err == nil && ip.Is4(); keep {
			rp = remotePod{Node: pod.NodeName, Namespace: pod.Namespace, IP: ip}
		}
	}
	changed, rendered := false, false
	w.view.update(func(v *nodeView) {
		prev, had := v.remotePods[key]
		switch {
		case keep && (!had || prev != rp):
			v.remotePods[key] = rp
			changed = true
		case !keep && had:
			delete(v.remotePods, key)
			changed = true
		}
		rendered = v.mode == pipeline.ModeMultitenant && v.uplink != ""
	})
	if changed && rendered {
		w.sync.Trigger()
	}
}
