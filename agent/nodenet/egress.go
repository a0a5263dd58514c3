package nodenet

// The host's part of egress IPs (flows/pipeline/egress.go): the holder of an egress IP has the address
// on its uplink (the interface that holds the node's address), announces it with gratuitous ARP, and
// SNATs to it what br0 hands to the host through tun0 with the IP's egress MAC.
//
// Why the host's nf_tables and not br0's conntrack: the host routes the packet out (and resolves the
// next hop's MAC, which br0 cannot), owns the address (answers ARP for it) and sees both directions, so
// its conntrack un-SNATs the replies, which arrive for a local address, and routes them back into br0.
// Were br0 to SNAT, the host would see a packet from one of its own addresses arrive on tun0 (a martian
// it drops) and replies for a local address with no socket behind it.
//
// The rules live in a table of their own, "ip ofsdn-egress" (the node's main table, "ip ofsdn", is
// firewall.go's and never changes for an egress IP move):
//   - postrouting (nat, srcnat-1, so before ofsdn's SNAT to the node's address): from tun0 with the
//     egress MAC of a held IP → snat to that IP;
//   - forward (filter): from tun0 with the egress MAC of a held IP → accept; any other egress MAC →
//     drop. An IP this node no longer holds is never sent from the node's address, whatever br0's flows
//     say for a moment.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// EgressNFTTable is the nf_tables table (family ip) of egress SNAT.
const EgressNFTTable = "ofsdn-egress"

// EgressConfig is what the host's egress part depends on.
type EgressConfig struct {
	HostNetNS string
	Tun0      string
	// MAC gives the source MAC br0 hands an egress IP's traffic over with (pipeline.EgressMAC), and
	// MACPrefix what every such MAC starts with.
	MAC       func(netip.Addr) net.HardwareAddr
	MACPrefix [2]byte
	Logger    klog.Logger
}

// egressChains renders the egress table for the held IPs. Pure.
func egressChains(cfg EgressConfig, held []netip.Addr) []nftChain {
	held = slices.Clone(held)
	slices.SortFunc(held, netip.Addr.Compare)
	held = slices.Compact(held)
	fromTun0 := []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(cfg.Tun0)}}
	etherSrc := func(mac net.HardwareAddr) []expr.Any {
		return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(mac)}}
	}
	var snat, forward []nftRule
	for _, ip := range held {
		if !ip.Is4() {
			continue
		}
		mac := cfg.MAC(ip)
		match := append(slices.Clone(fromTun0), etherSrc(mac)...)
		snat = append(snat, nftRule{Text: fmt.Sprintf("iifname %s ether saddr %s counter snat to %s", cfg.Tun0, mac, ip),
			Exprs: append(slices.Clone(match), &expr.Counter{},
				&expr.Immediate{Register: 1, Data: ip.AsSlice()},
				&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1})})
		forward = append(forward, nftRule{Text: fmt.Sprintf("iifname %s ether saddr %s counter accept", cfg.Tun0, mac),
			Exprs: append(slices.Clone(match), &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept})})
	}
	prefix := fmt.Sprintf("%02x:%02x:00:00:00:00", cfg.MACPrefix[0], cfg.MACPrefix[1])
	forward = append(forward, nftRule{Text: fmt.Sprintf("iifname %s ether saddr & ff:ff:00:00:00:00 == %s counter drop", cfg.Tun0, prefix),
		Exprs: append(slices.Clone(fromTun0),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: cfg.MACPrefix[:]},
			&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop})})
	srcnatEarly := nftables.ChainPriority(*nftables.ChainPriorityNATSource - 1)
	return []nftChain{
		{Name: "postrouting", Type: nftables.ChainTypeNAT, Hook: nftables.ChainHookPostrouting, Priority: &srcnatEarly, Rules: snat},
		{Name: "forward", Type: nftables.ChainTypeFilter, Hook: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Rules: forward},
	}
}

// EgressRules describes the egress table's rules in words, in order, for logs and tests.
func EgressRules(cfg EgressConfig, held []netip.Addr) []string {
	var out []string
	for _, ch := range egressChains(cfg, held) {
		for _, r := range ch.Rules {
			out = append(out, ch.Name+": "+r.Text)
		}
	}
	return out
}

// EnsureEgressSNAT makes the egress table SNAT exactly the held IPs (rewritten in one transaction when
// it differs; nothing is written when it does not).
func EnsureEgressSNAT(cfg EgressConfig, held []netip.Addr) error {
	if err := validName(cfg.Tun0); err != nil {
		return fmt.Errorf("nodenet: egress: %w", err)
	}
	h, ns, err := handleAt(cfg.HostNetNS)
	if err != nil {
		return err
	}
	h.Close()
	defer ns.Close()
	c, err := nftConn(ns)
	if err != nil {
		return err
	}
	want := egressChains(cfg, held)
	if same, err := tableInstalledNamed(c, EgressNFTTable, want); err != nil {
		return err
	} else if same {
		return nil
	}
	t := &nftables.Table{Name: EgressNFTTable, Family: nftables.TableFamilyIPv4}
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	for _, wc := range want {
		ch := c.AddChain(&nftables.Chain{Name: wc.Name, Table: t, Type: wc.Type, Hooknum: wc.Hook, Priority: wc.Priority})
		for _, r := range wc.Rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.Exprs, UserData: userdata.AppendString(nil, userdata.TypeComment, r.Text)})
		}
	}
	if err := c.Flush(); err != nil {
		return nftError("write nf_tables table ip "+EgressNFTTable, err)
	}
	cfg.Logger.V(2).Info("wrote nf_tables rules", "table", "ip "+EgressNFTTable, "held", held)
	return nil
}

// DeleteEgressSNAT removes the egress table, present or not.
func DeleteEgressSNAT(hostNetNS string) error {
	h, ns, err := handleAt(hostNetNS)
	if err != nil {
		return err
	}
	h.Close()
	defer ns.Close()
	c, err := nftConn(ns)
	if err != nil {
		return err
	}
	t := &nftables.Table{Name: EgressNFTTable, Family: nftables.TableFamilyIPv4}
	c.AddTable(t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return nftError("delete nf_tables table ip "+EgressNFTTable, err)
	}
	return nil
}

// UplinkAddresses lists the IPv4 addresses of the interface that holds nodeIP, and its name.
func UplinkAddresses(hostNetNS string, nodeIP netip.Addr) (string, []netip.Prefix, error) {
	link, err := uplink(hostNetNS, nodeIP)
	if err != nil {
		return "", nil, err
	}
	h, ns, err := handleAt(hostNetNS)
	if err != nil {
		return "", nil, err
	}
	defer h.Close()
	defer ns.Close()
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return "", nil, fmt.Errorf("nodenet: addresses of %s: %w", link.Attrs().Name, err)
	}
	out := make([]netip.Prefix, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, prefixOf(a.IPNet))
	}
	return link.Attrs().Name, out, nil
}

// egressPrefix is how an egress IP sits on the uplink: with the node address's prefix when inside its
// subnet (a secondary address, which the kernel never picks as a source of its own), else as a /32.
func egressPrefix(node netip.Prefix, ip netip.Addr) netip.Prefix {
	if node.IsValid() && node.Masked().Contains(ip) {
		return netip.PrefixFrom(ip, node.Bits())
	}
	return netip.PrefixFrom(ip, 32)
}

// AddEgressAddress puts ip on the interface that holds nodeIP (idempotent).
func AddEgressAddress(hostNetNS string, nodeIP, ip netip.Addr) error {
	return changeEgressAddress(hostNetNS, nodeIP, ip, true)
}

// DelEgressAddress removes ip from the interface that holds nodeIP (absent: nothing to do). It never
// removes the node's own address.
func DelEgressAddress(hostNetNS string, nodeIP, ip netip.Addr) error {
	if ip == nodeIP {
		return fmt.Errorf("nodenet: refusing to remove the node's own address %s", ip)
	}
	return changeEgressAddress(hostNetNS, nodeIP, ip, false)
}

func changeEgressAddress(hostNetNS string, nodeIP, ip netip.Addr, add bool) error {
	link, err := uplink(hostNetNS, nodeIP)
	if err != nil {
		return err
	}
	h, ns, err := handleAt(hostNetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	defer ns.Close()
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("nodenet: addresses of %s: %w", link.Attrs().Name, err)
	}
	var node netip.Prefix
	var have []netip.Prefix
	for _, a := range addrs {
		p := prefixOf(a.IPNet)
		if p.Addr() == nodeIP {
			node = p
		}
		if p.Addr() == ip {
			have = append(have, p)
		}
	}
	want := egressPrefix(node, ip)
	if add {
		if slices.Contains(have, want) {
			return nil
		}
		if err := h.AddrReplace(link, &netlink.Addr{IPNet: ipNet(want)}); err != nil {
			return fmt.Errorf("nodenet: add egress IP %s to %s: %w", want, link.Attrs().Name, err)
		}
		return nil
	}
	for _, p := range have {
		if err := h.AddrDel(link, &netlink.Addr{IPNet: ipNet(p)}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("nodenet: remove egress IP %s from %s: %w", p, link.Attrs().Name, err)
		}
	}
	return nil
}

// AnnounceAddress sends gratuitous ARP for ip from the interface that holds nodeIP, with its MAC: a
// request and a reply, each with sender and target ip, broadcast, so every neighbour's cache (a
// switch's, a host's, an ovs-vswitchd's tunnel next hops) takes the new MAC.
func AnnounceAddress(hostNetNS string, nodeIP, ip netip.Addr) error {
	link, err := uplink(hostNetNS, nodeIP)
	if err != nil {
		return err
	}
	mac := link.Attrs().HardwareAddr
	if len(mac) != 6 || !ip.Is4() {
		return fmt.Errorf("nodenet: announce %s on %s: not an Ethernet link or not IPv4", ip, link.Attrs().Name)
	}
	h, ns, err := handleAt(hostNetNS)
	if err != nil {
		return err
	}
	h.Close()
	defer ns.Close()
	return inNetNS(ns, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("nodenet: packet socket: %w", err)
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: link.Attrs().Index, Protocol: htons(unix.ETH_P_ARP), Halen: 6}
		copy(to.Addr[:], broadcast)
		for _, op := range []uint16{arpRequest, arpReply} {
			if err := unix.Sendto(fd, GratuitousARP(mac, ip, op), 0, to); err != nil {
				return fmt.Errorf("nodenet: gratuitous ARP for %s on %s: %w", ip, link.Attrs().Name, err)
			}
		}
		return nil
	})
}

var broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

const (
	arpRequest uint16 = 1
	arpReply   uint16 = 2
)

// GratuitousARP is the Ethernet frame announcing that ip is at mac: op 1 (request, target MAC zero) or
// 2 (reply, target MAC broadcast), sender and target address ip, to the broadcast address.
func GratuitousARP(mac net.HardwareAddr, ip netip.Addr, op uint16) []byte {
	f := make([]byte, 0, 42)
	f = append(f, broadcast...)
	f = append(f, mac...)
	f = binary.BigEndian.AppendUint16(f, unix.ETH_P_ARP)
	f = binary.BigEndian.AppendUint16(f, 1)             // Ethernet
	f = binary.BigEndian.AppendUint16(f, unix.ETH_P_IP) // IPv4
	f = append(f, 6, 4)                                 // address lengths
	f = binary.BigEndian.AppendUint16(f, op)            // operation
	f = append(f, mac...)                               // sender MAC
	f = append(f, ip.AsSlice()...)                      // sender IP
	if op == arpReply {
		f = append(f, broadcast...)
	} else {
		f = append(f, make([]byte, 6)...)
	}
	return append(f, ip.AsSlice()...) // target IP
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Announcements are when a claim announces itself again after the first: a lost frame, or a neighbour
// that answered for the address a moment longer (a node thawing with queued ARP requests), is
// corrected within these.
var Announcements = []time.Duration{0, 100 * time.Millisecond, 400 * time.Millisecond, 1500 * time.Millisecond}

// tableInstalledNamed reports whether the table holds exactly the wanted chains and rules.
func tableInstalledNamed(c *nftables.Conn, name string, want []nftChain) (bool, error) {
	t, err := c.ListTableOfFamily(name, nftables.TableFamilyIPv4)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, nftError("read nf_tables table ip "+name, err)
	}
	all, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return false, nftError("read nf_tables chains", err)
	}
	ours := map[string]*nftables.Chain{}
	for _, ch := range all {
		if ch.Table.Name == name {
			ours[ch.Name] = ch
		}
	}
	if len(ours) != len(want) {
		return false, nil
	}
	for _, w := range want {
		ch := ours[w.Name]
		if ch == nil || ch.Type != w.Type || ch.Hooknum == nil || *ch.Hooknum != *w.Hook || ch.Priority == nil || *ch.Priority != *w.Priority {
			return false, nil
		}
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return false, nftError("read nf_tables rules", err)
		}
		if !sameRules(rules, w.Rules) {
			return false, nil
		}
	}
	return true, nil
}

// ListenUDP opens a UDP socket bound to addr in the node's namespace ("" the caller's).
func ListenUDP(hostNetNS string, addr netip.AddrPort) (*net.UDPConn, error) {
	listen := func() (*net.UDPConn, error) { return net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr)) }
	if hostNetNS == "" {
		return listen()
	}
	h, ns, err := handleAt(hostNetNS)
	if err != nil {
		return nil, err
	}
	h.Close()
	defer ns.Close()
	var c *net.UDPConn
	err = inNetNS(ns, func() (err error) {
		c, err = listen()
		return err
	})
	return c, err
}
