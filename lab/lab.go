// Package lab builds the machines and wires of ofsdn's multi-node lab (shared/LAB.md): simulated nodes,
// each a network namespace running its own ovsdb-server and userspace ovs-vswitchd, joined by an underlay
// L2 segment, plus an "external" host on that segment and, optionally, one veth from the root namespace.
//
//	                      netns <prefix>-underlay
//	                ┌───── Linux bridge br-underlay ─────┐
//	            node1 ... nodeN        external        root (optional)
//	              │                       │               │
//	netns <prefix>-nodeK            netns <prefix>-   root namespace:
//	  eth0 ∈ OVS bridge br-ul       external: eth0    ol<hash>, first address
//	  underlay IP on br-ul          (last address)    of the underlay, connected
//	  (".10+K")                                       route only
//
// A node's underlay address sits on br-ul's internal interface because VXLAN in the netdev datapath only
// works that way; an agent creates br0 with vxlan0 (remote_ip=flow, key=flow) next to it and tunnels to
// the other nodes' addresses. br-ul forwards with one actions=NORMAL flow: it is lab infrastructure, not
// ofsdn's pipeline.
//
// This is test infrastructure: it execs ip, ethtool, ovsdb-tool, ovs-vsctl, ovs-ofctl and ovs-appctl,
// which ofsdn's production code never does. The core API takes a context and no testing.TB, so a demo
// program can run a lab too; StartT adds t.Cleanup for tests.
//
// Every network namespace is named "<prefix>-<role>", the directory is "<TMPDIR>/<prefix>-*" and holds a
// manifest (owner PID and start time, names) so that Sweep can remove what a killed run left behind.
// Stop removes every namespace whose name starts with "<prefix>-", including ones other code made under
// the lab's prefix (use Lab.NetNSName for pod namespaces), after ending every process still running in
// them.
//
// Network safety (LAB.md): addresses come from the documentation ranges only; the underlay bridge lives
// in a namespace of its own; the root namespace gets at most one veth with its connected route and
// nothing else (no forwarding, no other routes), and only in a range no root-namespace route overlaps.
package lab

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ofsdn/ofsdn/internal/proc"
)

const (
	// DefaultPrefixBase starts every default prefix: "ofsdn-lab-<pid>-<n>".
	DefaultPrefixBase = "ofsdn-lab-"
	// DefaultNodes is the node count when Options.Nodes is 0.
	DefaultNodes = 3
	// DefaultMTU is the underlay MTU when Options.MTU is 0.
	DefaultMTU = 1500
	// VXLANOverhead is what VXLAN over IPv4 adds to an inner packet (LAB.md): pods and tun0 get MTU-50.
	VXLANOverhead = 50
	// UnderlayBridge is the OVS bridge in each node that holds the uplink and the node's underlay address.
	UnderlayBridge = "br-ul"
	// Uplink is the node's (and the external host's) veth into the underlay segment.
	Uplink = "eth0"

	underlayLinuxBridge = "br-underlay"
	rootPortName        = "root" // the underlay-side end of the root link
	maxNodes            = 180    // node K gets offset 10+K; the external host the last address
	rootAliasPrefix     = "ofsdn-lab:"
)

// DocumentationRanges are the only underlay ranges a lab accepts (RFC 5737). TEST-NET-3
// (203.0.113.0/24) is left out on purpose: on these machines the Go module proxy and Debian's mirror
// resolve into it, and a root link's connected route there would capture the machine's own traffic.
var DocumentationRanges = []netip.Prefix{
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.51.100.0/24"),
}

// rootLinkRanges are the underlays a lab with a root link picks from: quarters of 198.51.100.0/24 (the
// root namespace sits in 192.0.2.0/24 here), so that four such labs can run at once.
var rootLinkRanges = []netip.Prefix{
	netip.MustParsePrefix("198.51.100.0/26"),
	netip.MustParsePrefix("198.51.100.64/26"),
	netip.MustParsePrefix("198.51.100.128/26"),
	netip.MustParsePrefix("198.51.100.192/26"),
}

// Options choose the lab's shape. The zero value is a usable 3-node lab.
type Options struct {
	// Nodes is the number of simulated nodes; default 3.
	Nodes int
	// Prefix names every namespace, link alias and directory of the lab; default "ofsdn-lab-<pid>-<n>".
	// Letters, digits, '.', '_' and '-', at most 40 characters.
	Prefix string
	// UnderlayCIDR is the underlay segment, inside a documentation range. Default 192.0.2.0/24; with
	// RootLink, the first of rootLinkRanges that no root-namespace route overlaps.
	UnderlayCIDR netip.Prefix
	// MTU of the underlay; default 1500. Pods and tun0 need MTU-VXLANOverhead.
	MTU int
	// RootLink adds one veth from the root namespace into the underlay, holding the underlay's first
	// address with its connected route only, so that processes in node namespaces reach a server (the
	// API server) bound to Lab.Root.IP.
	RootLink bool
	// NoOVS builds nodes without Open vSwitch: the underlay address sits on eth0, as on a host that
	// has none, for a cluster that brings Open vSwitch itself (deploy/ovs). Node.Dir still exists (the
	// cluster's Open vSwitch may keep its sockets there, where the Node helpers look).
	NoOVS bool
	// Logger receives the lab's progress at debug level and teardown problems at warn; default: discarded.
	Logger *slog.Logger
}

// Lab is a running lab. Stop tears it down; Stop is safe to call more than once and concurrently.
type Lab struct {
	Prefix        string
	Dir           string       // holds the manifest and one OVS directory per node
	Underlay      netip.Prefix // the segment's prefix (masked)
	MTU           int
	UnderlayNetNS string // the namespace holding the Linux bridge
	Nodes         []*Node
	External      *Host
	Root          *RootLink // nil unless Options.RootLink

	// StartDuration is how long Start took.
	StartDuration time.Duration

	noOVS    bool
	log      *slog.Logger
	man      manifest
	stopMu   sync.Mutex
	stopped  bool
	stopErr  error
	stopTime time.Duration
}

// Host is a namespace on the underlay with one address and no other route: the "external" world.
type Host struct {
	Name  string
	NetNS string
	IP    netip.Addr
	Addr  netip.Prefix // IP with the underlay's length, as configured on eth0
	MAC   net.HardwareAddr
}

// RootLink is the root namespace's optional veth into the underlay.
type RootLink struct {
	Name string // the root-namespace interface, "ol" + 8 hex digits (interface names are 15 bytes)
	IP   netip.Addr
	Addr netip.Prefix // IP with the underlay's length: its only route is the connected one
}

var seq atomic.Int32

// Start builds a lab. On error it has already torn down what it built; it then also returns the partial
// Lab, on which Stop is a harmless no-op, so callers may always defer Stop when the Lab is non-nil.
func Start(ctx context.Context, opts Options) (*Lab, error) {
	t0 := time.Now()
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	l := &Lab{Prefix: o.Prefix, MTU: o.MTU, UnderlayNetNS: o.Prefix + "-underlay", noOVS: o.NoOVS, log: o.Logger}
	if err := l.build(ctx, o); err != nil {
		stopErr := l.Stop()
		return l, errors.Join(fmt.Errorf("lab %s: %w", o.Prefix, err), stopErr)
	}
	l.StartDuration = time.Since(t0)
	l.log.Debug("lab started", "prefix", l.Prefix, "nodes", len(l.Nodes), "underlay", l.Underlay, "took", l.StartDuration)
	return l, nil
}

var prefixRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$`)

// withDefaults fills defaults and checks what needs no system access.
func (o Options) withDefaults() (Options, error) {
	if o.Nodes == 0 {
		o.Nodes = DefaultNodes
	}
	if o.Nodes < 1 || o.Nodes > maxNodes {
		return o, fmt.Errorf("lab: %d nodes: want 1..%d", o.Nodes, maxNodes)
	}
	if o.Prefix == "" {
		o.Prefix = fmt.Sprintf("%s%d-%d", DefaultPrefixBase, os.Getpid(), seq.Add(1))
	}
	if !prefixRE.MatchString(o.Prefix) {
		return o, fmt.Errorf("lab: prefix %q: want 1-40 of [A-Za-z0-9._-], starting with a letter or digit", o.Prefix)
	}
	if o.MTU == 0 {
		o.MTU = DefaultMTU
	}
	if o.MTU < 1280 || o.MTU > 9000 {
		return o, fmt.Errorf("lab: MTU %d: want 1280..9000", o.MTU)
	}
	if o.UnderlayCIDR.IsValid() {
		if err := checkUnderlay(o.UnderlayCIDR, o.Nodes); err != nil {
			return o, err
		}
		o.UnderlayCIDR = o.UnderlayCIDR.Masked()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// checkUnderlay accepts only documentation ranges big enough for the address plan.
func checkUnderlay(p netip.Prefix, nodes int) error {
	if !p.Addr().Is4() {
		return fmt.Errorf("lab: underlay %s: want IPv4", p)
	}
	inside := false
	for _, d := range DocumentationRanges {
		if d.Bits() <= p.Bits() && d.Contains(p.Addr()) {
			inside = true
		}
	}
	if !inside {
		return fmt.Errorf("lab: underlay %s: want a documentation range (%v) for network safety", p, DocumentationRanges)
	}
	if size := 1 << (32 - p.Bits()); nodes+12 > size {
		return fmt.Errorf("lab: underlay %s: too small for %d nodes", p, nodes)
	}
	return nil
}

// addressPlan: the root link gets the first address, node K (1-based) the address at offset 10+K, the
// external host the last usable one.
func rootAddr(p netip.Prefix) netip.Addr { return offset(p, 1) }
func nodeAddr(p netip.Prefix, k int) netip.Addr {
	return offset(p, 10+k)
}
func externalAddr(p netip.Prefix) netip.Addr { return offset(p, (1<<(32-p.Bits()))-2) }

func offset(p netip.Prefix, n int) netip.Addr {
	b := p.Masked().Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// macFor gives underlay interfaces stable, locally administered MACs (0a:58 + IPv4), which keeps ARP
// caches and packet captures readable.
func macFor(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
}

// rootLinkName fits the 15-byte interface name limit; the full prefix goes into the link's alias.
func rootLinkName(prefix string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(prefix))
	return fmt.Sprintf("ol%08x", h.Sum32())
}

// NetNSName names a namespace that belongs to the lab (e.g. a pod's: NetNSName("node1-pod-a")): Stop and
// Sweep remove every namespace named this way.
func (l *Lab) NetNSName(role string) string { return l.Prefix + "-" + role }

// PodMTU is the MTU pods and tun0 need so that VXLAN fits the underlay.
func (l *Lab) PodMTU() int { return l.MTU - VXLANOverhead }

// Node returns the node with the given name, or nil.
func (l *Lab) Node(name string) *Node {
	for _, n := range l.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// StopDuration is how long the first Stop took (0 before Stop).
func (l *Lab) StopDuration() time.Duration {
	l.stopMu.Lock()
	defer l.stopMu.Unlock()
	return l.stopTime
}

func (l *Lab) build(ctx context.Context, o Options) error {
	unlock, err := lockGlobal()
	if err != nil {
		return err
	}
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()
	if err := claimPrefix(o.Prefix, l.log); err != nil {
		return err
	}
	underlay := o.UnderlayCIDR
	if o.RootLink {
		if underlay, err = pickRootUnderlay(ctx, o.UnderlayCIDR, o.Nodes); err != nil {
			return err
		}
	} else if !underlay.IsValid() {
		underlay = DocumentationRanges[0]
	}
	l.Underlay = underlay
	start, err := proc.StartTime(os.Getpid())
	if err != nil {
		return fmt.Errorf("own start time: %w", err)
	}
	dir, err := os.MkdirTemp("", o.Prefix+"-")
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	l.Dir = dir
	// The manifest lists every name before anything exists, so a run killed at any point is sweepable.
	l.man = manifest{Prefix: o.Prefix, OwnerPID: os.Getpid(), OwnerStart: start, Dir: dir,
		NetNS: []string{l.UnderlayNetNS, o.Prefix + "-external"}}
	for k := 1; k <= o.Nodes; k++ {
		name := "node" + strconv.Itoa(k)
		n := &Node{Name: name, NetNS: o.Prefix + "-" + name, IP: nodeAddr(underlay, k),
			Dir: filepath.Join(dir, name)}
		n.Addr = netip.PrefixFrom(n.IP, underlay.Bits())
		n.MAC = macFor(n.IP)
		l.Nodes = append(l.Nodes, n)
		l.man.NetNS = append(l.man.NetNS, n.NetNS)
		l.man.Nodes = append(l.man.Nodes, manifestNode{Name: name, NetNS: n.NetNS, Dir: n.Dir})
	}
	if o.RootLink {
		l.Root = &RootLink{Name: rootLinkName(o.Prefix), IP: rootAddr(underlay)}
		l.Root.Addr = netip.PrefixFrom(l.Root.IP, underlay.Bits())
		l.man.RootLink = l.Root.Name
	}
	if err := l.man.write(); err != nil {
		return err
	}

	if err := l.buildUnderlay(ctx); err != nil {
		return err
	}
	if l.Root != nil {
		if err := l.buildRootLink(ctx); err != nil {
			return err
		}
	}
	// The root link's range is now visible as a route, so later Starts see it: release the lock.
	unlock()
	locked = false

	ext := &Host{Name: "external", NetNS: o.Prefix + "-external", IP: externalAddr(underlay)}
	ext.Addr = netip.PrefixFrom(ext.IP, underlay.Bits())
	ext.MAC = macFor(ext.IP)
	l.External = ext
	errs := make([]error, len(l.Nodes)+1)
	var wg sync.WaitGroup
	for i, n := range l.Nodes {
		wg.Go(func() { errs[i] = l.buildNode(ctx, n) })
	}
	wg.Go(func() { errs[len(l.Nodes)] = l.buildHost(ctx, ext) })
	wg.Wait()
	return errors.Join(errs...)
}

func (l *Lab) buildUnderlay(ctx context.Context) error {
	ns := l.UnderlayNetNS
	if err := run(ctx, "ip", "netns", "add", ns); err != nil {
		return err
	}
	return runAll(ctx, [][]string{
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "-n", ns, "link", "add", underlayLinuxBridge, "mtu", strconv.Itoa(l.MTU), "type", "bridge"},
		{"ip", "-n", ns, "link", "set", underlayLinuxBridge, "up"},
	})
}

// attach creates a veth pair: port on the underlay bridge, peer named peerName in namespace peerNS.
// TX checksum offload is off on the bridge port, so frames leave it with complete checksums: OVS reads
// the node's uplink with AF_PACKET and would hand partial checksums to the node's stack (LAB.md).
func (l *Lab) attach(ctx context.Context, port, peerNS, peerName string) error {
	u := l.UnderlayNetNS
	mtu := strconv.Itoa(l.MTU)
	return runAll(ctx, [][]string{
		{"ip", "-n", u, "link", "add", port, "mtu", mtu, "type", "veth", "peer", "name", peerName, "mtu", mtu, "netns", peerNS},
		{"ip", "-n", u, "link", "set", port, "master", underlayLinuxBridge},
		{"ip", "netns", "exec", u, "ethtool", "-K", port, "tx", "off"},
		{"ip", "-n", u, "link", "set", port, "up"},
	})
}

func (l *Lab) buildRootLink(ctx context.Context) error {
	r := l.Root
	mtu := strconv.Itoa(l.MTU)
	if err := run(ctx, "ip", "link", "add", r.Name, "mtu", mtu, "type", "veth", "peer", "name", rootPortName, "mtu", mtu, "netns", l.UnderlayNetNS); err != nil {
		return err
	}
	u := l.UnderlayNetNS
	return runAll(ctx, [][]string{
		// The alias carries the full prefix: the 15-byte name cannot, and Sweep needs it.
		{"ip", "link", "set", r.Name, "alias", rootAliasPrefix + l.Prefix},
		{"ip", "-n", u, "link", "set", rootPortName, "master", underlayLinuxBridge},
		{"ip", "netns", "exec", u, "ethtool", "-K", rootPortName, "tx", "off"},
		{"ip", "-n", u, "link", "set", rootPortName, "up"},
		{"ip", "addr", "add", r.Addr.String(), "dev", r.Name},
		{"ip", "link", "set", r.Name, "up"},
	})
}

func (l *Lab) buildHost(ctx context.Context, h *Host) error {
	if err := run(ctx, "ip", "netns", "add", h.NetNS); err != nil {
		return err
	}
	if err := l.attach(ctx, h.Name, h.NetNS, Uplink); err != nil {
		return err
	}
	return runAll(ctx, [][]string{
		{"ip", "-n", h.NetNS, "link", "set", "lo", "up"},
		{"ip", "-n", h.NetNS, "link", "set", Uplink, "address", h.MAC.String()},
		{"ip", "netns", "exec", h.NetNS, "ethtool", "-K", Uplink, "tx", "off"},
		{"ip", "-n", h.NetNS, "addr", "add", h.Addr.String(), "dev", Uplink},
		{"ip", "-n", h.NetNS, "link", "set", Uplink, "up"},
	})
}

// Stop tears the lab down: each node's ovs-vswitchd (exit --cleanup, then SIGKILL by PID) and
// ovsdb-server, every process left in the lab's namespaces, the root link, every namespace named
// "<prefix>-*", and the directory. It returns the first call's result on later calls.
func (l *Lab) Stop() error {
	l.stopMu.Lock()
	defer l.stopMu.Unlock()
	if l.stopped {
		return l.stopErr
	}
	l.stopped = true
	t0 := time.Now()
	if l.man.Prefix != "" {
		l.stopErr = teardown(l.man, l.log)
	}
	l.stopTime = time.Since(t0)
	l.log.Debug("lab stopped", "prefix", l.Prefix, "took", l.stopTime, "err", l.stopErr)
	return l.stopErr
}
