// Package podnet plumbs a pod's interface: a veth pair whose host end stays in the agent's network
// namespace (where ovs-vswitchd attaches it to br0) and whose other end becomes the pod's eth0 with its
// address, MAC, MTU and routes. All through netlink; nothing is exec'd.
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
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Config describes one pod interface.
type Config struct {
	NetNS           string // path of the pod's network namespace, e.g. /var/run/netns/x or /proc/PID/ns/net
	HostNetNS       string // where the host end lives (the node's, with ovs-vswitchd); "" = the agent's own
	IfName          string // inside the pod, usually eth0
	HostVeth        string // the host end's name (HostVethName)
	IP              netip.Prefix
	Gateway         netip.Addr
	ClusterNetworks []netip.Prefix // reached on-link, so pods ARP for each other across the overlay
	MTU             int
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

// ErrNetNSGone says the pod's network namespace no longer exists.
var ErrNetNSGone = errors.New("pod network namespace does not exist")

// Setup creates and configures the pod's interface and returns its MAC. Calling it again for an
// interface that exists reconfigures it (an ADD retried by the runtime).
func Setup(cfg Config) (net.HardwareAddr, error) {
	if !cfg.IP.IsValid() || !cfg.IP.Addr().Is4() {
		return nil, fmt.Errorf("podnet: pod address %s is not IPv4", cfg.IP)
	}
	podNS, err := netns.GetFromPath(cfg.NetNS)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("podnet: %s: %w", cfg.NetNS, ErrNetNSGone)
		}
		return nil, fmt.Errorf("podnet: open netns %s: %w", cfg.NetNS, err)
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
	mac := MACFor(cfg.IP.Addr())

	if old, err := hostH.LinkByName(cfg.HostVeth); err == nil {
		// A retried ADD: start from scratch so every setting below is known to hold.
		if err := hostH.LinkDel(old); err != nil {
			return nil, fmt.Errorf("podnet: remove previous %s: %w", cfg.HostVeth, err)
		}
	}
	if l, err := podH.LinkByName(cfg.IfName); err == nil {
		if err := podH.LinkDel(l); err != nil {
			return nil, fmt.Errorf("podnet: remove previous %s in pod: %w", cfg.IfName, err)
		}
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: cfg.HostVeth, MTU: cfg.MTU},
		PeerName:      cfg.IfName,
		PeerNamespace: netlink.NsFd(int(podNS)),
		PeerMTU:       uint32(cfg.MTU),
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
	pod, err := podH.LinkByName(cfg.IfName)
	if err != nil {
		return nil, fmt.Errorf("podnet: %s in pod: %w", cfg.IfName, err)
	}
	if err := podH.LinkSetHardwareAddr(pod, mac); err != nil {
		return nil, fmt.Errorf("podnet: MAC of %s: %w", cfg.IfName, err)
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
	if cfg.TxChecksumOff {
		if err := inNetNS(podNS, func() error { return setTxChecksum(cfg.IfName, false) }); err != nil {
			return nil, fmt.Errorf("podnet: TX checksum offload off on %s: %w", cfg.IfName, err)
		}
	}
	ok = true
	return mac, nil
}

// Teardown removes the pod interface by its host end (the kernel removes the peer with it). A missing
// interface is no error: DEL must be idempotent.
func Teardown(hostNetNS, hostVeth string) error {
	hostH, err := hostHandle(hostNetNS)
	if err != nil {
		return err
	}
	defer hostH.Close()
	l, err := hostH.LinkByName(hostVeth)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("podnet: %s: %w", hostVeth, err)
	}
	if err := hostH.LinkDel(l); err != nil {
		return fmt.Errorf("podnet: delete %s: %w", hostVeth, err)
	}
	return nil
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

// Check verifies that the pod interface exists with the expected address and MAC.
func Check(cfg Config) error {
	podNS, err := netns.GetFromPath(cfg.NetNS)
	if err != nil {
		return fmt.Errorf("podnet: %s: %w", cfg.NetNS, ErrNetNSGone)
	}
	defer podNS.Close()
	podH, err := netlink.NewHandleAt(podNS)
	if err != nil {
		return fmt.Errorf("podnet: %w", err)
	}
	defer podH.Close()
	pod, err := podH.LinkByName(cfg.IfName)
	if err != nil {
		return fmt.Errorf("podnet: %s missing in pod: %w", cfg.IfName, err)
	}
	if want := MACFor(cfg.IP.Addr()); pod.Attrs().HardwareAddr.String() != want.String() {
		return fmt.Errorf("podnet: %s has MAC %s, want %s", cfg.IfName, pod.Attrs().HardwareAddr, want)
	}
	addrs, err := podH.AddrList(pod, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("podnet: %w", err)
	}
	for _, a := range addrs {
		if a.IPNet.String() == cfg.IP.String() {
			hostH, err := hostHandle(cfg.HostNetNS)
			if err != nil {
				return err
			}
			defer hostH.Close()
			if _, err := hostH.LinkByName(cfg.HostVeth); err != nil {
				return fmt.Errorf("podnet: host end %s missing: %w", cfg.HostVeth, err)
			}
			return nil
		}
	}
	return fmt.Errorf("podnet: %s lacks address %s", cfg.IfName, cfg.IP)
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
