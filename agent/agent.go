package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"reflect"
	"time"

	nadclient "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/client/clientset/versioned"
	nadinformers "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/client/informers/externalversions"
	nadlisters "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/client/listers/k8s.cni.cncf.io/v1"
	"github.com/ofsdn/ofsdn/agent/adminpolicy"
	"github.com/ofsdn/ofsdn/agent/attach"
	"github.com/ofsdn/ofsdn/agent/drops"
	"github.com/ofsdn/ofsdn/agent/egress"
	"github.com/ofsdn/ofsdn/agent/hostnet"
	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/metrics"
	"github.com/ofsdn/ofsdn/agent/networks"
	"github.com/ofsdn/ofsdn/agent/nodeapi"
	"github.com/ofsdn/ofsdn/agent/nodenet"
	"github.com/ofsdn/ofsdn/agent/policy"
	"github.com/ofsdn/ofsdn/agent/preflight"
	"github.com/ofsdn/ofsdn/agent/services"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	cnp "github.com/ofsdn/ofsdn/apis/policy/v1beta1"
	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	networkinformers "github.com/ofsdn/ofsdn/client/informers/externalversions"
	"github.com/ofsdn/ofsdn/cni"
	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/loop"
	"github.com/ofsdn/ofsdn/ofswitch"
	"github.com/ofsdn/ofsdn/ovsdb"
	"github.com/ofsdn/ofsdn/unixctl"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
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
	// agent releases its attachment (attach.DefaultAbsentPodGrace).
	AbsentPodGrace time.Duration
	// UplinkLinger is how long br0's uplink port outlives a change from encapsulation none back to vxlan
	// (hostnet.DefaultUplinkLinger), for peers that still send unencapsulated until they follow.
	UplinkLinger time.Duration
	// Egress IP membership (agent/egress): its UDP port on the node's address, the heartbeat interval,
	// and how long a silent node stays alive; zero: the defaults.
	EgressPort                      int
	EgressInterval, EgressDeadAfter time.Duration
	// EgressDNSServer (HOST:PORT) resolves EgressNetworkPolicy DNS names; "" the node's resolv.conf.
	EgressDNSServer string
	// MetricsAddress serves /metrics, /healthz and /readyz over TLS ("" = not served). DebugAddress
	// serves the read-only debug API (debugapi/) over TLS, for flowctl through the API server's node
	// proxy ("" = not served). Both answer only callers the API server authenticates and authorizes
	// (agent/nodeauth; the probes' paths are open). DebugSocket serves the debug API on a root-only unix
	// socket for flowctl on the node, its file mode its only guard (default
	// <ovs-rundir>/<bridge>.ofsdn.sock; "-" = not served).
	MetricsAddress string
	DebugAddress   string
	DebugSocket    string
	// TLSCertFile and TLSKeyFile are a serving certificate of the operator's (PEM); without them the
	// agent makes a self-signed one in <state-dir>/pki (nodeauth.SelfSignedCert).
	TLSCertFile, TLSKeyFile string
	// Profiling adds Go's /debug/pprof/ to the metrics address (off by default: a CPU profile costs the
	// node CPU); it needs nodes/pprof of network.ofsdn.io like any other caller's request.
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
		c.UplinkLinger = hostnet.DefaultUplinkLinger
	}
	if c.AbsentPodGrace == 0 {
		c.AbsentPodGrace = attach.DefaultAbsentPodGrace
	}
	if c.DebugSocket == "" {
		c.DebugSocket = debugapi.DefaultSocket(c.OVSRunDir, c.Bridge)
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
	// NAD reads NetworkAttachmentDefinitions (pods' requests for Networks); nil: pods asking for
	// Networks by annotation are refused, and meta-plugins' ADDs still work.
	NAD nadclient.Interface
	// Events records Warning Events on API objects; nil: Agent.Run records through Kube.
	Events record.EventRecorder
	// Dynamic reads ClusterNetworkPolicies (adminpolicy.Watch); nil: they are not watched.
	Dynamic dynamic.Interface
	// Metrics; nil: a fresh registry.
	Metrics *metrics.Metrics
	// Reviews makes the TokenReviews and SubjectAccessReviews that guard the node API; nil: Kube. Run
	// gives it a client of its own, so callers with bad tokens cannot use up the agent's request rate.
	Reviews kubernetes.Interface
}

// Agent is one node's agent: informers and CNI requests feed its nodeView; flowSync renders it onto
// br0; hostSync carries it to the host (routes, nf_tables); attach.Handler serves the CNI plugin.
type Agent struct {
	cfg     Config
	deps    Deps
	log     klog.Logger
	view    *nodeView
	fs      *flowSync
	host    *hostSide
	hostFwd *hostSync
	pods    *attach.Handler
	metrics *metrics.Metrics
	events  record.EventRecorder
	// eventBroadcaster sends events to the API server once Run starts it (nil: Deps.Events records).
	eventBroadcaster record.EventBroadcaster
	// conflicts tells each hostPort conflict once; policyProblems each NetworkPolicy problem.
	conflicts      *hostnet.HostPortConflicts
	policyProblems *policy.ProblemReporter
	// purger clears the userspace datapath's flow cache after policy changes (hostnet/purge.go); nil
	// but for netdev.
	purger *hostnet.DatapathPurger
	// neighbors keeps ovs-vswitchd's tunnel neighbours right (hostnet/neighbors.go); nil but for netdev.
	neighbors *hostnet.TunnelNeighbors
	// health answers /healthz, /readyz and CNI STATUS (health.go).
	health *health
	// uplink keeps br0's uplink port for encapsulation none (hostnet/uplink.go); nil without OVSDB (unit tests).
	uplink *hostnet.Uplink
	// egress holds and moves egress IPs with the other nodes, records them, resolves the firewalls'
	// names (agent/egress).
	egress *egress.Node
	// netReport writes NetworkSubnet status and pods' network-status (agent/networks); routes keeps
	// running pods' cross-talk routes in step with their Networks (syncRoutes).
	netReport *networks.Reporter
	routes    *loop.Loop
	// nadInformers watch NetworkAttachmentDefinitions when the cluster has them; the agent does not wait
	// for them to sync (the CNI side asks the API server meanwhile).
	nadInformers nadinformers.SharedInformerFactory
	// healthChecks serves LoadBalancer services' health check node ports (services/healthcheck.go).
	healthChecks *services.HealthCheckServers

	netInformers  networkinformers.SharedInformerFactory
	kubeInformers kubeinformers.SharedInformerFactory
	// handlersSynced report whether each handler has seen every object its informer listed at start.
	handlersSynced []cache.InformerSynced
	// adminInformers watch ClusterNetworkPolicies (nil without Deps.Dynamic); started only when the API
	// server serves them (adminpolicy.Watch); adminSynced like handlersSynced.
	adminInformers dynamicinformer.DynamicSharedInformerFactory
	adminSynced    []cache.InformerSynced

	// Where the metrics and debug servers listen (serveObservability), "" when not served.
	listening nodeapi.Listening

	// drops turns the drop flows' samples into records (agent/drops): the OpenFlow session hands it
	// packet-ins, it decodes them against the last synced state (dropSnapshot), the debug API streams
	// its ring.
	drops *drops.Sampler

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
		deps.Metrics = metrics.New(nil)
	}
	log := cfg.Logger.WithName("agent").WithValues("node", cfg.NodeName)
	// The egress inputs come first: the view fills its snapshots from them, egress.Node changes them.
	egressInputs := egress.NewInputs(uint16(cmp.Or(cfg.EgressPort, egress.DefaultPort)))
	a := &Agent{cfg: cfg, deps: deps, log: log, view: newNodeView(cfg.NodeName, egressInputs), host: &hostSide{}, metrics: deps.Metrics,
		events: deps.Events}
	if a.events == nil {
		// Recorded to the API server once Run starts the broadcaster.
		a.eventBroadcaster = record.NewBroadcaster()
		a.events = a.eventBroadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "ofsdn-agent", Host: cfg.NodeName})
	}
	a.conflicts = hostnet.NewHostPortConflicts(a.events, log.WithName("hostports"))
	a.policyProblems = policy.NewProblemReporter(a.events, log.WithName("netpol"))
	a.healthChecks = services.NewHealthCheckServers(log)
	var heldStale func(context.Context, pipeline.NodeState) ([]openflow.ConntrackFlush, error)
	if deps.DialSwitch != nil { // a real bridge: its conntrack can be read
		heldStale = a.staleHeld
	}
	a.hostFwd = newHostSync(log, a.applyHost, heldStale)
	// The flow sync's reconciler comes with the bridge (openBridge); everything that feeds it exists now.
	a.fs = newFlowSync(a.view, nil, flowSyncHooks{metrics: deps.Metrics, host: a.hostFwd, onFailure: a.ownerFailed,
		onIndexChanged: a.saveOwnerIndex, onAdmin: adminpolicy.NewReporter(cfg.NodeName, a.events, log.WithName("cnp"), time.Now).Report}, log)
	a.health = newHealth(a.view.Ready, a.fs.loop)
	a.drops = drops.NewSampler(deps.Metrics.Registry, a.dropSnapshot)
	if err := deps.Metrics.Registry.Register(metrics.NewStateCollector(a.counts)); err != nil {
		return nil, fmt.Errorf("agent: metrics: %w", err)
	}
	a.netInformers = networkinformers.NewSharedInformerFactory(deps.Net, 0)
	// Every pod of the cluster (NetworkPolicy peers), trimmed to what the agent reads (k8sobj.Trim).
	a.kubeInformers = kubeinformers.NewSharedInformerFactoryWithOptions(deps.Kube, 0, kubeinformers.WithTransform(k8sobj.Trim))
	var ovs *unixctl.Client // the userspace datapath's tunnels' next hops
	if cfg.DatapathType == "netdev" {
		ovs = unixctl.New(cfg.OVSRunDir, "ovs-vswitchd")
	}
	a.egress = egress.NewNode(egress.NodeConfig{NodeName: cfg.NodeName, HostNetNS: cfg.HostNetNS, StateDir: cfg.StateDir,
		Interval: cfg.EgressInterval, DeadAfter: cfg.EgressDeadAfter, DNSServer: cfg.EgressDNSServer, OVS: ovs, Logger: log},
		egress.NodeDeps{Inputs: egressInputs, View: a.view, Sync: a.fs, Net: deps.Net, Events: a.events,
			NetNamespaces: a.netInformers.Network().V1().NetNamespaces().Lister()})
	a.netReport = networks.NewReporter(cfg.NodeName, deps.Net, deps.Kube, a.view, log)
	var nads nadlisters.NetworkAttachmentDefinitionLister
	var nadsSynced cache.InformerSynced
	if deps.NAD != nil {
		a.nadInformers = nadinformers.NewSharedInformerFactory(deps.NAD, 0)
		informer := a.nadInformers.K8sCniCncfIo().V1().NetworkAttachmentDefinitions()
		nads, nadsSynced = informer.Lister(), informer.Informer().HasSynced
	}
	requests := &networks.PodRequests{Placements: a.view, Pods: a.kubeInformers.Core().V1().Pods().Informer().GetStore(), Kube: deps.Kube,
		NAD: deps.NAD, NADs: nads, NADsSynced: nadsSynced, Log: log.WithName("networks")}
	a.pods = attach.New(attach.Config{Bridge: cfg.Bridge, HostNetNS: cfg.HostNetNS, Netdev: cfg.DatapathType == "netdev",
		StateDir: filepath.Join(cfg.StateDir, "ipam"), NetworksDir: filepath.Join(cfg.StateDir, "networks"),
		PendingDeletes: cni.PendingDeletesDirFor(cfg.CNISocket), AbsentGrace: cfg.AbsentPodGrace, Logger: log.WithName("cni")},
		attach.Deps{Node: a.view, Flows: a.egress.PodFlows(), DB: deps.DB, Readiness: a.health.Ready,
			BridgeUp: func() bool { return a.sess != nil && a.sess.Connected() },
			// Restore asks the pod informer (then the API server) whether a restored attachment's pod exists.
			Pods:     attach.APIPods{Cache: a.kubeInformers.Core().V1().Pods().Informer().GetStore(), Client: deps.Kube.CoreV1(), NodeName: cfg.NodeName},
			Networks: requests, Warn: a.podEvent, Changed: a.netReport.Kick})
	a.routes = loop.New(loop.Config{Name: "network-routes", Period: time.Minute, Log: log.WithName("networks"),
		Quiet: func(err error) bool { return errors.Is(err, errNotReady) }}, a.syncRoutes)
	var newPeer func(netip.Addr)
	if cfg.DatapathType == "netdev" {
		a.neighbors = hostnet.NewTunnelNeighbors(hostnet.Node{NetNS: cfg.HostNetNS}, ovs, a.view.peers, log)
		newPeer = func(netip.Addr) { a.neighbors.Kick() }
		if deps.DialSwitch != nil { // a real ovs-vswitchd to purge
			a.purger = hostnet.NewDatapathPurger(cfg.OVSRunDir)
		}
	}
	if deps.DB != nil {
		a.uplink = hostnet.NewUplink(hostnet.UplinkConfig{Bridge: cfg.Bridge, Datapath: cfg.DatapathType, Linger: cfg.UplinkLinger, Logger: log},
			hostnet.UplinkDeps{View: a.view, Host: hostnet.Node{NetNS: cfg.HostNetNS}, OVS: deps.DB, Changed: a.fs.Trigger, Warn: a.nodeEvent})
	}
	w := &watchNetwork{view: a.view, sync: a.fs, log: log, newPeer: newPeer, uplink: a.uplink}
	netObjects, netSubnets, netNamespaces := (&networks.Watch{View: a.view, Sync: a.fs, Log: log.WithName("networks"),
		Changed: func() { a.routes.Kick(); a.netReport.Kick() }}).Handlers()
	svcHandlers, sliceHandlers := (&services.Watch{View: a.view, Sync: a.fs}).Handlers()
	egressNetNamespaces, egressHostSubnets, egressPolicies, egressClusterNetworks := a.egress.Handlers()
	policyPods, policyNamespaces, policies := (&policy.Watch{View: a.view, Sync: a.fs}).Handlers()
	adminPods, adminNamespaces, adminNodes, adminPolicies := (&adminpolicy.Watch{View: a.view, Sync: a.fs, Log: log.WithName("cnp")}).Handlers()
	net := a.netInformers.Network().V1()
	pods := a.kubeInformers.Core().V1().Pods().Informer()
	for _, h := range []struct {
		informer cache.SharedIndexInformer
		handlers cache.ResourceEventHandlerFuncs
	}{
		{net.ClusterNetworks().Informer(), k8sobj.Handlers(w.clusterNetwork)},
		{net.HostSubnets().Informer(), k8sobj.Handlers(w.hostSubnet)},
		{net.NetNamespaces().Informer(), k8sobj.Handlers(w.netNamespace)},
		// Networks: their objects, node subnets, and the namespaces' labels their selectors read.
		{net.Networks().Informer(), netObjects},
		{net.NetworkSubnets().Informer(), netSubnets},
		{a.kubeInformers.Core().V1().Namespaces().Informer(), netNamespaces},
		// Services and their endpoints: br0 load-balances them, no kube-proxy needed.
		{a.kubeInformers.Core().V1().Services().Informer(), svcHandlers},
		{a.kubeInformers.Discovery().V1().EndpointSlices().Informer(), sliceHandlers},
		// The pods bound to this node: their hostPorts.
		{pods, (&hostnet.WatchHostPorts{View: a.view, Sync: a.fs}).Handlers()},
		// NetworkPolicies and what their selectors select (every mode; enforced in networkpolicy mode).
		{pods, policyPods},
		// Other nodes' pods: the source VNID of what arrives unencapsulated (encapsulation none).
		{pods, k8sobj.Handlers((&watchRemotePods{view: a.view, sync: a.fs}).pod)},
		{a.kubeInformers.Core().V1().Namespaces().Informer(), policyNamespaces},
		{a.kubeInformers.Networking().V1().NetworkPolicies().Informer(), policies},
		// Egress IPs and firewalls (agent/egress).
		{net.NetNamespaces().Informer(), egressNetNamespaces},
		{net.HostSubnets().Informer(), egressHostSubnets},
		{net.EgressNetworkPolicies().Informer(), egressPolicies},
		{net.ClusterNetworks().Informer(), egressClusterNetworks},
		// ClusterNetworkPolicies' pods, namespaces and nodes (the policies: below).
		{pods, adminPods},
		{a.kubeInformers.Core().V1().Namespaces().Informer(), adminNamespaces},
		{a.kubeInformers.Core().V1().Nodes().Informer(), adminNodes},
	} {
		reg, err := h.informer.AddEventHandler(h.handlers)
		if err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		a.handlersSynced = append(a.handlersSynced, reg.HasSynced)
	}
	if deps.Dynamic != nil {
		a.adminInformers = dynamicinformer.NewDynamicSharedInformerFactory(deps.Dynamic, 0)
		reg, err := a.adminInformers.ForResource(cnp.Resource).Informer().AddEventHandler(adminPolicies)
		if err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		a.adminSynced = append(a.adminSynced, reg.HasSynced)
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
	pc := preflight.Config{OVSDBEndpoint: cfg.OVSDBEndpoint, OVSRunDir: cfg.OVSRunDir, Bridge: cfg.Bridge, DatapathType: cfg.DatapathType}
	if err := preflight.Check(ctx, pc, cfg.Logger.WithName("agent").WithValues("node", cfg.NodeName)); err != nil {
		return err
	}
	rc := rest.CopyConfig(cfg.RestConfig)
	if rc.QPS == 0 {
		// client-go's default (5/s, bursts of 10) would queue a node's pod-start burst behind its own
		// writes: a pod the informer has not seen yet is read from the API server by its ADD (its
		// networks), and each attached pod gets its network-status. Reads of this rate are the
		// kubelet's order, per node.
		rc.QPS, rc.Burst = 50, 100
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	net, err := networkclient.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg.RestConfig)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	db, err := ovsdb.Connect(ctx, cfg.OVSDBEndpoint, cfg.Logger)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer db.Close()
	nad, err := nadclient.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	rr := rest.CopyConfig(cfg.RestConfig)
	rr.QPS, rr.Burst = nodeapi.ReviewQPS, nodeapi.ReviewBurst
	reviews, err := kubernetes.NewForConfig(rr)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	var a *Agent
	a, err = New(cfg, Deps{Kube: kube, Net: net, NAD: nad, Dynamic: dyn, DB: db, Reviews: reviews, DialSwitch: func(ctx context.Context) (*ofswitch.Session, error) {
		return ofswitch.Dial(ctx, ofswitch.Config{Socket: filepath.Join(cfg.OVSRunDir, cfg.Bridge+".mgmt"), Bridge: cfg.Bridge, Logger: cfg.Logger,
			OnPacketIn: a.drops.PacketIn}) // never blocks the OpenFlow reader
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
	if a.eventBroadcaster != nil {
		a.eventBroadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.deps.Kube.CoreV1().Events("")})
		defer a.eventBroadcaster.Shutdown()
	}
	defer a.healthChecks.Close()
	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		{"serve metrics, health and debug", a.serveObservability},
		{"open the bridge", a.openBridge},
		{"sync informers", a.syncInformers},
		{"wait for the node's subnet", a.waitForNode},
		{"set up the node", a.setUpNode},
		{"restore pods", a.pods.Restore},
		{"restore egress IPs", a.egress.Restore},
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

// serveObservability binds the metrics and debug listeners and serves them until ctx ends
// (agent/nodeapi). It is the first start-up step: liveness answers while the rest starts, and a port
// taken is a clear error.
func (a *Agent) serveObservability(ctx context.Context) error {
	reviews := a.deps.Reviews
	if reviews == nil {
		reviews = a.deps.Kube
	}
	var ports nodeapi.PortDB
	if a.deps.DB != nil {
		ports = a.deps.DB
	}
	var dropStream debugapi.DropStreamer
	if a.drops != nil {
		dropStream = a.drops
	}
	var err error
	a.listening, err = nodeapi.Serve(ctx, nodeapi.Config{NodeName: a.cfg.NodeName, Bridge: a.cfg.Bridge, OVSRunDir: a.cfg.OVSRunDir,
		StateDir: a.cfg.StateDir, MetricsAddress: a.cfg.MetricsAddress, DebugAddress: a.cfg.DebugAddress, DebugSocket: a.cfg.DebugSocket,
		TLSCertFile: a.cfg.TLSCertFile, TLSKeyFile: a.cfg.TLSKeyFile, Logger: a.log},
		nodeapi.Deps{Metrics: a.metricsHandler(), Agent: nodeAPIAgent{a}, Ports: ports, Drops: dropStream, Reviews: reviews})
	if err == nil && a.listening.Metrics != "" && a.cfg.Profiling {
		a.log.Info("serving /debug/pprof/ on the metrics address", "address", a.listening.Metrics)
	}
	return err
}

// nodeAPIAgent is the agent as the debug API reads it (nodeapi.Agent).
type nodeAPIAgent struct{ a *Agent }

func (n nodeAPIAgent) Bridge() (*ofswitch.Session, *reconcile.Reconciler, string) {
	sess, r, _ := n.a.health.parts()
	return sess, r, n.a.health.currentStep()
}

func (n nodeAPIAgent) State() (pipeline.NodeState, error) {
	if err := n.a.view.Ready(); err != nil {
		return pipeline.NodeState{}, err
	}
	if last, ok := n.a.fs.lastSynced(); ok {
		return last.state, nil // what br0 holds, policies resolved
	}
	return n.a.view.snapshot().state, nil
}

func (n nodeAPIAgent) VNIDs() map[string]uint32 { return n.a.view.namespaceVNIDs() }

func (n nodeAPIAgent) ServiceNetwork() netip.Prefix {
	cn, err := n.a.netInformers.Network().V1().ClusterNetworks().Lister().Get(networkv1.ClusterNetworkName)
	if err != nil {
		return netip.Prefix{}
	}
	sn, _ := netip.ParsePrefix(string(cn.Spec.ServiceNetwork))
	return sn
}

func (n nodeAPIAgent) NetAttachments() []nodeapi.NetAttachment {
	return n.a.view.netAttachmentStatuses()
}

// dropSnapshot is what the next sample is decoded against; nil before the first sync.
func (a *Agent) dropSnapshot() *drops.Snapshot {
	last, ok := a.fs.lastSynced()
	if !ok {
		return nil
	}
	snap := &drops.Snapshot{Node: a.cfg.NodeName, State: last.state}
	if _, r, _ := a.health.parts(); r != nil {
		idx := r.OwnerIndex()
		snap.Owners = func(c reconcile.Cookie) []reconcile.Owner { return idx.Lookup(c) }
	}
	return snap
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
	// The drop flows' meters, before any flow names them (a flow naming a missing meter is not
	// metered). A datapath without meters still forwards: the samples then reach the agent unmetered,
	// and the sampler's own limit (drops.MaxSampleRate) is all that bounds them.
	if err := a.sess.SetMeters(ctx, pipeline.DropMeters()); err != nil {
		a.log.Error(err, "drop sampling runs unmetered: the bridge refused the drop flows' meters", "agentLimit", drops.MaxSampleRate)
	}
	go a.drops.Run(ctx)
	a.recon = reconcile.New(metrics.Switch{Switch: ofswitch.FlowsSwitch(a.sess), M: a.metrics}, reconcile.Config{Round: round,
		PipelineVersion: pipeline.PipelineVersion, VersionOf: pipeline.VersionOf})
	a.fs.useBridge(a.recon)
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
		if err := a.sess.SetMeters(ctx, pipeline.DropMeters()); err != nil {
			a.log.Error(err, "drop sampling runs unmetered: the bridge refused the drop flows' meters", "agentLimit", drops.MaxSampleRate)
		}
		a.neighbors.Kick() // a restarted ovs-vswitchd starts with an empty tunnel neighbour cache
		a.uplink.Kick()    // tun0 came back with a MAC of its own
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
	if a.nadInformers != nil {
		a.nadInformers.Start(ctx.Done()) // not waited for: see networks.PodRequests
	}
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
	return a.syncAdminInformers(ctx)
}

// syncAdminInformers starts the ClusterNetworkPolicy informer when the API server serves the resource
// and waits for its handler, like syncInformers: a first sync without the policies would delete the
// Deny flows a restarted agent's bridge still holds. Without the CRD nothing is enforced, and a log
// line says so (installing it later needs an agent restart).
func (a *Agent) syncAdminInformers(ctx context.Context) error {
	if a.adminInformers == nil {
		return nil
	}
	served, err := adminpolicy.Served(ctx, a.deps.Kube.Discovery())
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if !served {
		a.log.Info("ClusterNetworkPolicy is not served by the API server (its CRD is not installed): not enforced")
		return nil
	}
	a.adminInformers.Start(ctx.Done())
	for typ, ok := range a.adminInformers.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), a.adminSynced...) {
		return errors.New("ClusterNetworkPolicy handler did not sync")
	}
	return nil
}

// waitForNode waits until this node has a subnet and the cluster network is known.
func (a *Agent) waitForNode(ctx context.Context) error {
	for a.view.Ready() != nil {
		a.log.Info("waiting for the node's HostSubnet and the ClusterNetwork", "reason", a.view.Ready())
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
	if _, err := db.EnsureVXLANPort(ctx, a.cfg.Bridge, pipeline.PortNameVXLAN, vxlanPort, int(pipeline.PortVXLAN)); err != nil {
		return err
	}
	a.view.update(func(v *nodeView) { v.vxlan0Port = uint16(vxlanPort) })
	nodeIP, subnet, clusterNets := a.view.addressing()
	nc := nodenet.Config{HostNetNS: a.cfg.HostNetNS, Tun0: pipeline.PortNameTun0, LocalSubnet: subnet, Logger: a.cfg.Logger.WithName("nodenet"),
		ClusterNetworks: clusterNets, NodeIP: nodeIP}
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
	a.view.update(func(v *nodeView) { v.mtu = mtu })
	// br0 serves services behind tun0 at link-local addresses of its own (flows/pipeline/services.go).
	nc.BridgeAddresses = []netip.Addr{pipeline.ServiceHairpinIP, pipeline.ServiceNodePortIP}
	nc.ServiceNextHop = pipeline.ServiceHairpinIP
	nc.Forwards = nodenet.Forwards{NodePortTarget: pipeline.ServiceNodePortIP, RejectPorts: [2]uint16{pipeline.RejectPortMin, pipeline.RejectPortMax}}
	nc.MasqueradePorts = [2]uint16{pipeline.MasqueradePortMin, pipeline.MasqueradePortMax}
	if _, err := db.EnsureInternalPort(ctx, a.cfg.Bridge, pipeline.PortNameTun0, int(pipeline.PortTun0), mtu); err != nil {
		return err
	}
	if err := nodenet.Ensure(ctx, nc); err != nil {
		return err
	}
	a.host.set(nc)
	go a.neighbors.Run(ctx) // once vxlan0 exists: OVS snoops ARP only when it tunnels
	if a.uplink != nil {
		// Before the first sync, so a restart in encapsulation none renders the flows it had.
		if err := a.uplink.Ensure(ctx); err != nil {
			a.log.Error(err, "uplink port (retried)")
		}
		go a.uplink.Run(ctx)
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
	a.metrics.ObserveSync("round", res.Stats, time.Since(start))
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
	srv := &cni.Server{Socket: a.cfg.CNISocket, Handler: metrics.CNIHandler{Handler: a.pods, M: a.metrics}, Logger: a.log.WithName("cni-server")}
	if err := srv.Listen(); err != nil {
		return err
	}
	// Listening: connections queue until Serve takes them. Ready before the conflist tells the runtime.
	a.health.setCNIListening(true)
	defer a.health.setCNIListening(false)
	_, _, mtu := a.view.Subnet()
	install := cni.Install{ConfDir: a.cfg.CNIConfDir, BinDir: a.cfg.CNIBinDir, Plugin: a.cfg.PluginBinary, Socket: a.cfg.CNISocket, MTU: mtu}
	if err := install.Write(); err != nil {
		return err
	}
	go a.fs.run(ctx)
	go a.hostFwd.run(ctx)
	go a.pods.RunJanitor(ctx) // DELs the plugin left while no agent listened, from now on too
	go a.fs.driftChecks(a.cfg.ResyncPeriod).Run(ctx)
	go a.netReport.Run(ctx)
	go a.routes.Run(ctx)
	go a.health.watch(ctx)
	go a.egress.Run(ctx)
	a.health.setStep("")
	a.log.Info("agent running", "bridge", a.cfg.Bridge, "cniSocket", a.cfg.CNISocket)
	return srv.Serve(ctx)
}

// nodeEvent records a Warning Event on this node's Node object.
func (a *Agent) nodeEvent(reason, message string) {
	if a.events == nil {
		return
	}
	a.events.Eventf(&corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: a.cfg.NodeName}, corev1.EventTypeWarning, reason, "%s", message)
}

// podEvent records an Event on a pod.
func (a *Agent) podEvent(namespace, name, reason, message string) {
	if a.events == nil {
		return
	}
	a.events.Eventf(&corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: namespace, Name: name}, corev1.EventTypeWarning, reason, "%s", message)
}

// syncRoutes is the routes loop's job.
func (a *Agent) syncRoutes(ctx context.Context) (time.Duration, error) {
	if err := a.view.Ready(); err != nil {
		return 0, err
	}
	err := a.pods.SyncRoutes(ctx)
	if errors.Is(err, context.Canceled) {
		return 0, nil
	}
	return 0, err
}

// counts reads the state gauges.
func (a *Agent) counts() metrics.NodeCounts {
	n := metrics.NodeCounts{Flows: map[reconcile.Category]int{}, Groups: map[reconcile.Category]int{}}
	sess, r, db := a.health.parts()
	if r != nil {
		for cat, c := range r.Counts() {
			n.Flows[cat], n.Groups[cat] = c.Flows, c.Groups
		}
	}
	if sess != nil {
		n.OpenFlowUp, n.OpenFlowConnections = sess.Connected(), 1+sess.Reconnects()
	}
	if db != nil {
		n.OVSDBUp = db.Connected()
	}
	n.Pods, n.Services, n.RemoteNodes = a.view.sizes()
	n.Ready = a.health.Ready() == nil
	return n
}
