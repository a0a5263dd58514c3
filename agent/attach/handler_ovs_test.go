package attach

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/ofsdn/ofsdn/agent/ipam"
	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/podnet"
	"github.com/ofsdn/ofsdn/cni"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/internal/ovstest"
	"github.com/ofsdn/ofsdn/ovsdb"
	"k8s.io/klog/v2"
)

// podNetEnv is a node for Handler: a real OVS (ovsdb-server and userspace ovs-vswitchd in a network
// namespace of its own, which is the node's namespace here), real sandbox namespaces, the address store
// and the pending-deletes directory on disk. Only the view and the flows are fakes (fake_test.go): these
// tests are about attachments, not flows.
type podNetEnv struct {
	t          *testing.T
	inst       *ovstest.Instance
	db         *ovsdb.Client
	stateDir   string
	pendingDir string
}

func newPodNetEnv(t *testing.T) *podNetEnv {
	inst := ovstest.Start(t)
	inst.AddBridge("br0")
	db, err := ovsdb.Connect(t.Context(), "unix:"+inst.DBSocket(), klog.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	// The node's own ports take their fixed numbers, as setUpNode makes them, so pods get others.
	if _, err := db.EnsureVXLANPort(t.Context(), "br0", "vxlan0", 4789, int(pipeline.PortVXLAN)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.EnsureInternalPort(t.Context(), "br0", "tun0", int(pipeline.PortTun0), 1450); err != nil {
		t.Fatal(err)
	}
	return &podNetEnv{t: t, inst: inst, db: db, stateDir: t.TempDir(), pendingDir: t.TempDir()}
}

// agent is a Handler as a (re)started agent has it: a fresh view (the fake) on the node's state.
func (e *podNetEnv) agent(pods PodLookup) *Handler {
	return New(Config{Bridge: "br0", HostNetNS: "/var/run/netns/" + e.inst.NetNS, Netdev: true, StateDir: e.stateDir,
		PendingDeletes: e.pendingDir}, Deps{Node: newFakeNode(), Flows: fakeFlows{}, DB: e.db, Pods: pods})
}

// netns makes a sandbox network namespace that the test's cleanup removes.
func (e *podNetEnv) netns(suffix string) string {
	name := fmt.Sprintf("%s%d-sb-%s", ovstest.Prefix, os.Getpid(), suffix)
	e.ip("netns", "add", name)
	e.t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name
}

// ip runs ip(8) and returns its standard output alone: iproute2 warns on stderr and still succeeds
// (e.g. "Error: Peer netns reference is invalid." for a veth whose peer's namespace has no id yet),
// and such a warning must not be read as the answer.
func (e *podNetEnv) ip(args ...string) string {
	e.t.Helper()
	var stderr strings.Builder
	cmd := exec.Command("ip", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		e.t.Fatalf("ip %s: %v: %s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

func addReq(containerID, netns, pod, uid string) *cni.Request {
	return &cni.Request{Command: cni.CmdAdd, ContainerID: containerID, Netns: "/var/run/netns/" + netns, IfName: "eth0",
		Args: map[string]string{"K8S_POD_NAMESPACE": "ns", "K8S_POD_NAME": pod, "K8S_POD_UID": uid}, Config: []byte(`{"type":"ofsdn"}`)}
}

// node is what the node holds, each from where it lives.
type node struct {
	Ports, Reservations, HostEnds, Pending []string // sandbox IDs
	View                                   map[string]string
}

func (e *podNetEnv) node(p *Handler) node {
	e.t.Helper()
	var n node
	ports, err := e.db.ListPorts(context.Background(), "br0")
	if err != nil {
		e.t.Fatal(err)
	}
	for _, port := range ports {
		if s := port.ExternalIDs[ExtSandbox]; s != "" {
			n.Ports = append(n.Ports, s)
		}
	}
	if store := p.currentStore(); store != nil {
		for _, a := range store.List() {
			n.Reservations = append(n.Reservations, a.ContainerID)
		}
	}
	ends, err := podnet.ListHostEnds(p.hostNetNS)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, h := range ends {
		n.HostEnds = append(n.HostEnds, h.ContainerID)
	}
	ds, _ := cni.ReadPendingDeletes(e.pendingDir)
	for _, d := range ds {
		n.Pending = append(n.Pending, d.ContainerID)
	}
	n.View = p.node.(*fakeNode).sandboxes()
	for _, l := range [][]string{n.Ports, n.Reservations, n.HostEnds, n.Pending} {
		sort.Strings(l)
	}
	return n
}

func (n node) String() string {
	return fmt.Sprintf("ports %v, reservations %v, host ends %v, pending deletes %v, view %v", n.Ports, n.Reservations, n.HostEnds, n.Pending, n.View)
}

// holds says whether the node holds exactly the given sandboxes, in every place.
func (n node) holds(sandboxes ...string) bool {
	sort.Strings(sandboxes)
	same := func(l []string) bool { return strings.Join(l, ",") == strings.Join(sandboxes, ",") }
	var inView []string
	for _, s := range n.View {
		inView = append(inView, s)
	}
	sort.Strings(inView)
	return same(n.Ports) && same(n.Reservations) && same(n.HostEnds) && same(inView) && len(n.Pending) == 0
}

// plumbing is what identifies an attachment's binding: the OVS port number and both ends' ifindexes.
func (e *podNetEnv) plumbing(containerID, netns string) string {
	e.t.Helper()
	host := podnet.HostVethName(containerID, "eth0")
	ofport, err := e.inst.Vsctl("get", "Interface", host, "ofport")
	if err != nil {
		e.t.Fatal(err)
	}
	hostLink := e.ip("-n", e.inst.NetNS, "-o", "link", "show", host)
	podLink := e.ip("-n", netns, "-o", "link", "show", "eth0")
	return fmt.Sprintf("ofport %s host %s pod %s", strings.TrimSpace(ofport), strings.Fields(hostLink)[0], strings.Fields(podLink)[0])
}

func code(err error) uint {
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}

// A repeated ADD of an attached sandbox answers with its result and touches nothing; one elsewhere or a
// second interface is refused; a broken attachment is rebuilt.
func TestRepeatedAdd(t *testing.T) {
	e := newPodNetEnv(t)
	ctx := t.Context()
	p := e.agent(nil)
	ns := e.netns("rep")
	first, err := p.Add(ctx, addReq("c1", ns, "web", "u1"))
	if err != nil {
		t.Fatal(err)
	}
	before := e.plumbing("c1", ns)
	again, err := p.Add(ctx, addReq("c1", ns, "web", "u1"))
	if err != nil {
		t.Fatalf("repeated ADD: %v", err)
	}
	a, _ := json.Marshal(first)
	b, _ := json.Marshal(again)
	if string(a) != string(b) {
		t.Errorf("repeated ADD answered\n%s\nthe first\n%s", b, a)
	}
	if after := e.plumbing("c1", ns); after != before {
		t.Errorf("repeated ADD changed the attachment: %s, was %s", after, before)
	}
	other := e.netns("rep-other")
	if _, err := p.Add(ctx, addReq("c1", other, "web", "u1")); code(err) != cni.ErrInvalidEnv || !strings.Contains(err.Error(), "CNI_NETNS") {
		t.Errorf("ADD of the attached sandbox in another netns: %v, want code 4 naming CNI_NETNS", err)
	}
	eth1 := addReq("c1", ns, "web", "u1")
	eth1.IfName = "eth1"
	if _, err := p.Add(ctx, eth1); code(err) != cni.ErrInvalidEnv || !strings.Contains(err.Error(), "CNI_IFNAME=eth1") {
		t.Errorf("second interface of the sandbox: %v, want code 4 naming CNI_IFNAME", err)
	}
	if after := e.plumbing("c1", ns); after != before {
		t.Errorf("refused ADDs changed the attachment: %s, was %s", after, before)
	}
	if n := e.node(p); !n.holds("c1") {
		t.Errorf("node holds %s, want c1 alone", n)
	}
	if err := podnet.Check(podnet.Config{NetNS: "/var/run/netns/" + ns, HostNetNS: p.hostNetNS, ContainerID: "c1", IfName: "eth0",
		HostVeth: podnet.HostVethName("c1", "eth0"), IP: netip.MustParsePrefix(first.IPs[0].Address.String())}); err != nil {
		t.Errorf("after refused ADDs: %v", err)
	}

	// Broken (its veth deleted behind ofsdn's back): a repeated ADD rebuilds it with a fresh OVS port.
	e.ip("-n", e.inst.NetNS, "link", "del", podnet.HostVethName("c1", "eth0"))
	rebuilt, err := p.Add(ctx, addReq("c1", ns, "web", "u1"))
	if err != nil {
		t.Fatalf("ADD of a broken attachment: %v", err)
	}
	if rebuilt.IPs[0].Address.String() != first.IPs[0].Address.String() {
		t.Errorf("rebuilt with %s, had %s", rebuilt.IPs[0].Address.String(), first.IPs[0].Address.String())
	}
	ofport, _ := e.inst.Vsctl("get", "Interface", podnet.HostVethName("c1", "eth0"), "ofport")
	attached, _ := p.node.Attached("ns/web")
	inView := attached.OFPort
	if strings.TrimSpace(ofport) != fmt.Sprint(inView) || inView == 0 {
		t.Errorf("rebuilt port has ofport %s, the pod's flows use %d", ofport, inView)
	}
}

// ADD never replaces an interface ofsdn did not make, in the sandbox or on the node.
func TestAddRefusesForeignInterfaces(t *testing.T) {
	e := newPodNetEnv(t)
	ctx := t.Context()
	p := e.agent(nil)

	ns, peer := e.netns("foreign"), e.netns("foreign-peer")
	e.ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "p0", "netns", peer)
	e.ip("-n", ns, "addr", "add", "203.0.113.5/24", "dev", "eth0")
	e.ip("-n", ns, "link", "set", "eth0", "up")
	_, err := p.Add(ctx, addReq("c2", ns, "web", "u2"))
	if code(err) != cni.ErrInvalidEnv || !strings.Contains(err.Error(), "CNI_IFNAME=eth0") || !strings.Contains(err.Error(), "203.0.113.5/24") {
		t.Errorf("ADD into a netns with a foreign eth0: %v, want code 4 naming CNI_IFNAME and what is there", err)
	}
	if err := p.Del(ctx, &cni.Request{Command: cni.CmdDel, ContainerID: "c2", Netns: "/var/run/netns/" + ns, IfName: "eth0"}); err != nil {
		t.Errorf("DEL after the refused ADD: %v", err)
	}
	if out := e.ip("-n", ns, "addr", "show", "eth0"); !strings.Contains(out, "203.0.113.5/24") {
		t.Errorf("the foreign eth0 changed:\n%s", out)
	}
	e.ip("-n", peer, "link", "show", "p0")
	if n := e.node(p); !n.holds() {
		t.Errorf("the refused ADD left %s", n)
	}

	// A link on the node with the host end's name but not ofsdn's mark.
	ns3 := e.netns("foreign-host")
	squatter := podnet.HostVethName("c3", "eth0")
	e.ip("-n", e.inst.NetNS, "link", "add", squatter, "type", "veth", "peer", "name", "sq0")
	e.ip("-n", e.inst.NetNS, "link", "set", squatter, "alias", "someone-else")
	if _, err := p.Add(ctx, addReq("c3", ns3, "web3", "u3")); code(err) != cni.ErrInvalidEnv || !strings.Contains(err.Error(), "someone-else") {
		t.Errorf("ADD whose host end name is taken: %v, want code 4", err)
	}
	if err := p.Del(ctx, &cni.Request{Command: cni.CmdDel, ContainerID: "c3", IfName: "eth0"}); err != nil {
		t.Errorf("DEL: %v", err)
	}
	e.ip("-n", e.inst.NetNS, "link", "show", squatter)
	e.ip("-n", e.inst.NetNS, "link", "del", squatter)

	// An interface of this very attachment that an ADD cut short left: replaced.
	ns4 := e.netns("leftover")
	if _, err := podnet.Setup(podnet.Config{NetNS: "/var/run/netns/" + ns4, HostNetNS: p.hostNetNS, ContainerID: "c4", IfName: "eth0",
		HostVeth: podnet.HostVethName("c4", "eth0"), IP: netip.MustParsePrefix("10.128.1.200/23"), MTU: 1450}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Add(ctx, addReq("c4", ns4, "web4", "u4")); err != nil {
		t.Errorf("ADD over its own unfinished interface: %v", err)
	}
	if n := e.node(p); !n.holds("c4") {
		t.Errorf("node holds %s, want c4", n)
	}
}

// A DEL the plugin left is served before an ADD of the same sandbox, and by the janitor otherwise.
func TestPendingDeletesAreServed(t *testing.T) {
	e := newPodNetEnv(t)
	ctx := t.Context()
	p := e.agent(nil)
	ns := e.netns("pend")
	if _, err := p.Add(ctx, addReq("c5", ns, "web", "u5")); err != nil {
		t.Fatal(err)
	}
	before := e.plumbing("c5", ns)
	del := &cni.Request{Command: cni.CmdDel, ContainerID: "c5", IfName: "eth0", Netns: "/var/run/netns/" + ns,
		Args: map[string]string{"K8S_POD_NAMESPACE": "ns", "K8S_POD_NAME": "web"}}
	if err := cni.WritePendingDelete(e.pendingDir, del, errors.New("agent down")); err != nil {
		t.Fatal(err)
	}
	// The runtime's next ADD of c5 comes after that DEL: the attachment is made anew, not handed back.
	if _, err := p.Add(ctx, addReq("c5", ns, "web", "u5")); err != nil {
		t.Fatal(err)
	}
	if after := e.plumbing("c5", ns); after == before {
		t.Errorf("ADD after a pending DEL kept the old attachment (%s)", after)
	}
	if n := e.node(p); !n.holds("c5") {
		t.Errorf("node holds %s, want c5 once, no pending delete", n)
	}
	if err := cni.WritePendingDelete(e.pendingDir, del, errors.New("agent frozen")); err != nil {
		t.Fatal(err)
	}
	p.janitorPass(ctx)
	if n := e.node(p); !n.holds() {
		t.Errorf("after the janitor, node holds %s, want nothing", n)
	}
}

// fakePods answers PodLookup from maps: cached is the informer (namespace/name → UID), api the server.
type fakePods struct {
	mu     sync.Mutex
	cached map[string]string
	api    map[string]PodPresence
}

func (f *fakePods) Cached(namespace, name string) (string, string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	uid, ok := f.cached[k8sobj.PodKey(namespace, name)]
	return uid, "", ok
}

func (f *fakePods) Get(_ context.Context, namespace, name string) PodPresence {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.api[k8sobj.PodKey(namespace, name)]; ok {
		return p
	}
	return PodPresence{}
}

// A restarted agent keeps what is still a pod and releases every other attachment, made stale each way
// a node meets: a DEL it never saw, a sandbox whose netns went away or now names another namespace, a pod
// deleted (or deleted and created again) in the API, a newer sandbox of the same pod, and ADDs cut short
// before their port. What the API server cannot confirm is kept until it can.
func TestRestoreReleasesStaleAttachments(t *testing.T) {
	e := newPodNetEnv(t)
	ctx := t.Context()
	p := e.agent(nil)
	add := func(sandbox, pod, uid string) string {
		t.Helper()
		ns := e.netns(sandbox)
		if _, err := p.Add(ctx, addReq(sandbox, ns, pod, uid)); err != nil {
			t.Fatalf("ADD %s: %v", sandbox, err)
		}
		return ns
	}
	add("live", "live", "u-live")
	gone := add("gone", "gone", "u-gone")
	add("pend", "pend", "u-pend")
	add("podgone", "podgone", "u-podgone")
	add("apierr", "apierr", "u-apierr")
	add("recreated", "recreated", "u-old")
	add("older", "two", "u-two")
	add("newer", "two", "u-two")
	reused := add("reused", "reused", "u-reused")
	// ADDs cut short: a reservation and veth without a port; a veth alone.
	store := p.currentStore()
	for _, sandbox := range []string{"half", "orphan"} {
		ns := e.netns(sandbox)
		ip := netip.MustParseAddr("10.128.1.210")
		if sandbox == "half" {
			var err error
			if ip, err = store.Allocate(ipam.Allocation{ContainerID: sandbox, IfName: "eth0", PodNamespace: "ns", PodName: sandbox}); err != nil {
				t.Fatal(err)
			}
		} else {
			ip = ip.Next()
		}
		if _, err := podnet.Setup(podnet.Config{NetNS: "/var/run/netns/" + ns, HostNetNS: p.hostNetNS, ContainerID: sandbox, IfName: "eth0",
			HostVeth: podnet.HostVethName(sandbox, "eth0"), IP: netip.PrefixFrom(ip, 23), MTU: 1450}); err != nil {
			t.Fatal(err)
		}
	}
	// Meanwhile, with the agent down:
	e.ip("netns", "del", gone)
	e.ip("netns", "del", reused)
	e.ip("netns", "add", reused) // the path names another namespace now
	if err := cni.WritePendingDelete(e.pendingDir, &cni.Request{ContainerID: "pend", IfName: "eth0",
		Args: map[string]string{"K8S_POD_NAMESPACE": "ns", "K8S_POD_NAME": "pend"}}, errors.New("agent down")); err != nil {
		t.Fatal(err)
	}
	pods := &fakePods{
		cached: map[string]string{"ns/live": "u-live", "ns/gone": "u-gone", "ns/pend": "u-pend", "ns/recreated": "u-new",
			"ns/two": "u-two", "ns/reused": "u-reused", "ns/half": "u-half"},
		api: map[string]PodPresence{"ns/apierr": {Err: errors.New("connection refused")},
			"ns/recreated": {Found: true, UID: "u-new", NodeName: "n1"}},
	}

	restarted := e.agent(pods)
	now := time.Now()
	restarted.clock = func() time.Time { return now }
	if err := restarted.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	// A pod missing from the API right after its ADD may be a static pod whose mirror kubelet has yet to
	// create: kept, and asked about again.
	if n := e.node(restarted); !n.holds("live", "newer", "apierr", "podgone") || n.View["ns/two"] != "newer" {
		t.Fatalf("after restore the node holds %s; want live, newer (as ns/two), apierr and podgone (both unconfirmed)", n)
	}
	restarted.janitorPass(ctx)
	if n := e.node(restarted); !n.holds("live", "newer", "apierr", "podgone") {
		t.Fatalf("the janitor released before an answer or the grace: %s", n)
	}
	// The API server answers again, and the grace passes: both pods are gone.
	pods.mu.Lock()
	pods.api["ns/apierr"] = PodPresence{}
	pods.mu.Unlock()
	now = now.Add(DefaultAbsentPodGrace)
	restarted.janitorPass(ctx)
	if n := e.node(restarted); !n.holds("live", "newer") {
		t.Fatalf("after the janitor the node holds %s; want live and newer", n)
	}
	if len(restarted.unsure) != 0 {
		t.Errorf("still unsure: %v", restarted.unsure)
	}
}
