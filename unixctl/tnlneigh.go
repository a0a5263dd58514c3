package unixctl

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// TunnelNeighbor is one entry of ovs-vswitchd's tunnel neighbour cache: the MAC its userspace datapath
// puts on tunnel packets towards IP (a peer, or the gateway towards it) sent out of Bridge. The cache
// exists only for userspace tunnels; the kernel datapath uses the kernel's neighbour table.
type TunnelNeighbor struct {
	IP     netip.Addr
	MAC    net.HardwareAddr // nil while Incomplete
	Bridge string
	// Stale: the entry has expired and will be dropped; OVS no longer uses it.
	Stale bool
	// Incomplete: OVS asked for the MAC and has no answer yet (newer OVS versions list these).
	Incomplete bool
}

// IFNAMSIZ less the terminating NUL: OVS keeps a neighbour's bridge name in a char[IFNAMSIZ] and cuts a
// longer one short, so such a name could never match a bridge.
const maxBridgeName = 15

// TunnelNeighbors lists ovs-vswitchd's tunnel neighbour cache (tnl/neigh/show).
func (c *Client) TunnelNeighbors(ctx context.Context) ([]TunnelNeighbor, error) {
	out, err := c.Call(ctx, "tnl/neigh/show")
	if err != nil {
		return nil, err
	}
	return ParseTunnelNeighbors(out)
}

// SetTunnelNeighbor makes ovs-vswitchd use mac for tunnel packets to ip out of bridge (tnl/neigh/set),
// replacing what it had learnt. Like a learnt entry it ages out once unused (15 minutes by default)
// and a later ARP reply snooped on the bridge replaces it.
func (c *Client) SetTunnelNeighbor(ctx context.Context, bridge string, ip netip.Addr, mac net.HardwareAddr) error {
	switch {
	case bridge == "" || len(bridge) > maxBridgeName || strings.ContainsAny(bridge, " \t\n/"):
		return fmt.Errorf("unixctl: tunnel neighbour: bridge name %q is not a valid interface name", bridge)
	case !ip.IsValid():
		return fmt.Errorf("unixctl: tunnel neighbour on %s: no IP address", bridge)
	case len(mac) != 6:
		return fmt.Errorf("unixctl: tunnel neighbour %s on %s: MAC %q is not an Ethernet address", ip, bridge, mac.String())
	}
	_, err := c.Call(ctx, "tnl/neigh/set", bridge, ip.Unmap().String(), mac.String())
	return err
}

// FlushTunnelNeighbors empties ovs-vswitchd's tunnel neighbour cache (tnl/neigh/flush).
func (c *Client) FlushTunnelNeighbors(ctx context.Context) error {
	_, err := c.Call(ctx, "tnl/neigh/flush")
	return err
}

// ParseTunnelNeighbors reads tnl/neigh/show's table:
//
//	IP                                            MAC                 Bridge
//	==========================================================================
//	192.0.2.12                                    0a:58:c0:00:02:0c   br-ul
//	192.0.2.13                                    0a:58:c0:00:02:0d   br-ul STALE
//	192.0.2.14                                                        br-ul INCOMPLETE
//
// IPv4 addresses come unmapped (OVS keeps them as IPv4-mapped IPv6).
func ParseTunnelNeighbors(out string) ([]TunnelNeighbor, error) {
	var list []TunnelNeighbor
	for i, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || (i == 0 && f[0] == "IP") || strings.Trim(f[0], "=") == "" {
			continue
		}
		bad := func(why string) error {
			return fmt.Errorf("unixctl: tnl/neigh/show line %d %q: %s", i+1, strings.TrimSpace(line), why)
		}
		ip, err := netip.ParseAddr(f[0])
		if err != nil {
			return nil, bad("no IP address")
		}
		n := TunnelNeighbor{IP: ip.Unmap()}
		rest := f[1:]
		if len(rest) > 0 {
			if mac, err := net.ParseMAC(rest[0]); err == nil && len(mac) == 6 {
				n.MAC, rest = mac, rest[1:]
			}
		}
		if len(rest) == 0 {
			return nil, bad("no bridge")
		}
		n.Bridge = rest[0]
		for _, flag := range rest[1:] {
			switch flag {
			case "STALE":
				n.Stale = true
			case "INCOMPLETE":
				n.Incomplete = true
			default:
				return nil, bad("unknown flag " + flag)
			}
		}
		if n.MAC == nil && !n.Incomplete {
			return nil, bad("no MAC address")
		}
		list = append(list, n)
	}
	return list, nil
}
