package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/ofsdn/ofsdn/agent/nodenet"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	networkinformers "github.com/ofsdn/ofsdn/client/informers/externalversions"
	"github.com/ofsdn/ofsdn/cni"
	"github.com/ofsdn/ofsdn/flows"
	"github.com/ofsdn/ofsdn/ofswitch"
	"github.com/ofsdn/ofsdn/ovsdb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// Config configures the node agent.
type Config struct {
	NodeName      string
	RestConfig    *rest.Config
	OVSRunDir     string // holds <bridge>.mgmt
	OVSDBEndpoint string // e.g. unix:/var/run/openvswitch/db.sock
	Bridge        string // br0
	DatapathType  string // "system" or "netdev" (userspace, as in the lab)
	HostNetNS     string // the node's network namespace; "" = the agent's own
	StateDir      string // IPAM store and other node-local state
	CNISocket     string
	CNIConfDir    string // where the conflist is installed
	CNIBinDir     string // where the plugin binary is installed
	PluginBinary  string // the plugin to install; "" = skip installing it
	ResyncPeriod  time.Duration
	Logger        klog.Logger
}

func (c *Config) defaults() error {
	if c.NodeName == "" {
		return errors.New("agent: node name required")
	}
	if c.RestConfig == nil {
		return errors.New("agent: API server configuration required")
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
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	return nil
}

// Run runs the agent until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	log := cfg.Logger.WithName("agent").WithValues("node", cfg.NodeName)
	netClient, err := networkclient.NewForConfig(cfg.RestConfig)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	kubeClient, err := kubernetes.NewForConfig(cfg.RestConfig)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	view := newNodeView(cfg.NodeName)

	// The cluster's configuration comes first: the VXLAN port and the MTU depend on it.
	factory := networkinformers.NewSharedInformerFactory(netClient, 0)
	informers := factory.Network().V1()
	db, err := ovsdb.Connect(ctx, cfg.OVSDBEndpoint, log)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer db.Close()

	// The bridge, and the round this run stamps into cookies.
	if err := db.EnsureBridge(ctx, ovsdb.BridgeConfig{Name: cfg.Bridge, DatapathType: cfg.DatapathType}); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	round, err := beginRound(ctx, db, cfg.Bridge)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	log = log.WithValues("round", round)
	sess, err := ofswitch.Dial(ctx, ofswitch.Config{Socket: filepath.Join(cfg.OVSRunDir, cfg.Bridge+".mgmt"), Bridge: cfg.Bridge, Logger: log})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer sess.Close()
	r := flows.NewReconciler(ofswitch.FlowsSwitch(sess), flows.ReconcilerConfig{Round: round, PipelineVersion: flows.PipelineVersion,
		OwnerIndexPath: filepath.Join(cfg.OVSRunDir, cfg.Bridge+".owners.json"), Logger: log})
	if err := r.LoadInstalled(ctx); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	fs := newFlowSync(view, r, log)
	// A restarted ovs-vswitchd recreates tun0 bare (userspace OVS's internal ports are taps that die with
	// it) and has no flows: put the host side back, then replay every owner.
	host := &hostSide{}
	// A userspace datapath drops the first packet to a tunnel peer it has not learnt (shared/LAB.md).
	netdev := cfg.DatapathType == "netdev"
	resolvePeer := func(peer netip.Addr) {
		if err := nodenet.ResolveNeighbor(cfg.HostNetNS, peer); err != nil {
			log.V(2).Info("tunnel peer warm-up failed", "peer", peer, "err", err)
		}
	}
	sess.OnReconnect(func(ctx context.Context) error {
		if err := host.ensure(ctx); err != nil {
			return err
		}
		if netdev {
			for _, peer := range view.peers() {
				resolvePeer(peer)
			}
		}
		st, err := r.ResyncFromSwitch(ctx)
		if err == nil {
			log.Info("replayed flows after reconnecting", "stats", st.String())
		}
		return err
	})
	pods := &podNetwork{view: view, sync: fs, db: db, bridge: cfg.Bridge, hostNetNS: cfg.HostNetNS,
		netdev: cfg.DatapathType == "netdev", stateDir: filepath.Join(cfg.StateDir, "ipam"), log: log.WithName("cni")}

	w := &watchNetwork{view: view, sync: fs, log: log}
	if netdev {
		w.newPeer = resolvePeer
	}
	_, _ = informers.ClusterNetworks().Informer().AddEventHandler(w.handlers(w.clusterNetwork))
	_, _ = informers.HostSubnets().Informer().AddEventHandler(w.handlers(w.hostSubnet))
	_, _ = informers.NetNamespaces().Informer().AddEventHandler(w.handlers(w.netNamespace))
	// Services and their endpoints: br0 load-balances them, no kube-proxy needed. The pods bound to
	// this node: their hostPorts.
	kubeFactory := kubeinformers.NewSharedInformerFactory(kubeClient, 0)
	localPods := kubeinformers.NewSharedInformerFactoryWithOptions(kubeClient, 0, kubeinformers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	}))
	_, _ = localPods.Core().V1().Pods().Informer().AddEventHandler(w.handlers((&watchHostPorts{view: view, sync: fs}).pod))
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kubeClient.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	conflicts := &conflictReporter{log: log.WithName("hostports"),
		recorder: broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "ofsdn-agent", Host: cfg.NodeName})}
	fs.afterSync = func(ctx context.Context, prev, cur flows.NodeState) {
		// UDP and SCTP entries towards endpoints a service no longer uses would keep their clients
		// on them: flush them in br0's service zone.
		if stale := flows.StaleConntrack(prev, cur); len(stale) > 0 {
			msgs := make([][]byte, 0, len(stale))
			for _, c := range stale {
				msgs = append(msgs, flows.EncodeConntrackFlush(flows.ZoneService, c))
			}
			if err := sess.Send(ctx, msgs); err != nil {
				log.Error(err, "flush stale service conntrack entries", "entries", len(stale))
			} else {
				log.V(2).Info("flushed stale service conntrack entries", "entries", stale)
			}
		}
		hostPorts, found := view.resolvedHostPorts()
		conflicts.report(found)
		if err := host.setForwards(nodePortsOf(cur.Services), hostPorts); err != nil {
			log.Error(err, "NodePort and hostPort forwarding")
		}
	}
	ws := &watchServices{view: view, sync: fs, log: log.WithName("services")}
	_, _ = kubeFactory.Core().V1().Services().Informer().AddEventHandler(w.handlers(ws.service))
	_, _ = kubeFactory.Discovery().V1().EndpointSlices().Informer().AddEventHandler(w.handlers(ws.endpointSlice))
	factory.Start(ctx.Done())
	kubeFactory.Start(ctx.Done())
	localPods.Start(ctx.Done())
	// The first sync must see every cache filled: a partial view would delete flows that still serve.
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("agent: informer for %v did not sync", typ)
		}
	}
	for typ, ok := range kubeFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("agent: informer for %v did not sync", typ)
		}
	}
	for typ, ok := range localPods.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("agent: informer for %v did not sync", typ)
		}
	}
	// Wait until this node has a subnet and the cluster network is known.
	for view.ready() != nil {
		log.Info("waiting for the node's HostSubnet and the ClusterNetwork", "reason", view.ready())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	cn, err := informers.ClusterNetworks().Lister().Get(networkv1.ClusterNetworkName)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	nc, err := setUpNode(ctx, cfg, db, view, cn, pods)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	host.set(nc)
	if netdev { // peers seen before vxlan0 existed were not learnt: OVS snoops only once it tunnels
		for _, peer := range view.peers() {
			resolvePeer(peer)
		}
	}
	// Pods that existed before this start come back from their OVS ports and the address store.
	if err := pods.restore(ctx); err != nil {
		return fmt.Errorf("agent: %w", err)
	}

	// Install this round, then drop what older rounds left, then remember the round.
	if _, err := fs.syncNow(ctx); err != nil {
		return fmt.Errorf("agent: first sync: %w", err)
	}
	if st, err := r.FinishRound(ctx); err != nil {
		return fmt.Errorf("agent: finish round: %w", err)
	} else {
		log.Info("pipeline installed", "stats", st.String())
	}
	if err := commitRound(ctx, db, cfg.Bridge, round); err != nil {
		return fmt.Errorf("agent: %w", err)
	}

	srv := &cni.Server{Socket: cfg.CNISocket, Handler: pods, Logger: log.WithName("cni-server")}
	if err := srv.Listen(); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if err := installCNI(cfg, pods.mtu); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	go fs.run(ctx)
	go func() {
		t := time.NewTicker(cfg.ResyncPeriod)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if st, err := r.ResyncFromSwitch(ctx); err != nil {
					log.Error(err, "periodic resync")
				} else if st.Changes() > 0 {
					log.Info("periodic resync repaired drift", "stats", st.String())
				}
			}
		}
	}()
	log.Info("agent running", "bridge", cfg.Bridge, "cniSocket", cfg.CNISocket)
	return srv.Serve(ctx)
}

// setUpNode creates the node's OVS ports and host networking for its subnet.
func setUpNode(ctx context.Context, cfg Config, db *ovsdb.Client, view *nodeView, cn *networkv1.ClusterNetwork, pods *podNetwork) (nodenet.Config, error) {
	vxlanPort := int(cn.Spec.VXLANPort)
	if vxlanPort == 0 {
		vxlanPort = int(networkv1.DefaultVXLANPort)
	}
	if _, err := db.EnsureVXLANPort(ctx, cfg.Bridge, "vxlan0", vxlanPort, int(flows.PortVXLAN)); err != nil {
		return nodenet.Config{}, err
	}
	view.mu.Lock()
	nc := nodenet.Config{HostNetNS: cfg.HostNetNS, Tun0: "tun0", LocalSubnet: view.localSubnet, Logger: cfg.Logger.WithName("nodenet"),
		ClusterNetworks: append([]netip.Prefix(nil), view.clusterNets...), NodeIP: view.nodeIP}
	view.mu.Unlock()
	if sn, err := netip.ParsePrefix(string(cn.Spec.ServiceNetwork)); err == nil {
		nc.ServiceNetwork = sn
	}
	mtu := int(cn.Spec.MTU)
	if mtu == 0 {
		uplink, err := nodenet.UplinkMTU(cfg.HostNetNS, nc.NodeIP)
		if err != nil {
			return nodenet.Config{}, err
		}
		mtu = uplink - 50 // VXLAN overhead
	}
	nc.MTU = mtu
	pods.mtu = mtu
	// br0 serves services behind tun0 at link-local addresses of its own (flows/services.go).
	nc.BridgeAddresses = []netip.Addr{flows.ServiceHairpinIP, flows.ServiceNodePortIP}
	nc.ServiceNextHop = flows.ServiceHairpinIP
	nc.Forwards = nodenet.Forwards{NodePortTarget: flows.ServiceNodePortIP, RejectPorts: [2]uint16{flows.RejectPortMin, flows.RejectPortMax}}
	if _, err := db.EnsureInternalPort(ctx, cfg.Bridge, "tun0", int(flows.PortTun0), mtu); err != nil {
		return nodenet.Config{}, err
	}
	return nc, nodenet.Ensure(ctx, nc)
}

// installCNI writes the conflist (atomically) and copies the plugin binary into the CNI directories.
func installCNI(cfg Config, mtu int) error {
	if cfg.CNIConfDir != "" {
		conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"ofsdn","plugins":[{"type":"ofsdn","agentSocket":%q,"mtu":%d}]}`+"\n", cfg.CNISocket, mtu)
		if err := writeAtomic(filepath.Join(cfg.CNIConfDir, "80-ofsdn.conflist"), []byte(conf), 0o644); err != nil {
			return fmt.Errorf("install CNI config: %w", err)
		}
	}
	if cfg.CNIBinDir != "" && cfg.PluginBinary != "" {
		data, err := os.ReadFile(cfg.PluginBinary)
		if err != nil {
			return fmt.Errorf("install CNI plugin: %w", err)
		}
		if err := writeAtomic(filepath.Join(cfg.CNIBinDir, "ofsdn"), data, 0o755); err != nil {
			return fmt.Errorf("install CNI plugin: %w", err)
		}
	}
	return nil
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
