// Package podnet plumbs a pod's interface: a veth pair whose host end stays in the agent's network
// namespace (where ovs-vswitchd attaches it to br0) and whose other end becomes the pod's eth0 with its
// address, MAC, MTU and routes. All through netlink; nothing is exec'd.
//
// Both ends carry a mark, the alias "ofsdn:<container ID>/<interface>" (Mark): podnet replaces or
// removes only interfaces with the mark of the attachment at hand (or, for pods plumbed before marks
// existed, an unmarked host end with the attachment's derived name and its own peer), and refuses
// everything else with ErrForeignInterface.
package podnet

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Config describes one pod interface.
type Config struct {
	NetNS           string // path of the pod's network namespace, e.g. /var/run/netns/x or /proc/PID/ns/net
	HostNetNS       string // where the host end lives (the node's, with ovs-vswitchd); "" = the agent's own
	ContainerID     string // the sandbox (CNI_CONTAINERID): with IfName, the attachment the mark names
	IfName          string // inside the pod, usually eth0
	HostVeth        string // the host end's name (HostVethName(ContainerID, IfName))
	IP              netip.Prefix
	Gateway         netip.Addr
	ClusterNetworks []netip.Prefix // reached on-link, so pods ARP for each other across the overlay
	// Routes are reached through RoutesVia (a Network's cross-talk peers through the node's gateway on
	// it), installed as ofsdn's (RouteProtocol) so SetRoutes can change them later.
	Routes    []netip.Prefix
	RoutesVia netip.Addr
	// MAC of the pod's interface; nil: MACFor(IP).
	MAC net.HardwareAddr
	MTU int
	// TxChecksumOff turns off TX checksum offload on the pod side: needed with OVS's userspace
	// (netdev) datapath, which passes partial checksums through AF_PACKET (shared/LAB.md).
	TxChecksumOff bool
}

// HostVethName derives a stable, unique, 15-character host interface name for a sandbox interface.
func HostVethName(containerID, ifName string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifName))
	return "veth" + hex.EncodeToString(sum[:])[:11]
}

// MACFor derives the pod's MAC from its IPv4 address (0a:58:a.b.c.d), as openshift-sdn and OVN do: a
// pod keeps its MAC across restarts of the agent, and neighbours' ARP caches stay right.
func MACFor(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
}

// RouteProtocol marks the routes ofsdn manages in a pod (rtnetlink's protocol field; 121 is not in
// iproute2's rt_protos): SetRoutes replaces only those.
const RouteProtocol netlink.RouteProtocol = 121

// routeMetric is the metric of ofsdn's routes on an interface: one per interface, so the same
// destination through two interfaces (a pod on two networks that both talk to a third) are two routes,
// not one replacing the other.
func routeMetric(link netlink.Link) int { return 1000 + link.Attrs().Index }

// markPrefix starts the alias of every interface ofsdn creates.
const markPrefix = "ofsdn:"

// Mark is the alias both ends of an attachment's veth carry.
func Mark(containerID, ifName string) string { return markPrefix + containerID + "/" + ifName }

// ParseMark returns the attachment an alias names, if it is an ofsdn mark.
func ParseMark(alias string) (containerID, ifName string, ok bool) {
	rest, ok := strings.CutPrefix(alias, markPrefix)
	if !ok {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, '/')
	if i <= 0 || i == len(rest)-1 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}

var (
	// ErrNetNSGone says the pod's network namespace no longer exists (or the path is no namespace).
	ErrNetNSGone = errors.New("pod network namespace does not exist")
	// ErrForeignInterface says an interface in the way was not made by ofsdn for this attachment.
	ErrForeignInterface = errors.New("not created by ofsdn for this attachment")
	// ErrNotAttached says the attachment's interface is not (or no longer) there: the host end is
	// missing, or the pod's namespace holds no interface of this attachment under its name.
	ErrNotAttached = errors.New("attachment's interface not present")
)

// openNetNS opens a namespace by path and makes sure it is one: a path whose namespace is gone can
// remain as an empty file (a runtime that died between unmounting and removing it).
func openNetNS(path string) (netns.NsHandle, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("podnet: %s: %w", path, ErrNetNSGone)
		}
		return 0, fmt.Errorf("podnet: open netns %s: %w", path, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(ns), &st); err != nil {
		ns.Close()
		return 0, fmt.Errorf("podnet: netns %s: %w", path, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		ns.Close()
		return 0, fmt.Errorf("podnet: %s is not a network namespace: %w", path, ErrNetNSGone)
	}
	return ns, nil
}

// ownedHostEnd says whether a host-side link is this attachment's: a veth with its mark, or unmarked
// (plumbed before marks existed; its name is derived from the attachment).
func ownedHostEnd(l netlink.Link, mark string) bool {
	return l.Type() == "veth" && (l.Attrs().Alias == mark || l.Attrs().Alias == "")
}

// ownedPodEnd says whether the pod-side link is this attachment's: a veth with its mark, or the peer of
// the attachment's host end (unmarked: plumbed before marks existed, or the agent died between creating
// the pair and marking this end).
func ownedPodEnd(pod, host netlink.Link, mark string) bool {
	if pod.Type() != "veth" {
		return false
	}
	if pod.Attrs().Alias == mark {
		return true
	}
	return pod.Attrs().Alias == "" && host != nil && ownedHostEnd(host, mark) &&
		pod.Attrs().ParentIndex == host.Attrs().Index && host.Attrs().ParentIndex == pod.Attrs().Index
}

// describe says what an interface is, for an error a person reads.
func describe(h *netlink.Handle, l netlink.Link) string {
	var addrs []string
	if list, err := h.AddrList(l, netlink.FAMILY_ALL); err == nil {
		for _, a := range list {
			addrs = append(addrs, a.IPNet.String())
		}
	}
	return fmt.Sprintf("type %s, addresses [%s], alias %q", l.Type(), strings.Join(addrs, " "), l.Attrs().Alias)
}

// Setup creates and configures the pod's interface and returns its MAC. An interface of this
// attachment left by an ADD that did not finish is replaced; any other interface in the way (the
// pod's IfName, or a host link with the host end's name) is left alone and refused with
// ErrForeignInterface.
func Setup(cfg Config) (net.HardwareAddr, error) {
	if !cfg.IP.IsValid() || !cfg.IP.Addr().Is4() {
		return nil, fmt.Errorf("podnet: pod address %s is not IPv4", cfg.IP)
	}
	if cfg.ContainerID == "" || cfg.IfName == "" || cfg.HostVeth == "" {
		return nil, fmt.Errorf("podnet: configuration needs a container ID, an interface name and a host end name")
	}
	podNS, err := openNetNS(cfg.NetNS)
	if err != nil {
		return nil, err
	}
	defer podNS.Close()
	podH, err := netlink.NewHandleAt(podNS)
	if err != nil {
		return nil, fmt.Errorf("podnet: netlink in %s: %w", cfg.NetNS, err)
	}
	defer podH.Close()
	hostH, err := hostHandle(cfg.HostNetNS)
	if err != nil {
		return nil, err
	}
	defer hostH.Close()
	mac := cfg.mac()
	mark := Mark(cfg.ContainerID, cfg.IfName)

	// What is in the way must be this attachment's own leftover (an ADD that did not finish) to go.
	oldHost, err := linkOrNil(hostH, cfg.HostVeth)
	if err != nil {
		return nil, err
	}
	if oldHost != nil && !ownedHostEnd(oldHost, mark) {
		return nil, fmt.Errorf("podnet: %s in the node's namespace (%s): %w", cfg.HostVeth, describe(hostH, oldHost), ErrForeignInterface)
	}
	oldPod, err := linkOrNil(podH, cfg.IfName)
	if err != nil {
		return nil, err
	}
	if oldPod != nil {
		if !ownedPodEnd(oldPod, oldHost, mark) {
			return nil, fmt.Errorf("podnet: %s already exists in %s (%s): %w", cfg.IfName, cfg.NetNS, describe(podH, oldPod), ErrForeignInterface)
		}
		if err := podH.LinkDel(oldPod); err != nil {
			return nil, fmt.Errorf("podnet: remove the unfinished %s in %s: %w", cfg.IfName, cfg.NetNS, err)
		}
	}
	if oldHost != nil {
		if err := hostH.LinkDel(oldHost); err != nil && !isNotFound(err) { // gone with its peer already
			return nil, fmt.Errorf("podnet: remove the unfinished %s: %w", cfg.HostVeth, err)
		}
	}
	// The kernel takes no alias when it creates a link: both ends get their mark right after. Until
	// then the host end is told this attachment's by its derived name, and the pod end as its peer.
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: cfg.HostVeth, MTU: cfg.MTU},
		PeerName:         cfg.IfName,
		PeerNamespace:    netlink.NsFd(int(podNS)),
		PeerMTU:          uint32(cfg.MTU),
		PeerHardwareAddr: mac,
	}
	if err := hostH.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("podnet: create veth %s: %w", cfg.HostVeth, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = hostH.LinkDel(veth)
		}
	}()
	host, err := hostH.LinkByName(cfg.HostVeth)
	if err != nil {
		return nil, fmt.Errorf("podnet: %w", err)
	}
	if err := hostH.LinkSetAlias(host, mark); err != nil {
		return nil, fmt.Errorf("podnet: mark %s: %w", cfg.HostVeth, err)
	}
	pod, err := podH.LinkByName(cfg.IfName)
	if err != nil {
		return nil, fmt.Errorf("podnet: %s in pod: %w", cfg.IfName, err)
	}
	if err := podH.LinkSetAlias(pod, mark); err != nil {
		return nil, fmt.Errorf("podnet: mark %s in pod: %w", cfg.IfName, err)
	}
	// Before the link is up (the pod's first ARP must not race this): the host end is a bridge port,
	// never an IP interface of the node. With the userspace datapath the node's kernel sees every frame
	// too (OVS reads the veth with a packet socket), and it would answer the pod's ARP for the gateway
	// with the veth's MAC, after which it routes the pod's packets itself, around br0 and its rules.
	if err := quietHostEnd(cfg.HostNetNS, cfg.HostVeth); err != nil {
		return nil, err
	}
	if err := hostH.LinkSetUp(host); err != nil {
		return nil, fmt.Errorf("podnet: up %s: %w", cfg.HostVeth, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: cfg.IP.Addr().AsSlice(), Mask: net.CIDRMask(cfg.IP.Bits(), 32)}}
	if err := podH.AddrAdd(pod, addr); err != nil {
		return nil, fmt.Errorf("podnet: address %s: %w", cfg.IP, err)
	}
	if err := podH.LinkSetUp(pod); err != nil {
		return nil, fmt.Errorf("podnet: up %s: %w", cfg.IfName, err)
	}
	if lo, err := podH.LinkByName("lo"); err == nil {
		_ = podH.LinkSetUp(lo)
	}
	for _, cn := range cfg.ClusterNetworks {
		r := &netlink.Route{LinkIndex: pod.Attrs().Index, Scope: netlink.SCOPE_LINK,
			Dst: &net.IPNet{IP: cn.Masked().Addr().AsSlice(), Mask: net.CIDRMask(cn.Bits(), 32)}}
		if err := podH.RouteReplace(r); err != nil {
			return nil, fmt.Errorf("podnet: route %s: %w", cn, err)
		}
	}
	if cfg.Gateway.IsValid() {
		r := &netlink.Route{LinkIndex: pod.Attrs().Index, Gw: cfg.Gateway.AsSlice()}
		if err := podH.RouteReplace(r); err != nil {
			return nil, fmt.Errorf("podnet: default route via %s: %w", cfg.Gateway, err)
		}
	}
	if err := setRoutes(podH, pod, cfg.RoutesVia, cfg.Routes); err != nil {
		return nil, err
	}
	if cfg.TxChecksumOff {
		if err := inNetNS(podNS, func() error { return setTxChecksum(cfg.IfName, false) }); err != nil {
			return nil, fmt.Errorf("podnet: TX checksum offload off on %s: %w", cfg.IfName, err)
		}
	}
	ok = true
	return mac, nil
}

// Teardown removes an attachment's interface by its host end (the kernel removes the peer with it). A
// missing interface is no error: DEL must be idempotent. A link with the host end's name that is not
// this attachment's is left alone (ErrForeignInterface).
func Teardown(hostNetNS, containerID, ifName string) error {
	hostH, err := hostHandle(hostNetNS)
	if err != nil {
		return err
	}
	defer hostH.Close()
	name := HostVethName(containerID, ifName)
	l, err := linkOrNil(hostH, name)
	if err != nil || l == nil {
		return err
	}
	if !ownedHostEnd(l, Mark(containerID, ifName)) {
		return fmt.Errorf("podnet: %s (%s): %w", name, describe(hostH, l), ErrForeignInterface)
	}
	if err := hostH.LinkDel(l); err != nil && !isNotFound(err) {
		return fmt.Errorf("podnet: delete %s: %w", name, err)
	}
	return nil
}

// HostEnd is the host end of an attachment, as found on the node.
type HostEnd struct {
	Name                string
	ContainerID, IfName string // from its mark
}

// ListHostEnds lists the marked host ends in the node's namespace: every veth ofsdn made there.
func ListHostEnds(hostNetNS string) ([]HostEnd, error) {
	hostH, err := hostHandle(hostNetNS)
	if err != nil {
		return nil, err
	}
	defer hostH.Close()
	links, err := hostH.LinkList()
	if err != nil {
		return nil, fmt.Errorf("podnet: list links: %w", err)
	}
	var out []HostEnd
	for _, l := range links {
		cid, ifName, ok := ParseMark(l.Attrs().Alias)
		if ok && l.Type() == "veth" && l.Attrs().Name == HostVethName(cid, ifName) {
			out = append(out, HostEnd{Name: l.Attrs().Name, ContainerID: cid, IfName: ifName})
		}
	}
	return out, nil
}

// HostEndPresent reports whether a link of that name exists in the node's namespace.
func HostEndPresent(hostNetNS, name string) (bool, error) {
	hostH, err := hostHandle(hostNetNS)
	if err != nil {
		return false, err
	}
	defer hostH.Close()
	l, err := linkOrNil(hostH, name)
	return l != nil, err
}

func linkOrNil(h *netlink.Handle, name string) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("podnet: %s: %w", name, err)
	}
	return l, nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// hostHandle opens netlink in the host end's namespace.
func hostHandle(path string) (*netlink.Handle, error) {
	if path == "" {
		h, err := netlink.NewHandle()
		if err != nil {
			return nil, fmt.Errorf("podnet: netlink: %w", err)
		}
		return h, nil
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("podnet: host netns %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("podnet: netlink in %s: %w", path, err)
	}
	return h, nil
}

// Check verifies an attachment's interface: ErrNetNSGone when its namespace no longer exists,
// ErrNotAttached when the host end is missing or the namespace holds no interface of this attachment
// under IfName (the netns path now names another sandbox's namespace), and other errors when the
// interface is there but not as configured (MAC, address) or when the kernel could not be asked.
func Check(cfg Config) error {
	podNS, err := openNetNS(cfg.NetNS)
	if err != nil {
		return err
	}
	defer podNS.Close()
	podH, err := netlink.NewHandleAt(podNS)
	if err != nil {
		return fmt.Errorf("podnet: %w", err)
	}
	defer podH.Close()
	hostH, err := hostHandle(cfg.HostNetNS)
	if err != nil {
		return err
	}
	defer hostH.Close()
	mark := Mark(cfg.ContainerID, cfg.IfName)
	host, err := linkOrNil(hostH, cfg.HostVeth)
	if err != nil {
		return err
	}
	if host == nil || !ownedHostEnd(host, mark) {
		return fmt.Errorf("podnet: host end %s of %s: %w", cfg.HostVeth, mark, ErrNotAttached)
	}
	pod, err := linkOrNil(podH, cfg.IfName)
	if err != nil {
		return err
	}
	if pod == nil || !ownedPodEnd(pod, host, mark) {
		return fmt.Errorf("podnet: %s in %s is not %s: %w", cfg.IfName, cfg.NetNS, mark, ErrNotAttached)
	}
	if want := cfg.mac(); pod.Attrs().HardwareAddr.String() != want.String() {
		return fmt.Errorf("podnet: %s has MAC %s, want %s", cfg.IfName, pod.Attrs().HardwareAddr, want)
	}
	if pod.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("podnet: %s in %s is down", cfg.IfName, cfg.NetNS)
	}
	addrs, err := podH.AddrList(pod, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("podnet: %w", err)
	}
	for _, a := range addrs {
		if a.IPNet.String() == cfg.IP.String() {
			return nil
		}
	}
	return fmt.Errorf("podnet: %s lacks address %s", cfg.IfName, cfg.IP)
}

func (cfg Config) mac() net.HardwareAddr {
	if len(cfg.MAC) == 6 {
		return cfg.MAC
	}
	return MACFor(cfg.IP.Addr())
}

// SetRoutes makes ofsdn's routes (RouteProtocol) on a pod interface exactly routes through via: what is
// missing is added, what is no longer wanted removed; the pod's other routes are left alone.
func SetRoutes(netnsPath, ifName string, via netip.Addr, routes []netip.Prefix) error {
	podNS, err := openNetNS(netnsPath)
	if err != nil {
		return err
	}
	defer podNS.Close()
	podH, err := netlink.NewHandleAt(podNS)
	if err != nil {
		return fmt.Errorf("podnet: netlink in %s: %w", netnsPath, err)
	}
	defer podH.Close()
	link, err := linkOrNil(podH, ifName)
	if err != nil {
		return err
	}
	if link == nil {
		return fmt.Errorf("podnet: %s in %s: %w", ifName, netnsPath, ErrNotAttached)
	}
	return setRoutes(podH, link, via, routes)
}

func setRoutes(h *netlink.Handle, link netlink.Link, via netip.Addr, routes []netip.Prefix) error {
	have, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: link.Attrs().Index, Protocol: RouteProtocol},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return fmt.Errorf("podnet: list routes of %s: %w", link.Attrs().Name, err)
	}
	want := map[netip.Prefix]bool{}
	if via.IsValid() {
		for _, r := range routes {
			want[r.Masked()] = true
		}
	}
	for _, r := range have {
		if r.Dst == nil {
			continue
		}
		dst, ok := netip.AddrFromSlice(r.Dst.IP)
		ones, _ := r.Dst.Mask.Size()
		gw, _ := netip.AddrFromSlice(r.Gw)
		p := netip.PrefixFrom(dst.Unmap(), ones)
		if ok && want[p] && gw.Unmap() == via {
			delete(want, p) // in place already
			continue
		}
		if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("podnet: remove route %s from %s: %w", r.Dst, link.Attrs().Name, err)
		}
	}
	for p := range want {
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)},
			Gw: via.AsSlice(), Protocol: RouteProtocol, Priority: routeMetric(link)}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("podnet: route %s via %s on %s: %w", p, via, link.Attrs().Name, err)
		}
	}
	return nil
}

// inNetNS runs f on a locked OS thread switched into ns. Should the thread fail to switch back, it
// stays locked, and Go discards it when the goroutine ends instead of reusing a thread in the wrong
// namespace.
func inNetNS(ns netns.NsHandle, f func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := f()
	if err := netns.Set(orig); err != nil {
		return errors.Join(ferr, fmt.Errorf("return to the agent's network namespace: %w", err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// quietHostEnd keeps the node's IP stack off a pod's host veth: no ARP replies (arp_ignore 8) and no
// IPv6 (no addresses, no neighbour discovery).
func quietHostEnd(hostNetNS, name string) error {
	set := func() error {
		if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+name+"/arp_ignore", []byte("8\n"), 0o644); err != nil {
			return err
		}
		err := os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1\n"), 0o644)
		if errors.Is(err, os.ErrNotExist) { // a kernel without IPv6
			return nil
		}
		return err
	}
	var err error
	if hostNetNS == "" {
		err = set()
	} else {
		ns, nerr := netns.GetFromPath(hostNetNS)
		if nerr != nil {
			return fmt.Errorf("podnet: host netns %s: %w", hostNetNS, nerr)
		}
		defer ns.Close()
		err = inNetNS(ns, set)
	}
	if err != nil {
		return fmt.Errorf("podnet: keep the node's IP stack off %s: %w", name, err)
	}
	return nil
}

// setTxChecksum sets TX checksum offload with the SIOCETHTOOL ioctl (ETHTOOL_STXCSUM).
func setTxChecksum(ifName string, on bool) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	const ethtoolSTxCsum = 0x17
	value := struct{ cmd, data uint32 }{cmd: ethtoolSTxCsum}
	if on {
		value.data = 1
	}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data uintptr
		_    [16]byte
	}
	copy(ifr.name[:], ifName)
	ifr.data = uintptr(unsafe.Pointer(&value))
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return errno
	}
	return nil
}
