package controller

// Networks (network.ofsdn.io/v1 Network and NetworkSubnet, issue 22): pod networks besides the cluster
// network. This file owns, for every Network:
//   - its VNI (status.vni): spec.vni when given and no other Network holds it, else the next free one of
//     MinNetworkVNI-MaxNetworkVNI (the lowest at a start; the VNIDAllocator's cursor moves on, so a VNI
//     just released is not handed out again at once); unique among Networks, held for the Network's life;
//   - a NetworkSubnet <network>.<node> for every Node that has a HostSubnet, while the Network is valid:
//     the HostSubnet's hostIP and a subnet of spec.cidr (one SubnetAllocator per Network), tied to the
//     Network by its UID (networkUIDAnnotation, not an owner reference: this file deletes them, never the
//     garbage collector);
//   - its finalizer (NetworkInUseFinalizer): a deleted Network keeps its VNI, subnets and NetworkSubnets
//     while agents report pods attached (the NetworkSubnets' status.attachments), and lets them go, then
//     the finalizer, once none are;
//   - its status: observedGeneration, vni, attachments, the effective cross-talk (both sides' spec.crossTalk,
//     only between valid, live Networks whose CIDRs do not overlap) and the conditions Valid,
//     SubnetsAvailable, CrossTalk and InUse, written only when they change.
//
// Not here: which namespaces may attach (agents read spec.namespaceSelector), the attachment counts (agents
// write them), the flows (agents render them from Networks and NetworkSubnets, and remove them when those
// go). As with HostSubnets and NetNamespaces, the allocations are plain data rebuilt from the API on every
// start (status.vni, the NetworkSubnets' subnets) and told of every object found since, so a controller
// replaced at any point keeps every VNI and subnet. One queue keyed by Network name; syncNetwork is
// idempotent. Everything under networkState's maps is guarded by Controller.mu.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkinformersv1 "github.com/ofsdn/ofsdn/client/informers/externalversions/network/v1"
	networklisters "github.com/ofsdn/ofsdn/client/listers/network/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// networkIndex indexes NetworkSubnets by their Network's name.
const networkIndex = "network"

// networkState is the controller's Network state.
type networkState struct {
	lister  networklisters.NetworkLister
	subnets cache.Indexer // NetworkSubnets, by networkIndex
	queue   workqueue.TypedRateLimitingInterface[string]
	// vniRange is what the VNI allocator hands out (the API's MinNetworkVNI-MaxNetworkVNI; tests narrow it).
	vniRange [2]uint32

	// Guarded by Controller.mu.
	vnis   *VNIDAllocator
	vni    map[string]uint32    // Network → the VNI it holds
	allocs map[string]*netAlloc // Network → its subnets: only for a valid Network holding a VNI
	// deleted holds the NetworkSubnets this controller deleted (UID → Network) until the informer stops
	// showing them, so a late view of one is never taken for an object to adopt or a corrupt one.
	deleted map[types.UID]string
}

// netAlloc is one Network's subnets.
type netAlloc struct {
	cidr     netip.Prefix
	hostBits int32
	subnets  *SubnetAllocator
	node     map[string]netip.Prefix // node → its subnet, as the API holds it (or is about to)
	waiting  int                     // nodes the last sync found no subnet for
}

// wireNetworks registers the Network handlers: Networks and NetworkSubnets from the network.ofsdn.io
// factory, and the Nodes and HostSubnets every Network has a subnet per.
func (c *Controller) wireNetworks(net networkinformersv1.Interface, nodeInf coreinformers.NodeInformer,
	hsInf networkinformersv1.HostSubnetInformer) error {
	netInf, subInf := net.Networks(), net.NetworkSubnets()
	if err := subInf.Informer().AddIndexers(cache.Indexers{networkIndex: func(obj any) ([]string, error) {
		if s, ok := obj.(*networkv1.NetworkSubnet); ok {
			return []string{s.Network}, nil
		}
		return nil, nil
	}}); err != nil {
		return err
	}
	c.nets.lister, c.nets.subnets = netInf.Lister(), subInf.Informer().GetIndexer()
	all := func(any) { c.queueNetworks(func(*networkv1.Network) bool { return true }) }
	for _, h := range []struct {
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandler
	}{
		{netInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.queueNetworkAndPeers(asNetwork(obj)) },
			UpdateFunc: func(old, obj any) { c.networkUpdated(asNetwork(old), asNetwork(obj)) },
			DeleteFunc: func(obj any) {
				if n := asNetwork(obj); n != nil {
					c.queueNetworkAndPeers(n)
					return
				}
				all(obj)
			},
		}},
		{subInf.Informer(), cache.ResourceEventHandlerFuncs{
			// A NetworkSubnet's change (agents write its attachments) is its Network's.
			AddFunc:    func(obj any) { c.queueNetworkOf(obj) },
			UpdateFunc: func(_, obj any) { c.queueNetworkOf(obj) },
			DeleteFunc: func(obj any) {
				if s := asNetworkSubnet(obj); s != nil {
					c.mu.Lock()
					delete(c.nets.deleted, s.UID)
					c.mu.Unlock()
				}
				c.queueNetworkOf(obj)
			},
		}},
		// Every Network has a subnet per node with a HostSubnet, on its hostIP.
		{nodeInf.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: all, DeleteFunc: all}},
		{hsInf.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: all, DeleteFunc: all,
			UpdateFunc: func(old, obj any) {
				if o, ok := old.(*networkv1.HostSubnet); ok {
					if n, ok := obj.(*networkv1.HostSubnet); ok && o.HostIP == n.HostIP {
						return
					}
				}
				all(obj)
			}}},
	} {
		if _, err := h.informer.AddEventHandler(h.handler); err != nil {
			return err
		}
		c.synced = append(c.synced, h.informer.HasSynced)
	}
	return nil
}

// networkUpdated queues a changed Network, and its peers (old and new) when what their cross-talk
// depends on changed: its spec.crossTalk, whether it is valid (holds a VNI) or whether it is being deleted.
func (c *Controller) networkUpdated(o, n *networkv1.Network) {
	if o == nil || n == nil {
		return
	}
	c.nets.queue.Add(n.Name)
	if !slices.Equal(o.Spec.CrossTalk, n.Spec.CrossTalk) || o.Status.VNI != n.Status.VNI ||
		(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) {
		c.queueNetworkAndPeers(o)
		c.queueNetworkAndPeers(n)
	}
}

func asNetwork(obj any) *networkv1.Network {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	n, _ := obj.(*networkv1.Network)
	return n
}

func asNetworkSubnet(obj any) *networkv1.NetworkSubnet {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	s, _ := obj.(*networkv1.NetworkSubnet)
	return s
}

func (c *Controller) queueNetworkOf(obj any) {
	if s := asNetworkSubnet(obj); s != nil {
		c.nets.queue.Add(s.Network)
		return
	}
	c.queueNetworks(func(*networkv1.Network) bool { return true }) // a tombstone without its object
}

// queueNetworkAndPeers queues a Network and every Network whose cross-talk may depend on it: pairing is
// cluster-wide (talkPairsLocked: a new pair can be ambiguous with a third Network's), so every Network
// that asks for cross-talk or has some.
func (c *Controller) queueNetworkAndPeers(n *networkv1.Network) {
	if n == nil {
		return
	}
	c.nets.queue.Add(n.Name)
	for _, peer := range n.Spec.CrossTalk {
		c.nets.queue.Add(peer)
	}
	c.queueNetworks(func(m *networkv1.Network) bool { return len(m.Spec.CrossTalk) > 0 || len(m.Status.CrossTalk) > 0 })
}

// queueNetworks queues the Networks the informer shows for which pick says so.
func (c *Controller) queueNetworks(pick func(*networkv1.Network) bool) {
	nets, err := c.nets.lister.List(labels.Everything())
	if err != nil {
		return
	}
	for _, n := range nets {
		if pick(n) {
			c.nets.queue.Add(n.Name)
		}
	}
}

// byAge orders objects oldest first (then by name): where two claim one VNI or subnet, the older keeps it.
func byAge[T metav1.Object](a, b T) int {
	if c := a.GetCreationTimestamp().Compare(b.GetCreationTimestamp().Time); c != 0 {
		return c
	}
	return cmp.Compare(a.GetName(), b.GetName())
}

// rebuildNetworksLocked loads the VNIs from the Networks' status and each valid Network's subnets from
// its NetworkSubnets. c.mu is held.
func (c *Controller) rebuildNetworksLocked() error {
	c.nets.vnis = newVNIDAllocator(c.nets.vniRange[0], c.nets.vniRange[1])
	c.nets.vni, c.nets.allocs = map[string]uint32{}, map[string]*netAlloc{}
	nets, err := c.nets.lister.List(labels.Everything())
	if err != nil {
		return err
	}
	slices.SortFunc(nets, byAge)
	for _, n := range nets {
		if id := n.Status.VNI; id != 0 && c.nets.vnis.Users(id) == 0 && c.nets.vnis.Use(id) == nil {
			c.nets.vni[n.Name] = id
		}
	}
	for _, n := range nets {
		if _, held := c.nets.vni[n.Name]; !held {
			continue // its sync picks a VNI, or says why not
		}
		if p, err := networkCIDR(n.Spec); err == nil {
			st := c.netAllocLocked(n, p)
			for _, s := range c.networkSubnetsOfLocked(n.Name) {
				c.adoptNetworkSubnetLocked(n, st, s)
			}
		}
	}
	c.networkGaugesLocked()
	return nil
}

// networkCIDR validates a Network's addresses: an IPv4 CIDR (the CRD checks the same; the controller
// checks again, as it must never allocate from a spec it cannot use).
func networkCIDR(spec networkv1.NetworkSpec) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(string(spec.CIDR))
	switch {
	case err != nil:
		return p, fmt.Errorf("cidr %q: %v", spec.CIDR, err)
	case !p.Addr().Is4():
		return p, fmt.Errorf("cidr %s: only IPv4 is supported", p)
	case p != p.Masked():
		return p, fmt.Errorf("cidr %s has host bits set (%s)", p, p.Masked())
	case spec.HostSubnetLength < 2 || spec.HostSubnetLength > 30:
		return p, fmt.Errorf("hostSubnetLength %d out of range 2-30", spec.HostSubnetLength)
	case p.Bits()+int(spec.HostSubnetLength) > 32:
		return p, fmt.Errorf("hostSubnetLength %d does not fit cidr %s", spec.HostSubnetLength, p)
	}
	return p, nil
}

// netAllocLocked returns the subnets of a Network that holds a VNI (p: its CIDR, as networkCIDR
// accepted it), made when new, or when the spec's addresses changed (the CRD forbids it): then its
// NetworkSubnets are adopted again, as at a start. c.mu is held.
func (c *Controller) netAllocLocked(n *networkv1.Network, p netip.Prefix) *netAlloc {
	st := c.nets.allocs[n.Name]
	if st == nil || st.cidr != p || st.hostBits != n.Spec.HostSubnetLength {
		// networkCIDR checked what NewSubnetAllocator checks: no error.
		a, _ := NewSubnetAllocator([]netip.Prefix{p}, int(n.Spec.HostSubnetLength))
		st = &netAlloc{cidr: p, hostBits: n.Spec.HostSubnetLength, subnets: a, node: map[string]netip.Prefix{}}
		c.nets.allocs[n.Name] = st
	}
	return st
}

// vniHolderLocked names the Network holding a VNI ("": none), for messages: whether one is held is
// c.nets.vnis.Users (the allocator counts the one holder of each). c.mu is held.
func (c *Controller) vniHolderLocked(id uint32) string {
	for name, held := range c.nets.vni {
		if held == id {
			return name
		}
	}
	return ""
}

// claimLocked makes sure a Network that can be valid holds a VNI and has its subnets, and returns its
// Valid condition. A deleted Network holding nothing claims nothing. c.mu is held.
func (c *Controller) claimLocked(n *networkv1.Network, deleting bool) metav1.Condition {
	valid := metav1.Condition{Type: networkv1.ConditionValid, Status: metav1.ConditionFalse, ObservedGeneration: n.Generation}
	p, err := networkCIDR(n.Spec)
	if err != nil {
		delete(c.nets.allocs, n.Name) // its VNI, if it holds one, stays: a Network's VNI is for life
		valid.Reason, valid.Message = "InvalidCIDR", err.Error()
		return valid
	}
	id, held := c.nets.vni[n.Name]
	if !held && deleting {
		valid.Reason, valid.Message = "Deleting", "deleted before it held a VNI"
		return valid
	}
	if !held {
		var reason, msg string
		if id, reason, msg = c.pickVNILocked(n); reason != "" {
			valid.Reason, valid.Message = reason, msg
			return valid
		}
		c.nets.vni[n.Name] = id
		c.metrics.Allocations.WithLabelValues("network-vni").Inc()
		c.log.Info("claimed network VNI", "network", n.Name, "vni", id)
	}
	c.netAllocLocked(n, p)
	valid.Status, valid.Reason, valid.Message = metav1.ConditionTrue, "Accepted", fmt.Sprintf("VNI %d", id)
	if n.Spec.VNI != 0 && n.Spec.VNI != id {
		valid.Message += fmt.Sprintf("; spec.vni %d is ignored: a Network keeps its VNI for life", n.Spec.VNI)
	}
	return valid
}

// pickVNILocked finds a Network's VNI: spec.vni if free; else the one its status records (another
// writer's, e.g. a previous leader whose write this run had not seen at its start) if free; else a free
// one. It returns the Valid=False reason and message when there is none. c.mu is held.
func (c *Controller) pickVNILocked(n *networkv1.Network) (id uint32, reason, msg string) {
	if want := n.Spec.VNI; want != 0 {
		if c.nets.vnis.Users(want) > 0 {
			return 0, "VNIConflict", fmt.Sprintf("VNI %d is held by Network %s", want, c.vniHolderLocked(want))
		}
		if err := c.nets.vnis.Use(want); err != nil {
			return 0, "VNIOutOfRange", err.Error()
		}
		return want, "", ""
	}
	if s := n.Status.VNI; s != 0 && c.nets.vnis.Users(s) == 0 && c.nets.vnis.Use(s) == nil {
		return s, "", ""
	}
	id, err := c.nets.vnis.Allocate()
	if err != nil {
		return 0, "VNIExhausted", fmt.Sprintf("no VNI left for Networks: %v", err)
	}
	return id, "", ""
}

// networkNodes lists the nodes a Network has a subnet on: those with a Node and a HostSubnet, with the
// HostSubnet's hostIP.
func (c *Controller) networkNodes() (map[string]string, error) {
	hss, err := c.subnets.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, hs := range hss {
		if _, err := c.nodes.Get(hs.Name); err != nil {
			continue
		}
		if ip, err := netip.ParseAddr(hs.HostIP); err == nil && ip.Is4() {
			out[hs.Name] = ip.String()
		}
	}
	return out, nil
}

// networkSubnetsOfLocked lists the NetworkSubnets the informer shows for a Network, oldest first, but
// those this controller has deleted; it forgets the deletions the informer shows. c.mu is held.
func (c *Controller) networkSubnetsOfLocked(network string) []*networkv1.NetworkSubnet {
	objs, _ := c.nets.subnets.ByIndex(networkIndex, network)
	shown := map[types.UID]bool{}
	var out []*networkv1.NetworkSubnet
	for _, o := range objs {
		s, ok := o.(*networkv1.NetworkSubnet)
		if !ok {
			continue
		}
		shown[s.UID] = true
		if _, gone := c.nets.deleted[s.UID]; !gone {
			out = append(out, s)
		}
	}
	for uid, n := range c.nets.deleted {
		if n == network && !shown[uid] {
			delete(c.nets.deleted, uid)
		}
	}
	slices.SortFunc(out, byAge)
	return out
}

// adoptNetworkSubnetLocked counts a NetworkSubnet's subnet as its node's, and says why not ("": adopted)
// for a corrupt one: a name that is not <network>.<node>, a subnet that is not one of the Network's, or
// one another node holds. One whose node holds another subnet replaces it if it is free (the API is the
// record). c.mu is held.
func (c *Controller) adoptNetworkSubnetLocked(n *networkv1.Network, st *netAlloc, s *networkv1.NetworkSubnet) string {
	if want := networkv1.NetworkSubnetName(n.Name, s.Node); s.Name != want {
		return fmt.Sprintf("its name is not %s", want)
	}
	p, err := netip.ParsePrefix(string(s.Subnet))
	if err != nil {
		return fmt.Sprintf("subnet %q: %v", s.Subnet, err)
	}
	held, ok := st.node[s.Node]
	if ok && held == p {
		return ""
	}
	if !st.subnets.Contains(p) {
		return fmt.Sprintf("subnet %s is not a /%d of %s", p, 32-st.hostBits, st.cidr)
	}
	for other, q := range st.node {
		if q == p {
			return fmt.Sprintf("subnet %s is node %s's", p, other)
		}
	}
	if ok {
		st.subnets.Release(held)
	}
	_ = st.subnets.MarkAllocated(p) // Contains and free: cannot fail
	st.node[s.Node] = p
	return ""
}

// dropped is a NetworkSubnet to delete, and why.
type dropped struct {
	s   *networkv1.NetworkSubnet
	why string
	// counted: its subnet is its node's, released once it is deleted; corrupt: it is reported (once).
	counted, corrupt bool
}

// created is a NetworkSubnet to create; fresh: its subnet was allocated for it just now.
type created struct {
	s     *networkv1.NetworkSubnet
	fresh bool
}

// syncNetwork brings one Network's VNI, NetworkSubnets, finalizer and status in line with the cluster.
func (c *Controller) syncNetwork(ctx context.Context, name string) error {
	n, err := c.nets.lister.Get(name)
	if apierrors.IsNotFound(err) {
		return c.dropNetwork(ctx, name)
	}
	if err != nil {
		return err
	}
	deleting := n.DeletionTimestamp != nil
	if !slices.Contains(n.Finalizers, networkv1.NetworkInUseFinalizer) {
		if deleting { // deleted before the controller saw it, or its finalizer removed by hand
			return c.dropNetwork(ctx, name)
		}
		upd := n.DeepCopy()
		upd.Finalizers = append(upd.Finalizers, networkv1.NetworkInUseFinalizer)
		if n, err = c.net.NetworkV1().Networks().Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			return staleOK(fmt.Errorf("add finalizer to Network %s: %w", name, err))
		}
	}
	nodes, err := c.networkNodes()
	if err != nil {
		return err
	}

	// What the API holds is adopted or dropped; a gone node's subnet goes, before any is handed out.
	c.mu.Lock()
	valid := c.claimLocked(n, deleting)
	st := c.nets.allocs[name]
	kept, drop := c.sortNetworkSubnetsLocked(n, st, c.networkSubnetsOfLocked(name), nodes)
	c.mu.Unlock()
	if err := c.deleteNetworkSubnets(ctx, n, st, drop); err != nil {
		return err
	}

	if deleting {
		return c.syncDeletedNetwork(ctx, n, valid, st, kept)
	}
	var errs []error
	if st != nil {
		c.mu.Lock()
		creates, updates := c.planNetworkSubnetsLocked(n, st, kept, nodes)
		c.mu.Unlock()
		errs = c.writeNetworkSubnets(ctx, n, st, creates, updates, kept)
	}
	if len(errs) > 0 {
		return errors.Join(errs...) // the retry writes the status
	}
	return c.writeNetworkStatus(ctx, n, valid, st, kept, false)
}

// sortNetworkSubnetsLocked splits a Network's NetworkSubnets into those kept (by node) and those to
// delete: all of an invalid Network's, corrupt ones, and those of nodes that are gone. The subnet of a
// gone node with no NetworkSubnet is released here. c.mu is held.
func (c *Controller) sortNetworkSubnetsLocked(n *networkv1.Network, st *netAlloc, existing []*networkv1.NetworkSubnet,
	nodes map[string]string) (map[string]*networkv1.NetworkSubnet, []dropped) {
	kept := map[string]*networkv1.NetworkSubnet{}
	var drop []dropped
	for _, s := range existing {
		if st == nil {
			drop = append(drop, dropped{s: s, why: "the Network is not valid"})
			continue
		}
		if why := c.adoptNetworkSubnetLocked(n, st, s); why != "" {
			drop = append(drop, dropped{s: s, why: why, corrupt: true})
			continue
		}
		delete(c.refused, "networksubnet/"+s.Name)
		if _, ok := nodes[s.Node]; !ok {
			drop = append(drop, dropped{s: s, why: "its node is gone", counted: true})
			continue
		}
		kept[s.Node] = s
	}
	if st != nil {
		for node, p := range st.node {
			if _, ok := nodes[node]; ok || slices.ContainsFunc(drop, func(d dropped) bool { return d.counted && d.s.Node == node }) {
				continue
			}
			st.subnets.Release(p)
			delete(st.node, node)
		}
	}
	return kept, drop
}

// deleteNetworkSubnets deletes NetworkSubnets (exactly those objects: a precondition on their UID) and
// releases the subnets they held. A corrupt one gets a Warning Event on its Network, once.
func (c *Controller) deleteNetworkSubnets(ctx context.Context, n *networkv1.Network, st *netAlloc, drop []dropped) error {
	for _, d := range drop {
		if d.corrupt {
			c.mu.Lock()
			key := "networksubnet/" + d.s.Name
			first := c.refused[key] != string(d.s.Subnet)
			c.refused[key] = string(d.s.Subnet)
			c.mu.Unlock()
			if first {
				c.recorder.Eventf(n, corev1.EventTypeWarning, "InvalidNetworkSubnet", "NetworkSubnet %s: %s; replacing it", d.s.Name, d.why)
			}
		}
		if err := c.deleteNetworkSubnet(ctx, d.s); err != nil {
			return err
		}
		c.log.Info("deleted network subnet", "networksubnet", d.s.Name, "subnet", d.s.Subnet, "why", d.why)
		if d.counted {
			c.mu.Lock()
			if p, ok := st.node[d.s.Node]; ok && string(d.s.Subnet) == p.String() {
				st.subnets.Release(p)
				delete(st.node, d.s.Node)
			}
			c.mu.Unlock()
		}
	}
	return nil
}

func (c *Controller) deleteNetworkSubnet(ctx context.Context, s *networkv1.NetworkSubnet) error {
	var opts metav1.DeleteOptions
	if s.UID != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &s.UID}
	}
	err := c.net.NetworkV1().NetworkSubnets().Delete(ctx, s.Name, opts)
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) { // Conflict: another object has the name now
		return fmt.Errorf("delete NetworkSubnet %s: %w", s.Name, err)
	}
	if s.UID != "" {
		c.mu.Lock()
		c.nets.deleted[s.UID] = s.Network
		c.mu.Unlock()
	}
	return nil
}

// planNetworkSubnetsLocked gives every node without a NetworkSubnet one (nodes in name order while
// subnets last) and lists the kept ones whose hostIP or owner is out of date. c.mu is held.
func (c *Controller) planNetworkSubnetsLocked(n *networkv1.Network, st *netAlloc, kept map[string]*networkv1.NetworkSubnet,
	nodes map[string]string) (creates []created, updates []*networkv1.NetworkSubnet) {
	names := make([]string, 0, len(nodes))
	for node := range nodes {
		names = append(names, node)
	}
	slices.Sort(names)
	st.waiting = 0
	for _, node := range names {
		ip := nodes[node]
		if s := kept[node]; s != nil {
			if s.HostIP != ip || !ownedBy(s, n) {
				upd := s.DeepCopy()
				upd.HostIP = ip
				setOwner(upd, n)
				updates = append(updates, upd)
			}
			continue
		}
		p, held := st.node[node]
		if !held {
			var err error
			if p, err = st.subnets.Allocate(); err != nil {
				st.waiting++
				continue
			}
			st.node[node] = p
		}
		s := &networkv1.NetworkSubnet{ObjectMeta: metav1.ObjectMeta{Name: networkv1.NetworkSubnetName(n.Name, node)},
			Network: n.Name, Node: node, HostIP: ip, Subnet: networkv1.CIDR(p.String())}
		setOwner(s, n)
		creates = append(creates, created{s, !held})
	}
	c.networkGaugesLocked()
	return creates, updates
}

func ownedBy(s *networkv1.NetworkSubnet, n *networkv1.Network) bool {
	return s.Annotations[networkUIDAnnotation] == string(n.UID)
}

// networkUIDAnnotation ties a NetworkSubnet to the Network (by UID) it was made for: one left by a
// deleted Network of the same name is not this one's. An annotation, not an owner reference: the
// garbage collector must never delete a NetworkSubnet (a foreground deletion of the Network would, and
// the attachment counts that hold the Network's deletion would go with it); the controller does.
const networkUIDAnnotation = "network.ofsdn.io/network-uid"

// setOwner ties the NetworkSubnet to its Network.
func setOwner(s *networkv1.NetworkSubnet, n *networkv1.Network) {
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[networkUIDAnnotation] = string(n.UID)
	s.OwnerReferences = nil
}

// writeNetworkSubnets creates and updates NetworkSubnets; kept learns what the API holds now. A fresh
// subnet whose NetworkSubnet could not be created is released (the retry allocates again, or adopts what
// another writer made).
func (c *Controller) writeNetworkSubnets(ctx context.Context, n *networkv1.Network, st *netAlloc, creates []created,
	updates []*networkv1.NetworkSubnet, kept map[string]*networkv1.NetworkSubnet) []error {
	var errs []error
	for _, cr := range creates {
		s, err := c.net.NetworkV1().NetworkSubnets().Create(ctx, cr.s, metav1.CreateOptions{})
		switch {
		case err == nil:
			kept[s.Node] = s
			if cr.fresh {
				c.metrics.Allocations.WithLabelValues("network-subnet").Inc()
				c.log.Info("allocated network subnet", "network", n.Name, "node", cr.s.Node, "subnet", cr.s.Subnet, "hostIP", cr.s.HostIP)
			} else {
				c.log.Info("recreated network subnet", "network", n.Name, "node", cr.s.Node, "subnet", cr.s.Subnet)
			}
		case !cr.fresh && apierrors.IsAlreadyExists(err): // created before; the informer shows it soon
			kept[cr.s.Node] = cr.s
		default:
			if cr.fresh {
				c.mu.Lock()
				if p, ok := st.node[cr.s.Node]; ok && p.String() == string(cr.s.Subnet) {
					st.subnets.Release(p)
					delete(st.node, cr.s.Node)
				}
				c.networkGaugesLocked()
				c.mu.Unlock()
			}
			errs = append(errs, fmt.Errorf("create NetworkSubnet %s: %w", cr.s.Name, err))
		}
	}
	for _, upd := range updates {
		s, err := c.net.NetworkV1().NetworkSubnets().Update(ctx, upd, metav1.UpdateOptions{})
		if err != nil {
			// A Conflict: its agent wrote its status since; that change queues the Network again.
			if err := staleOK(err); err != nil {
				errs = append(errs, fmt.Errorf("update NetworkSubnet %s: %w", upd.Name, err))
			}
			continue
		}
		kept[s.Node] = s
	}
	return errs
}

// syncDeletedNetwork keeps a deleted Network whole while pods are attached to it, and once none are,
// deletes its NetworkSubnets, removes its finalizer and releases its VNI and subnets.
func (c *Controller) syncDeletedNetwork(ctx context.Context, n *networkv1.Network, valid metav1.Condition, st *netAlloc,
	kept map[string]*networkv1.NetworkSubnet) error {
	if pods, _ := attachments(kept); pods > 0 {
		return c.writeNetworkStatus(ctx, n, valid, st, kept, true)
	}
	var drop []dropped
	for _, s := range kept {
		drop = append(drop, dropped{s: s, why: "its Network is deleted and no pod is attached", counted: true})
	}
	slices.SortFunc(drop, func(a, b dropped) int { return cmp.Compare(a.s.Name, b.s.Name) })
	if err := c.deleteNetworkSubnets(ctx, n, st, drop); err != nil {
		return err
	}
	upd := n.DeepCopy()
	upd.Finalizers = slices.DeleteFunc(upd.Finalizers, func(f string) bool { return f == networkv1.NetworkInUseFinalizer })
	if _, err := c.net.NetworkV1().Networks().Update(ctx, upd, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return staleOK(fmt.Errorf("remove finalizer from Network %s: %w", n.Name, err))
	}
	c.forgetNetwork(n.Name)
	c.log.Info("network deleted: no pod attached", "network", n.Name)
	return nil
}

// dropNetwork deletes what is left of a Network that is gone (or deleted without the controller's
// finalizer) and releases its VNI and subnets.
func (c *Controller) dropNetwork(ctx context.Context, name string) error {
	c.mu.Lock()
	existing := c.networkSubnetsOfLocked(name)
	c.mu.Unlock()
	for _, s := range existing {
		if err := c.deleteNetworkSubnet(ctx, s); err != nil {
			return err
		}
		c.log.Info("deleted network subnet", "networksubnet", s.Name, "why", "its Network is gone")
	}
	c.forgetNetwork(name)
	return nil
}

// forgetNetwork releases a Network's VNI and subnets; the Networks waiting for a VNI get another try.
func (c *Controller) forgetNetwork(name string) {
	c.mu.Lock()
	id, held := c.nets.vni[name]
	if held {
		c.nets.vnis.Release(id)
		delete(c.nets.vni, name)
	}
	delete(c.nets.allocs, name)
	c.networkGaugesLocked()
	c.mu.Unlock()
	if held {
		c.log.Info("released network VNI", "network", name, "vni", id)
		c.queueNetworks(func(m *networkv1.Network) bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			_, has := c.nets.vni[m.Name]
			return !has
		})
	}
}

// attachments sums the pods the NetworkSubnets' agents report, and names the nodes that have any.
func attachments(kept map[string]*networkv1.NetworkSubnet) (int64, []string) {
	var pods int64
	var nodes []string
	for node, s := range kept {
		if s.Status.Attachments > 0 {
			pods += s.Status.Attachments
			nodes = append(nodes, node)
		}
	}
	slices.Sort(nodes)
	return pods, nodes
}

// crossTalkLocked is a Network's effective cross-talk (sorted) and its CrossTalk condition: every
// Network either side's spec.crossTalk names, that exists, holds a VNI, is not being deleted, whose CIDR
// does not overlap this one's, and that the cluster-wide pairing (talkPairsLocked) keeps: a Network's
// peers never overlap each other, so an address names one network. An inactive Network (invalid or
// deleted) has none. c.mu is held.
func (c *Controller) crossTalkLocked(n *networkv1.Network, st *netAlloc, deleting bool) ([]string, metav1.Condition) {
	cond := metav1.Condition{Type: networkv1.ConditionCrossTalk, ObservedGeneration: n.Generation}
	switch {
	case deleting:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Deleting", "the Network is being deleted: no cross-talk"
		return nil, cond
	case st == nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "NotValid", "the Network is not valid: no cross-talk"
		return nil, cond
	}
	asked := map[string]bool{}
	for _, name := range n.Spec.CrossTalk {
		asked[name] = true
	}
	candidates := map[string]*networkv1.Network{}
	for name := range asked {
		candidates[name] = nil
	}
	others, _ := c.nets.lister.List(labels.Everything())
	for _, m := range others {
		if _, ok := candidates[m.Name]; ok || slices.Contains(m.Spec.CrossTalk, n.Name) {
			candidates[m.Name] = m
		}
	}
	kept, ambiguous := c.talkPairsLocked(others)
	var effective, overlapping, unknown, conflicting []string
	for name, m := range candidates {
		reason, why := c.peerLocked(n, st, name, m)
		if reason == "" && !kept[pairOf(n.Name, name)] {
			reason, why = "Ambiguous", fmt.Sprintf("%s (%s)", name, ambiguous[pairOf(n.Name, name)])
		}
		switch {
		case reason == "":
			effective = append(effective, name)
		case !asked[name]: // named only by the other side: nothing this Network asked for is missing
		case reason == "Overlapping":
			overlapping = append(overlapping, why)
		case reason == "Ambiguous":
			conflicting = append(conflicting, why)
		default:
			unknown = append(unknown, why)
		}
	}
	slices.Sort(effective)
	slices.Sort(overlapping)
	slices.Sort(unknown)
	slices.Sort(conflicting)
	switch {
	case len(overlapping) > 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, "Overlapping"
	case len(conflicting) > 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, "Ambiguous"
	case len(unknown) > 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, "UnknownNetwork"
	default:
		cond.Status, cond.Reason = metav1.ConditionTrue, "Effective"
	}
	if cond.Status == metav1.ConditionFalse {
		cond.Message = "no cross-talk with " + strings.Join(append(append(overlapping, conflicting...), unknown...), ", ")
		if len(effective) > 0 {
			cond.Message += "; cross-talk with " + strings.Join(effective, ", ")
		}
	} else if len(effective) > 0 {
		cond.Message = "cross-talk with " + strings.Join(effective, ", ")
	} else {
		cond.Message = "no cross-talk asked for"
	}
	return effective, cond
}

// pairOf names an unordered pair of Networks.
func pairOf(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// talkPairsLocked decides, cluster-wide, which pairs of Networks exchange traffic: of the pairs either
// side asks for whose Networks are live, valid and apart (peerLocked), one is kept unless it would give
// one of the two a second peer whose addresses overlap an existing peer's (then an address would name
// two networks: the pair is ambiguous, and the note names the peer it collides with). First come,
// first served: pairs already in effect (in both Networks' status.crossTalk) are kept before new ones,
// so a new request never takes an existing pair's traffic away; among new pairs, by name. c.mu is held.
func (c *Controller) talkPairsLocked(nets []*networkv1.Network) (kept map[[2]string]bool, ambiguous map[[2]string]string) {
	byName := make(map[string]*networkv1.Network, len(nets))
	for _, m := range nets {
		byName[m.Name] = m
	}
	type pair struct {
		p           [2]string
		established bool
	}
	var pairs []pair
	seen := map[[2]string]bool{}
	for _, a := range nets {
		if a.DeletionTimestamp != nil {
			continue
		}
		st := c.nets.allocs[a.Name]
		if st == nil {
			// Not synced yet: claimed now, so the pairing does not depend on which Network syncs first.
			c.claimLocked(a, false)
			if st = c.nets.allocs[a.Name]; st == nil {
				continue // not valid
			}
		}
		for _, name := range a.Spec.CrossTalk {
			b := byName[name]
			p := pairOf(a.Name, name)
			if b == nil || seen[p] {
				continue
			}
			if reason, _ := c.peerLocked(a, st, name, b); reason != "" {
				continue
			}
			seen[p] = true
			pairs = append(pairs, pair{p, slices.Contains(a.Status.CrossTalk, name) && slices.Contains(b.Status.CrossTalk, a.Name)})
		}
	}
	slices.SortFunc(pairs, func(x, y pair) int {
		if x.established != y.established {
			if x.established {
				return -1
			}
			return 1
		}
		return strings.Compare(x.p[0]+"\x00"+x.p[1], y.p[0]+"\x00"+y.p[1])
	})
	kept, ambiguous = map[[2]string]bool{}, map[[2]string]string{}
	peers := map[string][]string{}
	clash := func(of, with string) string { // a peer of `of` overlapping `with`
		for _, q := range peers[of] {
			if qa, wa := c.nets.allocs[q], c.nets.allocs[with]; qa != nil && wa != nil && qa.cidr.Overlaps(wa.cidr) {
				return q
			}
		}
		return ""
	}
	for _, x := range pairs {
		a, b := x.p[0], x.p[1]
		if q := clash(a, b); q != "" {
			ambiguous[x.p] = fmt.Sprintf("%s talks to %s already, whose addresses overlap %s's", a, q, b)
			continue
		}
		if q := clash(b, a); q != "" {
			ambiguous[x.p] = fmt.Sprintf("%s talks to %s already, whose addresses overlap %s's", b, q, a)
			continue
		}
		kept[x.p] = true
		peers[a], peers[b] = append(peers[a], b), append(peers[b], a)
	}
	return kept, ambiguous
}

// peerLocked says why a Network cannot exchange traffic with another (m: nil when it does not exist):
// reason Overlapping or UnknownNetwork, and a note naming it; "" when it can. c.mu is held.
func (c *Controller) peerLocked(n *networkv1.Network, st *netAlloc, name string, m *networkv1.Network) (reason, why string) {
	var other *netAlloc
	if m != nil {
		if other = c.nets.allocs[name]; other == nil && m.DeletionTimestamp == nil && name != n.Name {
			// Not synced yet (created together with n, say): its VNI is claimed now rather than
			// reported missing until its own sync.
			c.claimLocked(m, false)
			other = c.nets.allocs[name]
		}
	}
	switch {
	case name == n.Name:
		return "Overlapping", name + " (itself)"
	case m == nil:
		return "UnknownNetwork", name + " (no such Network)"
	case m.DeletionTimestamp != nil:
		return "UnknownNetwork", name + " (being deleted)"
	case other == nil:
		return "UnknownNetwork", name + " (not valid)"
	case other.cidr.Overlaps(st.cidr):
		return "Overlapping", fmt.Sprintf("%s (%s overlaps %s)", name, other.cidr, st.cidr)
	}
	return "", ""
}

// writeNetworkStatus writes a Network's status when it changed, then records the Events of the
// conditions that turned: Valid, SubnetsAvailable or CrossTalk turning False (Warning), InUse turning to
// Deleting (Normal).
func (c *Controller) writeNetworkStatus(ctx context.Context, n *networkv1.Network, valid metav1.Condition, st *netAlloc,
	kept map[string]*networkv1.NetworkSubnet, deleting bool) error {
	status := *n.Status.DeepCopy()
	status.ObservedGeneration = n.Generation
	pods, podNodes := attachments(kept)
	status.Attachments = pods

	avail := metav1.Condition{Type: networkv1.ConditionSubnetsAvailable, ObservedGeneration: n.Generation, Status: metav1.ConditionFalse}
	c.mu.Lock()
	status.VNI = c.nets.vni[n.Name]
	if st == nil {
		status.VNI = 0 // held for life all the same, but not in use
	}
	crossTalk, talk := c.crossTalkLocked(n, st, deleting)
	switch {
	case deleting:
		avail.Reason, avail.Message = "Deleting", "the Network is being deleted: no new subnets"
	case st == nil:
		avail.Reason, avail.Message = "NotValid", "the Network is not valid: no subnets"
	case st.waiting > 0:
		avail.Reason = "Exhausted"
		avail.Message = fmt.Sprintf("%d node(s) lack a subnet: all %d /%d subnets of %s are allocated",
			st.waiting, st.subnets.Total(), 32-st.hostBits, st.cidr)
	default:
		avail.Status, avail.Reason, avail.Message = metav1.ConditionTrue, "Available", "every node has a subnet"
	}
	c.mu.Unlock()
	status.CrossTalk = crossTalk

	inUse := metav1.Condition{Type: networkv1.ConditionInUse, ObservedGeneration: n.Generation, Status: metav1.ConditionTrue}
	switch {
	case deleting && pods > 0:
		inUse.Reason, inUse.Message = "Deleting", fmt.Sprintf("%d pods still attached on nodes %s", pods, strings.Join(podNodes, ", "))
	case pods > 0:
		inUse.Reason, inUse.Message = "Attached", fmt.Sprintf("%d pods on %d nodes", pods, len(podNodes))
	default:
		inUse.Status, inUse.Reason, inUse.Message = metav1.ConditionFalse, "Unused", "no pod is attached"
	}

	type turn struct{ kind, reason, message string }
	var turns []turn
	for _, cond := range []metav1.Condition{valid, avail, talk, inUse} {
		old := meta.FindStatusCondition(n.Status.Conditions, cond.Type)
		turned := old == nil || old.Status != cond.Status || old.Reason != cond.Reason
		switch {
		case !turned:
		case cond.Type == networkv1.ConditionInUse && cond.Reason == "Deleting":
			turns = append(turns, turn{corev1.EventTypeNormal, "Deleting", "deletion waits: " + cond.Message})
		case cond.Status == metav1.ConditionFalse && (cond.Type == networkv1.ConditionValid && cond.Reason != "Deleting" ||
			cond.Type == networkv1.ConditionSubnetsAvailable && cond.Reason == "Exhausted" ||
			cond.Type == networkv1.ConditionCrossTalk && (cond.Reason == "Overlapping" || cond.Reason == "UnknownNetwork" || cond.Reason == "Ambiguous")):
			turns = append(turns, turn{corev1.EventTypeWarning, cond.Reason, cond.Message})
		}
		meta.SetStatusCondition(&status.Conditions, cond)
	}
	if equality.Semantic.DeepEqual(status, n.Status) {
		return nil
	}
	upd := n.DeepCopy()
	upd.Status = status
	if _, err := c.net.NetworkV1().Networks().UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil {
		return staleOK(fmt.Errorf("update Network %s status: %w", n.Name, err))
	}
	for _, t := range turns {
		c.recorder.Eventf(n, t.kind, t.reason, "%s", t.message)
	}
	return nil
}

// staleOK drops a write's Conflict: the object changed since the informer's copy the sync worked from,
// and the informer's news of that change queues the Network again (at once, where a returned error would
// wait out the back-off and log a failure).
func staleOK(err error) error {
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// networkGaugesLocked sets the Networks' gauges. c.mu is held.
func (c *Controller) networkGaugesLocked() {
	var subnets int64
	for _, st := range c.nets.allocs {
		subnets += int64(len(st.node))
	}
	c.metrics.Networks.Set(float64(len(c.nets.vni)))
	c.metrics.NetworkSubnets.Set(float64(subnets))
}
