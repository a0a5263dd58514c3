package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/ofsdn/ofsdn/agent/ipam"
	"github.com/ofsdn/ofsdn/agent/podnet"
	"github.com/ofsdn/ofsdn/cni"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/ovsdb"
	"k8s.io/klog/v2"
)

// External IDs ofsdn writes on a pod's OVS port: a restarted agent rebuilds its pods from them.
const (
	extPodNamespace = "ofsdn/pod-namespace"
	extPodName      = "ofsdn/pod-name"
	extSandbox      = "ofsdn/sandbox"
	extIfName       = "ofsdn/ifname"
	extIP           = "ofsdn/ip"
	extMAC          = "ofsdn/mac"
)

// portDB is what the agent needs from OVSDB (ovsdb.Client provides it).
type portDB interface {
	EnsureSystemPort(ctx context.Context, bridge, name string, externalIDs map[string]string) (int, error)
	DeletePort(ctx context.Context, bridge, name string) error
	ListPorts(ctx context.Context, bridge string) ([]ovsdb.PortInfo, error)
}

// podNetwork serves CNI requests: address, veth, OVS port, flows — and undoes them.
//
// Requests for different sandboxes run in parallel (a node starting 10 pods at once must not queue
// them behind each other's veth and OVSDB round trips); only the address store is shared, and flow
// syncs coalesce in flowSync. GC and restore, which sweep every attachment, run alone.
type podNetwork struct {
	sweep     sync.RWMutex // ADD/DEL/CHECK hold it shared, GC and restore exclusively
	sandboxes keyedMutex   // one request per sandbox at a time
	mu        sync.Mutex   // guards store (the pointer: the subnet may change)
	view      *nodeView
	sync      *flowSync
	db        portDB
	bridge    string
	hostNetNS string
	netdev    bool // userspace datapath: pods need TX checksum offload off
	mtu       int
	stateDir  string
	store     *ipam.Store
	log       klog.Logger
}

// ipamFor opens (or reopens, after the node's subnet changed) the address store.
func (p *podNetwork) ipamFor(subnet netip.Prefix) (*ipam.Store, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.store != nil && p.store.Subnet() == subnet {
		return p.store, nil
	}
	s, dropped, err := ipam.Open(p.stateDir, subnet)
	if err != nil {
		return nil, err
	}
	for _, d := range dropped {
		p.log.Info("dropped an address reservation", "reservation", d)
	}
	p.store = s
	return s, nil
}

func (p *podNetwork) netconf(req *cni.Request) (*cni.NetConf, error) {
	conf := &cni.NetConf{}
	if err := json.Unmarshal(req.Config, conf); err != nil {
		return nil, cni.Errorf(cni.ErrDecoding, "malformed network configuration: %v", err)
	}
	return conf, nil
}

// Add implements cni.Handler.
func (p *podNetwork) Add(ctx context.Context, req *cni.Request) (*current.Result, error) {
	if req.Netns == "" || req.IfName == "" || req.ContainerID == "" {
		return nil, cni.Errorf(cni.ErrInvalidEnv, "ADD needs CNI_CONTAINERID, CNI_NETNS and CNI_IFNAME")
	}
	conf, err := p.netconf(req)
	if err != nil {
		return nil, err
	}
	if err := p.view.ready(); err != nil {
		return nil, cni.Errorf(cni.ErrTryAgainLater, "ofsdn agent not ready on this node: %v", err)
	}
	start := time.Now()
	p.sweep.RLock()
	defer p.sweep.RUnlock()
	defer p.sandboxes.lock(req.ContainerID)()
	p.view.mu.Lock()
	subnet, clusterNets := p.view.localSubnet, append([]netip.Prefix(nil), p.view.clusterNets...)
	p.view.mu.Unlock()
	store, err := p.ipamFor(subnet)
	if err != nil {
		return nil, cni.Errorf(cni.ErrIO, "ofsdn agent: address store: %v", err)
	}
	ip, err := store.Allocate(ipam.Allocation{ContainerID: req.ContainerID, IfName: req.IfName,
		PodNamespace: req.PodNamespace(), PodName: req.PodName()})
	if err != nil {
		if errors.Is(err, ipam.ErrExhausted) {
			return nil, cni.Errorf(cni.ErrTryAgainLater, "%v", err)
		}
		return nil, cni.Errorf(cni.ErrIO, "%v", err)
	}
	allocated := time.Now()
	ok := false
	hostVeth := podnet.HostVethName(req.ContainerID, req.IfName)
	defer func() {
		if !ok {
			p.undo(context.WithoutCancel(ctx), req.ContainerID, req.IfName, hostVeth, podKey(req.PodNamespace(), req.PodName()))
		}
	}()
	mtu := p.mtu
	if conf.MTU > 0 {
		mtu = conf.MTU
	}
	gw := ipamGateway(subnet)
	mac, err := podnet.Setup(podnet.Config{NetNS: req.Netns, HostNetNS: p.hostNetNS, IfName: req.IfName, HostVeth: hostVeth,
		IP: netip.PrefixFrom(ip, subnet.Bits()), Gateway: gw, ClusterNetworks: clusterNets, MTU: mtu, TxChecksumOff: p.netdev})
	if err != nil {
		if errors.Is(err, podnet.ErrNetNSGone) {
			return nil, cni.Errorf(cni.ErrInvalidEnv, "%v", err)
		}
		return nil, cni.Errorf(cni.ErrInternal, "%v", err)
	}
	wired := time.Now()
	ofport, err := p.db.EnsureSystemPort(ctx, p.bridge, hostVeth, map[string]string{
		extPodNamespace: req.PodNamespace(), extPodName: req.PodName(), extSandbox: req.ContainerID,
		extIfName: req.IfName, extIP: ip.String(), extMAC: mac.String()})
	if err != nil {
		return nil, cni.Errorf(cni.ErrInternal, "attach %s to %s: %v", hostVeth, p.bridge, err)
	}
	attached := time.Now()
	gen := p.view.update(func(v *nodeView) {
		v.pods[podKey(req.PodNamespace(), req.PodName())] = localPod{Namespace: req.PodNamespace(), Name: req.PodName(),
			SandboxID: req.ContainerID, IP: ip, MAC: mac, OFPort: uint32(ofport), HostVeth: hostVeth}
	})
	if _, err := p.sync.syncThrough(ctx, gen, pipeline.PodOwner(req.PodNamespace(), req.PodName())); err != nil {
		return nil, cni.Errorf(cni.ErrTryAgainLater, "install flows for %s/%s: %v", req.PodNamespace(), req.PodName(), err)
	}
	ok = true
	// Where an ADD's time went, for whoever chases CNI latency.
	p.log.V(2).Info("pod attached", "pod", podKey(req.PodNamespace(), req.PodName()), "ip", ip, "ofport", ofport,
		"total", time.Since(start), "ipam", allocated.Sub(start), "veth", wired.Sub(allocated), "ovsdb", attached.Sub(wired), "flows", time.Since(attached))
	return p.result(req, hostVeth, mac, ip, subnet, gw, clusterNets, mtu), nil
}

func (p *podNetwork) currentStore() *ipam.Store {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.store
}

// keyedMutex serialises work per key (a sandbox) and forgets keys nobody holds.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

type keyedLock struct {
	sync.Mutex
	users int
}

// lock takes key's lock and returns its unlock.
func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyedLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyedLock{}
		k.locks[key] = l
	}
	l.users++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

func ipamGateway(subnet netip.Prefix) netip.Addr { return subnet.Masked().Addr().Next() }

func (p *podNetwork) result(req *cni.Request, hostVeth string, mac net.HardwareAddr, ip netip.Addr, subnet netip.Prefix,
	gw netip.Addr, clusterNets []netip.Prefix, mtu int) *current.Result {
	podIf := 1
	res := &current.Result{CNIVersion: "1.1.0",
		Interfaces: []*current.Interface{{Name: hostVeth}, {Name: req.IfName, Mac: mac.String(), Sandbox: req.Netns, Mtu: mtu}},
		IPs: []*current.IPConfig{{Interface: &podIf, Address: net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(subnet.Bits(), 32)},
			Gateway: gw.AsSlice()}},
	}
	for _, cn := range clusterNets {
		res.Routes = append(res.Routes, &types.Route{Dst: net.IPNet{IP: cn.Addr().AsSlice(), Mask: net.CIDRMask(cn.Bits(), 32)}})
	}
	res.Routes = append(res.Routes, &types.Route{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, GW: gw.AsSlice()})
	return res
}

// undo releases whatever an ADD or a DEL finds: each step tolerates what is already gone.
func (p *podNetwork) undo(ctx context.Context, containerID, ifName, hostVeth, key string) error {
	var errs []error
	gen := p.view.update(func(v *nodeView) {
		if pod, ok := v.pods[key]; ok && pod.SandboxID == containerID {
			delete(v.pods, key)
		}
	})
	if _, err := p.sync.syncThrough(ctx, gen); err != nil && p.view.ready() == nil {
		errs = append(errs, fmt.Errorf("remove flows: %w", err))
	}
	if err := p.db.DeletePort(ctx, p.bridge, hostVeth); err != nil {
		errs = append(errs, err)
	}
	if err := podnet.Teardown(p.hostNetNS, hostVeth); err != nil {
		errs = append(errs, err)
	}
	if store := p.currentStore(); store != nil {
		if _, err := store.Release(containerID, ifName); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Del implements cni.Handler: idempotent, and it succeeds when the netns is gone or the pod was never
// added.
func (p *podNetwork) Del(ctx context.Context, req *cni.Request) error {
	if req.ContainerID == "" {
		return cni.Errorf(cni.ErrInvalidEnv, "DEL needs CNI_CONTAINERID")
	}
	ifName := req.IfName
	if ifName == "" {
		ifName = "eth0"
	}
	p.sweep.RLock()
	defer p.sweep.RUnlock()
	defer p.sandboxes.lock(req.ContainerID)()
	key := podKey(req.PodNamespace(), req.PodName())
	if store := p.currentStore(); store != nil {
		if a, ok := store.Lookup(req.ContainerID, ifName); ok {
			key = podKey(a.PodNamespace, a.PodName)
		}
	}
	if err := p.undo(ctx, req.ContainerID, ifName, podnet.HostVethName(req.ContainerID, ifName), key); err != nil {
		return cni.Errorf(cni.ErrTryAgainLater, "DEL %s: %v", req.ContainerID, err)
	}
	return nil
}

// Check implements cni.Handler.
func (p *podNetwork) Check(ctx context.Context, req *cni.Request) error {
	p.sweep.RLock()
	defer p.sweep.RUnlock()
	defer p.sandboxes.lock(req.ContainerID)()
	store := p.currentStore()
	if store == nil {
		return cni.Errorf(cni.ErrUnknownContainer, "no address allocated for %s", req.ContainerID)
	}
	a, ok := store.Lookup(req.ContainerID, req.IfName)
	if !ok {
		return cni.Errorf(cni.ErrUnknownContainer, "no address allocated for %s/%s", req.ContainerID, req.IfName)
	}
	hostVeth := podnet.HostVethName(req.ContainerID, req.IfName)
	if err := podnet.Check(podnet.Config{NetNS: req.Netns, HostNetNS: p.hostNetNS, IfName: req.IfName, HostVeth: hostVeth,
		IP: netip.PrefixFrom(a.IP, store.Subnet().Bits())}); err != nil {
		return cni.Errorf(cni.ErrInternal, "%v", err)
	}
	ports, err := p.db.ListPorts(ctx, p.bridge)
	if err != nil {
		return cni.Errorf(cni.ErrTryAgainLater, "%v", err)
	}
	for _, port := range ports {
		if port.Name == hostVeth && port.OFPort > 0 {
			return nil
		}
	}
	return cni.Errorf(cni.ErrInternal, "%s is not attached to %s", hostVeth, p.bridge)
}

// Status implements cni.Handler.
func (p *podNetwork) Status(context.Context) error { return p.view.ready() }

// GC implements cni.Handler: everything of attachments the runtime no longer lists goes.
func (p *podNetwork) GC(ctx context.Context, valid []cni.Attachment) error {
	p.sweep.Lock()
	defer p.sweep.Unlock()
	store := p.currentStore()
	if store == nil {
		return nil
	}
	keep := map[cni.Attachment]bool{}
	for _, v := range valid {
		keep[v] = true
	}
	var errs []error
	for _, a := range store.List() {
		if keep[cni.Attachment{ContainerID: a.ContainerID, IfName: a.IfName}] {
			continue
		}
		p.log.Info("GC: releasing a stale attachment", "containerID", a.ContainerID, "pod", podKey(a.PodNamespace, a.PodName), "ip", a.IP)
		if err := p.undo(ctx, a.ContainerID, a.IfName, podnet.HostVethName(a.ContainerID, a.IfName), podKey(a.PodNamespace, a.PodName)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// restore rebuilds the local pods after a (re)start: a port with ofsdn's external IDs, a live
// interface and an address reservation is a pod; a port whose interface vanished (its netns is gone)
// or that has no reservation is stale and removed; a reservation without a port (a crash between
// the two) is released.
func (p *podNetwork) restore(ctx context.Context) error {
	p.sweep.Lock()
	defer p.sweep.Unlock()
	p.view.mu.Lock()
	subnet := p.view.localSubnet
	p.view.mu.Unlock()
	store, err := p.ipamFor(subnet)
	if err != nil {
		return err
	}
	ports, err := p.db.ListPorts(ctx, p.bridge)
	if err != nil {
		return err
	}
	attached := map[string]bool{}
	for _, port := range ports {
		sandbox, ifName := port.ExternalIDs[extSandbox], port.ExternalIDs[extIfName]
		if sandbox == "" {
			continue
		}
		a, reserved := store.Lookup(sandbox, ifName)
		mac, merr := net.ParseMAC(port.ExternalIDs[extMAC])
		if !reserved || port.OFPort <= 0 || port.Error != "" || merr != nil {
			p.log.Info("removing a stale pod port", "port", port.Name, "sandbox", sandbox, "reserved", reserved, "ofport", port.OFPort, "error", port.Error)
			if err := p.db.DeletePort(ctx, p.bridge, port.Name); err != nil {
				return err
			}
			_ = podnet.Teardown(p.hostNetNS, port.Name)
			if reserved {
				if _, err := store.Release(sandbox, ifName); err != nil {
					return err
				}
			}
			continue
		}
		attached[sandbox+"/"+ifName] = true
		p.view.update(func(v *nodeView) {
			v.pods[podKey(a.PodNamespace, a.PodName)] = localPod{Namespace: a.PodNamespace, Name: a.PodName, SandboxID: sandbox,
				IP: a.IP, MAC: mac, OFPort: uint32(port.OFPort), HostVeth: port.Name}
		})
	}
	for _, a := range store.List() {
		if !attached[a.ContainerID+"/"+a.IfName] {
			p.log.Info("releasing an address whose pod has no port", "ip", a.IP, "sandbox", a.ContainerID)
			if _, err := store.Release(a.ContainerID, a.IfName); err != nil {
				return err
			}
		}
	}
	return nil
}
