package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	networkinformers "github.com/ofsdn/ofsdn/client/informers/externalversions"
	"github.com/ofsdn/ofsdn/controller"
	"github.com/ofsdn/ofsdn/internal/kubeconfig"
	"github.com/ofsdn/ofsdn/internal/version"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// Controller is ofsdn-controller's command line: the control plane (a Deployment of two replicas; one
// leads). See controller/.
func Controller(args []string) int {
	fs := flag.NewFlagSet("ofsdn-controller", flag.ExitOnError)
	klog.InitFlags(fs)
	var (
		kubeconfigPath = fs.String("kubeconfig", "", "kubeconfig; empty for in-cluster configuration")
		cidrs          = fs.String("cluster-cidrs", "10.128.0.0/14", "comma-separated cluster CIDRs (used to create ClusterNetwork default when absent)")
		hostBits       = fs.Int("host-subnet-length", 9, "host bits of each node's subnet (9 = a /23 per node)")
		svcNet         = fs.String("service-network", "172.30.0.0/16", "service ClusterIP range")
		mode           = fs.String("plugin-mode", "multitenant", "subnet, multitenant or networkpolicy")
		encap          = fs.String("encapsulation", string(networkv1.EncapsulationVXLAN), "vxlan, or none (unencapsulated between nodes on one L2 segment)")
		vxlanPort      = fs.Int("vxlan-port", int(networkv1.DefaultVXLANPort), "VXLAN UDP port")
		mtu            = fs.Int("mtu", 1450, "pod MTU (underlay MTU less 50)")
		globals        = fs.String("global-namespaces", "kube-system", "comma-separated namespaces with VNID 0 besides default")
		leaseNS        = fs.String("leader-elect-namespace", "ofsdn", "namespace of the leader election Lease")
		leaseName      = fs.String("leader-elect-name", "ofsdn-controller", "name of the leader election Lease")
		leaseID        = fs.String("leader-elect-identity", controller.DefaultIdentity(), "this replica's name in the Lease: unique among replicas, the same across restarts (default $POD_NAME, else hostname_pid)")
		leaseDur       = fs.Duration("leader-elect-lease-duration", controller.DefaultLeaseDuration, "how long a leader that stopped renewing blocks the others")
		renewDeadline  = fs.Duration("leader-elect-renew-deadline", controller.DefaultRenewDeadline, "how long the leader tries to renew before it stops leading (and exits)")
		retryPeriod    = fs.Duration("leader-elect-retry-period", controller.DefaultRetryPeriod, "how often candidates try to acquire and the leader to renew")
		metricsAddr    = fs.String("metrics-address", ":9102", "address of /metrics, /healthz and /readyz")
		workers        = fs.Int("workers", 4, "concurrent syncs per node and namespace queue (change-network requests always run one at a time)")
		showVersion    = fs.Bool("version", false, "print the version and exit")
	)
	_ = fs.Parse(args) // ExitOnError
	if *showVersion {
		fmt.Println("ofsdn-controller", version.String())
		return 0
	}
	defer klog.Flush()
	log := klog.Background().WithName("ofsdn-controller")
	log.Info("starting", "version", version.String())
	lc := controller.LeaderConfig{Namespace: *leaseNS, Name: *leaseName, Identity: *leaseID, LeaseDuration: *leaseDur,
		RenewDeadline: *renewDeadline, RetryPeriod: *retryPeriod}
	if err := runController(log, *kubeconfigPath, *cidrs, *hostBits, *svcNet, *mode, *encap, *vxlanPort, *mtu, *globals, lc, *metricsAddr, *workers); err != nil {
		log.Error(err, "exiting")
		return 1
	}
	return 0
}

func runController(log klog.Logger, kubeconfigPath, cidrs string, hostBits int, svcNet, mode, encap string, vxlanPort, mtu int, globals string,
	lc controller.LeaderConfig, metricsAddr string, workers int) error {
	cfg, err := kubeconfig.Load(kubeconfigPath)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 200, 400 // allocation bursts (a thousand namespaces at once) are the job
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	netc, err := networkclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	spec := networkv1.ClusterNetworkSpec{HostSubnetLength: int32(hostBits), ServiceNetwork: networkv1.CIDR(svcNet),
		PluginMode: networkv1.PluginMode(mode), Encapsulation: networkv1.Encapsulation(encap), VXLANPort: int32(vxlanPort), MTU: int32(mtu)}
	for _, c := range strings.Split(cidrs, ",") {
		spec.ClusterCIDRs = append(spec.ClusterCIDRs, networkv1.CIDR(strings.TrimSpace(c)))
	}
	if err := controller.ValidateSpec(spec); err != nil {
		return fmt.Errorf("flags: %w", err)
	}
	var globalNS []string
	for _, g := range strings.Split(globals, ",") {
		if g = strings.TrimSpace(g); g != "" {
			globalNS = append(globalNS, g)
		}
	}
	metrics := controller.NewMetrics(nil)
	// The controller starts the factories once it leads: a follower keeps no caches.
	c, err := controller.New(kube, netc, informers.NewSharedInformerFactory(kube, 0), networkinformers.NewSharedInformerFactory(netc, 0),
		controller.Config{Network: spec, GlobalNamespaces: globalNS, Logger: log, Workers: workers, Dynamic: dyn}, metrics)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ln, err := net.Listen("tcp", metricsAddr)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	srv := &http.Server{Handler: metrics.Handler(func() bool { return true }), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "metrics server")
		}
	}()
	defer srv.Close()
	log.Info("metrics, health and readiness", "address", ln.Addr().String())

	// SIGTERM cancels ctx: RunLeader stops the controller, then releases the Lease for the next leader.
	return controller.RunLeader(ctx, kube, lc, c)
}
