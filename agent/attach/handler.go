// Package attach is the agent's CNI side: it serves the plugin's requests — an address from the node's
// subnet (ipam/), the pod's veth (podnet/), its OVS port with ofsdn's external IDs — and puts the pod
// into the agent's view, returning only once the pod's flows are installed; it undoes all of that on DEL
// and GC. After a restart it restores the node's attachments from their pieces and releases the stale
// ones (restore.go); its janitor serves the DELs the plugin left while no agent could take them.
//
// It knows the rest of the agent through two small interfaces: Node (the view's readiness, subnet and
// attached pods) and Flows (install the view's flows up to a generation).
package attach

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/ofsdn/ofsdn/agent/ipam"
	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/podnet"
	"github.com/ofsdn/ofsdn/cni"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/ovsdb"
	"k8s.io/klog/v2"
)

// External IDs ofsdn writes on a pod's OVS port: a restarted agent rebuilds its pods from them and checks
// each against the sandbox's netns, the API server and the runtime's DELs (restore.go).
const (
	ExtPodNamespace = "ofsdn/pod-namespace"
	ExtPodName      = "ofsdn/pod-name"
	ExtPodUID       = "ofsdn/pod-uid" // K8S_POD_UID, when the runtime passes it
	ExtSandbox      = "ofsdn/sandbox"
	ExtIfName       = "ofsdn/ifname"
	ExtNetNS        = "ofsdn/netns" // CNI_NETNS
	ExtIP           = "ofsdn/ip"
	ExtMAC          = "ofsdn/mac"
	ExtAttached     = "ofsdn/attached" // when the ADD attached it (RFC 3339): of two sandboxes of a pod, the newer wins
)

// Pod is a pod attached to this node's bridge, as the view keeps it and its flows render it.
type Pod struct {
	Namespace, Name string
	SandboxID       string
	IfName          string // the interface in the sandbox ("" when restored from a port made before it was recorded)
	NetNS           string // the sandbox's netns path, as the runtime gave it ("" likewise)
	IP              netip.Addr
	MAC             net.HardwareAddr
	OFPort          uint32
	HostVeth        string
}

// Node is the agent's view as attachments use it. Attach and Detach return the view's generation that
// holds the change, for Flows.SyncThrough.
type Node interface {
	// Ready says why the node cannot attach pods yet (no subnet, no cluster network), or nil.
	Ready() error
	Name() string
	// Subnet is the node's pod subnet, the cluster networks pods route to through the gateway, and
	// the pods' MTU.
	Subnet() (subnet netip.Prefix, clusterNets []netip.Prefix, mtu int)
	// Attached returns the pod attached under namespace/name.
	Attached(key string) (Pod, bool)
	// Attach files a pod (replacing what was filed under its key).
	Attach(p Pod) (generation uint64)
	// Detach forgets the pod under key if sandbox is the one attached there.
	Detach(key, sandbox string) (generation uint64)
	// AttachNetwork files a pod's interface on a Network (replacing what was filed under its key).
	AttachNetwork(a NetAttachment) (generation uint64)
	// DetachNetwork forgets the interface under key (NetAttachmentKey) if sandbox is the one attached there.
	DetachNetwork(key, sandbox string) (generation uint64)
	// NetAttachments returns the Network interfaces of the pod under podKey that sandbox attached.
	NetAttachments(podKey, sandbox string) []NetAttachment
	// AllNetAttachments returns every Network interface attached on the node.
	AllNetAttachments() []NetAttachment
}

// Flows installs the view's flows: it returns once generation gen is on the bridge, or says why not
// (one of owners failing counts).
type Flows interface {
	SyncThrough(ctx context.Context, gen uint64, owners ...reconcile.Owner) error
}

// PortDB is what attachments need from OVSDB (ovsdb.Client provides it).
type PortDB interface {
	EnsureSystemPort(ctx context.Context, bridge, name string, externalIDs map[string]string) (int, error)
	DeletePort(ctx context.Context, bridge, name string) error
	ListPorts(ctx context.Context, bridge string) ([]ovsdb.PortInfo, error)
}

// Config configures the attachments of a node.
type Config struct {
	Bridge    string
	HostNetNS string // the node's network namespace ("" the agent's own)
	Netdev    bool   // userspace datapath: pods need TX checksum offload off
	// StateDir holds the address store; NetworksDir one store per Network, in a directory named after it.
	StateDir    string
	NetworksDir string
	// PendingDeletes is the directory where the plugin leaves the DELs it could not hand over.
	PendingDeletes string
	// AbsentGrace: how long after its ADD a pod may be missing from the API (DefaultAbsentPodGrace).
	AbsentGrace time.Duration
	Logger      klog.Logger
}

// Deps are what attachments talk to.
type Deps struct {
	Node  Node
	Flows Flows
	DB    PortDB
	// Pods tells restore whether a restored attachment's pod still exists; nil skips the question.
	Pods PodLookup
	// BridgeUp reports whether the agent holds its OpenFlow session to the bridge (nil: assumed so).
	BridgeUp func() bool
	// Readiness is the agent's readiness, CNI STATUS's answer (nil: the node's).
	Readiness func() error
	// Networks resolves the Networks pods ask for (nil: pods get eth0 only, and a Network's ADD fails).
	Networks Networks
	// Warn records a Warning Event on a pod (nil: none).
	Warn func(namespace, name, reason, message string)
	// Changed is told after an ADD, DEL or GC changed the node's attachments (nil: nobody).
	Changed func()
}

// Handler serves CNI requests: address, veth, OVS port, flows — and undoes them.
//
// Requests for different sandboxes run in parallel (a node starting 10 pods at once must not queue
// them behind each other's veth and OVSDB round trips); only the address store is shared, and flow
// syncs coalesce in the agent's flow loop. GC and restore, which sweep every attachment, run alone.
//
// A DEL the agent could not take (it was down, died or froze) reaches it later as a pending delete
// the plugin left (cni.WritePendingDelete): restore serves those before the server starts, an ADD of
// the same sandbox interface serves its own first, and the janitor serves the rest every few seconds.
type Handler struct {
	sweep     sync.RWMutex // ADD/DEL/CHECK and the janitor hold it shared, GC and restore exclusively
	sandboxes keyedMutex   // one request per sandbox at a time
	mu        sync.Mutex   // guards store (the pointer: the subnet may change) and unsure
	node      Node
	flows     Flows
	db        PortDB
	pods      PodLookup
	bridgeUp  func() bool
	readiness func() error
	bridge    string
	hostNetNS string
	netdev    bool
	stateDir  string
	store     *ipam.Store
	log       klog.Logger
	networks  Networks
	warn      func(namespace, name, reason, message string)
	changed   func()
	// networksDir holds the Networks' address stores, netStores those opened (guarded by mu).
	networksDir string
	netStores   map[string]*ipam.Store
	// pendingDeletes is the directory where the plugin leaves the DELs it could not hand over.
	pendingDeletes string
	// unsure holds restored attachments restore could not settle (the API server did not answer, a pod
	// is not in the API yet, or a release failed); the janitor settles them.
	unsure map[attachment]unsureAttachment
	// absentGrace: how long after its ADD a pod may be missing from the API.
	absentGrace time.Duration
	// clock is time.Now unless a test moves time on.
	clock func() time.Time
}

// New makes a node's attachment handler.
func New(cfg Config, deps Deps) *Handler {
	if cfg.AbsentGrace == 0 {
		cfg.AbsentGrace = DefaultAbsentPodGrace
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	readiness := deps.Readiness
	if readiness == nil {
		readiness = deps.Node.Ready
	}
	return &Handler{node: deps.Node, flows: deps.Flows, db: deps.DB, pods: deps.Pods, bridgeUp: deps.BridgeUp, readiness: readiness,
		bridge: cfg.Bridge, hostNetNS: cfg.HostNetNS, netdev: cfg.Netdev, stateDir: cfg.StateDir, pendingDeletes: cfg.PendingDeletes,
		absentGrace: cfg.AbsentGrace, log: cfg.Logger, networks: deps.Networks, warn: deps.Warn, changed: deps.Changed,
		networksDir: cfg.NetworksDir}
}

// notify tells Deps.Changed that the attachments changed.
func (p *Handler) notify() {
	if p.changed != nil {
		p.changed()
	}
}

func (p *Handler) now() time.Time {
	if p.clock != nil {
		return p.clock()
	}
	return time.Now()
}

// ipamFor opens (or reopens, after the node's subnet changed) the address store.
func (p *Handler) ipamFor(subnet netip.Prefix) (*ipam.Store, error) {
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

func (p *Handler) netconf(req *cni.Request) (*cni.NetConf, error) {
	conf := &cni.NetConf{}
	if err := json.Unmarshal(req.Config, conf); err != nil {
		return nil, cni.Errorf(cni.ErrDecoding, "malformed network configuration: %v", err)
	}
	return conf, nil
}

// Add implements cni.Handler.
func (p *Handler) Add(ctx context.Context, req *cni.Request) (*current.Result, error) {
	if req.Netns == "" || req.IfName == "" || req.ContainerID == "" {
		return nil, cni.Errorf(cni.ErrInvalidEnv, "ADD needs CNI_CONTAINERID, CNI_NETNS and CNI_IFNAME")
	}
	conf, err := p.netconf(req)
	if err != nil {
		return nil, err
	}
	if err := p.node.Ready(); err != nil {
		return nil, cni.Errorf(cni.ErrTryAgainLater, "ofsdn agent not ready on this node: %v", err)
	}
	if conf.Network != "" {
		return p.addNetwork(ctx, req, conf) // a meta-plugin's ADD of one interface (networks.go)
	}
	if req.IfName != "eth0" && conf.AttachesNetworks() && p.networks != nil {
		// net1... are the Networks' names: the cluster network's interface under another name would
		// collide with them.
		return nil, cni.Errorf(cni.ErrInvalidEnv, "CNI_IFNAME=%s: the cluster network's interface is eth0 when ofsdn attaches the pod's Networks (set attachNetworks false to name it otherwise)", req.IfName)
	}
	start := time.Now()
	p.sweep.RLock()
	defer p.sweep.RUnlock()
	defer p.sandboxes.lock(req.ContainerID)()
	// A runtime sends one request per sandbox at a time, so a pending DEL of this sandbox interface
	// came before this ADD: serve it first.
	if err := p.servePendingDelete(ctx, attachment{req.ContainerID, req.IfName}); err != nil {
		return nil, cni.Errorf(cni.ErrTryAgainLater, "an earlier DEL of %s/%s, left while the agent was away, failed: %v", req.ContainerID, req.IfName, err)
	}
	// Every Network the pod asks for is checked before anything is attached: all of them or none.
	var plans []netPlan
	if conf.AttachesNetworks() {
		if plans, err = p.planNetworks(ctx, req); err != nil {
			return nil, err
		}
	}
	subnet, clusterNets, mtu := p.node.Subnet()
	store, err := p.ipamFor(subnet)
	if err != nil {
		return nil, cni.Errorf(cni.ErrIO, "ofsdn agent: address store: %v", err)
	}
	if conf.MTU > 0 {
		mtu = conf.MTU
	}
	gw := ipamGateway(subnet)
	if res, done, err := p.repeatedAdd(ctx, req, store, subnet, gw, clusterNets, mtu, plans); done {
		return res, err
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
			if err := p.undo(context.WithoutCancel(ctx), attachment{req.ContainerID, req.IfName}, k8sobj.PodKey(req.PodNamespace(), req.PodName())); err != nil {
				p.log.Error(err, "undoing a failed ADD", "containerID", req.ContainerID, "ifName", req.IfName)
			}
		}
	}()
	// The Networks' interfaces are plumbed beside eth0's, each on a goroutine of its own: a pod with three
	// interfaces waits for the slowest, not for the sum. A failed ADD waits for them before its undo
	// (deferred calls run last first).
	waitNets := p.attachNetworks(ctx, req, plans, mtu)
	defer func() {
		if !ok {
			_, _, _ = waitNets()
		}
	}()
	// A port an unfinished ADD of this sandbox left is bound to the veth about to be replaced: OVS would
	// keep its number for a binding that no longer carries anything. Attach anew.
	if err := p.db.DeletePort(ctx, p.bridge, hostVeth); err != nil {
		return nil, cni.Errorf(cni.ErrTryAgainLater, "remove the unfinished port %s: %v", hostVeth, err)
	}
	mac, err := podnet.Setup(podnet.Config{NetNS: req.Netns, HostNetNS: p.hostNetNS, ContainerID: req.ContainerID, IfName: req.IfName,
		HostVeth: hostVeth, IP: netip.PrefixFrom(ip, subnet.Bits()), Gateway: gw, ClusterNetworks: clusterNets, MTU: mtu, TxChecksumOff: p.netdev})
	if err != nil {
		return nil, podnetError(req, req.IfName, err)
	}
	wired := time.Now()
	ofport, err := p.db.EnsureSystemPort(ctx, p.bridge, hostVeth, map[string]string{
		ExtPodNamespace: req.PodNamespace(), ExtPodName: req.PodName(), ExtPodUID: req.Args["K8S_POD_UID"], ExtSandbox: req.ContainerID,
		ExtIfName: req.IfName, ExtNetNS: req.Netns, ExtIP: ip.String(), ExtMAC: mac.String(), ExtAttached: time.Now().UTC().Format(time.RFC3339Nano)})
	if err != nil {
		return nil, cni.Errorf(cni.ErrInternal, "attach %s to %s: %v", hostVeth, p.bridge, err)
	}
	ported := time.Now()
	gen := p.node.Attach(Pod{Namespace: req.PodNamespace(), Name: req.PodName(),
		SandboxID: req.ContainerID, IfName: req.IfName, NetNS: req.Netns, IP: ip, MAC: mac, OFPort: uint32(ofport), HostVeth: hostVeth})
	owners := []reconcile.Owner{pipeline.PodOwner(req.PodNamespace(), req.PodName())}
	nets, netGen, err := waitNets()
	if err != nil {
		return nil, err
	}
	gen = max(gen, netGen)
	for _, a := range nets {
		owners = append(owners, a.Owner())
	}
	attached := time.Now()
	if err := p.flows.SyncThrough(ctx, gen, owners...); err != nil {
		return nil, cni.Errorf(cni.ErrTryAgainLater, "install flows for %s/%s: %v", req.PodNamespace(), req.PodName(), err)
	}
	ok = true
	p.notify()
	// Where an ADD's time went, for whoever chases CNI latency.
	p.log.V(2).Info("pod attached", "pod", k8sobj.PodKey(req.PodNamespace(), req.PodName()), "ip", ip, "ofport", ofport, "interfaces", 1+len(nets),
		"total", time.Since(start), "ipam", allocated.Sub(start), "veth", wired.Sub(allocated), "ovsdb", ported.Sub(wired),
		"networks-wait", attached.Sub(ported), "flows", time.Since(attached))
	res := p.result(req, hostVeth, mac, ip, subnet, gw, clusterNets, mtu)
	p.appendNetResults(res, req.Netns, nets, mtu)
	return res, nil
}

// repeatedAdd answers an ADD for a sandbox interface that is attached already. The spec says runtimes
// should not send one, but they retry after timeouts and people run tools by hand: the working pod must
// come out of it unharmed. An intact attachment in the same netns gets its result again, unchanged; one
// elsewhere, or a second interface of the sandbox, gets an error; done is false when nothing is attached
// for the sandbox interface yet, or what is there is broken, and the ADD (re)builds it.
func (p *Handler) repeatedAdd(ctx context.Context, req *cni.Request, store *ipam.Store, subnet netip.Prefix, gw netip.Addr,
	clusterNets []netip.Prefix, mtu int, plans []netPlan) (*current.Result, bool, error) {
	pod, inView := p.node.Attached(k8sobj.PodKey(req.PodNamespace(), req.PodName()))
	if !inView || pod.SandboxID != req.ContainerID {
		return nil, false, nil
	}
	if pod.IfName != "" && pod.IfName != req.IfName {
		return nil, true, cni.Errorf(cni.ErrInvalidEnv, "CNI_IFNAME=%s: sandbox %s of %s already has %s attached, and ofsdn attaches one interface per sandbox",
			req.IfName, req.ContainerID, k8sobj.PodKey(pod.Namespace, pod.Name), pod.IfName)
	}
	if pod.NetNS != "" && pod.NetNS != req.Netns {
		return nil, true, cni.Errorf(cni.ErrInvalidEnv, "CNI_NETNS=%s: sandbox %s's %s is attached in %s; DEL it before adding it elsewhere",
			req.Netns, req.ContainerID, req.IfName, pod.NetNS)
	}
	if a, reserved := store.Lookup(req.ContainerID, req.IfName); !reserved || a.IP != pod.IP {
		p.log.Info("repeated ADD finds no address reservation for the attached sandbox: rebuilding it", "containerID", req.ContainerID)
		return nil, false, nil
	}
	if err := p.verifyAttached(ctx, req, pod, subnet); err != nil {
		if ctx.Err() != nil {
			return nil, true, cni.Errorf(cni.ErrTryAgainLater, "ADD %s: %v", req.ContainerID, ctx.Err())
		}
		p.log.Info("repeated ADD finds the attachment broken: rebuilding it", "containerID", req.ContainerID, "pod", k8sobj.PodKey(pod.Namespace, pod.Name), "problem", err)
		return nil, false, nil
	}
	// Its Networks too: each one asked for attached as asked, else the ADD rebuilds what is missing.
	have := map[string]NetAttachment{}
	for _, a := range p.node.NetAttachments(k8sobj.PodKey(pod.Namespace, pod.Name), req.ContainerID) {
		have[a.IfName] = a
	}
	nets := make([]NetAttachment, 0, len(plans))
	for _, plan := range plans {
		a, ok := have[plan.req.Interface]
		if !ok || a.Network != plan.place.Network || (plan.req.IP.IsValid() && plan.req.IP != a.IP) {
			p.log.Info("repeated ADD finds a Network interface missing or changed: attaching it", "containerID", req.ContainerID,
				"ifName", plan.req.Interface, "network", plan.place.Network)
			return nil, false, nil
		}
		nets = append(nets, a)
	}
	p.log.Info("repeated ADD of an attached sandbox: answering with its result, unchanged", "containerID", req.ContainerID,
		"pod", k8sobj.PodKey(pod.Namespace, pod.Name), "ip", pod.IP)
	res := p.result(req, pod.HostVeth, pod.MAC, pod.IP, subnet, gw, clusterNets, mtu)
	p.appendNetResults(res, req.Netns, nets, mtu)
	return res, true, nil
}

// verifyAttached checks that an attached pod's interface and OVS port are as the agent made them.
func (p *Handler) verifyAttached(ctx context.Context, req *cni.Request, pod Pod, subnet netip.Prefix) error {
	if err := podnet.Check(podnet.Config{NetNS: req.Netns, HostNetNS: p.hostNetNS, ContainerID: req.ContainerID, IfName: req.IfName,
		HostVeth: pod.HostVeth, IP: netip.PrefixFrom(pod.IP, subnet.Bits())}); err != nil {
		return err
	}
	ports, err := p.db.ListPorts(ctx, p.bridge)
	if err != nil {
		return err
	}
	for _, port := range ports {
		if port.Name == pod.HostVeth {
			if port.OFPort != int(pod.OFPort) || port.Error != "" {
				return fmt.Errorf("OVS port %s has number %d (error %q), the pod's flows use %d", port.Name, port.OFPort, port.Error, pod.OFPort)
			}
			return nil
		}
	}
	return fmt.Errorf("no OVS port %s", pod.HostVeth)
}

func (p *Handler) currentStore() *ipam.Store {
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

func (p *Handler) result(req *cni.Request, hostVeth string, mac net.HardwareAddr, ip netip.Addr, subnet netip.Prefix,
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

// undo takes an attachment out of the flows, then releases its port, veth and address; each step
// tolerates what is already gone. The flows go first, so a port number OVS hands out again never
// receives this pod's traffic.
//
// The cluster network's interface goes with the sandbox's Network interfaces (networks.go), which go
// first; a Network interface goes alone (undoNetwork).
func (p *Handler) undo(ctx context.Context, a attachment, key string) error {
	var errs []error
	if ns, name, found := strings.Cut(key, "/"); found {
		if err := p.undoSandboxNetworks(ctx, a.ContainerID, ns, name); err != nil {
			errs = append(errs, err)
		}
	}
	gen := p.node.Detach(key, a.ContainerID)
	if err := p.flows.SyncThrough(ctx, gen); err != nil && p.node.Ready() == nil {
		errs = append(errs, fmt.Errorf("remove flows: %w", err))
	}
	if err := p.release(ctx, a, ""); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// release removes an attachment's OVS port, host veth (only if ofsdn's: podnet.Teardown) and address
// (in its Network's store; network "": the cluster network's).
func (p *Handler) release(ctx context.Context, a attachment, network string) error {
	var errs []error
	hostVeth := podnet.HostVethName(a.ContainerID, a.IfName)
	if err := p.db.DeletePort(ctx, p.bridge, hostVeth); err != nil {
		errs = append(errs, err)
	}
	if err := podnet.Teardown(p.hostNetNS, a.ContainerID, a.IfName); err != nil {
		if errors.Is(err, podnet.ErrForeignInterface) {
			p.log.Info("leaving a link that is not ofsdn's alone", "containerID", a.ContainerID, "ifName", a.IfName, "link", err)
		} else {
			errs = append(errs, err)
		}
	}
	store := p.currentStore()
	if network != "" {
		var err error
		if store, err = p.netStore(network, netip.Prefix{}); err != nil {
			store = nil
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if store != nil {
		if _, err := store.Release(a.ContainerID, a.IfName); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// podKeyOf finds which pod an attachment belongs to: its reservation says, else the request's args.
func (p *Handler) podKeyOf(a attachment, namespace, name string) string {
	if store := p.currentStore(); store != nil {
		if alloc, ok := store.Lookup(a.ContainerID, a.IfName); ok {
			return k8sobj.PodKey(alloc.PodNamespace, alloc.PodName)
		}
	}
	return k8sobj.PodKey(namespace, name)
}

// Del implements cni.Handler: idempotent, and it succeeds when the netns is gone or the pod was never
// added.
func (p *Handler) Del(ctx context.Context, req *cni.Request) error {
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
	a := attachment{req.ContainerID, ifName}
	if network, ok := p.networkOf(req, ifName); ok {
		// One Network interface (a meta-plugin's DEL of it): the rest of the sandbox stays.
		ns, name := req.PodNamespace(), req.PodName()
		if alloc, found := p.lookupNetAlloc(network, a); found {
			ns, name = alloc.PodNamespace, alloc.PodName
		}
		if err := p.undoNetwork(ctx, a, ns, name, network); err != nil {
			return cni.Errorf(cni.ErrTryAgainLater, "DEL %s/%s: %v", req.ContainerID, ifName, err)
		}
	} else if err := p.undo(ctx, a, p.podKeyOf(a, req.PodNamespace(), req.PodName())); err != nil {
		return cni.Errorf(cni.ErrTryAgainLater, "DEL %s: %v", req.ContainerID, err)
	}
	p.notify()
	// This DEL also serves one the plugin may have left for the same attachment.
	if d, found, err := cni.ReadPendingDelete(p.pendingDeletes, a.ContainerID, a.IfName); err == nil && found {
		p.dropPendingDelete(d)
	}
	return nil
}

// networkOf says whether a DEL's interface is a Network's, and which: the config names it (a
// meta-plugin's call), or a Network's store holds the interface's address.
func (p *Handler) networkOf(req *cni.Request, ifName string) (string, bool) {
	if conf, err := p.netconf(req); err == nil && conf.Network != "" {
		return conf.Network, true
	}
	if ifName == "eth0" {
		return "", false
	}
	for network, s := range p.allNetStores() {
		if _, ok := s.Lookup(req.ContainerID, ifName); ok {
			return network, true
		}
	}
	return "", false
}

// lookupNetAlloc returns a Network interface's address reservation.
func (p *Handler) lookupNetAlloc(network string, a attachment) (ipam.Allocation, bool) {
	s, err := p.netStore(network, netip.Prefix{})
	if err != nil {
		return ipam.Allocation{}, false
	}
	return s.Lookup(a.ContainerID, a.IfName)
}

// Check implements cni.Handler.
func (p *Handler) Check(ctx context.Context, req *cni.Request) error {
	p.sweep.RLock()
	defer p.sweep.RUnlock()
	defer p.sandboxes.lock(req.ContainerID)()
	store := p.currentStore()
	network, isNet := p.networkOf(req, req.IfName)
	if isNet {
		store = nil
		if s, err := p.netStore(network, netip.Prefix{}); err == nil {
			store = s
		}
	}
	if store == nil {
		return cni.Errorf(cni.ErrUnknownContainer, "no address allocated for %s", req.ContainerID)
	}
	a, ok := store.Lookup(req.ContainerID, req.IfName)
	if !ok {
		return cni.Errorf(cni.ErrUnknownContainer, "no address allocated for %s/%s", req.ContainerID, req.IfName)
	}
	hostVeth := podnet.HostVethName(req.ContainerID, req.IfName)
	want := podnet.Config{NetNS: req.Netns, HostNetNS: p.hostNetNS, ContainerID: req.ContainerID, IfName: req.IfName,
		HostVeth: hostVeth, IP: netip.PrefixFrom(a.IP, store.Subnet().Bits())}
	if isNet {
		// A Network interface has the Network's prefix length and perhaps a static MAC: as the view has it.
		found := false
		for _, n := range p.node.NetAttachments(k8sobj.PodKey(a.PodNamespace, a.PodName), req.ContainerID) {
			if n.IfName == req.IfName {
				want.IP, want.MAC, found = n.Prefix, n.MAC, true
			}
		}
		if !found {
			return cni.Errorf(cni.ErrInternal, "%s/%s holds %s on Network %s but is not attached", req.ContainerID, req.IfName, a.IP, network)
		}
	}
	if err := podnet.Check(want); err != nil {
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

// Status implements cni.Handler, from the agent's readiness (its /readyz): 50 while the
// node cannot serve ADDs (not set up, not synced yet, OVSDB down, or no address left), 51 when the
// agent has lost its bridge (pods already running may have limited connectivity).
func (p *Handler) Status(context.Context) error {
	if err := p.node.Ready(); err != nil {
		return cni.Errorf(cni.ErrPluginNotAvailable, "ofsdn agent not ready on this node: %v", err)
	}
	if p.bridgeUp != nil && !p.bridgeUp() {
		return cni.Errorf(cni.ErrPluginNotAvailableConn, "ofsdn agent lost its OpenFlow connection to %s (is ovs-vswitchd running?): "+
			"pods may have limited connectivity", p.bridge)
	}
	if err := p.readiness(); err != nil {
		return cni.Errorf(cni.ErrPluginNotAvailable, "ofsdn agent not ready on this node: %v", err)
	}
	if store := p.currentStore(); store != nil && store.Available() == 0 {
		return cni.Errorf(cni.ErrPluginNotAvailable, "node subnet %s has no free address", store.Subnet())
	}
	return nil
}

// GC implements cni.Handler: everything of attachments the runtime no longer lists goes.
func (p *Handler) GC(ctx context.Context, valid []cni.Attachment) error {
	p.sweep.Lock()
	defer p.sweep.Unlock()
	store := p.currentStore()
	if store == nil {
		return nil
	}
	keep := map[cni.Attachment]bool{}
	sandboxes := map[string]bool{}
	for _, v := range valid {
		keep[v] = true
		sandboxes[v.ContainerID] = true
	}
	var errs []error
	// A sandbox's Network interfaces were made by its eth0's ADD, which the runtime lists: they go with
	// their sandbox, or when a meta-plugin's GC no longer lists them.
	for network, s := range p.allNetStores() {
		for _, a := range s.List() {
			if sandboxes[a.ContainerID] {
				continue
			}
			p.log.Info("GC: releasing a stale Network attachment", "containerID", a.ContainerID, "pod", k8sobj.PodKey(a.PodNamespace, a.PodName),
				"network", network, "ifName", a.IfName, "ip", a.IP)
			if err := p.undoNetwork(ctx, attachment{a.ContainerID, a.IfName}, a.PodNamespace, a.PodName, network); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, a := range store.List() {
		if keep[cni.Attachment{ContainerID: a.ContainerID, IfName: a.IfName}] {
			continue
		}
		p.log.Info("GC: releasing a stale attachment", "containerID", a.ContainerID, "pod", k8sobj.PodKey(a.PodNamespace, a.PodName), "ip", a.IP)
		if err := p.undo(ctx, attachment{a.ContainerID, a.IfName}, k8sobj.PodKey(a.PodNamespace, a.PodName)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
