// Package ovsdb is the agent's OVSDB side, on libovsdb with models generated from OVS's own schema
// (ovsdb/vswitch): the bridge (OpenFlow 1.3 only, fail_mode=secure, never a controller: setting one
// flushes every flow), its internal, VXLAN and pod ports with their external_ids, and the bridge's
// external_ids where the flow engine keeps its round and pipeline version.
//
// Every Ensure* is idempotent: when the database already says what is asked, no transaction is sent.
// Ports are only done once ovs-vswitchd gave them an OpenFlow port number; an Interface.error becomes
// the returned error (ovs-vsctl exits 0 while a port failed: shared/LAB.md).
package ovsdb

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/go-logr/logr"
	"github.com/ofsdn/ofsdn/ovsdb/vswitch"
	"github.com/ovn-org/libovsdb/cache"
	"github.com/ovn-org/libovsdb/client"
	"github.com/ovn-org/libovsdb/model"
	libovsdb "github.com/ovn-org/libovsdb/ovsdb"
	"k8s.io/klog/v2"
)

// Client is a connection to ovsdb-server with a cache of the tables the agent uses.
type Client struct {
	c            client.Client
	log          klog.Logger
	transactions atomic.Int64
	// PortTimeout bounds the wait for ovs-vswitchd to number a new port.
	PortTimeout time.Duration

	// Waiters for an Interface row to change, by interface name: the cache's event handler closes the
	// channel, so a CNI ADD learns its port's number the moment the update arrives, without polling.
	ifaceMu      sync.Mutex
	ifaceChanged map[string]chan struct{}
}

// BridgeConfig is the bridge the agent wants.
type BridgeConfig struct {
	Name         string
	DatapathType string // "netdev" (userspace) or "system" (kernel); "" = system
	ExternalIDs  map[string]string
}

// PortInfo is one port of a bridge as OVSDB sees it.
type PortInfo struct {
	Name        string
	Type        string // "" for a system port (a veth), "internal", "vxlan"
	OFPort      int    // -1 when ovs-vswitchd could not open it, 0 while not yet numbered
	ExternalIDs map[string]string
	Error       string
	MAC         string // the interface's mac_in_use, once ovs-vswitchd opened it
}

// Connect connects to an endpoint such as "unix:/var/run/openvswitch/db.sock" and caches the Open_vSwitch,
// Bridge, Port and Interface tables. The connection is re-established on its own.
func Connect(ctx context.Context, endpoint string, logger klog.Logger) (*Client, error) {
	if logger.GetSink() == nil {
		logger = klog.Background()
	}
	dbModel, err := vswitch.FullDatabaseModel()
	if err != nil {
		return nil, fmt.Errorf("ovsdb: %w", err)
	}
	// libovsdb logs every RPC at its default verbosity; keep it for -v=5.
	quiet := logr.Logger(logger.WithName("libovsdb").V(5))
	bo := backoff.NewExponentialBackOff()
	bo.MaxInterval, bo.MaxElapsedTime = 2*time.Second, 0
	c, err := client.NewOVSDBClient(dbModel, client.WithEndpoint(endpoint), client.WithLogger(&quiet),
		client.WithReconnect(10*time.Second, bo))
	if err != nil {
		return nil, fmt.Errorf("ovsdb: %w", err)
	}
	if err := c.Connect(ctx); err != nil {
		return nil, fmt.Errorf("ovsdb: connect %s: %w", endpoint, err)
	}
	ovs := &Client{c: c, log: logger.WithName("ovsdb"), PortTimeout: 20 * time.Second, ifaceChanged: map[string]chan struct{}{}}
	c.Cache().AddEventHandler(&cache.EventHandlerFuncs{
		AddFunc:    func(table string, m model.Model) { ovs.interfaceEvent(table, m) },
		UpdateFunc: func(table string, _, m model.Model) { ovs.interfaceEvent(table, m) },
		DeleteFunc: func(table string, m model.Model) { ovs.interfaceEvent(table, m) },
	})
	mon := c.NewMonitor(client.WithTable(&vswitch.OpenvSwitch{}), client.WithTable(&vswitch.Bridge{}),
		client.WithTable(&vswitch.Port{}), client.WithTable(&vswitch.Interface{}))
	if _, err := c.Monitor(ctx, mon); err != nil {
		c.Close()
		return nil, fmt.Errorf("ovsdb: monitor %s: %w", endpoint, err)
	}
	return ovs, nil
}

// interfaceEvent wakes whoever waits for the Interface row that was added, updated or deleted.
func (c *Client) interfaceEvent(table string, m model.Model) {
	iface, ok := m.(*vswitch.Interface)
	if table != vswitch.InterfaceTable || !ok {
		return
	}
	c.ifaceMu.Lock()
	defer c.ifaceMu.Unlock()
	if ch, ok := c.ifaceChanged[iface.Name]; ok {
		close(ch)
		delete(c.ifaceChanged, iface.Name)
	}
}

// interfaceChange returns a channel closed at the next change of the named Interface row.
func (c *Client) interfaceChange(name string) <-chan struct{} {
	c.ifaceMu.Lock()
	defer c.ifaceMu.Unlock()
	ch, ok := c.ifaceChanged[name]
	if !ok {
		ch = make(chan struct{})
		c.ifaceChanged[name] = ch
	}
	return ch
}

// Close disconnects.
func (c *Client) Close() { c.c.Close() }

// Connected reports whether the connection to ovsdb-server is up (it reconnects on its own).
func (c *Client) Connected() bool { return c.c.Connected() }

// Transactions counts the transactions sent (idempotency shows as no increase).
func (c *Client) Transactions() int64 { return c.transactions.Load() }

func (c *Client) transact(ctx context.Context, what string, ops ...libovsdb.Operation) error {
	c.transactions.Add(1)
	res, err := c.c.Transact(ctx, ops...)
	if err != nil {
		return fmt.Errorf("ovsdb: %s: %w", what, err)
	}
	if _, err := libovsdb.CheckOperationResults(res, ops); err != nil {
		return fmt.Errorf("ovsdb: %s: %w", what, err)
	}
	return nil
}

func (c *Client) bridge(ctx context.Context, name string) (*vswitch.Bridge, error) {
	var bridges []vswitch.Bridge
	if err := c.c.WhereCache(func(b *vswitch.Bridge) bool { return b.Name == name }).List(ctx, &bridges); err != nil {
		return nil, fmt.Errorf("ovsdb: %w", err)
	}
	if len(bridges) == 0 {
		return nil, nil
	}
	return &bridges[0], nil
}

func (c *Client) mustBridge(ctx context.Context, name string) (*vswitch.Bridge, error) {
	br, err := c.bridge(ctx, name)
	if err == nil && br == nil {
		err = fmt.Errorf("ovsdb: bridge %s does not exist", name)
	}
	return br, err
}

func (c *Client) root(ctx context.Context) (*vswitch.OpenvSwitch, error) {
	var rows []vswitch.OpenvSwitch
	if err := c.c.List(ctx, &rows); err != nil {
		return nil, fmt.Errorf("ovsdb: %w", err)
	}
	if len(rows) != 1 {
		return nil, fmt.Errorf("ovsdb: %d Open_vSwitch rows (is the database initialised? ovs-vsctl init)", len(rows))
	}
	return &rows[0], nil
}

// EnsureBridge creates the bridge, or brings an existing one to OpenFlow 1.3 only, fail_mode=secure and
// the datapath type asked, without touching its flows. It never sets a controller.
func (c *Client) EnsureBridge(ctx context.Context, cfg BridgeConfig) error {
	dp := cfg.DatapathType
	if dp == "" {
		dp = "system"
	}
	secure := vswitch.BridgeFailModeSecure
	want := vswitch.Bridge{Name: cfg.Name, DatapathType: dp, FailMode: &secure,
		Protocols: []vswitch.BridgeProtocols{vswitch.BridgeProtocolsOpenflow13}, OtherConfig: map[string]string{"disable-in-band": "true"}}
	br, err := c.bridge(ctx, cfg.Name)
	if err != nil {
		return err
	}
	if br == nil {
		root, err := c.root(ctx)
		if err != nil {
			return err
		}
		want.UUID = "newbridge"
		want.ExternalIDs = cfg.ExternalIDs
		ops, err := c.c.Create(&want)
		if err != nil {
			return fmt.Errorf("ovsdb: create bridge %s: %w", cfg.Name, err)
		}
		mut, err := c.c.Where(root).Mutate(root, model.Mutation{Field: &root.Bridges, Mutator: libovsdb.MutateOperationInsert, Value: []string{want.UUID}})
		if err != nil {
			return fmt.Errorf("ovsdb: add bridge %s: %w", cfg.Name, err)
		}
		return c.transact(ctx, "create bridge "+cfg.Name, append(ops, mut...)...)
	}
	changed := br.DatapathType != dp || br.FailMode == nil || *br.FailMode != secure ||
		!slices.Equal(br.Protocols, want.Protocols) || br.OtherConfig["disable-in-band"] != "true" || len(br.Controller) != 0
	for k, v := range cfg.ExternalIDs {
		if br.ExternalIDs[k] != v {
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if len(br.Controller) != 0 {
		c.log.Info("bridge has a controller set; leaving it (removing one flushes the bridge's flows)", "bridge", cfg.Name)
	}
	upd := *br
	upd.DatapathType, upd.FailMode, upd.Protocols = dp, &secure, want.Protocols
	upd.OtherConfig = maps.Clone(br.OtherConfig)
	if upd.OtherConfig == nil {
		upd.OtherConfig = map[string]string{}
	}
	upd.OtherConfig["disable-in-band"] = "true"
	upd.ExternalIDs = maps.Clone(br.ExternalIDs)
	if upd.ExternalIDs == nil {
		upd.ExternalIDs = map[string]string{}
	}
	maps.Copy(upd.ExternalIDs, cfg.ExternalIDs)
	ops, err := c.c.Where(br).Update(&upd, &upd.DatapathType, &upd.FailMode, &upd.Protocols, &upd.OtherConfig, &upd.ExternalIDs)
	if err != nil {
		return fmt.Errorf("ovsdb: update bridge %s: %w", cfg.Name, err)
	}
	return c.transact(ctx, "update bridge "+cfg.Name, ops...)
}

// portSpec is a port as the agent wants it.
type portSpec struct {
	name          string
	ifType        string
	options       map[string]string
	ofportRequest int
	mtuRequest    int // 0: leave the MTU to ovs-vswitchd
	externalIDs   map[string]string
}

// EnsureInternalPort ensures an internal port (tun0) and returns its OpenFlow port number. A non-zero
// mtu goes into mtu_request: without it ovs-vswitchd gives an internal port the bridge's smallest MTU and
// resets it whenever ports come and go, undoing what the host side set.
func (c *Client) EnsureInternalPort(ctx context.Context, bridge, name string, ofportRequest, mtu int) (int, error) {
	return c.ensurePort(ctx, bridge, portSpec{name: name, ifType: "internal", ofportRequest: ofportRequest, mtuRequest: mtu})
}

// EnsureVXLANPort ensures the VXLAN port: remote_ip=flow and key=flow, so flows choose the tunnel
// destination and VNI per packet.
func (c *Client) EnsureVXLANPort(ctx context.Context, bridge, name string, dstPort, ofportRequest int) (int, error) {
	return c.ensurePort(ctx, bridge, portSpec{name: name, ifType: "vxlan", ofportRequest: ofportRequest,
		options: map[string]string{"remote_ip": "flow", "key": "flow", "dst_port": strconv.Itoa(dstPort)}})
}

// EnsurePatchPair ensures a patch port pair between two bridges of one ovs-vswitchd: port a on bridge
// aBridge (with ofport_request aOFPort, 0 for any) joined to port b on bridge bBridge. ovs-vswitchd
// refuses a patch port whose peer does not exist, so a missing or wrong pair is (re)made in one
// transaction. It returns a's OpenFlow port number.
func (c *Client) EnsurePatchPair(ctx context.Context, aBridge, a string, aOFPort int, bBridge, b string) (int, error) {
	type end struct {
		bridge, name, peer string
		ofport             int
	}
	ends := []end{{aBridge, a, b, aOFPort}, {bBridge, b, a, 0}}
	intact := true
	var ops []libovsdb.Operation
	for i, e := range ends {
		br, err := c.mustBridge(ctx, e.bridge)
		if err != nil {
			return 0, err
		}
		port, iface, err := c.portAndInterface(ctx, e.name)
		if err != nil {
			return 0, err
		}
		spec := portSpec{name: e.name, ifType: "patch", options: map[string]string{"peer": e.peer}, ofportRequest: e.ofport}
		var req *int
		if e.ofport > 0 {
			req = &spec.ofportRequest
		}
		if port != nil && iface != nil && slices.Contains(br.Ports, port.UUID) && sameInterface(iface, spec, req) {
			continue
		}
		intact = false
		if port != nil {
			var owner []vswitch.Bridge
			if err := c.c.WhereCache(func(x *vswitch.Bridge) bool { return slices.Contains(x.Ports, port.UUID) }).List(ctx, &owner); err != nil {
				return 0, fmt.Errorf("ovsdb: %w", err)
			}
			for j := range owner {
				del, err := c.c.Where(&owner[j]).Mutate(&owner[j], model.Mutation{Field: &owner[j].Ports, Mutator: libovsdb.MutateOperationDelete, Value: []string{port.UUID}})
				if err != nil {
					return 0, fmt.Errorf("ovsdb: patch port %s: %w", e.name, err)
				}
				ops = append(ops, del...)
			}
		}
		newIf := vswitch.Interface{UUID: fmt.Sprintf("newiface%d", i), Name: e.name, Type: "patch", Options: spec.options, OfportRequest: req}
		newPort := vswitch.Port{UUID: fmt.Sprintf("newport%d", i), Name: e.name, Interfaces: []string{newIf.UUID}}
		create, err := c.c.Create(&newIf, &newPort)
		if err != nil {
			return 0, fmt.Errorf("ovsdb: patch port %s: %w", e.name, err)
		}
		ins, err := c.c.Where(br).Mutate(br, model.Mutation{Field: &br.Ports, Mutator: libovsdb.MutateOperationInsert, Value: []string{newPort.UUID}})
		if err != nil {
			return 0, fmt.Errorf("ovsdb: patch port %s: %w", e.name, err)
		}
		ops = append(append(ops, create...), ins...)
	}
	if !intact {
		if err := c.transact(ctx, "patch ports "+a+" and "+b, ops...); err != nil {
			return 0, err
		}
	}
	if _, err := c.waitOFPort(ctx, b); err != nil {
		return 0, err
	}
	return c.waitOFPort(ctx, a)
}

// BridgeDatapath returns a bridge's datapath type ("system" when unset); ok is false when there is no
// such bridge.
func (c *Client) BridgeDatapath(ctx context.Context, name string) (datapath string, ok bool, err error) {
	br, err := c.bridge(ctx, name)
	if err != nil || br == nil {
		return "", false, err
	}
	if br.DatapathType == "" {
		return "system", true, nil
	}
	return br.DatapathType, true, nil
}

// EnsureSystemPort attaches an existing interface (a pod's host veth) with external_ids that identify
// the pod, and returns its OpenFlow port number.
func (c *Client) EnsureSystemPort(ctx context.Context, bridge, name string, externalIDs map[string]string) (int, error) {
	return c.ensurePort(ctx, bridge, portSpec{name: name, externalIDs: externalIDs})
}

func (c *Client) portAndInterface(ctx context.Context, name string) (*vswitch.Port, *vswitch.Interface, error) {
	var ports []vswitch.Port
	if err := c.c.WhereCache(func(p *vswitch.Port) bool { return p.Name == name }).List(ctx, &ports); err != nil {
		return nil, nil, fmt.Errorf("ovsdb: %w", err)
	}
	var ifaces []vswitch.Interface
	if err := c.c.WhereCache(func(i *vswitch.Interface) bool { return i.Name == name }).List(ctx, &ifaces); err != nil {
		return nil, nil, fmt.Errorf("ovsdb: %w", err)
	}
	var p *vswitch.Port
	var i *vswitch.Interface
	if len(ports) > 0 {
		p = &ports[0]
	}
	if len(ifaces) > 0 {
		i = &ifaces[0]
	}
	return p, i, nil
}

func (c *Client) ensurePort(ctx context.Context, bridge string, spec portSpec) (int, error) {
	br, err := c.mustBridge(ctx, bridge)
	if err != nil {
		return 0, err
	}
	port, iface, err := c.portAndInterface(ctx, spec.name)
	if err != nil {
		return 0, err
	}
	var req *int
	if spec.ofportRequest > 0 {
		req = &spec.ofportRequest
	}
	if port == nil || iface == nil || !slices.Contains(br.Ports, port.UUID) {
		if port != nil && !slices.Contains(br.Ports, port.UUID) {
			return 0, fmt.Errorf("ovsdb: port %s belongs to another bridge", spec.name)
		}
		newIf := vswitch.Interface{UUID: "newiface", Name: spec.name, Type: spec.ifType, Options: spec.options, OfportRequest: req,
			MTURequest: spec.mtuPtr(), ExternalIDs: spec.externalIDs}
		newPort := vswitch.Port{UUID: "newport", Name: spec.name, Interfaces: []string{newIf.UUID}, ExternalIDs: spec.externalIDs}
		ops, err := c.c.Create(&newIf, &newPort)
		if err != nil {
			return 0, fmt.Errorf("ovsdb: port %s: %w", spec.name, err)
		}
		mut, err := c.c.Where(br).Mutate(br, model.Mutation{Field: &br.Ports, Mutator: libovsdb.MutateOperationInsert, Value: []string{newPort.UUID}})
		if err != nil {
			return 0, fmt.Errorf("ovsdb: port %s: %w", spec.name, err)
		}
		if err := c.transact(ctx, "add port "+spec.name, append(ops, mut...)...); err != nil {
			return 0, err
		}
	} else if !sameInterface(iface, spec, req) || !maps.Equal(port.ExternalIDs, spec.externalIDs) && len(spec.externalIDs)+len(port.ExternalIDs) > 0 {
		ui := *iface
		ui.Type, ui.Options, ui.OfportRequest, ui.MTURequest, ui.ExternalIDs = spec.ifType, orEmpty(spec.options), req, spec.mtuPtr(), orEmpty(spec.externalIDs)
		ops, err := c.c.Where(iface).Update(&ui, &ui.Type, &ui.Options, &ui.OfportRequest, &ui.MTURequest, &ui.ExternalIDs)
		if err != nil {
			return 0, fmt.Errorf("ovsdb: port %s: %w", spec.name, err)
		}
		up := *port
		up.ExternalIDs = orEmpty(spec.externalIDs)
		pops, err := c.c.Where(port).Update(&up, &up.ExternalIDs)
		if err != nil {
			return 0, fmt.Errorf("ovsdb: port %s: %w", spec.name, err)
		}
		if err := c.transact(ctx, "update port "+spec.name, append(ops, pops...)...); err != nil {
			return 0, err
		}
	}
	return c.waitOFPort(ctx, spec.name)
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func sameInterface(i *vswitch.Interface, spec portSpec, req *int) bool {
	sameInt := func(a, b *int) bool { return (a == nil && b == nil) || (a != nil && b != nil && *a == *b) }
	return i.Type == spec.ifType && maps.Equal(orEmpty(i.Options), orEmpty(spec.options)) && sameInt(req, i.OfportRequest) &&
		sameInt(spec.mtuPtr(), i.MTURequest) && maps.Equal(orEmpty(i.ExternalIDs), orEmpty(spec.externalIDs))
}

func (s portSpec) mtuPtr() *int {
	if s.mtuRequest <= 0 {
		return nil
	}
	return &s.mtuRequest
}

// waitOFPort waits until ovs-vswitchd numbered the port, or reports its error.
func (c *Client) waitOFPort(ctx context.Context, name string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, c.PortTimeout)
	defer cancel()
	for {
		// Subscribe before reading the cache, so an update landing in between still wakes us.
		changed := c.interfaceChange(name)
		_, iface, err := c.portAndInterface(ctx, name)
		if err != nil {
			return 0, err
		}
		if iface != nil {
			if iface.Error != nil && *iface.Error != "" {
				return 0, fmt.Errorf("ovsdb: port %s: ovs-vswitchd: %s", name, *iface.Error)
			}
			if iface.Ofport != nil && *iface.Ofport > 0 {
				return *iface.Ofport, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("ovsdb: port %s: no OpenFlow port number from ovs-vswitchd: %w", name, ctx.Err())
		case <-changed:
		case <-time.After(100 * time.Millisecond): // only if libovsdb dropped the event (its buffer was full)
		}
	}
}

// DeletePort removes a port from the bridge; a missing port is no error.
func (c *Client) DeletePort(ctx context.Context, bridge, name string) error {
	br, err := c.bridge(ctx, bridge)
	if err != nil || br == nil {
		return err
	}
	port, _, err := c.portAndInterface(ctx, name)
	if err != nil || port == nil || !slices.Contains(br.Ports, port.UUID) {
		return err
	}
	ops, err := c.c.Where(br).Mutate(br, model.Mutation{Field: &br.Ports, Mutator: libovsdb.MutateOperationDelete, Value: []string{port.UUID}})
	if err != nil {
		return fmt.Errorf("ovsdb: delete port %s: %w", name, err)
	}
	// Port and Interface rows are not root rows: OVSDB garbage-collects them with the reference.
	return c.transact(ctx, "delete port "+name, ops...)
}

// ListPorts returns the bridge's ports (the bridge's own local port included).
func (c *Client) ListPorts(ctx context.Context, bridge string) ([]PortInfo, error) {
	br, err := c.mustBridge(ctx, bridge)
	if err != nil {
		return nil, err
	}
	var out []PortInfo
	for _, uuid := range br.Ports {
		p := &vswitch.Port{UUID: uuid}
		if err := c.c.Get(ctx, p); err != nil {
			continue // being deleted
		}
		info := PortInfo{Name: p.Name, ExternalIDs: p.ExternalIDs}
		if len(p.Interfaces) > 0 {
			i := &vswitch.Interface{UUID: p.Interfaces[0]}
			if err := c.c.Get(ctx, i); err == nil {
				info.Type = i.Type
				if i.Ofport != nil {
					info.OFPort = *i.Ofport
				}
				if i.Error != nil {
					info.Error = *i.Error
				}
				if i.MACInUse != nil {
					info.MAC = *i.MACInUse
				}
				if len(info.ExternalIDs) == 0 {
					info.ExternalIDs = i.ExternalIDs
				}
			}
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b PortInfo) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out, nil
}

// BridgeExternalIDs returns the bridge's external_ids.
func (c *Client) BridgeExternalIDs(ctx context.Context, bridge string) (map[string]string, error) {
	br, err := c.mustBridge(ctx, bridge)
	if err != nil {
		return nil, err
	}
	return maps.Clone(orEmpty(br.ExternalIDs)), nil
}

// SetBridgeExternalIDs merges keys into the bridge's external_ids (no transaction when nothing changes).
func (c *Client) SetBridgeExternalIDs(ctx context.Context, bridge string, set map[string]string) error {
	br, err := c.mustBridge(ctx, bridge)
	if err != nil {
		return err
	}
	merged := maps.Clone(orEmpty(br.ExternalIDs))
	maps.Copy(merged, set)
	if maps.Equal(merged, orEmpty(br.ExternalIDs)) {
		return nil
	}
	upd := *br
	upd.ExternalIDs = merged
	ops, err := c.c.Where(br).Update(&upd, &upd.ExternalIDs)
	if err != nil {
		return fmt.Errorf("ovsdb: bridge %s external_ids: %w", bridge, err)
	}
	return c.transact(ctx, "set external_ids of "+bridge, ops...)
}
