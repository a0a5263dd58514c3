package nodenet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NFTTable is ofsdn's own nf_tables table (family ip); nothing else in the node's firewall is touched.
// Its chains:
//   - postrouting (nat, srcnat): a pod reaching a NodePort through a node address is masqueraded to the
//     gateway (its replies must come back through this host's un-DNAT, not straight from br0), and so
//     is what the host DNATed from br0 back into br0 (a pod at its own node's hostPort);
//     destinations in the cluster or service networks return untouched; pod traffic leaving the
//     cluster is SNATed to the node's IP.
//   - prerouting and output (nat, dstnat): NodePorts (any local address) are DNATed to br0's NodePort
//     address with the client's source untouched, so br0 chooses the endpoint by the client's real
//     address and masquerades after the choice where externalTrafficPolicy Cluster needs it;
//     hostPorts are DNATed to their pod; output does it for the node's own connections.
//   - input (filter): the gateway ports br0 DNATs endpoint-less services to are refused at once.
const (
	NFTTable = "ofsdn"
	NFTChain = "postrouting"
)

// ctStatusDstNAT is conntrack's IPS_DST_NAT status bit: the connection was DNATed.
const ctStatusDstNAT uint32 = 1 << 5

// Forwards are the ports the node forwards into br0.
type Forwards struct {
	NodePorts []NodePort
	HostPorts []HostPort
	// NodePortTarget is where NodePorts are DNATed to (br0 serves services there); RejectPorts the
	// range of gateway ports endpoint-less services are DNATed to (refused by the input chain).
	NodePortTarget netip.Addr
	RejectPorts    [2]uint16
}

// NodePort is one service node port.
type NodePort struct {
	Protocol uint8
	Port     uint16
}

// HostPort is a pod's containerPort published at the node's addresses (or HostIP only).
type HostPort struct {
	Protocol uint8
	HostIP   netip.Addr // invalid: every local address
	HostPort uint16
	PodIP    netip.Addr
	PodPort  uint16
	Pod      string // namespace/name, for the rule's comment
}

// nftRule is one rule: its expressions and the words (stored as the rule's nft comment, so
// `nft list table ip ofsdn` explains itself) that say what it does.
type nftRule struct {
	Text  string
	Exprs []expr.Any
}

// nftChain is one chain of the table as nodenet wants it.
type nftChain struct {
	Name     string
	Type     nftables.ChainType
	Hook     *nftables.ChainHook
	Priority *nftables.ChainPriority
	Rules    []nftRule
}

// chains renders the whole table. Pure: cfg must be valid.
func chains(cfg Config) []nftChain {
	dnat := dnatRules(cfg)
	output := append([]nftRule{{Text: "ip daddr 127.0.0.0/8 return",
		Exprs: append(matchPrefix(16, netip.MustParsePrefix("127.0.0.0/8")), &expr.Verdict{Kind: expr.VerdictReturn})}}, dnat...)
	return []nftChain{
		{Name: "input", Type: nftables.ChainTypeFilter, Hook: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Rules: rejectRules(cfg)},
		{Name: "output", Type: nftables.ChainTypeNAT, Hook: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest, Rules: output},
		{Name: NFTChain, Type: nftables.ChainTypeNAT, Hook: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Rules: snatRules(cfg)},
		{Name: "prerouting", Type: nftables.ChainTypeNAT, Hook: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Rules: dnat},
	}
}

// snatRules builds the postrouting chain, in order: pods reaching a NodePort through a node address, and
// what the host DNATed from br0 back into br0 (hairpin), take the gateway's address; destinations in the cluster or service networks return untouched (nothing is NATed inside the cluster network, and host → pod keeps its
// source); then sources in the cluster networks, now known to be leaving the cluster, are SNATed to the
// node's IP.
func snatRules(cfg Config) []nftRule {
	var out []nftRule
	if fw := cfg.Forwards; len(fw.NodePorts) > 0 && fw.NodePortTarget.Is4() {
		for _, cn := range cfg.ClusterNetworks {
			cn = cn.Masked()
			target := netip.PrefixFrom(fw.NodePortTarget, 32)
			out = append(out, nftRule{Text: fmt.Sprintf("ip saddr %s ip daddr %s counter masquerade", cn, target),
				Exprs: append(append(matchPrefix(12, cn), matchPrefix(16, target)...),
					&expr.Counter{}, &expr.Masq{})})
		}
	}
	// Hairpin: a pod reaching its own node's address at a hostPort (or a NodePort whose traffic policy
	// keeps the client address) comes from br0 and, DNATed by the host, goes back into br0. Unless its
	// source becomes the gateway, the destination pod answers it straight through br0, around the host's
	// un-DNAT, and the client sees a reply from an address it never asked.
	out = append(out, nftRule{Text: fmt.Sprintf("iifname %s oifname %s ct status dnat counter masquerade", cfg.Tun0, cfg.Tun0),
		Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(cfg.Tun0)},
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(cfg.Tun0)},
			&expr.Ct{Key: expr.CtKeySTATUS, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: native32(ctStatusDstNAT), Xor: native32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: native32(0)},
			&expr.Counter{},
			&expr.Masq{},
		}})
	for _, p := range cfg.routed() {
		out = append(out, nftRule{Text: fmt.Sprintf("ip daddr %s return", p),
			Exprs: append(matchPrefix(16, p), &expr.Verdict{Kind: expr.VerdictReturn})})
	}
	// br0's own addresses leave the node too: the host reaching a service whose endpoint is outside the
	// cluster network (the API server behind default/kubernetes) is hairpinned from ServiceHairpinIP.
	sources := append([]netip.Prefix(nil), cfg.ClusterNetworks...)
	for _, a := range cfg.BridgeAddresses {
		if a.Is4() {
			sources = append(sources, netip.PrefixFrom(a, 32))
		}
	}
	for _, cn := range sources {
		cn = cn.Masked()
		out = append(out, nftRule{Text: fmt.Sprintf("ip saddr %s counter snat to %s", cn, cfg.NodeIP),
			Exprs: append(matchPrefix(12, cn),
				&expr.Counter{},
				&expr.Immediate{Register: 1, Data: cfg.NodeIP.AsSlice()},
				&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1})})
	}
	return out
}

// dnatRules forwards NodePorts and hostPorts. Sorted by the agent; hostPorts first, as a hostPort
// names one pod (a NodePort colliding with a hostPort is the cluster's misconfiguration either way).
func dnatRules(cfg Config) []nftRule {
	fw := cfg.Forwards
	var out []nftRule
	for _, hp := range fw.HostPorts {
		if !hp.PodIP.Is4() || hp.HostPort == 0 || hp.PodPort == 0 {
			continue
		}
		var match []expr.Any
		dst := "fib daddr type local"
		if hp.HostIP.Is4() && !hp.HostIP.IsUnspecified() {
			match, dst = matchPrefix(16, netip.PrefixFrom(hp.HostIP, 32)), "ip daddr "+hp.HostIP.String()
		} else {
			match = fibLocal()
		}
		match = append(match, matchPort(hp.Protocol, hp.HostPort)...)
		out = append(out, nftRule{
			Text: fmt.Sprintf("%s %s dport %d counter dnat to %s:%d # hostPort of %s", dst, protoName(hp.Protocol), hp.HostPort, hp.PodIP, hp.PodPort, hp.Pod),
			Exprs: append(match, &expr.Counter{},
				&expr.Immediate{Register: 1, Data: hp.PodIP.AsSlice()},
				&expr.Immediate{Register: 2, Data: be16(hp.PodPort)},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true})})
	}
	if !fw.NodePortTarget.Is4() {
		return out
	}
	for _, np := range fw.NodePorts {
		if np.Port == 0 {
			continue
		}
		exprs := append(fibLocal(), matchPort(np.Protocol, np.Port)...)
		text := fmt.Sprintf("fib daddr type local %s dport %d", protoName(np.Protocol), np.Port)
		out = append(out, nftRule{Text: fmt.Sprintf("%s counter dnat to %s # NodePort", text, fw.NodePortTarget),
			Exprs: append(exprs, &expr.Counter{},
				&expr.Immediate{Register: 1, Data: fw.NodePortTarget.AsSlice()},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1})})
	}
	return out
}

// rejectRules refuse the gateway ports br0 sends endpoint-less services to, whatever listens there.
func rejectRules(cfg Config) []nftRule {
	lo, hi := cfg.Forwards.RejectPorts[0], cfg.Forwards.RejectPorts[1]
	if lo == 0 || hi < lo {
		return nil
	}
	iif := []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(cfg.Tun0)}}
	portRange := func(proto uint8) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: be16(lo), ToData: be16(hi)},
		}
	}
	gw := matchPrefix(16, netip.PrefixFrom(cfg.Gateway(), 32))
	tcp := append(append(append([]expr.Any{}, iif...), gw...), portRange(unix.IPPROTO_TCP)...)
	udp := append(append(append([]expr.Any{}, iif...), gw...), portRange(unix.IPPROTO_UDP)...)
	return []nftRule{
		{Text: fmt.Sprintf("iifname %s ip daddr %s tcp dport %d-%d counter reject with tcp reset", cfg.Tun0, cfg.Gateway(), lo, hi),
			Exprs: append(tcp, &expr.Counter{}, &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})},
		{Text: fmt.Sprintf("iifname %s ip daddr %s udp dport %d-%d counter reject", cfg.Tun0, cfg.Gateway(), lo, hi),
			Exprs: append(udp, &expr.Counter{}, &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3 /* port unreachable */})},
	}
}

func fibLocal() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: native32(unix.RTN_LOCAL)},
	}
}

func matchPort(proto uint8, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(port)},
	}
}

func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	}
	return fmt.Sprintf("l4proto %d", p)
}

func native32(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }
func be16(v uint16) []byte     { return binaryutil.BigEndian.PutUint16(v) }

// ifname is an interface name as nf_tables compares it: NUL-padded to IFNAMSIZ.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// SNATRules describes the postrouting chain in words, in order, for logs and tests.
func SNATRules(cfg Config) []string {
	var out []string
	for _, r := range snatRules(cfg) {
		out = append(out, r.Text)
	}
	return out
}

// matchPrefix matches the IPv4 header's source (offset 12) or destination (16) against p.
func matchPrefix(offset uint32, p netip.Prefix) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: net.CIDRMask(p.Bits(), 32), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

func table() *nftables.Table {
	return &nftables.Table{Name: NFTTable, Family: nftables.TableFamilyIPv4}
}

func nftConn(ns netns.NsHandle) (*nftables.Conn, error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return nil, nftError("open nf_tables", err)
	}
	return c, nil
}

// nftError names what the kernel lacks when it refuses nf_tables, since the raw errno says little.
func nftError(op string, err error) error {
	switch {
	case errors.Is(err, unix.EPROTONOSUPPORT), errors.Is(err, unix.EAFNOSUPPORT):
		return fmt.Errorf("nodenet: %s: the kernel has no nf_tables netlink family (needs CONFIG_NF_TABLES); SNAT for pods is impossible: %w", op, err)
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.EOPNOTSUPP):
		return fmt.Errorf("nodenet: %s: the kernel lacks nf_tables NAT (needs CONFIG_NFT_NAT and CONFIG_NF_NAT): %w", op, err)
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("nodenet: %s: needs CAP_NET_ADMIN in the node's network namespace: %w", op, err)
	}
	return fmt.Errorf("nodenet: %s: %w", op, err)
}

// ensureSNAT makes ofsdn's table hold exactly the wanted chains and rules (the name is historical: the
// table also forwards ports). When it already does, nothing is written (rule handles and counters
// survive); otherwise the table is replaced in one nf_tables transaction (add, delete, add: the delete
// cannot fail on a missing table), so the rules are never half there and nothing stale survives.
// Conntrack keeps the NAT of established connections across a rewrite.
func ensureSNAT(ns netns.NsHandle, cfg Config) error {
	c, err := nftConn(ns)
	if err != nil {
		return err
	}
	want := chains(cfg)
	if same, err := tableInstalled(c, want); err != nil {
		return err
	} else if same {
		return nil
	}
	t := table()
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	n := 0
	for _, wc := range want {
		ch := c.AddChain(&nftables.Chain{Name: wc.Name, Table: t, Type: wc.Type, Hooknum: wc.Hook, Priority: wc.Priority})
		for _, r := range wc.Rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.Exprs,
				UserData: userdata.AppendString(nil, userdata.TypeComment, r.Text)})
			n++
		}
	}
	if err := c.Flush(); err != nil {
		return nftError("write nf_tables table ip "+NFTTable, err)
	}
	cfg.Logger.Info("wrote nf_tables rules", "table", "ip "+NFTTable, "rules", n, "snat", SNATRules(cfg),
		"nodePorts", len(cfg.Forwards.NodePorts), "hostPorts", len(cfg.Forwards.HostPorts))
	return nil
}

// EnsureFirewall rewrites only ofsdn's nf_tables table (when it differs): what a change of NodePorts or
// hostPorts needs.
func EnsureFirewall(cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	h, ns, err := handleAt(cfg.HostNetNS)
	if err != nil {
		return err
	}
	h.Close()
	defer ns.Close()
	return ensureSNAT(ns, cfg)
}

// tableInstalled reports whether ofsdn's table holds exactly the wanted chains and rules.
func tableInstalled(c *nftables.Conn, want []nftChain) (bool, error) {
	return tableInstalledNamed(c, NFTTable, want)
}

// sameRules compares installed rules with wanted ones, expression by expression, ignoring counters'
// values. A difference only costs a rewrite, never a wrong skip.
func sameRules(have []*nftables.Rule, want []nftRule) bool {
	if len(have) != len(want) {
		return false
	}
	for i, r := range have {
		text, _ := userdata.GetString(r.UserData, userdata.TypeComment)
		if text != want[i].Text || len(r.Exprs) != len(want[i].Exprs) {
			return false
		}
		for j, e := range r.Exprs {
			if _, ok := e.(*expr.Counter); ok {
				e = &expr.Counter{}
			}
			if !reflect.DeepEqual(e, want[i].Exprs[j]) {
				return false
			}
		}
	}
	return true
}

// deleteSNAT removes ofsdn's table, present or not, in one transaction.
func deleteSNAT(ns netns.NsHandle) error {
	c, err := nftConn(ns)
	if err != nil {
		return err
	}
	t := table()
	c.AddTable(t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return nftError("delete nf_tables table ip "+NFTTable, err)
	}
	return nil
}
