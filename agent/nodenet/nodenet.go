// Package nodenet sets up the host side of a node's pod network, with netlink and nf_tables and no exec:
// tun0 (br0's internal port) as the node subnet's gateway, routes that send the cluster and service
// networks into br0 through tun0, IP forwarding, and SNAT to the node's IP for pod traffic that leaves the
// cluster network (nothing inside the cluster network is NATed). Ensure is idempotent and is run again
// whenever ovs-vswitchd recreates tun0.
//
// Everything happens in the node's network namespace (Config.HostNetNS) through handles opened there; the
// only thread that ever switches namespace is a locked one that switches back (for /proc/sys).
package nodenet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Config is what the host side of the node's pod network depends on.
type Config struct {
	HostNetNS       string         // path of the node's network namespace; "" = the current one
	Tun0            string         // br0's internal port, the pods' gateway
	LocalSubnet     netip.Prefix   // this node's HostSubnet; tun0 gets its first address
	ClusterNetworks []netip.Prefix // routed into br0 via tun0; never NATed among themselves
	ServiceNetwork  netip.Prefix   // optional: routed into br0 too (services are done in br0)
	MTU             int            // tun0's MTU and the routes': the uplink's less VXLAN's 50 bytes
	NodeIP          netip.Addr     // SNAT source for traffic leaving the cluster network
	// BridgeAddresses are link-local addresses br0 itself answers for behind tun0 (the service hairpin
	// source and the NodePort target): each gets a /32 route on tun0.
	BridgeAddresses []netip.Addr
	// ServiceNextHop, when valid, is the onlink gateway of the service network's route: the host then
	// sends ClusterIP traffic to the MAC br0 answers for that address instead of ARPing for every
	// ClusterIP, which nothing would answer.
	ServiceNextHop netip.Addr
	// Forwards are the NodePorts and hostPorts the host DNATs into br0 (nftables, see firewall.go).
	Forwards Forwards
	// MasqueradePorts, when set, are the source ports br0 masquerades connections to at the gateway's
	// address. The node's own connections from the gateway must not pick them (br0 cannot see the
	// kernel's connections): Ensure reports a node whose ephemeral port range overlaps them.
	MasqueradePorts [2]uint16
	Logger          klog.Logger // optional; changes are logged, a no-op Ensure logs nothing but what it must report
}

// MinMTU and MaxMTU bound Config.MTU: below 576 IPv4 hosts may refuse to talk, above 65535 no link goes.
const (
	MinMTU = 576
	MaxMTU = 65535
)

// routeProto marks the routes nodenet owns: static routes on tun0 (iproute2 adds "boot" by default, so
// a hand-made route on tun0 is not taken for one of ours).
const routeProto = netlink.RouteProtocol(unix.RTPROT_STATIC)

// Gateway is tun0's address: the node subnet's first address.
func (c Config) Gateway() netip.Addr { return c.LocalSubnet.Masked().Addr().Next() }

// validName reports whether name can be a Linux interface name (dev_valid_name).
func validName(name string) error {
	switch {
	case name == "":
		return errors.New("no tun0 interface name")
	case len(name) >= unix.IFNAMSIZ:
		return fmt.Errorf("interface name %q longer than %d bytes", name, unix.IFNAMSIZ-1)
	case name == "." || name == ".." || strings.ContainsAny(name, "/: \t\n"):
		return fmt.Errorf("interface name %q is not valid", name)
	}
	return nil
}

func (c Config) validate() error {
	var errs []error
	if err := validName(c.Tun0); err != nil {
		errs = append(errs, err)
	}
	v4net := func(p netip.Prefix) bool { return p.IsValid() && p.Addr().Is4() && p.Bits() > 0 }
	if len(c.ClusterNetworks) == 0 {
		errs = append(errs, errors.New("no cluster networks"))
	}
	inCluster := false
	for _, cn := range c.ClusterNetworks {
		if !v4net(cn) {
			errs = append(errs, fmt.Errorf("cluster network %v: want an IPv4 prefix (not /0)", cn))
			continue
		}
		if c.LocalSubnet.IsValid() && cn.Bits() <= c.LocalSubnet.Bits() && cn.Contains(c.LocalSubnet.Addr()) {
			inCluster = true
		}
		if c.ServiceNetwork.IsValid() && cn.Overlaps(c.ServiceNetwork) {
			errs = append(errs, fmt.Errorf("service network %v overlaps cluster network %v", c.ServiceNetwork, cn))
		}
		if c.NodeIP.IsValid() && cn.Contains(c.NodeIP) {
			errs = append(errs, fmt.Errorf("node IP %v lies inside cluster network %v", c.NodeIP, cn))
		}
	}
	switch {
	case !c.LocalSubnet.IsValid() || !c.LocalSubnet.Addr().Is4() || c.LocalSubnet.Bits() > 30:
		errs = append(errs, fmt.Errorf("node subnet %v: want an IPv4 prefix of /30 or shorter", c.LocalSubnet))
	case !inCluster && len(c.ClusterNetworks) > 0:
		errs = append(errs, fmt.Errorf("node subnet %v lies in no cluster network", c.LocalSubnet))
	}
	if c.ServiceNetwork.IsValid() {
		if !v4net(c.ServiceNetwork) {
			errs = append(errs, fmt.Errorf("service network %v: want an IPv4 prefix (not /0)", c.ServiceNetwork))
		} else if c.NodeIP.IsValid() && c.ServiceNetwork.Contains(c.NodeIP) {
			errs = append(errs, fmt.Errorf("node IP %v lies inside the service network %v", c.NodeIP, c.ServiceNetwork))
		}
	}
	if c.MTU < MinMTU || c.MTU > MaxMTU {
		errs = append(errs, fmt.Errorf("MTU %d out of range %d-%d", c.MTU, MinMTU, MaxMTU))
	}
	if !c.NodeIP.Is4() || c.NodeIP.IsUnspecified() || c.NodeIP.IsLoopback() || c.NodeIP.IsMulticast() {
		errs = append(errs, fmt.Errorf("node IP %v: want a unicast IPv4 address", c.NodeIP))
	}
	if len(errs) > 0 {
		return fmt.Errorf("nodenet: invalid config: %w", errors.Join(errs...))
	}
	return nil
}

// routed lists the prefixes routed through tun0.
func (c Config) routed() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(c.ClusterNetworks)+1+len(c.BridgeAddresses))
	for _, cn := range c.ClusterNetworks {
		out = append(out, cn.Masked())
	}
	if c.ServiceNetwork.IsValid() {
		out = append(out, c.ServiceNetwork.Masked())
	}
	for _, a := range c.BridgeAddresses {
		if a.Is4() {
			out = append(out, netip.PrefixFrom(a, 32))
		}
	}
	return out
}

// Ensure makes the host side match cfg. It waits (bounded by ctx) for tun0 to appear: a userspace
// ovs-vswitchd creates it as a tap a moment after OVSDB has the port. A second call with the same cfg
// changes nothing (not even the nf_tables rules' handles or counters).
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
	if err := ensureRoutes(h, link, cfg); err != nil {
		return err
	}
	if err := ensureForwarding(ns, cfg.Logger); err != nil {
		return err
	}
	checkEphemeralPorts(ns, cfg)
	return ensureSNAT(ns, cfg)
}

// ensureLink gives tun0 its MTU and the gateway address (and no other IPv4 address: a stale one from an
// earlier subnet would answer for the wrong network), and brings it up. The new address goes on before
// stale ones come off, so the gateway never vanishes during a change.
func ensureLink(h *netlink.Handle, link netlink.Link, cfg Config) error {
	name, log := cfg.Tun0, cfg.Logger
	if link.Attrs().MTU != cfg.MTU {
		if err := h.LinkSetMTU(link, cfg.MTU); err != nil {
			return fmt.Errorf("nodenet: MTU %d on %s: %w", cfg.MTU, name, err)
		}
		log.Info("set MTU", "link", name, "from", link.Attrs().MTU, "to", cfg.MTU)
	}
	want := netip.PrefixFrom(cfg.Gateway(), cfg.LocalSubnet.Bits())
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("nodenet: addresses of %s: %w", name, err)
	}
	var stale []netlink.Addr
	have := false
	for _, a := range addrs {
		if prefixOf(a.IPNet) == want {
			have = true
		} else {
			stale = append(stale, a)
		}
	}
	if !have {
		if err := h.AddrAdd(link, &netlink.Addr{IPNet: ipNet(want)}); err != nil {
			return fmt.Errorf("nodenet: address %s on %s: %w", want, name, err)
		}
		log.Info("added gateway address", "link", name, "address", want)
	}
	for _, a := range stale {
		if err := h.AddrDel(link, &a); err != nil {
			return fmt.Errorf("nodenet: remove stale address %s from %s: %w", a.IPNet, name, err)
		}
		log.Info("removed stale address", "link", name, "address", a.IPNet)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := h.LinkSetUp(link); err != nil {
			return fmt.Errorf("nodenet: bring %s up: %w", name, err)
		}
		log.Info("brought link up", "link", name)
	}
	return nil
}

// route is the route nodenet wants for p: on tun0, from the gateway, with the overlay's MTU.
func route(link netlink.Link, p netip.Prefix, cfg Config) *netlink.Route {
	r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: ipNet(p), Src: cfg.Gateway().AsSlice(),
		Scope: netlink.SCOPE_LINK, MTU: cfg.MTU, Protocol: routeProto, Table: unix.RT_TABLE_MAIN, Type: unix.RTN_UNICAST}
	if cfg.ServiceNextHop.Is4() && cfg.ServiceNetwork.IsValid() && p == cfg.ServiceNetwork.Masked() {
		r.Gw, r.Scope, r.Flags = cfg.ServiceNextHop.AsSlice(), netlink.SCOPE_UNIVERSE, int(netlink.FLAG_ONLINK)
	}
	return r
}

// ownedRoutes lists the routes nodenet put on the link: static ones in the main table.
func ownedRoutes(h *netlink.Handle, link netlink.Link) ([]netlink.Route, error) {
	all, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: link.Attrs().Index, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, err
	}
	var out []netlink.Route
	for _, r := range all {
		if r.Protocol == routeProto && r.Dst != nil {
			out = append(out, r)
		}
	}
	return out, nil
}

// sameRoute compares the attributes nodenet sets.
func sameRoute(a, b *netlink.Route) bool {
	return prefixOf(a.Dst) == prefixOf(b.Dst) && a.Src.Equal(b.Src) && a.MTU == b.MTU && a.Scope == b.Scope &&
		a.Gw.Equal(b.Gw) && a.Priority == b.Priority
}

// ensureRoutes installs a route per routed prefix and removes owned routes that are no longer wanted
// (a cluster network that went away), touching nothing that already matches.
func ensureRoutes(h *netlink.Handle, link netlink.Link, cfg Config) error {
	have, err := ownedRoutes(h, link)
	if err != nil {
		return fmt.Errorf("nodenet: routes on %s: %w", cfg.Tun0, err)
	}
	wanted := map[netip.Prefix]bool{}
	for _, p := range cfg.routed() {
		wanted[p] = true
		r := route(link, p, cfg)
		ok := false
		for i := range have {
			if sameRoute(&have[i], r) {
				ok = true
				break
			}
		}
		if ok {
			continue
		}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("nodenet: route %s via %s: %w", p, cfg.Tun0, err)
		}
		cfg.Logger.Info("set route", "dst", p, "dev", cfg.Tun0, "src", cfg.Gateway(), "mtu", cfg.MTU)
	}
	for i := range have {
		if p := prefixOf(have[i].Dst); !wanted[p] {
			if err := h.RouteDel(&have[i]); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("nodenet: delete stale route %s via %s: %w", p, cfg.Tun0, err)
			}
			cfg.Logger.Info("deleted stale route", "dst", p, "dev", cfg.Tun0)
		}
	}
	return nil
}

// ensureForwarding sets net.ipv4.ip_forward in the node's namespace: /proc/sys follows the reading
// thread's namespace, so it is done from a thread switched into it.
func ensureForwarding(ns netns.NsHandle, log klog.Logger) error {
	const path = "/proc/sys/net/ipv4/ip_forward"
	err := inNetNS(ns, func() error {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(b)) == "1" {
			return nil
		}
		log.Info("enabling IP forwarding")
		return os.WriteFile(path, []byte("1\n"), 0o644)
	})
	if err != nil {
		return fmt.Errorf("nodenet: enable IP forwarding: %w", err)
	}
	return nil
}

// checkEphemeralPorts logs an error when the node's ip_local_port_range overlaps MasqueradePorts: a
// connection of the node's own from the gateway could then take the very address and port a
// masqueraded connection to the same endpoint has, and one of the two would fail. It changes nothing:
// the range is the administrator's.
func checkEphemeralPorts(ns netns.NsHandle, cfg Config) {
	lo, hi := cfg.MasqueradePorts[0], cfg.MasqueradePorts[1]
	if lo == 0 || hi < lo {
		return
	}
	const path = "/proc/sys/net/ipv4/ip_local_port_range"
	var b []byte
	err := inNetNS(ns, func() (err error) {
		b, err = os.ReadFile(path)
		return err
	})
	first, last, perr := parsePortRange(string(b))
	switch {
	case err != nil:
		cfg.Logger.Error(err, "cannot read the node's ephemeral port range", "path", path)
	case perr != nil:
		cfg.Logger.Error(perr, "cannot parse the node's ephemeral port range", "path", path, "content", string(b))
	case first <= int(hi) && int(lo) <= last:
		cfg.Logger.Error(fmt.Errorf("net.ipv4.ip_local_port_range %d-%d overlaps %d-%d", first, last, lo, hi),
			"the node's own connections may clash with connections br0 masquerades to the gateway; keep the range outside those ports")
	}
}

// parsePortRange reads ip_local_port_range ("32768\t60999").
func parsePortRange(s string) (int, int, error) {
	var first, last int
	if _, err := fmt.Sscan(s, &first, &last); err != nil {
		return 0, 0, fmt.Errorf("port range %q: %w", strings.TrimSpace(s), err)
	}
	return first, last, nil
}

// Cleanup removes what Ensure added: nodenet's routes on tun0 (whatever subnet they were made for) and
// the nf_tables table. tun0 and its address belong to OVSDB; IP forwarding stays on, as other things on
// the node may rely on it. Missing pieces are not errors, so Cleanup can run twice.
func Cleanup(ctx context.Context, cfg Config) error {
	if err := validName(cfg.Tun0); err != nil {
		return fmt.Errorf("nodenet: invalid config: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("nodenet: cleanup: %w", err)
	}
	h, ns, err := handleAt(cfg.HostNetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	defer ns.Close()
	var errs []error
	link, err := h.LinkByName(cfg.Tun0)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		// Its routes went with it.
	case err != nil:
		errs = append(errs, fmt.Errorf("nodenet: look up %s: %w", cfg.Tun0, err))
	default:
		routes, err := ownedRoutes(h, link)
		if err != nil {
			errs = append(errs, fmt.Errorf("nodenet: routes on %s: %w", cfg.Tun0, err))
		}
		for i := range routes {
			if err := h.RouteDel(&routes[i]); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("nodenet: delete route %s via %s: %w", routes[i].Dst, cfg.Tun0, err))
			}
		}
	}
	if err := deleteSNAT(ns); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// UplinkMTU returns the MTU of the link that holds nodeIP in the node's namespace.
func UplinkMTU(hostNetNS string, nodeIP netip.Addr) (int, error) {
	link, err := uplink(hostNetNS, nodeIP)
	if err != nil {
		return 0, err
	}
	return link.Attrs().MTU, nil
}

// Uplink names the interface that holds nodeIP in the node's namespace: with an OVS bridge holding
// the node's address, the bridge's own (internal) interface, which has the bridge's name.
func Uplink(hostNetNS string, nodeIP netip.Addr) (string, error) {
	link, err := uplink(hostNetNS, nodeIP)
	if err != nil {
		return "", err
	}
	return link.Attrs().Name, nil
}

func uplink(hostNetNS string, nodeIP netip.Addr) (netlink.Link, error) {
	if !nodeIP.IsValid() {
		return nil, errors.New("nodenet: uplink: no node IP")
	}
	h, ns, err := handleAt(hostNetNS)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	defer ns.Close()
	family := netlink.FAMILY_V4
	if !nodeIP.Unmap().Is4() {
		family = netlink.FAMILY_V6
	}
	addrs, err := h.AddrList(nil, family)
	if err != nil {
		return nil, fmt.Errorf("nodenet: list addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == nodeIP.Unmap() {
			link, err := h.LinkByIndex(a.LinkIndex)
			if err != nil {
				return nil, fmt.Errorf("nodenet: link of %s: %w", nodeIP, err)
			}
			return link, nil
		}
	}
	return nil, fmt.Errorf("nodenet: no interface in %s holds the node IP %s", nsName(hostNetNS), nodeIP)
}

// LinkMAC returns an interface's MAC in the node's namespace (tun0's, which br0 addresses the host by).
func LinkMAC(hostNetNS, name string) (net.HardwareAddr, error) {
	h, ns, err := handleAt(hostNetNS)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	defer ns.Close()
	link, err := h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("nodenet: look up %s: %w", name, err)
	}
	return link.Attrs().HardwareAddr, nil
}

func nsName(path string) string {
	if path == "" {
		return "the current network namespace"
	}
	return "network namespace " + path
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
		return nil, 0, fmt.Errorf("nodenet: open %s: %w", nsName(path), err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, 0, fmt.Errorf("nodenet: netlink in %s: %w", nsName(path), err)
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
		// The thread is in the wrong namespace: an extra lock keeps it locked past the deferred unlock,
		// so the runtime ends the thread with its goroutine instead of reusing it.
		runtime.LockOSThread()
		return errors.Join(ferr, fmt.Errorf("return to the original namespace: %w", err))
	}
	return ferr
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// prefixOf converts back; a nil or malformed IPNet gives the zero Prefix.
func prefixOf(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	ip, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}
	}
	ones, bits := n.Mask.Size()
	ip = ip.Unmap()
	if bits != ip.BitLen() {
		return netip.Prefix{}
	}
	return netip.PrefixFrom(ip, ones)
}
