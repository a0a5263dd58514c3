package attach

// A pod's interfaces on Networks (network.ofsdn.io): net1, net2, ... beside eth0, each a veth into br0
// with an address from this node's subnet of its Network (an address store per Network) and its own
// OVS port, recorded with the Network's name so restore knows it again.
//
// Two ways in, one result. The cluster network's ADD (eth0) attaches every Network the pod's
// k8s.v1.cni.cncf.io/networks annotation asks for, after checking all of them: the pod gets all its
// interfaces or none, and a request that cannot be served (a Network that does not admit the pod's
// namespace, a static address outside the node's subnet or taken, a missing NetworkAttachmentDefinition)
// fails the ADD with an error that says so. Or a meta-plugin (Multus) calls the plugin once per
// attachment with the NetworkAttachmentDefinition's config ("network": its Network) and
// CNI_IFNAME=netN: that call attaches the one interface, and answers an interface the eth0 ADD
// attached already with its result, unchanged. DEL of eth0 undoes the whole sandbox; DEL of netN, that
// interface.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/ofsdn/ofsdn/agent/ipam"
	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/networks"
	"github.com/ofsdn/ofsdn/agent/podnet"
	"github.com/ofsdn/ofsdn/cni"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// External IDs of a Network attachment's OVS port, besides the pod's (ExtPodNamespace...).
const (
	ExtNetwork     = "ofsdn/network"
	ExtNetworkCIDR = "ofsdn/network-cidr" // the address's prefix in the pod
	ExtNAD         = "ofsdn/nad"          // namespace/name of the NetworkAttachmentDefinition, when one named it
)

// NetAttachment is a pod's interface on a Network, as the view keeps it and its flows render it.
type NetAttachment struct {
	Namespace, Name string
	SandboxID       string
	IfName          string
	NetNS           string
	Network         string
	NAD             string
	IP              netip.Addr
	Prefix          netip.Prefix // the address with the Network's prefix length, as the pod has it
	MAC             net.HardwareAddr
	MTU             int // 0: not known (restored)
	OFPort          uint32
	HostVeth        string
}

// Key is the attachment's key in the view: namespace/name@ifname, its flows' owner's name.
func (a NetAttachment) Key() string { return NetAttachmentKey(a.Namespace, a.Name, a.IfName) }

// NetAttachmentKey is the key of a pod's interface on a Network.
func NetAttachmentKey(namespace, name, ifName string) string {
	return k8sobj.PodKey(namespace, name) + "@" + ifName
}

// Owner is the owner of its flows.
func (a NetAttachment) Owner() reconcile.Owner {
	return pipeline.AttachmentOwner(a.Namespace, a.Name, a.IfName)
}

// Networks is what attachments need to know of Networks: what a pod asks for, and where it may attach.
type Networks interface {
	// Requests resolves the pod's k8s.v1.cni.cncf.io/networks annotation.
	Requests(ctx context.Context, namespace, name string) ([]networks.Request, error)
	// Placement says how a pod of namespace attaches to network on this node, or why it cannot.
	Placement(network, namespace string) (networks.Placement, error)
}

// netPlan is one interface an ADD is about to attach: what was asked, where it goes.
type netPlan struct {
	req   networks.Request
	place networks.Placement
}

// planNetworks resolves and checks what the pod asks for, before anything is attached.
func (p *Handler) planNetworks(ctx context.Context, req *cni.Request) ([]netPlan, error) {
	if p.networks == nil {
		return nil, nil
	}
	reqs, err := p.networks.Requests(ctx, req.PodNamespace(), req.PodName())
	if err != nil {
		return nil, p.refuse(req, err)
	}
	plans := make([]netPlan, 0, len(reqs))
	for _, r := range reqs {
		pl, err := p.checkRequest(req, r)
		if err != nil {
			return nil, err
		}
		plans = append(plans, netPlan{req: r, place: pl})
	}
	return plans, nil
}

// checkRequest checks one requested interface against its Network's placement on this node.
func (p *Handler) checkRequest(req *cni.Request, r networks.Request) (networks.Placement, error) {
	pl, err := p.networks.Placement(r.Network, req.PodNamespace())
	if err != nil {
		return networks.Placement{}, p.refuse(req, fmt.Errorf("%s (%s): %w", r.Interface, describeRequest(r), err))
	}
	if r.IP.IsValid() && !pl.Subnet.Contains(r.IP) {
		where := "outside Network " + r.Network + " (" + pl.CIDR.String() + ")"
		if pl.CIDR.Contains(r.IP) {
			where = fmt.Sprintf("in Network %s but not in this node's subnet of it (%s): a static address must be in the subnet of the node the pod runs on",
				r.Network, pl.Subnet)
		}
		return networks.Placement{}, p.refuse(req, fmt.Errorf("%w: %s: static address %s is %s", networks.ErrBadRequest, r.Interface, r.IP, where))
	}
	return pl, nil
}

func describeRequest(r networks.Request) string {
	if r.NAD != "" {
		return "NetworkAttachmentDefinition " + r.NAD + ", Network " + r.Network
	}
	return "Network " + r.Network
}

// refuse turns why a pod's networks cannot be attached into its CNI error, and tells the pod (a
// Warning Event) so `kubectl describe pod` says it too.
func (p *Handler) refuse(req *cni.Request, err error) error {
	if p.warn != nil {
		p.warn(req.PodNamespace(), req.PodName(), "NetworkAttachmentRefused", err.Error())
	}
	code := cni.ErrInvalidConfig
	if errors.Is(err, networks.ErrUnavailable) {
		code = cni.ErrTryAgainLater // no VNI or subnet yet: the runtime retries
	}
	return cni.Errorf(code, "ofsdn: %v", err)
}

// netStore opens (or reopens, after the Network's subnet here changed) a Network's address store; an
// invalid subnet reopens it with the subnet it had (a Network gone from this node, releasing).
func (p *Handler) netStore(network string, subnet netip.Prefix) (*ipam.Store, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.netStores[network]; s != nil && (!subnet.IsValid() || s.Subnet() == subnet) {
		return s, nil
	}
	if p.networksDir == "" {
		return nil, errors.New("no directory for the Networks' address stores")
	}
	dir := filepath.Join(p.networksDir, network)
	var s *ipam.Store
	var dropped []string
	var err error
	if subnet.IsValid() {
		s, dropped, err = ipam.Open(dir, subnet)
	} else {
		s, dropped, err = ipam.OpenDir(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("network %s: address store: %w", network, err)
	}
	for _, d := range dropped {
		p.log.Info("dropped an address reservation", "network", network, "reservation", d)
	}
	if p.netStores == nil {
		p.netStores = map[string]*ipam.Store{}
	}
	p.netStores[network] = s
	return s, nil
}

// allNetStores opens the address store of every Network this node has attached pods to.
func (p *Handler) allNetStores() map[string]*ipam.Store {
	out := map[string]*ipam.Store{}
	if p.networksDir == "" {
		return out
	}
	entries, err := os.ReadDir(p.networksDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		p.log.Error(err, "listing the Networks' address stores")
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		s, err := p.netStore(e.Name(), netip.Prefix{})
		if err != nil {
			p.log.Error(err, "opening a Network's address store", "network", e.Name())
			continue
		}
		out[e.Name()] = s
	}
	return out
}

// attachNetwork attaches one interface of the sandbox to its Network: address, veth, OVS port, view.
// It installs no flows (the caller syncs every owner of the ADD at once) and undoes nothing: the
// caller's undo of the sandbox does.
func (p *Handler) attachNetwork(ctx context.Context, req *cni.Request, plan netPlan, mtu int) (NetAttachment, uint64, error) {
	r, pl := plan.req, plan.place
	store, err := p.netStore(pl.Network, pl.Subnet)
	if err != nil {
		return NetAttachment{}, 0, cni.Errorf(cni.ErrIO, "ofsdn agent: %v", err)
	}
	alloc := ipam.Allocation{ContainerID: req.ContainerID, IfName: r.Interface, PodNamespace: req.PodNamespace(), PodName: req.PodName()}
	ip := r.IP
	if ip.IsValid() {
		if err := store.AllocateIP(alloc, ip); err != nil {
			return NetAttachment{}, 0, p.refuse(req, fmt.Errorf("%w: %s (%s): %v", networks.ErrBadRequest, r.Interface, describeRequest(r), err))
		}
	} else if ip, err = store.Allocate(alloc); err != nil {
		if errors.Is(err, ipam.ErrExhausted) {
			return NetAttachment{}, 0, cni.Errorf(cni.ErrTryAgainLater, "network %s: %v", pl.Network, err)
		}
		return NetAttachment{}, 0, cni.Errorf(cni.ErrIO, "network %s: %v", pl.Network, err)
	}
	if pl.MTU > 0 && pl.MTU < mtu {
		mtu = pl.MTU // larger than the overlay carries: the cluster network's (the Network's Event says so)
	}
	hostVeth := podnet.HostVethName(req.ContainerID, r.Interface)
	if err := p.db.DeletePort(ctx, p.bridge, hostVeth); err != nil {
		return NetAttachment{}, 0, cni.Errorf(cni.ErrTryAgainLater, "remove the unfinished port %s: %v", hostVeth, err)
	}
	prefix := netip.PrefixFrom(ip, pl.CIDR.Bits())
	mac, err := podnet.Setup(podnet.Config{NetNS: req.Netns, HostNetNS: p.hostNetNS, ContainerID: req.ContainerID, IfName: r.Interface,
		HostVeth: hostVeth, IP: prefix, Routes: pl.Routes, RoutesVia: pl.Gateway, MAC: r.MAC, MTU: mtu, TxChecksumOff: p.netdev})
	if err != nil {
		return NetAttachment{}, 0, podnetError(req, r.Interface, err)
	}
	ofport, err := p.db.EnsureSystemPort(ctx, p.bridge, hostVeth, map[string]string{
		ExtPodNamespace: req.PodNamespace(), ExtPodName: req.PodName(), ExtPodUID: req.Args["K8S_POD_UID"], ExtSandbox: req.ContainerID,
		ExtIfName: r.Interface, ExtNetNS: req.Netns, ExtIP: ip.String(), ExtMAC: mac.String(), ExtAttached: time.Now().UTC().Format(time.RFC3339Nano),
		ExtNetwork: pl.Network, ExtNetworkCIDR: pl.CIDR.String(), ExtNAD: r.NAD})
	if err != nil {
		return NetAttachment{}, 0, cni.Errorf(cni.ErrInternal, "attach %s to %s: %v", hostVeth, p.bridge, err)
	}
	a := NetAttachment{Namespace: req.PodNamespace(), Name: req.PodName(), SandboxID: req.ContainerID, IfName: r.Interface, NetNS: req.Netns,
		Network: pl.Network, NAD: r.NAD, IP: ip, Prefix: prefix, MAC: mac, MTU: mtu, OFPort: uint32(ofport), HostVeth: hostVeth}
	return a, p.node.AttachNetwork(a), nil
}

// attachNetworks starts attaching every planned interface, each on a goroutine of its own, and returns
// the wait for them: the attachments in plan order, the view's generation holding all of them, and the
// first error (the caller's undo of the sandbox removes whatever was attached).
func (p *Handler) attachNetworks(ctx context.Context, req *cni.Request, plans []netPlan, mtu int) (wait func() ([]NetAttachment, uint64, error)) {
	atts := make([]NetAttachment, len(plans))
	gens := make([]uint64, len(plans))
	errs := make([]error, len(plans))
	var wg sync.WaitGroup
	for i, plan := range plans {
		wg.Go(func() { atts[i], gens[i], errs[i] = p.attachNetwork(ctx, req, plan, mtu) })
	}
	var once sync.Once
	return func() ([]NetAttachment, uint64, error) {
		once.Do(wg.Wait)
		for _, err := range errs {
			if err != nil {
				return nil, 0, err
			}
		}
		var gen uint64
		for _, g := range gens {
			gen = max(gen, g)
		}
		return atts, gen, nil
	}
}

// podnetError maps podnet's errors to CNI codes.
func podnetError(req *cni.Request, ifName string, err error) error {
	switch {
	case errors.Is(err, podnet.ErrForeignInterface):
		return cni.Errorf(cni.ErrInvalidEnv, "CNI_IFNAME=%s: refusing to replace an interface ofsdn did not create: %v", ifName, err)
	case errors.Is(err, podnet.ErrNetNSGone):
		return cni.Errorf(cni.ErrInvalidEnv, "CNI_NETNS=%s: %v", req.Netns, err)
	}
	return cni.Errorf(cni.ErrInternal, "%v", err)
}

// addNetwork serves a meta-plugin's ADD of one interface on a Network (the config names the Network):
// an interface the eth0 ADD attached already gets its result again; else it is attached now.
func (p *Handler) addNetwork(ctx context.Context, req *cni.Request, conf *cni.NetConf) (*current.Result, error) {
	if req.IfName == "eth0" {
		return nil, cni.Errorf(cni.ErrInvalidEnv, "CNI_IFNAME=eth0 is the cluster network's; a Network's interface needs another name (net1...)")
	}
	r := networks.Request{Interface: req.IfName, Network: conf.Network}
	if len(conf.RuntimeConfig.IPs) > 0 || conf.RuntimeConfig.MAC != "" {
		var err error
		if r.IP, r.MAC, err = networks.StaticAddress(conf.RuntimeConfig.IPs, conf.RuntimeConfig.MAC); err != nil {
			return nil, p.refuse(req, fmt.Errorf("%w: runtimeConfig: %v", networks.ErrBadRequest, err))
		}
	}
	if p.networks == nil {
		return nil, cni.Errorf(cni.ErrInvalidConfig, "ofsdn agent: Networks are not served on this node")
	}
	_, _, mtu := p.node.Subnet()
	p.sweep.RLock()
	defer p.sweep.RUnlock()
	defer p.sandboxes.lock(req.ContainerID)()
	if err := p.servePendingDelete(ctx, attachment{req.ContainerID, req.IfName}); err != nil {
		return nil, cni.Errorf(cni.ErrTryAgainLater, "an earlier DEL of %s/%s, left while the agent was away, failed: %v", req.ContainerID, req.IfName, err)
	}
	key := NetAttachmentKey(req.PodNamespace(), req.PodName(), req.IfName)
	for _, a := range p.node.NetAttachments(k8sobj.PodKey(req.PodNamespace(), req.PodName()), req.ContainerID) {
		if a.IfName != req.IfName {
			continue
		}
		if a.Network != conf.Network || (r.IP.IsValid() && r.IP != a.IP) || a.NetNS != req.Netns {
			return nil, cni.Errorf(cni.ErrInvalidEnv, "CNI_IFNAME=%s: sandbox %s has it attached to Network %s (%s in %s); DEL it before adding it otherwise",
				req.IfName, req.ContainerID, a.Network, a.IP, a.NetNS)
		}
		if err := p.flows.SyncThrough(ctx, 0, a.Owner()); err != nil {
			return nil, cni.Errorf(cni.ErrTryAgainLater, "flows of %s: %v", key, err)
		}
		return p.netResult(req.Netns, []NetAttachment{a}, mtu), nil
	}
	pl, err := p.checkRequest(req, r)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			if err := p.undoNetwork(context.WithoutCancel(ctx), attachment{req.ContainerID, req.IfName}, req.PodNamespace(), req.PodName(), conf.Network); err != nil {
				p.log.Error(err, "undoing a failed ADD", "containerID", req.ContainerID, "ifName", req.IfName)
			}
		}
	}()
	a, gen, err := p.attachNetwork(ctx, req, netPlan{req: r, place: pl}, mtu)
	if err != nil {
		return nil, err
	}
	if err := p.flows.SyncThrough(ctx, gen, a.Owner()); err != nil {
		return nil, cni.Errorf(cni.ErrTryAgainLater, "install flows for %s: %v", key, err)
	}
	ok = true
	p.notify()
	p.log.V(2).Info("network interface attached", "pod", key, "network", a.Network, "ip", a.IP)
	return p.netResult(req.Netns, []NetAttachment{a}, mtu), nil
}

// netResult is the CNI result of a meta-plugin's ADD of one interface.
func (p *Handler) netResult(netns string, atts []NetAttachment, mtu int) *current.Result {
	res := &current.Result{CNIVersion: "1.1.0"}
	p.appendNetResults(res, netns, atts, mtu)
	return res
}

// appendNetResults adds the Network interfaces to a result: the host end, the pod's interface and its
// address (no gateway: a Network is no default route).
func (p *Handler) appendNetResults(res *current.Result, netns string, atts []NetAttachment, mtu int) {
	for _, a := range atts {
		res.Interfaces = append(res.Interfaces, &current.Interface{Name: a.HostVeth},
			&current.Interface{Name: a.IfName, Mac: a.MAC.String(), Sandbox: netns, Mtu: mtu})
		idx := len(res.Interfaces) - 1
		res.IPs = append(res.IPs, &current.IPConfig{Interface: &idx,
			Address: net.IPNet{IP: a.IP.AsSlice(), Mask: net.CIDRMask(a.Prefix.Bits(), 32)}})
	}
}

// undoNetwork takes one Network interface out of the flows, then releases its port, veth and address.
func (p *Handler) undoNetwork(ctx context.Context, a attachment, namespace, name, network string) error {
	var errs []error
	gen := p.node.DetachNetwork(NetAttachmentKey(namespace, name, a.IfName), a.ContainerID)
	if err := p.flows.SyncThrough(ctx, gen); err != nil && p.node.Ready() == nil {
		errs = append(errs, fmt.Errorf("remove flows: %w", err))
	}
	if err := p.release(ctx, a, network); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// netAttachmentsOf lists a sandbox's Network interfaces: those in the view and those holding an
// address in a Network's store (an ADD cut short), by interface name with their Network.
func (p *Handler) netAttachmentsOf(containerID, podKey string) map[string]string {
	out := map[string]string{}
	for _, a := range p.node.NetAttachments(podKey, containerID) {
		out[a.IfName] = a.Network
	}
	for network, s := range p.allNetStores() {
		for _, a := range s.List() {
			if a.ContainerID == containerID {
				out[a.IfName] = network
			}
		}
	}
	return out
}

// undoSandboxNetworks undoes every Network interface of a sandbox, in name order.
func (p *Handler) undoSandboxNetworks(ctx context.Context, containerID, namespace, name string) error {
	atts := p.netAttachmentsOf(containerID, k8sobj.PodKey(namespace, name))
	ifNames := make([]string, 0, len(atts))
	for n := range atts {
		ifNames = append(ifNames, n)
	}
	sort.Strings(ifNames)
	var errs []error
	for _, ifName := range ifNames {
		if err := p.undoNetwork(ctx, attachment{containerID, ifName}, namespace, name, atts[ifName]); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ifName, err))
		}
	}
	return errors.Join(errs...)
}

// SyncRoutes makes every attached Network interface's cross-talk routes those its Network has now
// (podnet.SetRoutes): a Network that starts or stops talking to another changes running pods' routes,
// not only br0's flows (which are what enforces it).
func (p *Handler) SyncRoutes(ctx context.Context) error {
	if p.networks == nil {
		return nil
	}
	var errs []error
	for _, a := range p.node.AllNetAttachments() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		pl, err := p.networks.Placement(a.Network, a.Namespace)
		if err != nil {
			pl = networks.Placement{} // not admitted, or gone: no routes to anywhere else
		}
		if a.NetNS == "" {
			continue
		}
		if err := podnet.SetRoutes(a.NetNS, a.IfName, pl.Gateway, pl.Routes); err != nil && !errors.Is(err, podnet.ErrNetNSGone) {
			errs = append(errs, fmt.Errorf("%s: %w", a.Key(), err))
		}
	}
	return errors.Join(errs...)
}
