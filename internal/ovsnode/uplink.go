package ovsnode

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/ofsdn/ofsdn/internal/proc"
	"github.com/ofsdn/ofsdn/ovsdb/vswitch"
	"github.com/ovn-org/libovsdb/client"
	"github.com/ovn-org/libovsdb/model"
	libovsdb "github.com/ovn-org/libovsdb/ovsdb"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// connect opens an OVSDB session to the node's ovsdb-server and caches the tables this package reads.
func connect(ctx context.Context, cfg Config) (client.Client, error) {
	dbModel, err := vswitch.FullDatabaseModel()
	if err != nil {
		return nil, fmt.Errorf("ovsnode: %w", err)
	}
	quiet := logr.Discard()
	c, err := client.NewOVSDBClient(dbModel, client.WithEndpoint("unix:"+cfg.DBSocket()), client.WithLogger(&quiet))
	if err != nil {
		return nil, fmt.Errorf("ovsnode: %w", err)
	}
	if err := c.Connect(ctx); err != nil {
		return nil, fmt.Errorf("ovsnode: connect %s: %w", cfg.DBSocket(), err)
	}
	mon := c.NewMonitor(client.WithTable(&vswitch.OpenvSwitch{}), client.WithTable(&vswitch.Bridge{}),
		client.WithTable(&vswitch.Port{}), client.WithTable(&vswitch.Interface{}))
	if _, err := c.Monitor(ctx, mon); err != nil {
		c.Close()
		return nil, fmt.Errorf("ovsnode: monitor: %w", err)
	}
	return c, nil
}

func transact(ctx context.Context, c client.Client, what string, ops ...libovsdb.Operation) error {
	res, err := c.Transact(ctx, ops...)
	if err == nil {
		_, err = libovsdb.CheckOperationResults(res, ops)
	}
	if err != nil {
		return fmt.Errorf("ovsnode: %s: %w", what, err)
	}
	return nil
}

// initDB gives a fresh database its Open_vSwitch row (what `ovs-vsctl init` does), so ovs-vswitchd and
// the agent find one.
func initDB(ctx context.Context, cfg Config) error {
	c, err := connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	var rows []vswitch.OpenvSwitch
	if err := c.List(ctx, &rows); err != nil {
		return fmt.Errorf("ovsnode: %w", err)
	}
	if len(rows) > 0 {
		return nil
	}
	ops, err := c.Create(&vswitch.OpenvSwitch{UUID: "root"})
	if err != nil {
		return fmt.Errorf("ovsnode: %w", err)
	}
	return transact(ctx, c, "initialise the database", ops...)
}

// ensureUplinkBridge makes UplinkBridge (userspace datapath, standalone: it switches as a learning
// bridge, with no controller and no flows) holding its internal port and Uplink, then moves the
// uplink's IPv4 addresses and routes onto the bridge. Each step checks what is there first.
func ensureUplinkBridge(ctx context.Context, cfg Config) error {
	up, err := netlink.LinkByName(cfg.Uplink)
	if err != nil {
		return fmt.Errorf("ovsnode: uplink %s: %w", cfg.Uplink, err)
	}
	addrs, err := netlink.AddrList(up, unix.AF_INET)
	if err != nil {
		return fmt.Errorf("ovsnode: addresses of %s: %w", cfg.Uplink, err)
	}
	c, err := connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	// The addresses the bridge carries are recorded on it, so that they come back if its interface
	// went (an ovs-vswitchd stopped with --cleanup, a node that rebooted with its database).
	recorded, err := recordedAddresses(ctx, c, cfg.UplinkBridge)
	if err != nil {
		return err
	}
	var nodeIP netip.Addr
	switch {
	case len(addrs) > 0:
		nodeIP, _ = netip.AddrFromSlice(addrs[0].IP.To4())
	case len(recorded) > 0:
		nodeIP = recorded[0].Addr()
	default:
		if br, err := netlink.LinkByName(cfg.UplinkBridge); err == nil {
			if bas, err := netlink.AddrList(br, unix.AF_INET); err == nil && len(bas) > 0 {
				nodeIP, _ = netip.AddrFromSlice(bas[0].IP.To4())
			}
		}
	}
	if !nodeIP.IsValid() {
		return fmt.Errorf("ovsnode: neither %s nor %s has an IPv4 address to carry, and none is recorded", cfg.Uplink, cfg.UplinkBridge)
	}
	if err := ensureBridgePorts(ctx, c, cfg, nodeIP); err != nil {
		return err
	}
	moving := map[netip.Prefix]bool{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			ones, _ := a.Mask.Size()
			moving[netip.PrefixFrom(ip, ones)] = true
		}
	}
	for _, p := range recorded {
		moving[p] = true
	}
	if err := recordAddresses(ctx, c, cfg.UplinkBridge, moving); err != nil {
		return err
	}
	var br netlink.Link
	if err := proc.Until(ctx, 20*time.Second, func() bool { br, err = netlink.LinkByName(cfg.UplinkBridge); return err == nil }); err != nil {
		return fmt.Errorf("ovsnode: %s's interface never appeared: %w", cfg.UplinkBridge, err)
	}
	if err := netlink.LinkSetMTU(br, up.Attrs().MTU); err != nil {
		return fmt.Errorf("ovsnode: MTU of %s: %w", cfg.UplinkBridge, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return fmt.Errorf("ovsnode: %s up: %w", cfg.UplinkBridge, err)
	}
	// Routes through a gateway go with the addresses: read them before the addresses leave.
	routes, err := netlink.RouteList(up, unix.AF_INET)
	if err != nil {
		return fmt.Errorf("ovsnode: routes of %s: %w", cfg.Uplink, err)
	}
	for p := range moving {
		moved := netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}}
		if err := netlink.AddrReplace(br, &moved); err != nil {
			return fmt.Errorf("ovsnode: %s on %s: %w", p, cfg.UplinkBridge, err)
		}
		cfg.Logger.Info("the node's address is on the uplink bridge", "address", p.String(), "bridge", cfg.UplinkBridge)
	}
	for _, a := range addrs {
		if err := netlink.AddrDel(up, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("ovsnode: %s off %s: %w", a.IPNet, cfg.Uplink, err)
		}
	}
	for _, r := range routes {
		if r.Gw == nil || r.Protocol == unix.RTPROT_KERNEL {
			continue // connected routes follow their address
		}
		r.LinkIndex = br.Attrs().Index
		if err := netlink.RouteReplace(&r); err != nil {
			return fmt.Errorf("ovsnode: route %s via %s on %s: %w", r.Dst, r.Gw, cfg.UplinkBridge, err)
		}
	}
	return nil
}

// addressesKey is the uplink bridge's external_ids key that records the addresses it carries.
const addressesKey = "ofsdn.io/uplink-addresses"

func recordedAddresses(ctx context.Context, c client.Client, bridge string) ([]netip.Prefix, error) {
	var bridges []vswitch.Bridge
	if err := c.WhereCache(func(b *vswitch.Bridge) bool { return b.Name == bridge }).List(ctx, &bridges); err != nil {
		return nil, fmt.Errorf("ovsnode: %w", err)
	}
	if len(bridges) == 0 || bridges[0].ExternalIDs[addressesKey] == "" {
		return nil, nil
	}
	var out []netip.Prefix
	for _, s := range strings.Split(bridges[0].ExternalIDs[addressesKey], ",") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("ovsnode: %s's %s: %w", bridge, addressesKey, err)
		}
		out = append(out, p)
	}
	return out, nil
}

func recordAddresses(ctx context.Context, c client.Client, bridge string, addrs map[netip.Prefix]bool) error {
	var list []string
	for p := range addrs {
		list = append(list, p.String())
	}
	slices.Sort(list)
	var bridges []vswitch.Bridge
	if err := c.WhereCache(func(b *vswitch.Bridge) bool { return b.Name == bridge }).List(ctx, &bridges); err != nil || len(bridges) == 0 {
		return fmt.Errorf("ovsnode: bridge %s: %v", bridge, err)
	}
	br := bridges[0]
	if br.ExternalIDs[addressesKey] == strings.Join(list, ",") {
		return nil
	}
	ids := maps.Clone(br.ExternalIDs)
	if ids == nil {
		ids = map[string]string{}
	}
	ids[addressesKey] = strings.Join(list, ",")
	br.ExternalIDs = ids
	ops, err := c.Where(&br).Update(&br, &br.ExternalIDs)
	if err != nil {
		return fmt.Errorf("ovsnode: %w", err)
	}
	return transact(ctx, c, "record the uplink's addresses", ops...)
}

// ensureBridgePorts creates the bridge with its internal port and the uplink, or adds what is missing.
func ensureBridgePorts(ctx context.Context, c client.Client, cfg Config, nodeIP netip.Addr) error {
	var bridges []vswitch.Bridge
	if err := c.WhereCache(func(b *vswitch.Bridge) bool { return b.Name == cfg.UplinkBridge }).List(ctx, &bridges); err != nil {
		return fmt.Errorf("ovsnode: %w", err)
	}
	var ports []vswitch.Port
	if err := c.WhereCache(func(p *vswitch.Port) bool { return p.Name == cfg.Uplink }).List(ctx, &ports); err != nil {
		return fmt.Errorf("ovsnode: %w", err)
	}
	upIf := vswitch.Interface{UUID: "upif", Name: cfg.Uplink}
	upPort := vswitch.Port{UUID: "upport", Name: cfg.Uplink, Interfaces: []string{upIf.UUID}}
	switch {
	case len(bridges) == 0:
		standalone := vswitch.BridgeFailModeStandalone
		brIf := vswitch.Interface{UUID: "brif", Name: cfg.UplinkBridge, Type: "internal"}
		brPort := vswitch.Port{UUID: "brport", Name: cfg.UplinkBridge, Interfaces: []string{brIf.UUID}}
		br := vswitch.Bridge{UUID: "br", Name: cfg.UplinkBridge, DatapathType: "netdev", FailMode: &standalone,
			OtherConfig: map[string]string{"hwaddr": uplinkMAC(nodeIP).String()}, Ports: []string{brPort.UUID, upPort.UUID},
			ExternalIDs: map[string]string{"ofsdn.io/uplink-bridge": "true"}}
		var roots []vswitch.OpenvSwitch
		if err := c.List(ctx, &roots); err != nil || len(roots) != 1 {
			return fmt.Errorf("ovsnode: the Open_vSwitch row: %v (%d rows)", err, len(roots))
		}
		ops, err := c.Create(&brIf, &brPort, &upIf, &upPort, &br)
		if err != nil {
			return fmt.Errorf("ovsnode: %w", err)
		}
		mut, err := c.Where(&roots[0]).Mutate(&roots[0], model.Mutation{Field: &roots[0].Bridges, Mutator: libovsdb.MutateOperationInsert, Value: []string{br.UUID}})
		if err != nil {
			return fmt.Errorf("ovsnode: %w", err)
		}
		if err := transact(ctx, c, "create bridge "+cfg.UplinkBridge, append(ops, mut...)...); err != nil {
			return err
		}
	case len(ports) == 0:
		br := &bridges[0]
		ops, err := c.Create(&upIf, &upPort)
		if err != nil {
			return fmt.Errorf("ovsnode: %w", err)
		}
		mut, err := c.Where(br).Mutate(br, model.Mutation{Field: &br.Ports, Mutator: libovsdb.MutateOperationInsert, Value: []string{upPort.UUID}})
		if err != nil {
			return fmt.Errorf("ovsnode: %w", err)
		}
		if err := transact(ctx, c, "add "+cfg.Uplink+" to "+cfg.UplinkBridge, append(ops, mut...)...); err != nil {
			return err
		}
	}
	// ovs-vswitchd can accept a port it then fails to open: check each interface's ofport and error.
	for _, name := range []string{cfg.UplinkBridge, cfg.Uplink} {
		var last string
		err := proc.Until(ctx, 20*time.Second, func() bool {
			var ifs []vswitch.Interface
			if err := c.WhereCache(func(i *vswitch.Interface) bool { return i.Name == name }).List(ctx, &ifs); err != nil || len(ifs) == 0 {
				return false
			}
			if e := ifs[0].Error; e != nil && *e != "" {
				last = *e
				return false
			}
			return ifs[0].Ofport != nil && *ifs[0].Ofport > 0
		})
		if err != nil {
			return fmt.Errorf("ovsnode: port %s on %s: %s: %w", name, cfg.UplinkBridge, last, err)
		}
	}
	return nil
}
