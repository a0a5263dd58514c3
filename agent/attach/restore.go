package attach

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"time"

	"github.com/ofsdn/ofsdn/agent/ipam"
	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/podnet"
	"github.com/ofsdn/ofsdn/cni"
	"github.com/ofsdn/ofsdn/internal/loop"
	"github.com/ofsdn/ofsdn/ovsdb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
)

// A restarting agent finds its pods' attachments in pieces: OVS ports with ofsdn's external IDs, address
// reservations, host veths with ofsdn's mark, and the DELs the plugin left while no agent could take
// them. An ADD cut short by a crash leaves some of the pieces; a DEL the agent never saw leaves all of
// them. restore gathers every piece by attachment, keeps what is still a pod, and releases the rest:
//
//   - a pending DEL: the runtime is done with it;
//   - no OVS port, or no reservation, or a port OVS cannot use: an ADD that never finished;
//   - the sandbox's netns gone, or it no longer holds this attachment's interface (the path names
//     another sandbox's namespace now): the sandbox is gone;
//   - the pod gone from the API server (for longer than Config.AbsentPodGrace since its ADD: a static pod's mirror
//     appears late), or deleted and created again (another UID), or bound to another node: asked of the
//     synced informer cache, and confirmed with a read from the API server itself before anything is
//     released, since a cache can lag;
//   - another, newer sandbox of the same pod attached: the runtime replaced this one.
//
// What cannot be decided (the API server does not answer; the kernel cannot be asked) is kept and asked
// again by the janitor, never released on a guess: releasing a live pod cuts it off for good, keeping a
// dead one costs an address until the next answer.

// attachment names one sandbox interface (CNI_CONTAINERID, CNI_IFNAME).
type attachment struct{ ContainerID, IfName string }

// restoredFacts is what a restarting agent finds of one attachment, each piece from where it lives.
type restoredFacts struct {
	attachment
	// Network is the Network of a pod's interface on one (its port's or its address store's); "" the
	// cluster network's.
	Network       string
	Port          *ovsdb.PortInfo    // its OVS port; nil: none
	Alloc         *ipam.Allocation   // its address reservation; nil: none
	PendingDelete *cni.PendingDelete // the runtime DELed it while no agent could take the DEL
	// Plumbing is podnet.Check of its interface (asked only of attachments with a port and a
	// reservation): nil, podnet.ErrNetNSGone, podnet.ErrNotAttached, or an error that proves nothing.
	Plumbing error
}

// recorded is what the ADD wrote on the attachment's port.
type recorded struct {
	Namespace, Name, UID, NetNS string
	MAC                         net.HardwareAddr
	Attached                    time.Time
	// A Network interface's: its Network, NetworkAttachmentDefinition and the Network's CIDR.
	Network, NAD string
	NetworkCIDR  netip.Prefix
}

func recordedOn(port *ovsdb.PortInfo) recorded {
	ids := port.ExternalIDs
	r := recorded{Namespace: ids[ExtPodNamespace], Name: ids[ExtPodName], UID: ids[ExtPodUID], NetNS: ids[ExtNetNS],
		Network: ids[ExtNetwork], NAD: ids[ExtNAD]}
	r.MAC, _ = net.ParseMAC(ids[ExtMAC])
	r.Attached, _ = time.Parse(time.RFC3339Nano, ids[ExtAttached])
	r.NetworkCIDR, _ = netip.ParsePrefix(ids[ExtNetworkCIDR])
	return r
}

type verdict int

const (
	keep      verdict = iota
	release           // the attachment is stale
	undecided         // kept for now; the janitor asks again
)

type decision struct {
	verdict verdict
	reason  string
}

func (d decision) String() string {
	return map[verdict]string{keep: "keep", release: "release", undecided: "undecided"}[d.verdict] + ": " + d.reason
}

// localDecision judges an attachment by what the node itself holds.
func localDecision(f restoredFacts) decision {
	switch {
	case f.PendingDelete != nil:
		return decision{release, fmt.Sprintf("the runtime deleted it while the agent could not serve the DEL (%s)", f.PendingDelete.Reason)}
	case f.Port == nil:
		return decision{release, "no OVS port: an ADD that did not finish"}
	case f.Alloc == nil:
		return decision{release, "no address reservation: an ADD that did not finish"}
	case f.Port.OFPort <= 0 || f.Port.Error != "":
		return decision{release, fmt.Sprintf("OVS cannot use its port (ofport %d, error %q)", f.Port.OFPort, f.Port.Error)}
	case recordedOn(f.Port).MAC == nil:
		return decision{release, "its port does not record the pod's MAC"}
	case recordedOn(f.Port).Network != f.Network:
		return decision{release, fmt.Sprintf("its port records Network %q, its address is in %q's store", recordedOn(f.Port).Network, f.Network)}
	case f.Network != "" && !recordedOn(f.Port).NetworkCIDR.IsValid():
		return decision{release, "its port does not record its Network's CIDR"}
	case errors.Is(f.Plumbing, podnet.ErrNetNSGone):
		return decision{release, "its network namespace is gone"}
	case errors.Is(f.Plumbing, podnet.ErrNotAttached):
		return decision{release, fmt.Sprintf("its interface is gone: %v", f.Plumbing)}
	case f.Plumbing != nil:
		return decision{keep, fmt.Sprintf("kept, though its interface is not as configured: %v", f.Plumbing)}
	}
	return decision{keep, "attached"}
}

// PodPresence is what the API server says of an attachment's pod.
type PodPresence struct {
	Found         bool
	UID, NodeName string
	// MirrorOf is the UID of the static pod a mirror pod stands for (kubelet passes the static pod's
	// UID to CNI, and the mirror in the API has a UID of its own).
	MirrorOf string
	Err      error // no answer: nothing can be concluded
}

// DefaultAbsentPodGrace is how long after its ADD a pod may be missing from the API before its
// attachment is released (Config.AbsentPodGrace): kubelet creates a static pod's mirror only after the
// pod runs.
const DefaultAbsentPodGrace = 2 * time.Minute

// apiDecision judges an attachment the node still holds by its pod in the API; absentGrace is how
// long after its ADD a pod may be missing.
func apiDecision(rec recorded, node string, p PodPresence, now time.Time, absentGrace time.Duration) decision {
	key := k8sobj.PodKey(rec.Namespace, rec.Name)
	switch {
	case p.Err != nil:
		return decision{undecided, fmt.Sprintf("the API server could not confirm pod %s: %v", key, p.Err)}
	case !p.Found && (rec.Attached.IsZero() || now.Sub(rec.Attached) >= absentGrace):
		return decision{release, fmt.Sprintf("pod %s no longer exists", key)}
	case !p.Found:
		return decision{undecided, fmt.Sprintf("pod %s is not in the API (yet?): attached %s ago", key, now.Sub(rec.Attached).Round(time.Second))}
	case rec.UID != "" && p.UID != rec.UID && p.MirrorOf != rec.UID:
		return decision{release, fmt.Sprintf("pod %s was deleted and created again (UID %s, attached for %s)", key, p.UID, rec.UID)}
	case p.NodeName != node:
		return decision{release, fmt.Sprintf("pod %s is bound to node %q", key, p.NodeName)}
	}
	return decision{keep, "attached"}
}

// supersede leaves one attachment per pod interface: the newest, by when its ADD attached it.
// Attachments whose order cannot be told (made before the time was recorded) are all left as they are.
func supersede(facts map[attachment]*restoredFacts, decisions map[attachment]decision) {
	byPod := map[string][]attachment{}
	for a, d := range decisions {
		if d.verdict != release {
			rec := recordedOn(facts[a].Port)
			key := k8sobj.PodKey(rec.Namespace, rec.Name)
			if facts[a].Network != "" {
				key = NetAttachmentKey(rec.Namespace, rec.Name, a.IfName) // eth0's sandbox and net1's are one
			}
			byPod[key] = append(byPod[key], a)
		}
	}
	for _, as := range byPod {
		if len(as) < 2 {
			continue
		}
		sort.Slice(as, func(i, j int) bool {
			ti, tj := recordedOn(facts[as[i]].Port).Attached, recordedOn(facts[as[j]].Port).Attached
			if !ti.Equal(tj) {
				return ti.After(tj)
			}
			return as[i].ContainerID < as[j].ContainerID
		})
		newest := as[0]
		for _, a := range as[1:] {
			if t := recordedOn(facts[a].Port).Attached; !t.IsZero() && t.Before(recordedOn(facts[newest].Port).Attached) {
				decisions[a] = decision{release, fmt.Sprintf("sandbox %s of the same pod is newer", newest.ContainerID)}
			}
		}
	}
}

// PodLookup answers whether a pod exists, from the agent's synced informer cache of this node's pods
// and, to confirm an absence, from the API server itself.
type PodLookup interface {
	// Cached reports the pod's UID, and its static pod's for a mirror, from the informer.
	Cached(namespace, name string) (uid, mirrorOf string, found bool)
	Get(ctx context.Context, namespace, name string) PodPresence
}

// APIPods is PodLookup on the pod informer's cache (k8sobj.Pods, this node's) and the API server.
type APIPods struct {
	Cache    cache.Store // the pod informer's
	Client   typedcorev1.PodsGetter
	NodeName string
}

func (a APIPods) Cached(namespace, name string) (string, string, bool) {
	obj, found, err := a.Cache.GetByKey(k8sobj.PodKey(namespace, name))
	pod, ok := obj.(*k8sobj.Pod)
	if err != nil || !found || !ok || pod.NodeName != a.NodeName {
		return "", "", false // the informer holds the whole cluster: a pod elsewhere is a question for the API server
	}
	return string(pod.UID), pod.Annotations[k8sobj.MirrorAnnotation], true
}

func (a APIPods) Get(ctx context.Context, namespace, name string) PodPresence {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pod, err := a.Client.Pods(namespace).Get(ctx, name, metav1.GetOptions{}) // no resourceVersion: a quorum read
	switch {
	case apierrors.IsNotFound(err):
		return PodPresence{}
	case err != nil:
		return PodPresence{Err: err}
	}
	return PodPresence{Found: true, UID: string(pod.UID), NodeName: pod.Spec.NodeName, MirrorOf: pod.Annotations[k8sobj.MirrorAnnotation]}
}

// presence asks about a restored attachment's pod: the cache when it agrees, else the API server.
func (p *Handler) presence(ctx context.Context, rec recorded) PodPresence {
	if uid, mirrorOf, ok := p.pods.Cached(rec.Namespace, rec.Name); ok && (rec.UID == "" || uid == rec.UID || mirrorOf == rec.UID) {
		return PodPresence{Found: true, UID: uid, MirrorOf: mirrorOf, NodeName: p.node.Name()}
	}
	return p.pods.Get(ctx, rec.Namespace, rec.Name)
}

// unsureAttachment is a restored attachment the janitor has to settle.
type unsureAttachment struct {
	facts   restoredFacts
	release bool // restore decided to release it and failed; else the API server's answer is awaited
	reason  string
}

// restore rebuilds the local pods after a (re)start and releases the stale attachments (see above). It
// runs before the CNI server accepts requests and before the first flow sync, so it only edits the
// view; the first sync then installs the kept pods and drops every other pod's flows.
func (p *Handler) Restore(ctx context.Context) error {
	p.sweep.Lock()
	defer p.sweep.Unlock()
	subnet, _, _ := p.node.Subnet()
	store, err := p.ipamFor(subnet)
	if err != nil {
		return err
	}
	ports, err := p.db.ListPorts(ctx, p.bridge)
	if err != nil {
		return err
	}
	hostEnds, err := podnet.ListHostEnds(p.hostNetNS)
	if err != nil {
		return err
	}
	facts := map[attachment]*restoredFacts{}
	of := func(a attachment) *restoredFacts {
		if facts[a] == nil {
			facts[a] = &restoredFacts{attachment: a}
		}
		return facts[a]
	}
	for _, port := range ports {
		if sandbox := port.ExternalIDs[ExtSandbox]; sandbox != "" {
			f := of(attachment{sandbox, port.ExternalIDs[ExtIfName]})
			f.Port, f.Network = &port, port.ExternalIDs[ExtNetwork]
		}
	}
	for _, a := range store.List() {
		of(attachment{a.ContainerID, a.IfName}).Alloc = &a
	}
	for network, s := range p.allNetStores() {
		for _, a := range s.List() {
			f := of(attachment{a.ContainerID, a.IfName})
			if f.Alloc == nil || f.Network == network {
				f.Alloc, f.Network = &a, network
			}
		}
	}
	for _, d := range p.readPendingDeletes() {
		of(attachment{d.ContainerID, d.IfName}).PendingDelete = &d
	}
	for _, h := range hostEnds {
		of(attachment{h.ContainerID, h.IfName}) // an orphan veth: released unless something keeps it
	}

	decisions := map[attachment]decision{}
	for a, f := range facts {
		if f.Port != nil && f.Alloc != nil && f.PendingDelete == nil {
			f.Plumbing = p.plumbing(*f)
		}
		d := localDecision(*f)
		if d.verdict == keep && p.pods != nil {
			if api := apiDecision(recordedOn(f.Port), p.node.Name(), p.presence(ctx, recordedOn(f.Port)), p.now(), p.absentGrace); api.verdict != keep {
				d = api
			}
		}
		decisions[a] = d
	}
	supersede(facts, decisions)
	// A sandbox's Network interfaces go with its eth0.
	for a, d := range decisions {
		if facts[a].Network == "" || d.verdict == release {
			continue
		}
		for b, e := range decisions {
			if b.ContainerID == a.ContainerID && facts[b].Network == "" && e.verdict == release {
				decisions[a] = decision{release, "its sandbox's cluster network interface is released: " + e.reason}
			}
		}
	}

	kept, released := 0, 0
	for a, d := range decisions {
		f := facts[a]
		if d.verdict == release {
			released++
			p.log.Info("releasing a stale attachment", "containerID", a.ContainerID, "ifName", a.IfName, "reason", d.reason)
			if err := p.release(ctx, a, f.Network); err != nil {
				p.log.Error(err, "releasing a stale attachment failed; retrying later", "containerID", a.ContainerID)
				p.setUnsure(a, unsureAttachment{facts: *f, release: true, reason: d.reason})
			} else if f.PendingDelete != nil {
				p.dropPendingDelete(*f.PendingDelete)
			}
			continue
		}
		kept++
		rec := recordedOn(f.Port)
		if d.verdict == undecided {
			p.log.Info("keeping an attachment until its pod can be confirmed", "containerID", a.ContainerID, "reason", d.reason)
			p.setUnsure(a, unsureAttachment{facts: *f, reason: d.reason})
		}
		if f.Network != "" {
			p.node.AttachNetwork(NetAttachment{Namespace: rec.Namespace, Name: rec.Name, SandboxID: a.ContainerID, IfName: a.IfName,
				NetNS: rec.NetNS, Network: f.Network, NAD: rec.NAD, IP: f.Alloc.IP, Prefix: netip.PrefixFrom(f.Alloc.IP, rec.NetworkCIDR.Bits()),
				MAC: rec.MAC, OFPort: uint32(f.Port.OFPort), HostVeth: f.Port.Name})
			continue
		}
		p.node.Attach(Pod{Namespace: rec.Namespace, Name: rec.Name, SandboxID: a.ContainerID,
			IfName: a.IfName, NetNS: rec.NetNS, IP: f.Alloc.IP, MAC: rec.MAC, OFPort: uint32(f.Port.OFPort), HostVeth: f.Port.Name})
	}
	p.log.Info("restored the node's pods", "kept", kept, "released", released)
	return nil
}

// plumbing checks a restored attachment's interface: in full when its netns path is recorded, else
// (ports made before it was recorded) only that its host end exists.
func (p *Handler) plumbing(f restoredFacts) error {
	rec := recordedOn(f.Port)
	if rec.NetNS == "" {
		present, err := podnet.HostEndPresent(p.hostNetNS, f.Port.Name)
		if err == nil && !present {
			return fmt.Errorf("host end %s missing: %w", f.Port.Name, podnet.ErrNotAttached)
		}
		return err
	}
	cfg := podnet.Config{NetNS: rec.NetNS, HostNetNS: p.hostNetNS, ContainerID: f.ContainerID, IfName: f.IfName,
		HostVeth: f.Port.Name, IP: netip.PrefixFrom(f.Alloc.IP, p.currentStore().Subnet().Bits())}
	if f.Network != "" {
		cfg.IP, cfg.MAC = netip.PrefixFrom(f.Alloc.IP, rec.NetworkCIDR.Bits()), rec.MAC
	}
	return podnet.Check(cfg)
}

func (p *Handler) setUnsure(a attachment, u unsureAttachment) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.unsure == nil {
		p.unsure = map[attachment]unsureAttachment{}
	}
	p.unsure[a] = u
}

// readPendingDeletes reads the DELs the plugin left; files that are no DEL are reported and removed.
func (p *Handler) readPendingDeletes() []cni.PendingDelete {
	if p.pendingDeletes == "" {
		return nil
	}
	ds, errs := cni.ReadPendingDeletes(p.pendingDeletes)
	for _, err := range errs {
		var m *cni.MalformedPendingDelete
		if errors.As(err, &m) {
			p.log.Error(err, "removing a malformed pending delete")
			_ = cni.RemoveMalformedPendingDelete(m)
			continue
		}
		p.log.Error(err, "reading pending deletes")
	}
	return ds
}

func (p *Handler) dropPendingDelete(d cni.PendingDelete) {
	if err := cni.RemovePendingDelete(p.pendingDeletes, d); err != nil {
		p.log.Error(err, "removing a served pending delete", "containerID", d.ContainerID)
	}
}

// servePendingDelete serves the pending DEL of one attachment, if the plugin left one. The caller holds
// the sweep lock shared and the sandbox's lock.
func (p *Handler) servePendingDelete(ctx context.Context, a attachment) error {
	if p.pendingDeletes == "" {
		return nil
	}
	d, found, err := cni.ReadPendingDelete(p.pendingDeletes, a.ContainerID, a.IfName)
	if err != nil || !found {
		return err
	}
	p.log.Info("serving a DEL left while the agent was away", "containerID", d.ContainerID, "ifName", d.IfName,
		"pod", k8sobj.PodKey(d.PodNamespace(), d.PodName()), "left", d.Written, "reason", d.Reason)
	if err := p.undo(ctx, a, p.podKeyOf(a, d.PodNamespace(), d.PodName())); err != nil {
		return err
	}
	p.dropPendingDelete(d)
	return nil
}

// janitorPeriod is how often the janitor serves pending DELs and settles unsure attachments.
const janitorPeriod = 5 * time.Second

// RunJanitor serves the DELs the plugin leaves and settles what restore could not, every janitorPeriod
// until ctx ends. Its first pass runs at once: DELs left between restore and the server's start wait
// for nobody else.
func (p *Handler) RunJanitor(ctx context.Context) {
	loop.New(loop.Config{Name: "cni-janitor", Period: janitorPeriod, Log: p.log}, func(ctx context.Context) (time.Duration, error) {
		p.janitorPass(ctx)
		return 0, nil
	}).Run(ctx)
}

func (p *Handler) janitorPass(ctx context.Context) {
	for _, d := range p.readPendingDeletes() {
		a := attachment{d.ContainerID, d.IfName}
		p.sweep.RLock()
		unlock := p.sandboxes.lock(a.ContainerID)
		if err := p.servePendingDelete(ctx, a); err != nil {
			p.log.Error(err, "serving a pending DEL failed; retrying later", "containerID", a.ContainerID)
		}
		unlock()
		p.sweep.RUnlock()
	}
	p.mu.Lock()
	unsure := make(map[attachment]unsureAttachment, len(p.unsure))
	for a, u := range p.unsure {
		unsure[a] = u
	}
	p.mu.Unlock()
	for a, u := range unsure {
		p.sweep.RLock()
		unlock := p.sandboxes.lock(a.ContainerID)
		settled := p.settle(ctx, a, u)
		unlock()
		p.sweep.RUnlock()
		if settled {
			p.mu.Lock()
			delete(p.unsure, a)
			p.mu.Unlock()
		}
	}
}

// settle retries an unsure attachment; it reports whether it is settled. A DEL or a new ADD of the
// sandbox since restore settles it too.
func (p *Handler) settle(ctx context.Context, a attachment, u unsureAttachment) bool {
	rec := recordedOn(u.facts.Port)
	key := k8sobj.PodKey(rec.Namespace, rec.Name)
	pod, inView := p.node.Attached(key)
	attached := inView && pod.SandboxID == a.ContainerID
	network := u.facts.Network
	if network != "" {
		attached = false
		for _, n := range p.node.NetAttachments(key, a.ContainerID) {
			attached = attached || n.IfName == a.IfName
		}
	}
	if u.release {
		if attached { // added again since
			return true
		}
		if err := p.release(ctx, a, network); err != nil {
			p.log.Error(err, "releasing a stale attachment failed; retrying later", "containerID", a.ContainerID)
			return false
		}
		if u.facts.PendingDelete != nil {
			p.dropPendingDelete(*u.facts.PendingDelete)
		}
		return true
	}
	if !attached || p.pods == nil {
		return true
	}
	d := apiDecision(rec, p.node.Name(), p.presence(ctx, rec), p.now(), p.absentGrace)
	switch d.verdict {
	case undecided:
		return false
	case release:
		p.log.Info("releasing a stale attachment", "containerID", a.ContainerID, "ifName", a.IfName, "reason", d.reason)
		undo := func() error { return p.undo(ctx, a, key) }
		if network != "" {
			undo = func() error { return p.undoNetwork(ctx, a, rec.Namespace, rec.Name, network) }
		}
		if err := undo(); err != nil {
			p.log.Error(err, "releasing a stale attachment failed; retrying later", "containerID", a.ContainerID)
			return false
		}
	}
	return true
}
