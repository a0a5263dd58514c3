package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"github.com/ofsdn/ofsdn/agent/nodenet"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	networkinformers "github.com/ofsdn/ofsdn/client/informers/externalversions"
	"github.com/ofsdn/ofsdn/cni"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/atomicfile"
	"github.com/ofsdn/ofsdn/ofswitch"
	"github.com/ofsdn/ofsdn/ovsdb"
	"github.com/ofsdn/ofsdn/unixctl"
	corev1 "k8s.io/api/core/v1"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// Config configures the node agent.
type Config struct {
	NodeName      string
	RestConfig    *rest.Config // for Run; New takes clients instead
	OVSRunDir     string       // holds <bridge>.mgmt
	OVSDBEndpoint string       // e.g. unix:/var/run/openvswitch/db.sock
	Bridge        string       // br0
	DatapathType  string       // "system" or "netdev" (userspace, as in the lab)
	HostNetNS     string       // the node's network namespace; "" = the agent's own
	StateDir      string       // IPAM store and other node-local state
	CNISocket     string
	CNIConfDir    string // where the conflist is installed
	CNIBinDir     string // where the plugin binary is installed
	PluginBinary  string // the plugin to install; "" = skip installing it
	// ResyncPeriod is how often the agent compares the bridge with what it wants and repairs drift.
	ResyncPeriod time.Duration
	// AbsentPodGrace is how long after its ADD an attached pod may be missing from the API before the
	// agent releases its attachment (DefaultAbsentPodGrace).
	AbsentPodGrace time.Duration
	// UplinkLinger is how long br0's uplink port outlives a change from encapsulation none back to vxlan
	// (DefaultUplinkLinger), for peers that still send unencapsulated until they follow.
	UplinkLinger time.Duration
	// MetricsAddress serves /metrics, /healthz and /readyz ("" = not served). DebugAddress serves the
	// read-only debug API (debugapi/) over TCP for flowctl through the API server's node proxy ("" = not
	// served); DebugSocket serves it on a root-only unix socket for flowctl on the node (default
	// <ovs-rundir>/<bridge>.ofsdn.sock; "-" = not served).
	MetricsAddress string
	DebugAddress   string
	DebugSocket    string
	// Profiling adds Go's /debug/pprof/ to the metrics address: off by default, as that address is
	// unauthenticated and a CPU profile costs the node CPU.
	Profiling bool
	Logger    klog.Logger
}

func (c *Config) defaults() error {
	if c.NodeName == "" {
		return errors.New("agent: node name required")
	}
	if c.Bridge == "" {
		c.Bridge = "br0"
	}
	if c.OVSRunDir == "" {
		c.OVSRunDir = "/var/run/openvswitch"
	}
	if c.OVSDBEndpoint == "" {
		c.OVSDBEndpoint = "unix:" + filepath.Join(c.OVSRunDir, "db.sock")
	}
	if c.DatapathType == "" {
		c.DatapathType = "system"
	}
	if c.StateDir == "" {
		c.StateDir = "/var/lib/ofsdn"
	}
	if c.CNISocket == "" {
		c.CNISocket = cni.DefaultSocket
	}
	if c.ResyncPeriod == 0 {
		c.ResyncPeriod = 5 * time.Minute
	}
	if c.UplinkLinger == 0 {
		c.UplinkLinger = DefaultUplinkLinger
	}
	if c.AbsentPodGrace == 0 {
		c.AbsentPodGrace = DefaultAbsentPodGrace
	}
	if c.DebugSocket == "" {
		c.DebugSocket = DefaultDebugSocket(c.OVSRunDir, c.Bridge)
	}
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	return nil
}

// Deps are what the agent talks to. Run makes them from a Config; tests make their own (fake
// clientsets for the informer handlers, real OVS for the data path).
type Deps struct {
	Kube kubernetes.Interface
	Net  networkclient.Interface
	// DB is the node's OVSDB (bridge, ports, external_ids); only Agent.Run uses it.
	DB *ovsdb.Client
	// DialSwitch opens the OpenFlow session to the bridge, which exists by the time it is called.
	DialSwitch func(ctx context.Context) (*ofswitch.Session, error)
	// Events records Warning Events on API objects; nil: Agent.Run records through Kube.
	Events record.EventRecorder
	// Metrics; nil: a fresh registry.
	Metrics *Metrics
}

// Agent is one node's agent: informers and CNI requests feed its nodeView; flowSync renders it onto
// br0; hostSync carries it to the host (routes, nf_tables); podNetwork serves the CNI plugin.
type Agent struct {
	cfg     Config
	deps    Deps
	log     klog.Logger
	view    *nodeView
	fs      *flowSync
	host    *hostSide
	hostFwd *hostSync
	pods    *podNetwork
	metrics *Metrics
	events  record.EventRecorder
	// conflicts tells each hostPort conflict once; policyProblems each NetworkPolicy problem.
	conflicts      *conflictReporter
	policyProblems *policyProblemReporter
	// purger clears the userspace datapath's flow cache after policy changes (datapathpurge.go); nil
	// but for netdev.
	purger *datapathPurger
	// neighbors keeps ovs-vswitchd's tunnel neighbours right (tunnelneigh.go); nil but for netdev.
	neighbors *tunnelNeighbors
	// health answers /healthz, /readyz and CNI STATUS (health.go).
	health *health
	// uplink keeps br0's uplink port for encapsulation none (uplink.go); nil without OVSDB (unit tests).
	uplink *uplinkSync
	// healthChecks serves LoadBalancer services' health check node ports (healthcheck.go).
	healthChecks *healthCheckServers

	netInformers  networkinformers.SharedInformerFactory
	kubeInformers kubeinformers.SharedInformerFactory
	// handlersSynced report whether each handler has seen every object its informer listed at start.
	handlersSynced []cache.InformerSynced

	// Set by Run's first step.
	sess  *ofswitch.Session
	recon *reconcile.Reconciler
	round uint16
}

// New wires an agent: its view, the informers on every object its flows depend on and their
// handlers. It does no I/O: Run does, step by step.
func New(cfg Config, deps Deps) (*Agent, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if deps.Kube == nil || deps.Net == nil {
		return nil, errors.New("agent: Kubernetes and ofsdn API clients required")
	}
	if deps.Metrics == nil {
		deps.Metrics = NewMetrics(nil)
	}
	log := cfg.Logger.WithName("agent").WithValues("node", cfg.NodeName)
	a := &Agent{cfg: cfg, deps: deps, log: log, view: newNodeView(cfg.NodeName), host: &hostSide{}, metrics: deps.Metrics,
		events: deps.Events}
	a.conflicts = &conflictReporter{log: log.WithName("hostports")}
	a.policyProblems = &policyProblemReporter{log: log.WithName("netpol")}
	a.healthChecks = newHealthCheckServers(log)
	// The flow sync's reconciler comes with the bridge in Run; everything that feeds it exists now.
	a.fs = newFlowSync(a.view, nil, log)
	a.fs.metrics = deps.Metrics
	a.fs.onFailure = a.ownerFailed
	a.hostFwd = newHostSync(log, a.applyHost)
	if deps.DialSwitch != nil { // a real bridge: its conntrack can be read
		a.hostFwd.heldStale = a.staleHeld
	}
	a.fs.host = a.hostFwd
	a.fs.onIndexChanged = a.saveOwnerIndex
	a.health = newHealth()
	a.health.viewReady, a.health.flowLoop, a.fs.health = a.view.ready, a.fs.ping, a.health
	if err := deps.Metrics.Registry.Register(newStateCollector(a.counts)); err != nil {
		return nil, fmt.Errorf("agent: metrics: %w", err)
	}
	a.pods = &podNetwork{view: a.view, sync: a.fs, db: deps.DB, bridge: cfg.Bridge, hostNetNS: cfg.HostNetNS,
		netdev: cfg.DatapathType == "netdev", stateDir: filepath.Join(cfg.StateDir, "ipam"), log: log.WithName("cni"),
		pendingDeletes: cni.PendingDeletesDirFor(cfg.CNISocket), absentGrace: cfg.AbsentPodGrace, bridgeUp: func() bool { return a.sess != nil && a.sess.Connected() }}

	a.netInformers = networkinformers.NewSharedInformerFactory(deps.Net, 0)
	// Every pod of the cluster (NetworkPolicy peers), trimmed to what the agent reads (trimForAgent).
	a.kubeInformers = kubeinformers.NewSharedInformerFactoryWithOptions(deps.Kube, 0, kubeinformers.WithTransform(trimForAgent))
	// Restore asks it whether a restored attachment's pod still exists.
	a.pods.apiPods = apiPods{cache: a.kubeInformers.Core().V1().Pods().Informer().GetStore(), client: deps.Kube.CoreV1(), nodeName: cfg.NodeName}
	w := &watchNetwork{view: a.view, sync: a.fs, log: log}
	if cfg.DatapathType == "netdev" {
		a.neighbors = newTunnelNeighbors(cfg.HostNetNS, cfg.OVSRunDir, a.view.peers, log)
		w.newPeer = func(netip.Addr) { a.neighbors.kick() }
		if deps.DialSwitch != nil { // a real ovs-vswitchd to purge
			a.purger = newDatapathPurger(cfg.OVSRunDir)
		}
	}
	if deps.DB != nil {
		a.uplink = newUplinkSync(a.view, a.fs.trigger, uplinkNode{cfg.HostNetNS}, deps.DB, cfg.Bridge, cfg.DatapathType, cfg.UplinkLinger, log)
		a.uplink.warn = a.nodeEvent
		w.uplink = a.uplink
	}
	ws := &watchServices{view: a.view, sync: a.fs, log: log.WithName("services")}
	wp := &watchPolicies{view: a.view, sync: a.fs}
	net := a.netInformers.Network().V1()
	pods := a.kubeInformers.Core().V1().Pods().Informer()
	for _, h := range []struct {
		informer cache.SharedIndexInformer
		handle   func(obj any, deleted bool)
	}{
		{net.ClusterNetworks().Informer(), w.clusterNetwork},
		{net.HostSubnets().Informer(), w.hostSubnet},
		{net.NetNamespaces().Informer(), w.netNamespace},
		// Services and their endpoints: br0 load-balances them, no kube-proxy needed.
		{a.kubeInformers.Core().V1().Services().Informer(), ws.service},
		{a.kubeInformers.Discovery().V1().EndpointSlices().Informer(), ws.endpointSlice},
		// The pods bound to this node: their hostPorts.
		{pods, (&watchHostPorts{view: a.view, sync: a.fs}).pod},
		// NetworkPolicies and what their selectors select (every mode; enforced in networkpolicy mode).
		{pods, wp.pod},
		// Other nodes' pods: the source VNID of what arrives unencapsulated (encapsulation none).
		{pods, (&watchRemotePods{view: a.view, sync: a.fs}).pod},
		{a.kubeInformers.Core().V1().Namespaces().Informer(), wp.namespace},
		{a.kubeInformers.Networking().V1().NetworkPolicies().Informer(), wp.networkPolicy},
	} {
		reg, err := h.informer.AddEventHandler(handlers(h.handle))
		if err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		a.handlersSynced = append(a.handlersSynced, reg.HasSynced)
	}
	return a, nil
}

// Run connects the agent to the API server and the node's Open vSwitch as cfg says and runs it
// until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	if cfg.RestConfig == nil {
		return errors.New("agent: API server configuration required")
	}
	if err := checkPrerequisites(ctx, cfg, cfg.Logger.WithName("agent").WithValues("node", cfg.NodeName)); err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg.RestConfig)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	net, err := networkclient.NewForConfig(cfg.RestConfig)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	db, err := ovsdb.Connect(ctx, cfg.OVSDBEndpoint, cfg.Logger)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer db.Close()
	a, err := New(cfg, Deps{Kube: kube, Net: net, DB: db, DialSwitch: func(ctx context.Context) (*ofswitch.Session, error) {
		return ofswitch.Dial(ctx, ofswitch.Config{Socket: filepath.Join(cfg.OVSRunDir, cfg.Bridge+".mgmt"), Bridge: cfg.Bridge, Logger: cfg.Logger})
	}})
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// Run runs the agent's start-up steps in order, then serves CNI requests until ctx ends. Each step
// needs the ones before it; none deletes a flow that still forwards.
func (a *Agent) Run(ctx context.Context) error {
	if a.deps.DB == nil || a.deps.DialSwitch == nil {
		return errors.New("agent: Run needs the node's OVSDB and a way to dial its bridge")
	}
	if a.events == nil {
		broadcaster := record.NewBroadcaster(record.WithContext(ctx))
		broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.deps.Kube.CoreV1().Events("")})
		defer broadcaster.Shutdown()
		a.events = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "ofsdn-agent", Host: a.cfg.NodeName})
	}
	a.conflicts.recorder = a.events
	a.policyProblems.recorder = a.events
	defer a.healthChecks.close()
	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		{"serve metrics, health and debug", a.serveObservability},
		{"open the bridge", a.openBridge},
		{"sync informers", a.syncInformers},
		{"wait for the node's subnet", a.waitForNode},
		{"set up the node", a.setUpNode},
		{"restore pods", a.pods.restore},
		{"install this round", a.installRound},
		{"serve CNI", a.serveCNI},
	}
	for _, s := range steps {
		start := time.Now()
		a.health.setStep(s.name)
		if err := s.run(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("agent: %s: %w", s.name, err)
		}
		a.log.V(1).Info("start-up step done", "step", s.name, "took", time.Since(start))
	}
	return nil
}

// openBridge makes sure br0 exists, picks this run's round, opens the OpenFlow session and reads what
// the bridge holds, so the first sync replaces the previous round's flows in place.
func (a *Agent) openBridge(ctx context.Context) error {
	if err := a.deps.DB.EnsureBridge(ctx, ovsdb.BridgeConfig{Name: a.cfg.Bridge, DatapathType: a.cfg.DatapathType}); err != nil {
		return err
	}
	round, err := beginRound(ctx, a.deps.DB, a.cfg.Bridge)
	if err != nil {
		return err
	}
	a.round = round
	a.log = a.log.WithValues("round", round)
	a.sess, err = a.deps.DialSwitch(ctx)
	if err != nil {
		return err
	}
	context.AfterFunc(ctx, func() { _ = a.sess.Close() })
	a.recon = reconcile.New(meteredSwitch{ofswitch.FlowsSwitch(a.sess), a.metrics}, reconcile.Config{Round: round,
		PipelineVersion: pipeline.PipelineVersion, VersionOf: pipeline.VersionOf})
	a.fs.r = a.recon
	a.health.setSession(a.sess, a.recon, a.deps.DB)
	rep, err := a.recon.LoadInstalled(ctx)
	if err != nil {
		return err
	}
	a.log.Info("bridge opened", "flows", rep.Flows, "groups", rep.Groups, "undecodable", rep.Undecodable)
	if rep.Rebuild {
		a.log.Info("bridge holds flows of another pipeline version: the first sync rebuilds it in one bundle",
			"found", rep.FoundVersion, "foundNote", rep.SawVersion, "want", pipeline.PipelineVersion)
	}
	// A restarted ovs-vswitchd recreates tun0 bare (userspace OVS's internal ports are taps that die
	// with it) and has no flows: put the host side back, then replay every owner through the sync loop.
	a.sess.OnReconnect(func(ctx context.Context) error {
		if err := a.host.ensure(ctx); err != nil {
			return err
		}
		a.neighbors.kick() // a restarted ovs-vswitchd starts with an empty tunnel neighbour cache
		a.uplink.kick()    // tun0 came back with a MAC of its own
		if err := a.fs.resync(ctx, resyncReconnect); err != nil {
			return err
		}
		a.log.Info("replayed flows after reconnecting")
		return nil
	})
	return nil
}

// syncInformers starts the informers and waits until their handlers have put every object the API
// held into the view (a synced cache alone does not say the handlers ran): a partial view would delete
// flows that still serve.
func (a *Agent) syncInformers(ctx context.Context) error {
	a.netInformers.Start(ctx.Done())
	a.kubeInformers.Start(ctx.Done())
	for _, wait := range []func(<-chan struct{}) map[reflect.Type]bool{a.netInformers.WaitForCacheSync, a.kubeInformers.WaitForCacheSync} {
		for typ, ok := range wait(ctx.Done()) {
			if !ok {
				return fmt.Errorf("informer for %v did not sync", typ)
			}
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), a.handlersSynced...) {
		return errors.New("informer handlers did not sync")
	}
	return nil
}

// waitForNode waits until this node has a subnet and the cluster network is known.
func (a *Agent) waitForNode(ctx context.Context) error {
	for a.view.ready() != nil {
		a.log.Info("waiting for the node's HostSubnet and the ClusterNetwork", "reason", a.view.ready())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return nil
}

// setUpNode creates the node's OVS ports and host networking for its subnet.
func (a *Agent) setUpNode(ctx context.Context) error {
	cn, err := a.netInformers.Network().V1().ClusterNetworks().Lister().Get(networkv1.ClusterNetworkName)
	if err != nil {
		return err
	}
	vxlanPort := int(cn.Spec.VXLANPort)
	if vxlanPort == 0 {
		vxlanPort = int(networkv1.DefaultVXLANPort)
	}
	db := a.deps.DB
	if _, err := db.EnsureVXLANPort(ctx, a.cfg.Bridge, "vxlan0", vxlanPort, int(pipeline.PortVXLAN)); err != nil {
		return err
	}
	a.view.mu.Lock()
	nc := nodenet.Config{HostNetNS: a.cfg.HostNetNS, Tun0: "tun0", LocalSubnet: a.view.localSubnet, Logger: a.cfg.Logger.WithName("nodenet"),
		ClusterNetworks: append([]netip.Prefix(nil), a.view.clusterNets...), NodeIP: a.view.nodeIP}
	a.view.mu.Unlock()
	if sn, err := netip.ParsePrefix(string(cn.Spec.ServiceNetwork)); err == nil {
		nc.ServiceNetwork = sn
	}
	mtu := int(cn.Spec.MTU)
	if mtu == 0 {
		uplink, err := nodenet.UplinkMTU(a.cfg.HostNetNS, nc.NodeIP)
		if err != nil {
			return err
		}
		mtu = uplink - 50 // VXLAN overhead
	}
	nc.MTU = mtu
	a.pods.mtu = mtu
	// br0 serves services behind tun0 at link-local addresses of its own (flows/pipeline/services.go).
	nc.BridgeAddresses = []netip.Addr{pipeline.ServiceHairpinIP, pipeline.ServiceNodePortIP}
	nc.ServiceNextHop = pipeline.ServiceHairpinIP
	nc.Forwards = nodenet.Forwards{NodePortTarget: pipeline.ServiceNodePortIP, RejectPorts: [2]uint16{pipeline.RejectPortMin, pipeline.RejectPortMax}}
	nc.MasqueradePorts = [2]uint16{pipeline.MasqueradePortMin, pipeline.MasqueradePortMax}
	if _, err := db.EnsureInternalPort(ctx, a.cfg.Bridge, "tun0", int(pipeline.PortTun0), mtu); err != nil {
		return err
	}
	if err := nodenet.Ensure(ctx, nc); err != nil {
		return err
	}
	a.host.set(nc)
	go a.neighbors.run(ctx) // once vxlan0 exists: OVS snoops ARP only when it tunnels
	if a.uplink != nil {
		// Before the first sync, so a restart in encapsulation none renders the flows it had.
		if err := a.uplink.ensure(ctx); err != nil {
			a.log.Error(err, "uplink port (retried)")
		}
		go a.uplink.run(ctx)
	}
	return nil
}

// installRound installs this round's flows beside the previous round's, then deletes what older
// rounds left, then records the round: no datapath gap across a restart.
func (a *Agent) installRound(ctx context.Context) error {
	if _, err := a.fs.syncNow(ctx); err != nil {
		return fmt.Errorf("first sync: %w", err)
	}
	start := time.Now()
	res, err := a.recon.FinishRound(ctx)
	a.metrics.observeSync("round", res.Stats, time.Since(start))
	if err != nil {
		return fmt.Errorf("finish round: %w", err)
	}
	for o, ferr := range res.Failed {
		a.log.Error(ferr, "owner refused while finishing the round; it keeps its last good flows", "owner", o.String())
	}
	a.log.Info("pipeline installed", "stats", res.Stats.String())
	if err := commitRound(ctx, a.deps.DB, a.cfg.Bridge, a.round); err != nil {
		return err
	}
	a.health.setFirstSync()
	return nil
}

// serveCNI starts the sync loops and serves the CNI plugin until ctx ends.
func (a *Agent) serveCNI(ctx context.Context) error {
	srv := &cni.Server{Socket: a.cfg.CNISocket, Handler: meteredCNI{a.pods, a.metrics}, Logger: a.log.WithName("cni-server")}
	if err := srv.Listen(); err != nil {
		return err
	}
	// Listening: connections queue until Serve takes them. Ready before the conflist tells the runtime.
	a.health.setCNIListening(true)
	defer a.health.setCNIListening(false)
	if err := installCNI(a.cfg, a.pods.mtu); err != nil {
		return err
	}
	go a.fs.run(ctx)
	go a.hostFwd.run(ctx)
	go a.pods.runJanitor(ctx) // DELs the plugin left while no agent listened, from now on too
	go a.fs.resyncEvery(ctx, a.cfg.ResyncPeriod)
	go a.health.watch(ctx)
	a.health.setStep("")
	a.log.Info("agent running", "bridge", a.cfg.Bridge, "cniSocket", a.cfg.CNISocket)
	return srv.Serve(ctx)
}

// applyHost carries a synced state to the host: conntrack flushes, forwards, hostPort conflicts; and
// reports the NetworkPolicy problems the sync found.
func (a *Agent) applyHost(ctx context.Context, st pipeline.NodeState, stale []openflow.ConntrackFlush) error {
	a.policyProblems.report(a.view.problemsOfPolicies())
	// UDP and SCTP entries towards endpoints a service no longer uses would keep their clients on
	// them: flush them in br0's service zone.
	if len(stale) > 0 && a.sess != nil {
		msgs := make([][]byte, 0, len(stale))
		for _, c := range stale {
			msgs = append(msgs, openflow.EncodeConntrackFlush(pipeline.ZoneService, c))
		}
		if err := a.sess.Send(ctx, msgs); err != nil {
			a.log.Error(err, "flush stale service conntrack entries", "entries", len(stale))
		} else {
			a.log.V(2).Info("flushed stale service conntrack entries", "entries", stale)
		}
	}
	if a.purger != nil {
		if purged, err := a.purger.synced(ctx, st); err != nil {
			a.log.Error(err, "policy verdicts may lag in the datapath cache")
		} else if purged {
			a.log.V(2).Info("purged the datapath flow cache after a policy change")
		}
	}
	hostPorts, found := a.view.resolvedHostPorts()
	a.conflicts.report(found)
	if err := a.host.setForwards(nodePortsOf(st.Services), hostPorts); err != nil {
		return fmt.Errorf("NodePort and hostPort forwarding: %w", err)
	}
	// A port another process holds is told, and tried again at the next sync; it fails no flow sync.
	if err := a.healthChecks.sync(a.view.healthChecks()); err != nil {
		a.log.Error(err, "health check node ports")
	}
	return nil
}

// staleHeld reads what br0's conntrack holds in the service zone and returns the DNATed UDP and SCTP
// entries st no longer DNATs to (the start-up half of the stale-entry flush; hostSync does the rest).
func (a *Agent) staleHeld(ctx context.Context, st pipeline.NodeState) ([]openflow.ConntrackFlush, error) {
	entries, err := unixctl.New(a.cfg.OVSRunDir, "ovs-vswitchd").Conntrack(ctx, pipeline.ZoneService)
	if err != nil {
		return nil, err
	}
	held := make([]openflow.ConntrackFlush, 0, len(entries))
	for _, e := range entries {
		held = append(held, openflow.ConntrackFlush{Protocol: e.Protocol, Dst: e.Orig.Dst, DstPort: e.Orig.DstPort, ReplySrc: e.Reply.Src})
	}
	return pipeline.StaleConntrackHeld(st, held), nil
}

// saveOwnerIndex writes the owner index flowctl names flows' owners with.
func (a *Agent) saveOwnerIndex(x *reconcile.OwnerIndex) {
	data, err := json.Marshal(x)
	if err == nil {
		err = atomicfile.Write(filepath.Join(a.cfg.OVSRunDir, a.cfg.Bridge+".owners.json"), data, 0o644)
	}
	if err != nil {
		a.log.Error(err, "saving the owner index (flowctl shows owner hashes instead of names meanwhile)")
	}
}

// ownerFailed reports an owner that keeps its last good flows with a Warning Event on the API object
// it renders, if it has one (flowSync logs it and counts it in the metrics).
func (a *Agent) ownerFailed(o reconcile.Owner, fail *ownerFailure) {
	if fail.attempts > 1 || a.events == nil {
		return // one Event per failure, not per retry
	}
	if ref := ownerObject(o); ref != nil {
		a.events.Eventf(ref, corev1.EventTypeWarning, "FlowsNotInstalled",
			"ofsdn could not install this object's flows on node %s; it keeps its previous flows and retries: %v", a.cfg.NodeName, fail.err)
	}
}

// ownerObject is the API object an owner's flows render, when there is one.
func ownerObject(o reconcile.Owner) *corev1.ObjectReference {
	ns, rest, namespaced := strings.Cut(o.Name, "/")
	switch o.Category {
	case reconcile.CategoryPod:
		if namespaced {
			return &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: rest}
		}
	case reconcile.CategoryService:
		if name, _, ok := strings.Cut(rest, ":"); namespaced && ok {
			return &corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: ns, Name: name}
		}
	case reconcile.CategoryNetPol:
		if namespaced {
			return &corev1.ObjectReference{Kind: "NetworkPolicy", APIVersion: "networking.k8s.io/v1", Namespace: ns, Name: rest}
		}
	case reconcile.CategoryNode:
		return &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: o.Name}
	}
	return nil
}

// installCNI writes the conflist and copies the plugin binary into the CNI directories, atomically.
// The conflist offers CNI 1.1 through cniVersions (runtimes whose libcni knows 1.1 take it, with STATUS
// and GC) and says 1.0.0 in cniVersion for the others: containerd 1.6 and 1.7 (libcni 1.1) refuse a
// 1.1.0 result ("unsupported CNI result version"), which broke every pod on a real kubelet.
func installCNI(cfg Config, mtu int) error {
	if cfg.CNIConfDir != "" {
		conf := fmt.Sprintf(`{"cniVersion":"1.0.0","cniVersions":["1.0.0","1.1.0"],"name":"ofsdn","plugins":[{"type":"ofsdn","agentSocket":%q,"pendingDeletesDir":%q,"mtu":%d}]}`+"\n",
			cfg.CNISocket, cni.PendingDeletesDirFor(cfg.CNISocket), mtu)
		if err := atomicfile.Write(filepath.Join(cfg.CNIConfDir, "80-ofsdn.conflist"), []byte(conf), 0o644); err != nil {
			return fmt.Errorf("install CNI config: %w", err)
		}
	}
	if cfg.CNIBinDir != "" && cfg.PluginBinary != "" {
		data, err := os.ReadFile(cfg.PluginBinary)
		if err != nil {
			return fmt.Errorf("install CNI plugin: %w", err)
		}
		if err := atomicfile.Write(filepath.Join(cfg.CNIBinDir, "ofsdn"), data, 0o755); err != nil {
			return fmt.Errorf("install CNI plugin: %w", err)
		}
	}
	return nil
}
