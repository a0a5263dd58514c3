package nodenet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

func goodConfig() Config {
	return Config{Tun0: "tun0", LocalSubnet: netip.MustParsePrefix("10.128.2.0/23"),
		ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")}, ServiceNetwork: netip.MustParsePrefix("172.30.0.0/16"),
		MTU: 1450, NodeIP: netip.MustParseAddr("192.0.2.10")}
}

func TestValidate(t *testing.T) {
	p := netip.MustParsePrefix
	tests := []struct {
		name string
		edit func(c *Config)
		want string // "" = valid
	}{
		{"good", func(*Config) {}, ""},
		{"no service network", func(c *Config) { c.ServiceNetwork = netip.Prefix{} }, ""},
		{"unmasked subnet", func(c *Config) { c.LocalSubnet = p("10.128.3.7/23") }, ""},
		{"two cluster networks", func(c *Config) { c.ClusterNetworks = append(c.ClusterNetworks, p("10.132.0.0/14")) }, ""},
		{"no tun0", func(c *Config) { c.Tun0 = "" }, "no tun0"},
		{"long tun0", func(c *Config) { c.Tun0 = "a-very-long-name0" }, "longer than 15"},
		{"slash in tun0", func(c *Config) { c.Tun0 = "tun/0" }, "not valid"},
		{"no subnet", func(c *Config) { c.LocalSubnet = netip.Prefix{} }, "node subnet invalid Prefix"},
		{"/31 subnet", func(c *Config) { c.LocalSubnet = p("10.128.2.0/31") }, "node subnet"},
		{"IPv6 subnet", func(c *Config) { c.LocalSubnet = p("fd00::/64") }, "node subnet"},
		{"subnet outside the cluster", func(c *Config) { c.LocalSubnet = p("10.200.2.0/23") }, "in no cluster network"},
		{"subnet wider than the cluster", func(c *Config) { c.LocalSubnet = p("10.0.0.0/8") }, "in no cluster network"},
		{"IPv6 cluster network", func(c *Config) { c.ClusterNetworks = []netip.Prefix{p("fd00::/64")} }, "cluster network fd00::/64"},
		{"/0 cluster network", func(c *Config) { c.ClusterNetworks = []netip.Prefix{p("0.0.0.0/0")} }, "not /0"},
		{"invalid cluster network", func(c *Config) { c.ClusterNetworks = []netip.Prefix{{}} }, "cluster network invalid Prefix"},
		{"no cluster network", func(c *Config) { c.ClusterNetworks = nil }, "no cluster networks"},
		{"IPv6 service network", func(c *Config) { c.ServiceNetwork = p("fd00:1::/108") }, "service network"},
		{"service overlaps cluster", func(c *Config) { c.ServiceNetwork = p("10.130.0.0/16") }, "overlaps cluster network"},
		{"tiny MTU", func(c *Config) { c.MTU = 100 }, "MTU 100 out of range"},
		{"huge MTU", func(c *Config) { c.MTU = 70000 }, "MTU 70000 out of range"},
		{"no node IP", func(c *Config) { c.NodeIP = netip.Addr{} }, "node IP invalid IP"},
		{"IPv6 node IP", func(c *Config) { c.NodeIP = netip.MustParseAddr("2001:db8::1") }, "node IP"},
		{"loopback node IP", func(c *Config) { c.NodeIP = netip.MustParseAddr("127.0.0.1") }, "unicast"},
		{"node IP in the cluster", func(c *Config) { c.NodeIP = netip.MustParseAddr("10.129.0.1") }, "inside cluster network"},
		{"node IP in the services", func(c *Config) { c.NodeIP = netip.MustParseAddr("172.30.0.1") }, "inside the service network"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := goodConfig()
			tc.edit(&c)
			err := c.validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("validate: %v, want an error about %q", err, tc.want)
			}
			if err != nil && !strings.HasPrefix(err.Error(), "nodenet: invalid config: ") {
				t.Errorf("error without context: %v", err)
			}
		})
	}
}

func TestGateway(t *testing.T) {
	for subnet, want := range map[string]string{"10.128.2.0/23": "10.128.2.1", "10.128.3.9/23": "10.128.2.1", "10.129.0.0/30": "10.129.0.1"} {
		c := Config{LocalSubnet: netip.MustParsePrefix(subnet)}
		if g := c.Gateway(); g != netip.MustParseAddr(want) {
			t.Errorf("gateway of %s: %s, want %s", subnet, g, want)
		}
	}
}

func TestSNATRules(t *testing.T) {
	p := netip.MustParsePrefix
	tests := []struct {
		name string
		edit func(c *Config)
		want []string
	}{
		{"one cluster network and services", func(*Config) {}, []string{
			"iifname tun0 oifname tun0 ct status dnat counter masquerade",
			"ip daddr 10.128.0.0/14 return", "ip daddr 172.30.0.0/16 return",
			"ip saddr 10.128.0.0/14 counter snat to 192.0.2.10"}},
		{"no service network", func(c *Config) { c.ServiceNetwork = netip.Prefix{} }, []string{
			"iifname tun0 oifname tun0 ct status dnat counter masquerade",
			"ip daddr 10.128.0.0/14 return", "ip saddr 10.128.0.0/14 counter snat to 192.0.2.10"}},
		{"two cluster networks, one unmasked", func(c *Config) {
			c.ClusterNetworks = []netip.Prefix{p("10.128.0.0/14"), p("10.200.7.0/16")}
		}, []string{
			"iifname tun0 oifname tun0 ct status dnat counter masquerade",
			"ip daddr 10.128.0.0/14 return", "ip daddr 10.200.0.0/16 return", "ip daddr 172.30.0.0/16 return",
			"ip saddr 10.128.0.0/14 counter snat to 192.0.2.10", "ip saddr 10.200.0.0/16 counter snat to 192.0.2.10"}},
		// Only pods reaching a NodePort through a node address (and hairpinned hostPorts) are
		// masqueraded by the host: br0 chooses everyone else's endpoint by their own address and
		// masquerades after the choice.
		{"NodePorts", func(c *Config) {
			c.Forwards = Forwards{NodePortTarget: netip.MustParseAddr("169.254.169.3"), NodePorts: []NodePort{{Protocol: unix.IPPROTO_TCP, Port: 30080}}}
		}, []string{
			"ip saddr 10.128.0.0/14 ip daddr 169.254.169.3/32 counter masquerade",
			"iifname tun0 oifname tun0 ct status dnat counter masquerade",
			"ip daddr 10.128.0.0/14 return", "ip daddr 172.30.0.0/16 return", "ip saddr 10.128.0.0/14 counter snat to 192.0.2.10"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := goodConfig()
			tc.edit(&c)
			if err := c.validate(); err != nil {
				t.Fatal(err)
			}
			rules := snatRules(c)
			var got []string
			for _, r := range rules {
				got = append(got, r.Text)
				// The expressions must say what the text says.
				if s := exprText(r.Exprs); s != r.Text {
					t.Errorf("rule %q has expressions that read %q", r.Text, s)
				}
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("rules:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
			if s := SNATRules(c); strings.Join(s, "\n") != strings.Join(got, "\n") {
				t.Errorf("SNATRules %q differ from the rules %q", s, got)
			}
		})
	}
}

// exprText reads nodenet's own expression shapes back into nft syntax, independently of snatRules.
func exprText(es []expr.Any) string {
	var out []string
	var reg []byte
	for i := 0; i < len(es); i++ {
		switch e := es[i].(type) {
		case *expr.Payload:
			field := map[uint32]string{12: "saddr", 16: "daddr"}[e.Offset]
			bw, ok1 := es[i+1].(*expr.Bitwise)
			cmp, ok2 := es[i+2].(*expr.Cmp)
			if e.Base != expr.PayloadBaseNetworkHeader || e.Len != 4 || field == "" || !ok1 || !ok2 || cmp.Op != expr.CmpOpEq {
				return fmt.Sprintf("unexpected match at %d", i)
			}
			ones, _ := net.IPMask(bw.Mask).Size()
			a, _ := netip.AddrFromSlice(cmp.Data)
			out = append(out, fmt.Sprintf("ip %s %s", field, netip.PrefixFrom(a, ones)))
			i += 2
		case *expr.Meta:
			cmp, ok := es[i+1].(*expr.Cmp)
			name := map[expr.MetaKey]string{expr.MetaKeyIIFNAME: "iifname", expr.MetaKeyOIFNAME: "oifname"}[e.Key]
			if !ok || name == "" || cmp.Op != expr.CmpOpEq {
				return fmt.Sprintf("unexpected meta at %d", i)
			}
			out = append(out, name+" "+strings.TrimRight(string(cmp.Data), "\x00"))
			i++
		case *expr.Ct:
			bw, ok1 := es[i+1].(*expr.Bitwise)
			cmp, ok2 := es[i+2].(*expr.Cmp)
			if e.Key != expr.CtKeySTATUS || !ok1 || !ok2 || cmp.Op != expr.CmpOpNeq || binary.NativeEndian.Uint32(bw.Mask) != 1<<5 {
				return fmt.Sprintf("unexpected ct at %d", i)
			}
			out = append(out, "ct status dnat")
			i += 2
		case *expr.Masq:
			out = append(out, "masquerade")
		case *expr.Verdict:
			out = append(out, map[expr.VerdictKind]string{expr.VerdictReturn: "return", expr.VerdictAccept: "accept"}[e.Kind])
		case *expr.Counter:
			out = append(out, "counter")
		case *expr.Immediate:
			reg = e.Data
		case *expr.NAT:
			a, _ := netip.AddrFromSlice(reg)
			if e.Type != expr.NATTypeSourceNAT || e.Family != unix.NFPROTO_IPV4 || e.RegAddrMin != 1 {
				return "unexpected nat"
			}
			out = append(out, "snat to "+a.String())
		default:
			return fmt.Sprintf("unexpected %T", e)
		}
	}
	return strings.Join(out, " ")
}

func TestNFTError(t *testing.T) {
	// Shaped as nftables.Conn.Flush returns them: joined netlink errors around an errno.
	op := func(errno syscall.Errno) error {
		return fmt.Errorf("conn.Receive: %w", errors.Join(fmt.Errorf("netlink receive: %w", errno)))
	}
	tests := []struct {
		err  error
		want string
	}{
		{op(unix.EPROTONOSUPPORT), "no nf_tables netlink family"},
		{op(unix.ENOENT), "lacks nf_tables NAT"},
		{op(unix.EPERM), "CAP_NET_ADMIN"},
		{errors.New("boom"), "nodenet: write: boom"},
	}
	for _, tc := range tests {
		if got := nftError("write", tc.err); !strings.Contains(got.Error(), tc.want) || !errors.Is(got, tc.err) {
			t.Errorf("nftError(%v) = %v, want it to mention %q and wrap the cause", tc.err, got, tc.want)
		}
	}
	if !errors.Is(op(unix.EPERM), os.ErrPermission) {
		t.Error("EPERM through the wrapping is not os.ErrPermission: the CAP_NET_ADMIN hint cannot fire")
	}
}

func TestParsePortRange(t *testing.T) {
	if a, b, err := parsePortRange("32768\t60999\n"); err != nil || a != 32768 || b != 60999 {
		t.Errorf("default range: %d %d %v", a, b, err)
	}
	if _, _, err := parsePortRange("garbage"); err == nil {
		t.Error("garbage parsed")
	}
}

func TestPrefixRoundTrip(t *testing.T) {
	for _, s := range []string{"10.128.0.0/14", "172.30.0.0/16", "10.128.2.1/23", "0.0.0.0/0"} {
		p := netip.MustParsePrefix(s)
		if got := prefixOf(ipNet(p)); got != p {
			t.Errorf("%s → %s", s, got)
		}
	}
	if got := prefixOf(nil); got.IsValid() {
		t.Errorf("nil → %s", got)
	}
}

// A hostPort bound to a loopback hostIP is DNATed for the node's own connections before loopback
// destinations return (the upstream HostPort conformance test reaches 127.0.0.1:hostPort from the
// node); every other DNAT stays after that return.
func TestOutputChainLoopbackHostPortFirst(t *testing.T) {
	c := goodConfig()
	c.Forwards = Forwards{NodePortTarget: netip.MustParseAddr("169.254.169.3"), NodePorts: []NodePort{{Protocol: unix.IPPROTO_TCP, Port: 30080}},
		HostPorts: []HostPort{
			{Protocol: unix.IPPROTO_TCP, HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: 54323, PodIP: netip.MustParseAddr("10.128.2.5"), PodPort: 8080, Pod: "a/lo"},
			{Protocol: unix.IPPROTO_TCP, HostIP: netip.MustParseAddr("192.0.2.10"), HostPort: 54323, PodIP: netip.MustParseAddr("10.128.2.6"), PodPort: 8080, Pod: "a/node"}}}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	var output []string
	for _, ch := range chains(c) {
		if ch.Name == "output" {
			for _, r := range ch.Rules {
				output = append(output, r.Text)
			}
		}
	}
	want := []string{
		"ip daddr 127.0.0.1 tcp dport 54323 counter dnat to 10.128.2.5:8080 # hostPort of a/lo",
		"ip daddr 127.0.0.0/8 return",
		"ip daddr 192.0.2.10 tcp dport 54323 counter dnat to 10.128.2.6:8080 # hostPort of a/node",
		"fib daddr type local tcp dport 30080 counter dnat to 169.254.169.3 # NodePort",
	}
	if strings.Join(output, "\n") != strings.Join(want, "\n") {
		t.Errorf("output chain:\n%s\nwant\n%s", strings.Join(output, "\n"), strings.Join(want, "\n"))
	}
}
