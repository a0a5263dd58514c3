// Package nodenet sets up the host side of a node's pod network, with netlink and nf_tables and no exec:
// tun0 (br0's internal port) as the node subnet's gateway, routes that send the cluster and service
// networks into br0 through tun0, IP forwarding, and SNAT to the node's IP for pod traffic that leaves the
// cluster network (nothing inside the cluster network is NATed). Ensure is idempotent and is run again
// whenever ovs-vswitchd recreates tun0.
package nodenet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NFTTable is ofsdn's own nf_tables table (family ip); nothing else in the host's firewall is touched.
const NFTTable = "ofsdn"

// Config is what the host side of the node's pod network depends on.
type Config struct {
	HostNetNS       string       // path of the node's network namespace; "" = the current one
	Tun0            string       // br0's internal port, the pods' gateway
	LocalSubnet     netip.Prefix // this node's HostSubnet; tun0 gets its first address
	ClusterNetworks []netip.Prefix
	ServiceNetwork  netip.Prefix // optional: routed into br0 too (services are done in br0)
	MTU             int          // tun0's MTU and the routes': the uplink's less VXLAN's 50 bytes
	NodeIP          netip.Addr   // SNAT source for traffic leaving the cluster network
}

// Gateway is tun0's address: the node subnet's first address.
func (c Config) Gateway() netip.Addr { return c.LocalSubnet.Masked().Addr().Next() }

func (c Config) validate() error {
	var errs []error
	if c.Tun0 == "" {
		errs = append(errs, errors.New("no tun0 interface name"))
	}
	if !c.LocalSubnet.IsValid() || !c.LocalSubnet.Addr().Is4() || c.LocalSubnet.Bits() > 30 {
		errs = append(errs, fmt.Errorf("node subnet %v: want an IPv4 prefix of /30 or shorter", c.LocalSubnet))
	}
	if len(c.ClusterNetworks) == 0 {
		errs = append(errs, errors.New("no cluster networks"))
	}
	for _, cn := range c.ClusterNetworks {
		if !cn.IsValid() || !cn.Addr().Is4() {
			errs = append(errs, fmt.Errorf("cluster network %v: want an IPv4 prefix", cn))
		}
	}
	if c.ServiceNetwork.IsValid() && !c.ServiceNetwork.Addr().Is4() {
		errs = append(errs, fmt.Errorf("service network %v: want an IPv4 prefix", c.ServiceNetwork))
	}
	if c.MTU < 576 || c.MTU > 65535 {
		errs = append(errs, fmt.Errorf("MTU %d out of range 576-65535", c.MTU))
	}
	if !c.NodeIP.Is4() {
		errs = append(errs, fmt.Errorf("node IP %v: want an IPv4 address", c.NodeIP))
	}
	if len(errs) > 0 {
		return fmt.Errorf("nodenet: %w", errors.Join(errs...))
	}
	return nil
}

// routed lists the prefixes routed through tun0.
func (c Config) routed() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(c.ClusterNetworks)+1)
	for _, cn := range c.ClusterNetworks {
		out = append(out, cn.Masked())
	}
	if c.ServiceNetwork.IsValid() {
		out = append(out, c.ServiceNetwork.Masked())
	}
	return out
}

// Ensure makes the host side match cfg. It waits (bounded by ctx) for tun0 to appear: a userspace
// ovs-vswitchd creates it as a tap a moment after OVSDB has the port.
func Ensure(ctx context.Context, cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	h, ns, err := handleAt(cfg.HostNetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	defer ns.Close()
	link, err := waitLink(ctx, h, cfg.Tun0)
	if err != nil {
		return err
	}
	if err := ensureLink(h, link, cfg); err != nil {
		return err
	}
	for _, p := range cfg.routed() {
		r := route(link, p, cfg)
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("nodenet: route %s via %s: %w", p, cfg.Tun0, err)
		}
	}
	if err := inNetNS(ns, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644)
	}); err != nil {
		return fmt.Errorf("nodenet: enable IP forwarding: %w", err)
	}
	if err := ensureSNAT(ns, cfg); err != nil {
		return err
	}
	return nil
}

// ensureLink gives tun0 its MTU and the gateway address (and no other IPv4 address: a stale one from an
// earlier subnet would answer for the wrong network), and brings it up.
func ensureLink(h *netlink.Handle, link netlink.Link, cfg Config) error {
	name := cfg.Tun0
	if link.Attrs().MTU != cfg.MTU {
		if err := h.LinkSetMTU(link, cfg.MTU); err != nil {
			return fmt.Errorf("nodenet: MTU %d on %s: %w", cfg.MTU, name, err)
		}
	}
	want := &net.IPNet{IP: cfg.Gateway().AsSlice(), Mask: net.CIDRMask(cfg.LocalSubnet.Bits(), 32)}
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("nodenet: addresses of %s: %w", name, err)
	}
	have := false
	for _, a := range addrs {
		if a.IPNet.String() == want.String() {
			have = true
			continue
		}
		if err := h.AddrDel(link, &a); err != nil {
			return fmt.Errorf("nodenet: remove stale address %s from %s: %w", a.IPNet, name, err)
		}
	}
	if !have {
		if err := h.AddrAdd(link, &netlink.Addr{IPNet: want}); err != nil {
			return fmt.Errorf("nodenet: address %s on %s: %w", want, name, err)
		}
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := h.LinkSetUp(link); err != nil {
			return fmt.Errorf("nodenet: bring %s up: %w", name, err)
		}
	}
	return nil
}

func route(link netlink.Link, p netip.Prefix, cfg Config) *netlink.Route {
	return &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)},
		Src: cfg.Gateway().AsSlice(), Scope: netlink.SCOPE_LINK, MTU: cfg.MTU, Protocol: netlink.RouteProtocol(unix.RTPROT_STATIC)}
}

// Cleanup removes the routes and the nf_tables table Ensure added. tun0 itself belongs to OVSDB.
func Cleanup(ctx context.Context, cfg Config) error {
	h, ns, err := handleAt(cfg.HostNetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	defer ns.Close()
	var errs []error
	if link, err := h.LinkByName(cfg.Tun0); err == nil {
		for _, p := range cfg.routed() {
			if err := h.RouteDel(route(link, p, cfg)); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("nodenet: delete route %s: %w", p, err))
			}
		}
	}
	c, err := nftConn(ns)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	if t, err := c.ListTableOfFamily(NFTTable, nftables.TableFamilyIPv4); err == nil && t != nil {
		c.DelTable(t)
		if err := c.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("nodenet: delete nf_tables table %s: %w", NFTTable, err))
		}
	}
	return errors.Join(errs...)
}

// UplinkMTU returns the MTU of the link that holds nodeIP in the node's namespace.
func UplinkMTU(hostNetNS string, nodeIP netip.Addr) (int, error) {
	h, ns, err := handleAt(hostNetNS)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	defer ns.Close()
	addrs, err := h.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return 0, fmt.Errorf("nodenet: list addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == nodeIP {
			link, err := h.LinkByIndex(a.LinkIndex)
			if err != nil {
				return 0, fmt.Errorf("nodenet: link of %s: %w", nodeIP, err)
			}
			return link.Attrs().MTU, nil
		}
	}
	return 0, fmt.Errorf("nodenet: no interface holds the node IP %s", nodeIP)
}

// handleAt opens a netlink handle in the namespace at path ("" = the current one).
func handleAt(path string) (*netlink.Handle, netns.NsHandle, error) {
	var ns netns.NsHandle
	var err error
	if path == "" {
		ns, err = netns.Get()
	} else {
		ns, err = netns.GetFromPath(path)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("nodenet: network namespace %q: %w", path, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, 0, fmt.Errorf("nodenet: netlink in %q: %w", path, err)
	}
	return h, ns, nil
}

func waitLink(ctx context.Context, h *netlink.Handle, name string) (netlink.Link, error) {
	for {
		link, err := h.LinkByName(name)
		if err == nil {
			return link, nil
		}
		var notFound netlink.LinkNotFoundError
		if !errors.As(err, &notFound) {
			return nil, fmt.Errorf("nodenet: look up %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("nodenet: %s never appeared (is ovs-vswitchd running and br0 configured?): %w", name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// inNetNS runs fn on a locked OS thread switched into ns (for /proc/sys, which follows the thread's
// namespace), and switches back.
func inNetNS(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		return err
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		// The thread is in the wrong namespace: never let it run other goroutines again.
		runtime.LockOSThread()
		return errors.Join(ferr, fmt.Errorf("return to the original namespace: %w", err))
	}
	return ferr
}

func nftConn(ns netns.NsHandle) (*nftables.Conn, error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return nil, fmt.Errorf("nodenet: nf_tables: %w", err)
	}
	return c, nil
}

// SNATRules describes the postrouting chain in words, in order, for logs and tests: destinations in the
// cluster or service networks return untouched; sources in the cluster networks are SNATed to the node.
func SNATRules(cfg Config) []string {
	var out []string
	for _, p := range cfg.routed() {
		out = append(out, fmt.Sprintf("ip daddr %s return", p))
	}
	for _, cn := range cfg.ClusterNetworks {
		out = append(out, fmt.Sprintf("ip saddr %s snat to %s", cn.Masked(), cfg.NodeIP))
	}
	return out
}

// ensureSNAT rewrites ofsdn's table in one nf_tables transaction, so the rules are never half there.
func ensureSNAT(ns netns.NsHandle, cfg Config) error {
	c, err := nftConn(ns)
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Name: NFTTable, Family: nftables.TableFamilyIPv4})
	ch := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.FlushChain(ch)
	for _, p := range cfg.routed() {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(matchPrefix(16, p), &expr.Verdict{Kind: expr.VerdictReturn})})
	}
	for _, cn := range cfg.ClusterNetworks {
		exprs := append(matchPrefix(12, cn.Masked()),
			&expr.Immediate{Register: 1, Data: cfg.NodeIP.AsSlice()},
			&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nodenet: nf_tables table %s: %w", NFTTable, err)
	}
	return nil
}

// matchPrefix matches the IPv4 header's source (offset 12) or destination (16) against p.
func matchPrefix(offset uint32, p netip.Prefix) []expr.Any {
	mask := net.CIDRMask(p.Bits(), 32)
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

// ResolveNeighbor makes the node's kernel resolve a peer node's address now, by forgetting its neighbour
// entry and sending it one datagram (to the discard port). A userspace ovs-vswitchd learns tunnel
// neighbours only by snooping ARP on the bridge that holds the node's address, and drops the first
// packet to a peer it has not learnt (shared/LAB.md): resolving each peer when it appears, and again
// after ovs-vswitchd restarts, keeps that first packet from being a pod's.
func ResolveNeighbor(hostNetNS string, peer netip.Addr) error {
	h, ns, err := handleAt(hostNetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	defer ns.Close()
	neighs, err := h.NeighList(0, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("nodenet: neighbours: %w", err)
	}
	for _, n := range neighs {
		if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == peer && n.State&netlink.NUD_PERMANENT == 0 {
			_ = h.NeighDel(&n) // a stale entry only delays the ARP; never fatal
		}
	}
	return inNetNS(ns, func() error {
		c, err := net.Dial("udp4", netip.AddrPortFrom(peer, 9).String())
		if err != nil {
			return fmt.Errorf("nodenet: resolve %s: %w", peer, err)
		}
		defer c.Close()
		_, err = c.Write([]byte{0})
		return err
	})
}
