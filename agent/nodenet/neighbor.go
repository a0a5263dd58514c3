package nodenet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Neighbor is what the node's kernel knows of the next hop towards a tunnel peer on the underlay. A
// userspace ovs-vswitchd needs the same: it sends a tunnel packet out of the bridge the route names, to
// the MAC of the route's next hop, and learns that MAC only by snooping ARP (shared/LAB.md).
type Neighbor struct {
	Peer    netip.Addr
	Link    string     // the interface the route to Peer leaves by
	NextHop netip.Addr // Peer itself on a shared segment, else the route's gateway
	// MAC is nil while the kernel has no usable entry (none, still resolving, or failed).
	MAC net.HardwareAddr
	// Confirmed: the kernel heard from MAC lately (REACHABLE) or was told it (PERMANENT). A STALE, DELAY
	// or PROBE entry is usable but may be out of date.
	Confirmed bool
}

// Neighbor states whose link-layer address the kernel would send to.
const (
	nudUsable    = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE | netlink.NUD_PERMANENT
	nudConfirmed = netlink.NUD_REACHABLE | netlink.NUD_PERMANENT
)

// PeerNeighbors looks up, in the node's namespace, the route to each peer and the kernel's neighbour
// entry for its next hop. It changes nothing. A peer it cannot route is left out and named in the error,
// so the others still count.
func PeerNeighbors(hostNetNS string, peers []netip.Addr) ([]Neighbor, error) {
	h, ns, err := handleAt(hostNetNS)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	defer ns.Close()
	type key struct {
		link int
		ip   netip.Addr
	}
	entries := map[key]netlink.Neigh{}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		list, err := h.NeighList(0, family)
		if err != nil {
			return nil, fmt.Errorf("nodenet: neighbours in %s: %w", nsName(hostNetNS), err)
		}
		for _, n := range list {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				entries[key{n.LinkIndex, ip.Unmap()}] = n
			}
		}
	}
	names := map[int]string{}
	var out []Neighbor
	var errs []error
	for _, peer := range peers {
		n, linkIndex, err := nextHop(h, peer)
		if err == nil && names[linkIndex] == "" {
			var link netlink.Link
			if link, err = h.LinkByIndex(linkIndex); err == nil {
				names[linkIndex] = link.Attrs().Name
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("nodenet: route to peer %s in %s: %w", peer, nsName(hostNetNS), err))
			continue
		}
		n.Link = names[linkIndex]
		if e, ok := entries[key{linkIndex, n.NextHop}]; ok && e.State&nudUsable != 0 && usableMAC(e.HardwareAddr) {
			n.MAC = append(net.HardwareAddr(nil), e.HardwareAddr...)
			n.Confirmed = e.State&nudConfirmed != 0
		}
		out = append(out, n)
	}
	return out, errors.Join(errs...)
}

// nextHop asks the kernel's routing for the way to peer, as a packet to it would go.
func nextHop(h *netlink.Handle, peer netip.Addr) (Neighbor, int, error) {
	if !peer.IsValid() {
		return Neighbor{}, 0, errors.New("no address")
	}
	routes, err := h.RouteGet(peer.Unmap().AsSlice())
	if err != nil {
		return Neighbor{}, 0, err
	}
	if len(routes) == 0 {
		return Neighbor{}, 0, errors.New("no route")
	}
	r := routes[0]
	if r.Type == unix.RTN_LOCAL {
		return Neighbor{}, 0, errors.New("it is an address of this node")
	}
	n := Neighbor{Peer: peer.Unmap(), NextHop: peer.Unmap()}
	if gw, ok := netip.AddrFromSlice(r.Gw); ok && r.Gw != nil && !gw.IsUnspecified() {
		n.NextHop = gw.Unmap()
	}
	return n, r.LinkIndex, nil
}

func usableMAC(mac net.HardwareAddr) bool {
	if len(mac) != 6 {
		return false
	}
	for _, b := range mac {
		if b != 0 {
			return true
		}
	}
	return false
}

// ProbeNeighbor makes the kernel resolve the next hop towards peer, or re-confirm a stale entry, as if
// it had a packet to send there (NTF_USE): an ARP request, or a unicast probe for an entry it has. No
// packet goes to the peer and the entry the kernel has is kept while it is confirmed: a working
// neighbour is never thrown away. Permanent entries are left as they are.
func ProbeNeighbor(hostNetNS string, peer netip.Addr) error {
	h, ns, err := handleAt(hostNetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	defer ns.Close()
	n, linkIndex, err := nextHop(h, peer)
	if err != nil {
		return fmt.Errorf("nodenet: route to peer %s in %s: %w", peer, nsName(hostNetNS), err)
	}
	family := netlink.FAMILY_V4
	if !n.NextHop.Is4() {
		family = netlink.FAMILY_V6
	}
	// Since Linux 5.16 NTF_USE also turns a PERMANENT entry into a dynamic one: leave what an
	// administrator fixed alone (there is nothing to resolve).
	list, err := h.NeighList(linkIndex, family)
	if err != nil {
		return fmt.Errorf("nodenet: neighbours in %s: %w", nsName(hostNetNS), err)
	}
	for _, e := range list {
		if ip, ok := netip.AddrFromSlice(e.IP); ok && ip.Unmap() == n.NextHop && e.State&(netlink.NUD_PERMANENT|netlink.NUD_NOARP) != 0 {
			return nil
		}
	}
	// NeighSet is RTM_NEWNEIGH with NLM_F_CREATE|NLM_F_REPLACE; with NTF_USE and no address the kernel
	// creates the entry if need be and "uses" it, keeping the address it has.
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: linkIndex, Family: family, IP: n.NextHop.AsSlice(), Flags: netlink.NTF_USE}); err != nil {
		return fmt.Errorf("nodenet: resolve %s (next hop to %s) in %s: %w", n.NextHop, peer, nsName(hostNetNS), err)
	}
	return nil
}
