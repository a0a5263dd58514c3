package nodenet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NFTTable is ofsdn's own nf_tables table (family ip); nothing else in the node's firewall is touched.
// NFTChain is its one chain: nat, hooked at postrouting with the srcnat priority.
const (
	NFTTable = "ofsdn"
	NFTChain = "postrouting"
)

// snatRule is one rule of the chain: its expressions and the words (stored as the rule's nft comment, so
// `nft list table ip ofsdn` explains itself) that say what it does.
type snatRule struct {
	Text  string
	Exprs []expr.Any
}

// snatRules builds the postrouting chain, in order: destinations in the cluster or service networks
// return untouched (nothing is NATed inside the cluster network, and host → pod keeps its source); then
// sources in the cluster networks, now known to be leaving the cluster, are SNATed to the node's IP.
// Pure: cfg must be valid.
func snatRules(cfg Config) []snatRule {
	var out []snatRule
	for _, p := range cfg.routed() {
		out = append(out, snatRule{Text: fmt.Sprintf("ip daddr %s return", p),
			Exprs: append(matchPrefix(16, p), &expr.Verdict{Kind: expr.VerdictReturn})})
	}
	for _, cn := range cfg.ClusterNetworks {
		cn = cn.Masked()
		out = append(out, snatRule{Text: fmt.Sprintf("ip saddr %s counter snat to %s", cn, cfg.NodeIP),
			Exprs: append(matchPrefix(12, cn),
				&expr.Counter{},
				&expr.Immediate{Register: 1, Data: cfg.NodeIP.AsSlice()},
				&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1})})
	}
	return out
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

func chain(t *nftables.Table) *nftables.Chain {
	return &nftables.Chain{Name: NFTChain, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource}
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

// ensureSNAT makes ofsdn's table hold exactly the wanted chain and rules. When it already does, nothing
// is written (rule handles and counters survive); otherwise the table is replaced in one nf_tables
// transaction (add, delete, add: the delete cannot fail on a missing table), so the rules are never half
// there and nothing stale from an older layout survives.
func ensureSNAT(ns netns.NsHandle, cfg Config) error {
	c, err := nftConn(ns)
	if err != nil {
		return err
	}
	want := snatRules(cfg)
	if same, err := snatInstalled(c, want); err != nil {
		return err
	} else if same {
		return nil
	}
	t := table()
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	ch := c.AddChain(chain(t))
	for _, r := range want {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.Exprs,
			UserData: userdata.AppendString(nil, userdata.TypeComment, r.Text)})
	}
	if err := c.Flush(); err != nil {
		return nftError("write nf_tables table ip "+NFTTable, err)
	}
	cfg.Logger.Info("wrote SNAT rules", "table", "ip "+NFTTable, "rules", SNATRules(cfg))
	return nil
}

// snatInstalled reports whether the table holds just our chain with exactly the wanted rules.
func snatInstalled(c *nftables.Conn, want []snatRule) (bool, error) {
	t, err := c.ListTableOfFamily(NFTTable, nftables.TableFamilyIPv4)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, nftError("read nf_tables table ip "+NFTTable, err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return false, nftError("read nf_tables chains", err)
	}
	var ours []*nftables.Chain
	for _, ch := range chains {
		if ch.Table.Name == NFTTable {
			ours = append(ours, ch)
		}
	}
	w := chain(t)
	if len(ours) != 1 || ours[0].Name != w.Name || ours[0].Type != w.Type ||
		ours[0].Hooknum == nil || *ours[0].Hooknum != *w.Hooknum || ours[0].Priority == nil || *ours[0].Priority != *w.Priority {
		return false, nil
	}
	rules, err := c.GetRules(t, ours[0])
	if err != nil {
		return false, nftError("read nf_tables rules", err)
	}
	return sameRules(rules, want), nil
}

// sameRules compares installed rules with wanted ones, expression by expression, ignoring counters'
// values. A difference only costs a rewrite, never a wrong skip.
func sameRules(have []*nftables.Rule, want []snatRule) bool {
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
