package controller_test

// Networks on a real API server (deploy/'s CRDs, so their validation is real; the controller's and the
// agent's RBAC): the controller runs in-process as deployed, the test writes NetworkSubnet status as an
// agent does, with the agent's ServiceAccount. Expected subnets and cross-talk come from the test's own
// reading of the objects.

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	"github.com/ofsdn/ofsdn/controller/controllertest"
	"github.com/ofsdn/ofsdn/internal/proc"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

func TestNetworks(t *testing.T) {
	api := kubelab.StartDeploy(t, kubelab.Options{}, append(slices.Clone(controllertest.Manifests), "agent/rbac.yaml")...)
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(api.AdminConfig())
	net := networkclient.NewForConfigOrDie(api.AdminConfig())
	agent := networkclient.NewForConfigOrDie(api.ServiceAccountConfig(t, "ofsdn", "ofsdn-agent"))
	stopA := controllertest.Start(t, api, controllertest.Spec("10.128.0.0/14", 9), "a")

	nodes := []string{"node-1", "node-2", "node-3"}
	for i, name := range nodes {
		n, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("192.0.2.%d", i+1)}}
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create := func(name, cidr string, bits int32, crossTalk ...string) {
		t.Helper()
		n := &networkv1.Network{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: networkv1.NetworkSpec{CIDR: networkv1.CIDR(cidr), HostSubnetLength: bits, CrossTalk: crossTalk}}
		if _, err := net.NetworkV1().Networks().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// blue and red share a CIDR (allowed; no cross-talk between them); green does not overlap either.
	create("blue", "10.200.0.0/16", 8)
	create("red", "10.200.0.0/16", 8, "blue")
	create("green", "10.201.0.0/24", 6)

	// The CRD refuses what the controller would only report.
	bad := &networkv1.Network{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: networkv1.NetworkSpec{CIDR: "10.9.0.0/28", HostSubnetLength: 8}}
	if _, err := net.NetworkV1().Networks().Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("a hostSubnetLength that does not fit the CIDR: %v, want Invalid", err)
	}

	served := func(name string) func() bool {
		return func() bool {
			n, err := net.NetworkV1().Networks().Get(ctx, name, metav1.GetOptions{})
			subs := networkSubnets(t, net, name)
			return err == nil && n.Status.VNI != 0 && n.Status.ObservedGeneration == n.Generation &&
				meta.IsStatusConditionTrue(n.Status.Conditions, networkv1.ConditionSubnetsAvailable) && len(subs) == len(nodes)
		}
	}
	for _, name := range []string{"blue", "red", "green"} {
		proc.Eventually(t, time.Minute, name+" with a VNI and a NetworkSubnet per node", served(name))
	}
	hostIPs := map[string]string{}
	for _, name := range nodes {
		hs, err := net.NetworkV1().HostSubnets().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		hostIPs[name] = hs.HostIP
	}
	vnis := map[uint32]string{}
	for _, name := range []string{"blue", "red", "green"} {
		n, err := net.NetworkV1().Networks().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v := n.Status.VNI; v < networkv1.MinNetworkVNI || v > networkv1.MaxNetworkVNI || vnis[v] != "" {
			t.Errorf("%s: VNI %d (out of range, or %q's too)", name, v, vnis[v])
		}
		vnis[n.Status.VNI] = name
		if !slices.Contains(n.Finalizers, networkv1.NetworkInUseFinalizer) {
			t.Errorf("%s: finalizers %v", name, n.Finalizers)
		}
		if !meta.IsStatusConditionTrue(n.Status.Conditions, networkv1.ConditionValid) ||
			!meta.IsStatusConditionFalse(n.Status.Conditions, networkv1.ConditionInUse) {
			t.Errorf("%s: conditions %+v", name, n.Status.Conditions)
		}
		checkSubnets(t, n, networkSubnets(t, net, name), hostIPs)
	}
	// red asked for blue, whose addresses it shares: refused, and nobody carries it.
	red, _ := net.NetworkV1().Networks().Get(ctx, "red", metav1.GetOptions{})
	if c := meta.FindStatusCondition(red.Status.Conditions, networkv1.ConditionCrossTalk); c == nil || c.Status != metav1.ConditionFalse ||
		c.Reason != "Overlapping" || !strings.Contains(c.Message, "blue") {
		t.Errorf("red's CrossTalk condition %+v, want False/Overlapping naming blue", c)
	}
	crossTalk := func(want map[string][]string) func() bool {
		return func() bool {
			for name, w := range want {
				n, err := net.NetworkV1().Networks().Get(ctx, name, metav1.GetOptions{})
				if err != nil || !slices.Equal(n.Status.CrossTalk, w) {
					return false
				}
			}
			return true
		}
	}
	proc.Eventually(t, 30*time.Second, "no cross-talk between overlapping Networks",
		crossTalk(map[string][]string{"blue": nil, "red": nil, "green": nil}))

	// Cross-talk enabled live between green and blue (green names blue: both carry it), then disabled.
	setCrossTalk := func(name string, peers ...string) {
		t.Helper()
		n, err := net.NetworkV1().Networks().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Spec.CrossTalk = peers
		if _, err := net.NetworkV1().Networks().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setCrossTalk("green", "blue")
	proc.Eventually(t, 30*time.Second, "green and blue exchanging traffic",
		crossTalk(map[string][]string{"blue": {"green"}, "green": {"blue"}, "red": nil}))
	setCrossTalk("green")
	proc.Eventually(t, 30*time.Second, "green and blue no longer", crossTalk(map[string][]string{"blue": nil, "green": nil}))
	setCrossTalk("green", "blue")
	proc.Eventually(t, 30*time.Second, "green and blue again", crossTalk(map[string][]string{"blue": {"green"}, "green": {"blue"}}))

	// A restart (a new controller on the same API server) keeps every VNI and subnet, and the objects.
	type record struct {
		vni     uint32
		subnets map[string]string // NetworkSubnet name → subnet/uid
	}
	snapshot := func() map[string]record {
		out := map[string]record{}
		for _, name := range []string{"blue", "red", "green"} {
			n, err := net.NetworkV1().Networks().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			r := record{vni: n.Status.VNI, subnets: map[string]string{}}
			for _, s := range networkSubnets(t, net, name) {
				r.subnets[s.Name] = string(s.Subnet) + "/" + string(s.UID)
			}
			out[name] = r
		}
		return out
	}
	before := snapshot()
	stopA()
	controllertest.Start(t, api, controllertest.Spec("10.128.0.0/14", 9), "b")
	create("probe", "10.202.0.0/16", 8)
	proc.Eventually(t, time.Minute, "the new controller serving a new Network", served("probe"))
	after := snapshot()
	for name, b := range before {
		a := after[name]
		if a.vni != b.vni || !maps.Equal(a.subnets, b.subnets) {
			t.Errorf("%s across the restart: VNI %d → %d, subnets %v → %v", name, b.vni, a.vni, b.subnets, a.subnets)
		}
	}
	if p, _ := net.NetworkV1().Networks().Get(ctx, "probe", metav1.GetOptions{}); p != nil && vnis[p.Status.VNI] != "" {
		t.Errorf("probe got VNI %d, %s's", p.Status.VNI, vnis[p.Status.VNI])
	}

	// Deleting blue while its agent on node-1 reports 2 pods: blue stays, says why, and goes at 0.
	attach := func(node string, pods int64) {
		t.Helper()
		// A merge patch of the status subresource, as agent/networks writes it.
		patch := fmt.Appendf(nil, `{"status":{"attachments":%d}}`, pods)
		if _, err := agent.NetworkV1().NetworkSubnets().Patch(ctx, networkv1.NetworkSubnetName("blue", node), types.MergePatchType,
			patch, metav1.PatchOptions{}, "status"); err != nil {
			t.Fatalf("the agent's status write: %v", err)
		}
	}
	attach("node-1", 2)
	proc.Eventually(t, 30*time.Second, "blue counting 2 pods", func() bool {
		n, err := net.NetworkV1().Networks().Get(ctx, "blue", metav1.GetOptions{})
		return err == nil && n.Status.Attachments == 2 && meta.IsStatusConditionTrue(n.Status.Conditions, networkv1.ConditionInUse)
	})
	if err := net.NetworkV1().Networks().Delete(ctx, "blue", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	proc.Eventually(t, 30*time.Second, "blue waiting for its pods, and a Normal Event saying so", func() bool {
		n, err := net.NetworkV1().Networks().Get(ctx, "blue", metav1.GetOptions{})
		if err != nil {
			return false
		}
		c := meta.FindStatusCondition(n.Status.Conditions, networkv1.ConditionInUse)
		evs, _ := admin.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=blue,reason=Deleting"})
		return c != nil && c.Reason == "Deleting" && c.Message == "2 pods still attached on nodes node-1" &&
			evs != nil && len(evs.Items) == 1 && evs.Items[0].Type == corev1.EventTypeNormal
	})
	if subs := networkSubnets(t, net, "blue"); len(subs) != len(nodes) {
		t.Errorf("blue's NetworkSubnets while pods are attached: %d, want %d", len(subs), len(nodes))
	}
	proc.Eventually(t, 30*time.Second, "green no longer carrying blue", crossTalk(map[string][]string{"green": nil}))
	if n, err := net.NetworkV1().Networks().Get(ctx, "blue", metav1.GetOptions{}); err != nil || n.DeletionTimestamp == nil {
		t.Fatalf("blue: %v (deleting: %v)", err, n != nil && n.DeletionTimestamp != nil)
	}
	attach("node-1", 0)
	proc.Eventually(t, 30*time.Second, "blue and its NetworkSubnets gone", func() bool {
		_, err := net.NetworkV1().Networks().Get(ctx, "blue", metav1.GetOptions{})
		return apierrors.IsNotFound(err) && len(networkSubnets(t, net, "blue")) == 0
	})
	if r, _ := net.NetworkV1().Networks().Get(ctx, "red", metav1.GetOptions{}); r == nil || r.Status.VNI != before["red"].vni {
		t.Errorf("red after blue went: %+v", r)
	}
}

func networkSubnets(t *testing.T, net networkclient.Interface, network string) []networkv1.NetworkSubnet {
	t.Helper()
	list, err := net.NetworkV1().NetworkSubnets().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []networkv1.NetworkSubnet
	for _, s := range list.Items {
		if s.Network == network {
			out = append(out, s)
		}
	}
	return out
}

// checkSubnets: one NetworkSubnet per node, <network>.<node>, on the node's HostSubnet hostIP, a
// /(32-hostSubnetLength) of the Network's CIDR, none shared, owned by the Network.
func checkSubnets(t *testing.T, n *networkv1.Network, subs []networkv1.NetworkSubnet, hostIPs map[string]string) {
	t.Helper()
	cidr := netip.MustParsePrefix(string(n.Spec.CIDR))
	if len(subs) != len(hostIPs) {
		t.Errorf("%s: %d NetworkSubnets, want %d", n.Name, len(subs), len(hostIPs))
	}
	seen := map[netip.Prefix]string{}
	for _, s := range subs {
		p, err := netip.ParsePrefix(string(s.Subnet))
		if err != nil || p.Bits() != 32-int(n.Spec.HostSubnetLength) || p != p.Masked() || !cidr.Contains(p.Addr()) {
			t.Errorf("%s: %s has %q, not a /%d of %s", n.Name, s.Name, s.Subnet, 32-n.Spec.HostSubnetLength, cidr)
		}
		if other := seen[p]; other != "" {
			t.Errorf("%s: %s and %s share %s", n.Name, s.Name, other, p)
		}
		seen[p] = s.Name
		if s.Name != n.Name+"."+s.Node || s.HostIP != hostIPs[s.Node] {
			t.Errorf("%s: %s on node %s hostIP %s, want %s.%s on %s", n.Name, s.Name, s.Node, s.HostIP, n.Name, s.Node, hostIPs[s.Node])
		}
		if len(s.OwnerReferences) != 0 || s.Annotations["network.ofsdn.io/network-uid"] != string(n.UID) {
			t.Errorf("%s: %s owners %+v, annotations %v", n.Name, s.Name, s.OwnerReferences, s.Annotations)
		}
	}
}
