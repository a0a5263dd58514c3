// Package preflight checks the agent's node prerequisites: Open vSwitch runs on the host as a system
// service, and it does what ofsdn's pipeline needs. The agent runs Check before it touches anything
// else; a missing prerequisite stops it with one line that names what is missing and what to do
// (Error), rather than letting it fail half way through setting the node up, or later at the first
// flow that uses a missing feature.
package preflight

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	of "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/ofswitch"
	"github.com/ofsdn/ofsdn/ovsdb"
	"k8s.io/klog/v2"
)

// Wait bounds the wait for OVSDB and for the bridge's management socket, which may not be
// there yet while the node boots.
const Wait = 20 * time.Second

// Error is a node prerequisite the agent found missing.
type Error struct {
	Missing string // what the node lacks
	Fix     string // what to do about it
	Err     error  // what showed it
}

func (e *Error) Error() string {
	s := "node prerequisite missing: " + e.Missing
	if e.Err != nil {
		s += " (" + strings.Join(strings.Fields(e.Err.Error()), " ") + ")"
	}
	return s + ". Fix: " + e.Fix
}

func (e *Error) Unwrap() error { return e.Err }

// featureProbe is a flow that uses one feature of Open vSwitch the pipeline depends on.
type featureProbe struct {
	feature string
	fix     string
	flow    of.Flow
}

const fixConntrack = "an Open vSwitch release with conntrack NAT (3.1 is tested); with --datapath-type=system, a kernel whose openvswitch " +
	"module has conntrack and NAT (nf_conntrack, nf_nat)"

// featureProbes are one flow per feature, shaped as the pipeline uses it (flows/pipeline: services.go
// and netpol.go). The agent never installs them: Session.Validate has the switch check them in a
// bundle that it then discards.
func featureProbes() []featureProbe {
	probeIP := netip.AddrFrom4([4]byte{192, 0, 2, 1})
	lb, eip, eport, src := of.Whole(pipeline.RegServiceLB), of.Whole(pipeline.RegEndpointIP), of.Whole(pipeline.RegEndpointPort), of.Whole(of.FieldIPSrc)
	return []featureProbe{
		{"conntrack with zones (ct(table=..,zone=..,nat))", fixConntrack,
			of.F(pipeline.TableConntrack, 1, of.M(of.IP...),
				of.CT{Table: pipeline.TableServices, Zone: pipeline.ZoneService, NAT: &of.NAT{Kind: of.NATReverse}})},
		{"conntrack state matches (ct_state=+trk+est-rpl)", fixConntrack,
			of.F(pipeline.TableServices, 1, of.M(append(of.IP, of.CtState(of.CtTrk|of.CtEst, of.CtRpl))...),
				of.Goto{Table: pipeline.TableServiceL2})},
		{"destination NAT in conntrack (ct(commit,nat(dst=IP:PORT)))", fixConntrack,
			of.F(pipeline.TableServiceLB, 1, of.M(of.TCP...),
				of.CT{Commit: true, Table: pipeline.TableServiceL2, Zone: pipeline.ZoneService,
					NAT: &of.NAT{Kind: of.NATDst, AddrMin: probeIP, PortMin: 8080}})},
		{"source NAT in conntrack (ct(commit,nat(src=IP)))", fixConntrack,
			of.F(pipeline.TableOutput, 1, of.M(of.IP...),
				of.CT{Commit: true, Table: pipeline.TableHairpinOutput, Zone: pipeline.ZoneHairpin,
					NAT: &of.NAT{Kind: of.NATSrc, AddrMin: pipeline.ServiceHairpinIP}})},
		{"conjunctive matches (conjunction)", "an Open vSwitch release with conjunctive matches (3.1 is tested)",
			of.F(pipeline.TableIngressIsolation, 1, of.M(append(of.IP, of.IPDst(probeIP))...),
				of.Conjunction{ID: 1, Clause: 1, NClauses: 2})},
		{"learned flows (learn(..,delete_learned))", "an Open vSwitch release whose learn action has delete_learned (3.1 is tested)",
			of.F(pipeline.TableServiceLB, 2, of.M(append(of.TCP, of.Reg(pipeline.RegServiceLB, 1))...),
				of.Learn{Table: pipeline.TableServiceAffinity, Priority: 100, IdleTimeout: 10800, DeleteLearned: true,
					Specs: []of.LearnSpec{
						{Kind: of.LearnMatch, Dst: of.Whole(of.FieldEthType), SrcValue: uint64(of.EthTypeIPv4)},
						{Kind: of.LearnMatch, Dst: lb, Src: &lb},
						{Kind: of.LearnMatch, Dst: src, Src: &src},
						{Kind: of.LearnLoad, Dst: eip, Src: &eip},
						{Kind: of.LearnLoad, Dst: eport, Src: &eport},
					}})},
	}
}

// Config is the node's Open vSwitch as the agent will use it.
type Config struct {
	OVSDBEndpoint string // e.g. unix:/var/run/openvswitch/db.sock
	OVSRunDir     string // holds <Bridge>.mgmt
	Bridge        string
	DatapathType  string // "system" or "netdev"
}

// Check checks, in order: OVSDB answers; ovs-vswitchd offers the datapath type and the
// interface types the agent uses; the bridge, if it exists already, allows OpenFlow 1.3 (one that
// something else set up for other versions is not taken over); ovs-vswitchd serves the bridge's
// management socket and speaks OpenFlow 1.3 on it; it takes bundles, and refuses none of the probe
// flows. A missing bridge is created as the agent would next (ovsdb.EnsureBridge), so that a new node
// is checked too.
func Check(ctx context.Context, cfg Config, log klog.Logger) error {
	dbCtx, cancel := context.WithTimeout(ctx, Wait)
	defer cancel()
	var db *ovsdb.Client
	err := retry(dbCtx, func() (err error) {
		db, err = ovsdb.Connect(dbCtx, cfg.OVSDBEndpoint, log)
		return err
	})
	if err != nil {
		return &Error{Missing: "Open vSwitch's database at " + cfg.OVSDBEndpoint, Err: err,
			Fix: "run Open vSwitch on the node as a system service (e.g. systemctl enable --now openvswitch-switch) and give the agent " +
				"its run directory (hostPath /var/run/openvswitch mounted at --ovs-rundir)"}
	}
	defer db.Close()

	sys, err := db.System(ctx)
	if err != nil {
		return &Error{Missing: "an initialised Open vSwitch database", Err: err,
			Fix: "start Open vSwitch through its service, which initialises the database (or run ovs-vsctl --no-wait init)"}
	}
	// Empty lists: ovs-vswitchd has not run yet; the management socket check below says so.
	if len(sys.DatapathTypes) > 0 && !slices.Contains(sys.DatapathTypes, cfg.DatapathType) {
		return &Error{Missing: fmt.Sprintf("datapath type %q in ovs-vswitchd, which offers %s", cfg.DatapathType, strings.Join(sys.DatapathTypes, ", ")),
			Fix: "pass the agent a --datapath-type ovs-vswitchd offers (system is the kernel datapath, netdev the userspace one)"}
	}
	for _, typ := range []string{"internal", "vxlan"} {
		if len(sys.IfaceTypes) > 0 && !slices.Contains(sys.IfaceTypes, typ) {
			return &Error{Missing: fmt.Sprintf("%s interfaces in ovs-vswitchd, which offers %s", typ, strings.Join(sys.IfaceTypes, ", ")),
				Fix: "an Open vSwitch build with internal ports and VXLAN tunnels (every distribution's openvswitch-switch)"}
		}
	}
	protocols, exists, err := db.BridgeProtocols(ctx, cfg.Bridge)
	if err != nil {
		return fmt.Errorf("prerequisites: %w", err)
	}
	if exists && len(protocols) > 0 && !slices.Contains(protocols, "OpenFlow13") {
		return &Error{Missing: fmt.Sprintf("OpenFlow 1.3 on bridge %s, which allows only %s", cfg.Bridge, strings.Join(protocols, ", ")),
			Fix: fmt.Sprintf("the bridge was set up by something other than ofsdn; if ofsdn may own it, run ovs-vsctl set bridge %s protocols=OpenFlow13 "+
				"(or ovs-vsctl del-br %s and the agent creates it)", cfg.Bridge, cfg.Bridge)}
	}
	if !exists {
		if err := db.EnsureBridge(ctx, ovsdb.BridgeConfig{Name: cfg.Bridge, DatapathType: cfg.DatapathType}); err != nil {
			return fmt.Errorf("prerequisites: %w", err)
		}
	}

	socket := filepath.Join(cfg.OVSRunDir, cfg.Bridge+".mgmt")
	ofCtx, cancelOF := context.WithTimeout(ctx, Wait)
	defer cancelOF()
	sess, err := ofswitch.Dial(ofCtx, ofswitch.Config{Socket: socket, Bridge: cfg.Bridge, Logger: log, RequestTimeout: Wait})
	switch {
	case errors.Is(err, of.ErrVersion):
		return &Error{Missing: fmt.Sprintf("OpenFlow 1.3 on bridge %s's management socket", cfg.Bridge), Err: err,
			Fix: fmt.Sprintf("allow it: ovs-vsctl set bridge %s protocols=OpenFlow13", cfg.Bridge)}
	case err != nil:
		fix := fmt.Sprintf("start ovs-vswitchd (systemctl start openvswitch-switch); `ovs-vsctl show` must list bridge %s without an error", cfg.Bridge)
		if cfg.DatapathType == "system" {
			fix += "; the kernel datapath needs the openvswitch kernel module loaded (modprobe openvswitch)"
		}
		return &Error{Missing: fmt.Sprintf("ovs-vswitchd serving bridge %s at %s", cfg.Bridge, socket), Err: err, Fix: fix}
	}
	defer sess.Close()

	probes := featureProbes()
	msgs := make([][]byte, 0, len(probes))
	for _, p := range probes {
		msg, err := of.EncodeFlowMod(p.flow)
		if err != nil {
			return fmt.Errorf("prerequisites: probe for %s: %w", p.feature, err)
		}
		msgs = append(msgs, msg)
	}
	vCtx, cancelV := context.WithTimeout(ctx, Wait)
	defer cancelV()
	err = sess.Validate(vCtx, msgs)
	var be *ofswitch.BundleError
	switch {
	case errors.As(err, &be) && be.Index >= 0 && be.Index < len(probes):
		p := probes[be.Index]
		return &Error{Missing: fmt.Sprintf("%s on bridge %s", p.feature, cfg.Bridge), Err: err, Fix: p.fix}
	case errors.As(err, &be):
		return &Error{Missing: fmt.Sprintf("OpenFlow bundles (the ONF extension of OpenFlow 1.3) on bridge %s", cfg.Bridge), Err: err,
			Fix: "an Open vSwitch release with OpenFlow 1.3 bundles (3.1 is tested)"}
	case err != nil:
		return fmt.Errorf("prerequisites: %w", err)
	}
	features := make([]string, 0, len(probes))
	for _, p := range probes {
		features = append(features, p.feature)
	}
	log.Info("node prerequisites met", "ovsVersion", sys.OVSVersion, "datapathType", cfg.DatapathType, "bridge", cfg.Bridge, "features", features)
	return nil
}

// retry calls f until it succeeds or ctx ends, returning f's last error.
func retry(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}
