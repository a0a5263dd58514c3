// Package controller is ofsdn's control plane (one active replica, leader-elected): it keeps the
// ClusterNetwork `default`, a HostSubnet per Node and a NetNamespace (VNID) per Namespace, and carries out
// the change-network requests (join / isolate / global) written on NetNamespaces, as openshift-sdn's master
// did; for every Network its VNI, a NetworkSubnet per node, its finalizer and its status (networks.go);
// and it judges egress IPs and EgressNetworkPolicies and places egress IPs (egress.go). The client-go
// pattern throughout: informers (from factories the caller builds, sample-controller's
// shape) feed workqueues keyed by object name; each sync function is idempotent; allocators are plain
// data rebuilt from the API objects on every start and told of every object found since, so a controller
// killed at any point resumes without changing or repeating an allocation.
//
// Tests: sync_test.go drives the sync functions on fake clientsets (make unit); controller_test.go runs
// the controller in-process on a real API server as deployed (controllertest); bench_test.go measures
// the binary.
package controller

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
	networkinformers "github.com/ofsdn/ofsdn/client/informers/externalversions"
	networklisters "github.com/ofsdn/ofsdn/client/listers/network/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// Config is the controller's configuration: the ClusterNetwork it creates when there is none, and the
// namespaces that are global (VNID 0) besides `default`.
type Config struct {
	Network          networkv1.ClusterNetworkSpec
	GlobalNamespaces []string
	// Workers per node and namespace queue (default 4): allocation itself is serialised under one lock,
	// but each allocation waits on an API write, and several writes in flight make a burst of a thousand
	// namespaces converge faster. Change-network requests always run one at a time: a join reads the
	// target's NETID, which a concurrent isolate of that target could change.
	Workers int
	Logger  klog.Logger
	// Events records the controller's Events; nil: Run records them through the API server.
	Events record.EventRecorder
	// Dynamic reads and writes ClusterNetworkPolicies' status (adminstatus.go); nil: not written.
	Dynamic dynamic.Interface
}

// Controller allocates node subnets and namespace VNIDs.
type Controller struct {
	kube     kubernetes.Interface
	net      networkclient.Interface
	cfg      Config
	log      klog.Logger
	recorder record.EventRecorder
	metrics  *Metrics

	nodes      corelisters.NodeLister
	namespaces corelisters.NamespaceLister
	subnets    networklisters.HostSubnetLister
	netns      networklisters.NetNamespaceLister
	networks   networklisters.ClusterNetworkLister
	// egressPolicies are the EgressNetworkPolicies (egress.go).
	egressPolicies networklisters.EgressNetworkPolicyLister
	synced         []cache.InformerSynced
	factories      []interface{ Start(stopCh <-chan struct{}) }
	// vnidRange is what the VNID allocator hands out (the API's MinVNID-MaxVNID; tests narrow it).
	vnidRange [2]uint32

	nodeQ, nsQ, changeQ, statusQ workqueue.TypedRateLimitingInterface[string]
	// admin writes ClusterNetworkPolicies' status (nil without Config.Dynamic).
	admin *adminStatus
	nets  networkState // Networks (networks.go); its maps under mu
	// egressQ holds egressIPsKey and egressPoliciesKey (egress.go).
	egressQ workqueue.TypedRateLimitingInterface[string]

	mu         sync.Mutex // guards everything below
	accepted   networkv1.ClusterNetworkSpec
	subnetA    *SubnetAllocator
	vnidA      *VNIDAllocator
	nodeSubnet map[string]netip.Prefix // node → its subnet, as the API holds it
	nsVNID     map[string]uint32       // namespace → its VNID, as the API holds it
	waiting    map[string]bool         // nodes with no subnet because the CIDRs are full
	refused    map[string]string       // "hostsubnet/<name>", "netnamespace/<name>" → the invalid value not counted (reported once)
	ready      bool
}

// New builds a controller on informers from the caller's factories (sample-controller's
// NewController shape): Nodes and Namespaces from kubeInformers; HostSubnets, NetNamespaces, the
// ClusterNetwork, Networks and NetworkSubnets from netInformers. It registers its handlers and does no I/O; Run starts the factories
// (Start is idempotent: a caller that started them already loses nothing), waits for their caches and
// runs the workers.
func New(kube kubernetes.Interface, net networkclient.Interface, kubeInformers informers.SharedInformerFactory,
	netInformers networkinformers.SharedInformerFactory, cfg Config, metrics *Metrics) (*Controller, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	rl := func(name string) workqueue.TypedRateLimitingInterface[string] {
		return workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: name})
	}
	c := &Controller{kube: kube, net: net, cfg: cfg, log: cfg.Logger.WithName("controller"), metrics: metrics, recorder: cfg.Events,
		nodeQ: rl("nodes"), nsQ: rl("namespaces"), changeQ: rl("change-network"), statusQ: rl("status"), egressQ: rl("egress"),
		nodeSubnet: map[string]netip.Prefix{}, nsVNID: map[string]uint32{}, waiting: map[string]bool{}, refused: map[string]string{},
		vnidRange: [2]uint32{networkv1.MinVNID, networkv1.MaxVNID},
		nets: networkState{queue: rl("networks"), vniRange: [2]uint32{networkv1.MinNetworkVNI, networkv1.MaxNetworkVNI},
			deleted: map[types.UID]string{}},
		factories: []interface{ Start(<-chan struct{}) }{kubeInformers, netInformers}}

	nodeInf, nsInf := kubeInformers.Core().V1().Nodes(), kubeInformers.Core().V1().Namespaces()
	net1 := netInformers.Network().V1()
	hsInf, nnInf, cnInf := net1.HostSubnets(), net1.NetNamespaces(), net1.ClusterNetworks()
	c.nodes, c.namespaces = nodeInf.Lister(), nsInf.Lister()
	if cfg.Dynamic != nil {
		var err error
		if c.admin, err = newAdminStatus(kube, cfg.Dynamic, kubeInformers, c.log); err != nil {
			return nil, err
		}
	}
	c.subnets, c.netns, c.networks = hsInf.Lister(), nnInf.Lister(), cnInf.Lister()
	enpInf := net1.EgressNetworkPolicies()
	c.egressPolicies = enpInf.Lister()
	on := func(q workqueue.TypedRateLimitingInterface[string]) cache.ResourceEventHandlerFuncs {
		return cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { q.Add(objectName(obj)) },
			UpdateFunc: func(_, obj any) { q.Add(objectName(obj)) },
			DeleteFunc: func(obj any) { q.Add(objectName(obj)) },
		}
	}
	for _, h := range []struct {
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandler
	}{
		{nodeInf.Informer(), on(c.nodeQ)},
		{hsInf.Informer(), on(c.nodeQ)}, // a HostSubnet deleted by hand comes back (syncNode)
		{nsInf.Informer(), on(c.nsQ)},
		{nnInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.nsQ.Add(objectName(obj)); c.changeQ.Add(objectName(obj)) },
			UpdateFunc: func(_, obj any) { c.changeQ.Add(objectName(obj)) },
			DeleteFunc: func(obj any) { c.nsQ.Add(objectName(obj)) },
		}},
		{cnInf.Informer(), on(c.statusQ)},
		// Egress IPs depend on NetNamespaces, HostSubnets, Nodes' readiness and the cluster network.
		{nnInf.Informer(), onKey(c.egressQ, egressIPsKey)},
		{hsInf.Informer(), onKey(c.egressQ, egressIPsKey)},
		{nodeInf.Informer(), onNodeReadiness(c.egressQ, egressIPsKey)},
		{cnInf.Informer(), onKey(c.egressQ, egressIPsKey)},
		{enpInf.Informer(), onKey(c.egressQ, egressPoliciesKey)},
	} {
		if _, err := h.informer.AddEventHandler(h.handler); err != nil {
			return nil, fmt.Errorf("controller: %w", err)
		}
		c.synced = append(c.synced, h.informer.HasSynced)
	}
	if err := c.wireNetworks(net1, nodeInf, hsInf); err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	return c, nil
}

// onKey queues one fixed key on every event of an informer.
func onKey(q workqueue.TypedRateLimitingInterface[string], key string) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { q.Add(key) },
		UpdateFunc: func(_, _ any) { q.Add(key) },
		DeleteFunc: func(any) { q.Add(key) },
	}
}

// objectName is the workqueue key of an informer's object: its name (every object here is
// cluster-scoped), also for a deletion whose final state is unknown.
func objectName(obj any) string {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Key
	}
	if m, err := meta.Accessor(obj); err == nil {
		return m.GetName()
	}
	return ""
}

// Ready reports whether the controller has rebuilt its state and is allocating.
func (c *Controller) Ready() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ready
}

// Run runs the controller until ctx ends (call it once leadership is held).
func (c *Controller) Run(ctx context.Context) error {
	defer c.nodeQ.ShutDown()
	defer c.nsQ.ShutDown()
	defer c.changeQ.ShutDown()
	defer c.statusQ.ShutDown()
	defer c.egressQ.ShutDown()
	defer c.nets.queue.ShutDown()
	if c.recorder == nil {
		broadcaster := record.NewBroadcaster(record.WithContext(ctx))
		broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.kube.CoreV1().Events("")})
		defer broadcaster.Shutdown()
		sch := runtime.NewScheme()
		_ = scheme.AddToScheme(sch)
		_ = networkv1.AddToScheme(sch)
		c.recorder = broadcaster.NewRecorder(sch, corev1.EventSource{Component: "ofsdn-controller"})
	}

	if err := c.ensureClusterNetwork(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return err
	}
	for _, f := range c.factories {
		f.Start(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil // only ctx ending stops the wait
	}
	if err := c.rebuild(); err != nil {
		return err
	}
	c.log.Info("allocators rebuilt", "subnets", c.subnetA.Used(), "subnetsTotal", c.subnetA.Total(), "vnids", len(c.vnidA.InUse()),
		"networks", len(c.nets.vni))
	var wg sync.WaitGroup
	for _, w := range []struct {
		q       workqueue.TypedRateLimitingInterface[string]
		name    string
		sync    func(context.Context, string) error
		workers int
	}{{c.nodeQ, "node", c.syncNode, c.cfg.Workers}, {c.nsQ, "namespace", c.syncNamespace, c.cfg.Workers},
		{c.changeQ, "change-network", c.syncChangeNetwork, 1}, {c.statusQ, "status", c.syncStatus, 1},
		{c.egressQ, "egress", c.syncEgress, 1},
		{c.nets.queue, "network", c.syncNetwork, c.cfg.Workers}} {
		for range w.workers {
			wg.Add(1)
			go func() { defer wg.Done(); c.work(ctx, w.q, w.name, w.sync) }()
		}
	}
	c.statusQ.Add(networkv1.ClusterNetworkName)
	c.egressQ.Add(egressIPsKey)
	c.egressQ.Add(egressPoliciesKey)
	if c.admin != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.admin.Run(ctx); err != nil {
				c.log.Error(err, "ClusterNetworkPolicy status stopped")
			}
		}()
	}
	c.mu.Lock()
	c.ready = true
	c.mu.Unlock()
	<-ctx.Done()
	c.nodeQ.ShutDown()
	c.nsQ.ShutDown()
	c.changeQ.ShutDown()
	c.statusQ.ShutDown()
	c.egressQ.ShutDown()
	c.nets.queue.ShutDown()
	wg.Wait()
	return nil
}

func (c *Controller) work(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], kind string, sync func(context.Context, string) error) {
	for {
		key, quit := q.Get()
		if quit {
			return
		}
		start := time.Now()
		err := sync(ctx, key)
		c.metrics.SyncDuration.WithLabelValues(kind).Observe(time.Since(start).Seconds())
		switch {
		case err == nil:
			q.Forget(key)
		case ctx.Err() != nil:
		default:
			c.metrics.Errors.WithLabelValues(kind).Inc()
			c.log.Error(err, "sync failed; retrying", "kind", kind, "key", key)
			q.AddRateLimited(key)
		}
		q.Done(key)
	}
}

// rebuild loads the allocators from the objects that exist: they are the record of every allocation.
func (c *Controller) rebuild() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	sa, err := allocatorFor(c.accepted)
	if err != nil {
		return err
	}
	c.subnetA, c.vnidA = sa, newVNIDAllocator(c.vnidRange[0], c.vnidRange[1])
	hss, err := c.subnets.List(labels.Everything())
	if err != nil {
		return err
	}
	for _, hs := range hss {
		c.adoptSubnetLocked(hs)
	}
	nns, err := c.netns.List(labels.Everything())
	if err != nil {
		return err
	}
	for _, nn := range nns {
		c.adoptVNIDLocked(nn)
	}
	return c.rebuildNetworksLocked()
}

// adoptSubnetLocked counts the subnet of a HostSubnet this run did not allocate — one that existed at
// start, or one another writer made since (an admin, or a previous leader's last write landing late) —
// so it is never handed out a second time. A subnet the CIDRs do not hold, or one already taken, is not
// counted and is reported once; the HostSubnet is left alone (someone may rely on it). c.mu is held.
func (c *Controller) adoptSubnetLocked(hs *networkv1.HostSubnet) {
	if _, ok := c.nodeSubnet[hs.Name]; ok {
		return
	}
	p, err := netip.ParsePrefix(string(hs.Subnet))
	if err == nil {
		err = c.subnetA.MarkAllocated(p)
	}
	if err != nil {
		if key := "hostsubnet/" + hs.Name; c.refused[key] != string(hs.Subnet) {
			c.refused[key] = string(hs.Subnet)
			c.log.Error(err, "HostSubnet not counted", "hostsubnet", hs.Name)
			c.recorder.Eventf(hs, corev1.EventTypeWarning, "InvalidSubnet", "subnet %q: %v", hs.Subnet, err)
		}
		return
	}
	delete(c.refused, "hostsubnet/"+hs.Name)
	c.nodeSubnet[hs.Name] = p
}

// adoptVNIDLocked counts the VNID of a NetNamespace this run did not allocate (as adoptSubnetLocked).
// c.mu is held.
func (c *Controller) adoptVNIDLocked(nn *networkv1.NetNamespace) {
	if _, ok := c.nsVNID[nn.Name]; ok {
		return
	}
	if err := c.vnidA.Use(nn.NetID); err != nil {
		if key := "netnamespace/" + nn.Name; c.refused[key] != fmt.Sprint(nn.NetID) {
			c.refused[key] = fmt.Sprint(nn.NetID)
			c.recorder.Eventf(nn, corev1.EventTypeWarning, "InvalidNetID", "%v", err)
		}
		return
	}
	c.nsVNID[nn.Name] = nn.NetID
}

func allocatorFor(spec networkv1.ClusterNetworkSpec) (*SubnetAllocator, error) {
	var cidrs []netip.Prefix
	for _, s := range spec.ClusterCIDRs {
		p, err := netip.ParsePrefix(string(s))
		if err != nil {
			return nil, fmt.Errorf("cluster CIDR %q: %w", s, err)
		}
		cidrs = append(cidrs, p)
	}
	return NewSubnetAllocator(cidrs, int(spec.HostSubnetLength))
}

// syncNode gives a Node a HostSubnet (hostIP = its InternalIP), keeps hostIP current, and frees the
// subnet of a Node that is gone.
func (c *Controller) syncNode(ctx context.Context, name string) error {
	node, err := c.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		return c.releaseNode(ctx, name)
	}
	if err != nil {
		return err
	}
	ip := internalIP(node)
	if !ip.IsValid() {
		return nil // no address yet: the Node's next update brings it
	}
	hs, err := c.subnets.Get(name)
	if err == nil {
		c.mu.Lock()
		c.adoptSubnetLocked(hs)
		c.mu.Unlock()
		if hs.HostIP != ip.String() {
			upd := hs.DeepCopy()
			upd.HostIP = ip.String()
			if _, err := c.net.NetworkV1().HostSubnets().Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("update HostSubnet %s: %w", name, err)
			}
			c.log.Info("node address changed", "node", name, "hostIP", ip)
		}
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return err
	}
	// A subnet the controller already holds for this node is one whose HostSubnet it created and the
	// informer does not show yet, or one whose HostSubnet was deleted (by hand, or by this controller
	// just before the node came back): create it again with that subnet, so the node's pods keep their
	// addresses; AlreadyExists means it is there.
	c.mu.Lock()
	subnet, held := c.nodeSubnet[name]
	if !held {
		var aerr error
		if subnet, aerr = c.subnetA.Allocate(); aerr != nil {
			first := !c.waiting[name]
			c.waiting[name] = true
			c.mu.Unlock()
			c.statusQ.Add(networkv1.ClusterNetworkName)
			if first {
				c.recorder.Eventf(node, corev1.EventTypeWarning, "SubnetExhausted", "no HostSubnet for node %s: %v", name, aerr)
				c.log.Info("no subnet left for node", "node", name, "err", aerr)
			}
			return nil // retried when a subnet is freed
		}
		c.nodeSubnet[name] = subnet
		delete(c.waiting, name)
	}
	c.mu.Unlock()
	hs = &networkv1.HostSubnet{ObjectMeta: metav1.ObjectMeta{Name: name}, Host: name, HostIP: ip.String(), Subnet: networkv1.CIDR(subnet.String())}
	if _, err := c.net.NetworkV1().HostSubnets().Create(ctx, hs, metav1.CreateOptions{}); err != nil {
		if held && apierrors.IsAlreadyExists(err) {
			return nil
		}
		if !held {
			c.releaseSubnet(name) // the retry allocates again (or adopts what another writer made)
		}
		return fmt.Errorf("create HostSubnet %s: %w", name, err)
	}
	if held {
		c.log.Info("recreated host subnet", "node", name, "subnet", subnet, "hostIP", ip)
		return nil
	}
	c.metrics.Allocations.WithLabelValues("subnet").Inc()
	c.log.Info("allocated host subnet", "node", name, "subnet", subnet, "hostIP", ip)
	c.statusQ.Add(networkv1.ClusterNetworkName)
	return nil
}

func (c *Controller) releaseNode(ctx context.Context, name string) error {
	if _, err := c.subnets.Get(name); err == nil {
		if err := c.net.NetworkV1().HostSubnets().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete HostSubnet %s: %w", name, err)
		}
	}
	c.mu.Lock()
	delete(c.waiting, name)
	delete(c.refused, "hostsubnet/"+name)
	c.mu.Unlock()
	if p, ok := c.releaseSubnet(name); ok {
		c.log.Info("released host subnet", "node", name, "subnet", p)
	}
	return nil
}

// releaseSubnet frees the subnet the controller holds for a node and forgets it — the node is gone, or
// the HostSubnet that recorded it could not be created — and gives the nodes waiting for a subnet
// another try.
func (c *Controller) releaseSubnet(node string) (netip.Prefix, bool) {
	c.mu.Lock()
	p, ok := c.nodeSubnet[node]
	var retry []string
	if ok {
		delete(c.nodeSubnet, node)
		c.subnetA.Release(p)
		for n := range c.waiting {
			retry = append(retry, n)
		}
	}
	c.mu.Unlock()
	if ok {
		c.statusQ.Add(networkv1.ClusterNetworkName)
	}
	for _, n := range retry {
		c.nodeQ.Add(n)
	}
	return p, ok
}

// releaseVNID drops a namespace's use of the VNID the controller holds for it and forgets it — the
// namespace is gone, or the NetNamespace that recorded it could not be created.
func (c *Controller) releaseVNID(namespace string) (uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.nsVNID[namespace]
	if ok {
		c.vnidA.Release(id)
		delete(c.nsVNID, namespace)
	}
	return id, ok
}

func internalIP(n *corev1.Node) netip.Addr {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Is4() {
				return ip
			}
		}
	}
	return netip.Addr{}
}

func (c *Controller) isGlobal(ns string) bool {
	return ns == metav1.NamespaceDefault || slices.Contains(c.cfg.GlobalNamespaces, ns)
}

// syncNamespace gives a Namespace a NetNamespace and removes the NetNamespace of a Namespace that is gone.
func (c *Controller) syncNamespace(ctx context.Context, name string) error {
	_, err := c.namespaces.Get(name)
	if apierrors.IsNotFound(err) {
		if _, err := c.netns.Get(name); err == nil {
			if err := c.net.NetworkV1().NetNamespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete NetNamespace %s: %w", name, err)
			}
		}
		c.mu.Lock()
		delete(c.refused, "netnamespace/"+name)
		c.mu.Unlock()
		if id, ok := c.releaseVNID(name); ok {
			c.log.Info("released VNID", "namespace", name, "netid", id)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if nn, err := c.netns.Get(name); err == nil {
		c.mu.Lock()
		c.adoptVNIDLocked(nn)
		c.mu.Unlock()
		return nil
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	// A VNID held already: the NetNamespace is created and not shown yet, or it was deleted by hand;
	// create it again with that VNID (as syncNode does with subnets).
	c.mu.Lock()
	id, held := c.nsVNID[name]
	if !held {
		id = networkv1.GlobalVNID
		if !c.isGlobal(name) {
			if id, err = c.vnidA.Allocate(); err != nil {
				c.mu.Unlock()
				return err
			}
		}
		c.nsVNID[name] = id
	}
	c.mu.Unlock()
	nn := &networkv1.NetNamespace{ObjectMeta: metav1.ObjectMeta{Name: name}, NetName: name, NetID: id}
	if _, err := c.net.NetworkV1().NetNamespaces().Create(ctx, nn, metav1.CreateOptions{}); err != nil {
		if held && apierrors.IsAlreadyExists(err) {
			return nil
		}
		if held {
			return fmt.Errorf("create NetNamespace %s again: %w", name, err)
		}
		c.releaseVNID(name) // the retry allocates again
		if apierrors.IsAlreadyExists(err) {
			// Another writer made it: the retry takes what the API holds once the informer shows it.
			return errors.New("NetNamespace appeared concurrently; retrying")
		}
		return fmt.Errorf("create NetNamespace %s: %w", name, err)
	}
	if held {
		c.log.Info("recreated NetNamespace", "namespace", name, "netid", id)
		return nil
	}
	c.metrics.Allocations.WithLabelValues("vnid").Inc()
	c.log.V(2).Info("allocated VNID", "namespace", name, "netid", id)
	return nil
}

// syncChangeNetwork carries out a change-network request and clears it; a malformed one is cleared with
// nothing changed and a Warning Event that says why.
func (c *Controller) syncChangeNetwork(ctx context.Context, name string) error {
	nn, err := c.netns.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	value, ok := nn.Annotations[networkv1.ChangeNetworkAnnotation]
	if !ok {
		return nil
	}
	upd := nn.DeepCopy()
	delete(upd.Annotations, networkv1.ChangeNetworkAnnotation)
	req, perr := networkv1.ParseChangeNetwork(value)
	var target uint32
	c.mu.Lock()
	c.adoptVNIDLocked(nn) // a request may come before the namespace's own sync
	old, tracked := c.nsVNID[name]
	if !tracked {
		old = nn.NetID
	}
	if perr == nil {
		switch req.Action {
		case networkv1.ChangeNetworkGlobal:
			target = networkv1.GlobalVNID
		case networkv1.ChangeNetworkIsolate:
			target, perr = c.vnidA.Allocate()
		case networkv1.ChangeNetworkJoin:
			if req.Target == name {
				perr = fmt.Errorf("change-network %q: a namespace cannot join itself", value)
			} else if other, err := c.netns.Get(req.Target); err != nil {
				perr = fmt.Errorf("change-network %q: namespace %q has no NetNamespace: %v", value, req.Target, err)
			} else {
				target = other.NetID
				perr = c.vnidA.Use(target)
			}
		}
	}
	c.mu.Unlock()
	if perr != nil {
		c.recorder.Eventf(nn, corev1.EventTypeWarning, "InvalidChangeNetwork", "%v; nothing changed", perr)
		c.log.Info("refused change-network request", "namespace", name, "request", value, "err", perr)
		if _, err := c.net.NetworkV1().NetNamespaces().Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("clear change-network on %s: %w", name, err)
		}
		return nil
	}
	upd.NetID = target
	if _, err := c.net.NetworkV1().NetNamespaces().Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		c.mu.Lock()
		c.vnidA.Release(target) // undo this attempt's claim; the retry claims again
		c.mu.Unlock()
		return fmt.Errorf("apply change-network %q to %s: %w", value, name, err)
	}
	c.mu.Lock()
	c.vnidA.Release(old)
	c.nsVNID[name] = target
	c.mu.Unlock()
	c.recorder.Eventf(nn, corev1.EventTypeNormal, "NetIDChanged", "%s: NETID %d → %d", value, old, target)
	c.log.Info("changed network", "namespace", name, "request", value, "from", old, "to", target)
	return nil
}
