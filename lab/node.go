package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ofsdn/ofsdn/internal/proc"
)

const ovsSchema = "/usr/share/openvswitch/vswitch.ovsschema"

// Node is a simulated node: a namespace with its own ovsdb-server and userspace ovs-vswitchd, whose
// uplink eth0 is a port of the netdev bridge br-ul, and whose underlay address sits on br-ul.
type Node struct {
	Name  string
	NetNS string
	IP    netip.Addr       // the node's underlay address (VXLAN endpoint)
	Addr  netip.Prefix     // IP with the underlay's length, as configured on br-ul
	MAC   net.HardwareAddr // br-ul's MAC
	Dir   string           // OVS_RUNDIR/DBDIR/LOGDIR: conf.db, sockets, pidfiles, logs
}

// DBSocket is the node's ovsdb-server unix socket (endpoint "unix:" + DBSocket()), reachable from any
// namespace.
func (n *Node) DBSocket() string { return filepath.Join(n.Dir, "db.sock") }

// MgmtSocket is the OpenFlow management socket ovs-vswitchd opens for a bridge of this node.
func (n *Node) MgmtSocket(bridge string) string { return filepath.Join(n.Dir, bridge+".mgmt") }

// OVSEnv is the environment OVS tools and daemons need to find this node's instance.
func (n *Node) OVSEnv() []string {
	return append(os.Environ(), "OVS_RUNDIR="+n.Dir, "OVS_DBDIR="+n.Dir, "OVS_LOGDIR="+n.Dir,
		"OVS_SYSCONFDIR="+n.Dir, "OVS_PKGDATADIR=/usr/share/openvswitch")
}

// Exec runs a command inside the node's namespace with the node's OVS environment and returns its
// standard output.
func (n *Node) Exec(ctx context.Context, name string, args ...string) (string, error) {
	return output(ctx, n.OVSEnv(), "ip", append([]string{"netns", "exec", n.NetNS, name}, args...)...)
}

// Vsctl runs ovs-vsctl against the node's database.
func (n *Node) Vsctl(ctx context.Context, args ...string) (string, error) {
	return output(ctx, n.OVSEnv(), "ovs-vsctl", append([]string{"--db=unix:" + n.DBSocket(), "--timeout=20"}, args...)...)
}

// Ofctl runs ovs-ofctl -O OpenFlow13 against a bridge's management socket. br-ul speaks OpenFlow 1.0
// to 1.3; bridges an agent makes may be 1.3 only.
func (n *Node) Ofctl(ctx context.Context, cmd, bridge string, args ...string) (string, error) {
	return output(ctx, n.OVSEnv(), "ovs-ofctl", append([]string{"-O", "OpenFlow13", cmd, "unix:" + n.MgmtSocket(bridge)}, args...)...)
}

// VswitchdAppctl runs an ovs-appctl command against the node's running ovs-vswitchd.
func (n *Node) VswitchdAppctl(ctx context.Context, args ...string) (string, error) {
	ctl := filepath.Join(n.Dir, fmt.Sprintf("ovs-vswitchd.%d.ctl", n.VswitchdPID()))
	return output(ctx, n.OVSEnv(), "ovs-appctl", append([]string{"-t", ctl}, args...)...)
}

// VswitchdPID is the PID of the node's running ovs-vswitchd, or 0.
func (n *Node) VswitchdPID() int { return daemonPID(n.Dir, "ovs-vswitchd") }

// OVSDBPID is the PID of the node's running ovsdb-server, or 0.
func (n *Node) OVSDBPID() int { return daemonPID(n.Dir, "ovsdb-server") }

// Exec runs a command inside the host's namespace and returns its standard output.
func (h *Host) Exec(ctx context.Context, name string, args ...string) (string, error) {
	return output(ctx, nil, "ip", append([]string{"netns", "exec", h.NetNS, name}, args...)...)
}

func (l *Lab) buildNode(ctx context.Context, n *Node) error {
	t0 := time.Now()
	if err := os.Mkdir(n.Dir, 0o700); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	if err := run(ctx, "ip", "netns", "add", n.NetNS); err != nil {
		return err
	}
	if err := l.attach(ctx, n.Name, n.NetNS, Uplink); err != nil {
		return err
	}
	if err := oneNICARP(n.NetNS); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	if err := runAll(ctx, [][]string{
		{"ip", "-n", n.NetNS, "link", "set", "lo", "up"},
		{"ip", "netns", "exec", n.NetNS, "ethtool", "-K", Uplink, "tx", "off"},
		{"ip", "-n", n.NetNS, "link", "set", Uplink, "up"},
	}); err != nil {
		return err
	}
	if l.noOVS {
		// A host without Open vSwitch: its address on its NIC. Open vSwitch brought later (deploy/ovs on
		// the userspace datapath) moves it onto br-ul, with br-ul's MAC as below.
		if err := run(ctx, "ip", "-n", n.NetNS, "addr", "add", n.Addr.String(), "dev", Uplink); err != nil {
			return err
		}
		l.log.Debug("node up without Open vSwitch", "node", n.Name, "netns", n.NetNS, "ip", n.IP, "took", time.Since(t0))
		return nil
	}
	if err := n.startOVS(ctx); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	// fail_mode=secure with an explicit NORMAL flow: br-ul forwards the same way whatever happens to
	// controllers, and the flow shows up in dumps. The fixed hwaddr keeps br-ul's MAC from following
	// its ports' MACs.
	if _, err := n.Vsctl(ctx, "add-br", UnderlayBridge,
		"--", "set", "Bridge", UnderlayBridge, "datapath_type=netdev", "fail_mode=secure",
		"other-config:hwaddr="+n.MAC.String(),
		"--", "set", "Interface", UnderlayBridge, "mtu_request="+strconv.Itoa(l.MTU),
		"--", "add-port", UnderlayBridge, Uplink); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	// ovs-vsctl can exit 0 while a port failed (LAB.md): check the interface.
	if out, err := n.Vsctl(ctx, "--columns=ofport,error", "--format=csv", "--data=bare", "--no-headings", "list", "Interface", Uplink); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	} else if f := strings.SplitN(strings.TrimSpace(out), ",", 2); len(f) != 2 || f[0] == "-1" || f[0] == "" || f[1] != "" {
		return fmt.Errorf("%s: uplink %s on %s failed: ofport,error = %q", n.Name, Uplink, UnderlayBridge, strings.TrimSpace(out))
	}
	if err := proc.Until(ctx, 10*time.Second, func() bool { _, err := os.Stat(n.MgmtSocket(UnderlayBridge)); return err == nil }); err != nil {
		return fmt.Errorf("%s: %s management socket: %w", n.Name, UnderlayBridge, err)
	}
	if _, err := n.Ofctl(ctx, "add-flow", UnderlayBridge, "priority=0,actions=NORMAL"); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	if err := runAll(ctx, [][]string{
		{"ip", "-n", n.NetNS, "addr", "add", n.Addr.String(), "dev", UnderlayBridge},
		{"ip", "-n", n.NetNS, "link", "set", UnderlayBridge, "up"},
	}); err != nil {
		return err
	}
	l.log.Debug("node up", "node", n.Name, "netns", n.NetNS, "ip", n.IP, "took", time.Since(t0))
	return nil
}

// oneNICARP makes a node's kernel answer ARP the way a host with one NIC does. The userspace datapath
// reads the uplink eth0 through AF_PACKET, which leaves every frame to the kernel too, and by default
// Linux answers ARP for any of its addresses on any interface: a who-has for the underlay address would
// get two replies, one with br-ul's MAC and one with eth0's, and a snooping ovs-vswitchd on the asking
// node keeps whichever came last (a wrong one black-holes the tunnel; shared/LAB.md, issue 10).
// arp_ignore=1 answers only on the interface that holds the address (br-ul), arp_announce=2 never
// advertises an address on an interface that does not hold it. "all" covers every interface, including
// those an agent adds later (the kernel takes the larger of "all" and the interface's own value). These
// are the node namespace's own settings; the root namespace is never touched.
func oneNICARP(netns string) error {
	if netns == "" { // InNetNS would write the caller's (the root namespace's) settings
		return errors.New("ARP settings: no namespace")
	}
	return InNetNS(netns, func() error {
		for _, kv := range [][2]string{
			{"/proc/sys/net/ipv4/conf/all/arp_ignore", "1"},
			{"/proc/sys/net/ipv4/conf/all/arp_announce", "2"},
		} {
			if err := os.WriteFile(kv[0], []byte(kv[1]+"\n"), 0o644); err != nil {
				return fmt.Errorf("ARP settings in %s: %w", netns, err)
			}
		}
		return nil
	})
}

// startOVS follows LAB.md: a database of its own, then ovsdb-server and ovs-vswitchd in the node's
// namespace (one userspace vswitchd per namespace).
func (n *Node) startOVS(ctx context.Context) error {
	db := filepath.Join(n.Dir, "conf.db")
	if err := run(ctx, "ovsdb-tool", "create", db, ovsSchema); err != nil {
		return err
	}
	if _, err := n.Exec(ctx, "ovsdb-server", db, "--remote=punix:"+n.DBSocket(),
		"--remote=db:Open_vSwitch,Open_vSwitch,manager_options",
		"--pidfile="+filepath.Join(n.Dir, "ovsdb-server.pid"), "--log-file="+filepath.Join(n.Dir, "ovsdb-server.log"),
		"--detach", "--no-chdir", "-vconsole:off"); err != nil {
		return err
	}
	if _, err := n.Vsctl(ctx, "--no-wait", "init"); err != nil {
		return err
	}
	return n.startVswitchd(ctx)
}

func (n *Node) startVswitchd(ctx context.Context) error {
	_, err := n.Exec(ctx, "ovs-vswitchd", "unix:"+n.DBSocket(), "--pidfile="+filepath.Join(n.Dir, "ovs-vswitchd.pid"),
		"--log-file="+filepath.Join(n.Dir, "ovs-vswitchd.log"), "--detach", "--no-chdir", "-vconsole:off")
	return err
}

// RestartVswitchd kills the node's ovs-vswitchd (SIGKILL, as a crash) and starts it again on the same
// database: the bridges and their ports come back, their flows do not — the agent must replay br0's.
// The lab itself restores what it owns: br-ul's NORMAL flow and the node's underlay address (br-ul is a
// tap that died with the daemon; on a real node the uplink is a NIC outside OVS).
func (n *Node) RestartVswitchd(ctx context.Context) error {
	if pid := n.VswitchdPID(); pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		if err := proc.WaitGone(pid, 10*time.Second); err != nil {
			return fmt.Errorf("node %s: ovs-vswitchd %d: %w", n.Name, pid, err)
		}
	}
	if err := n.startVswitchd(ctx); err != nil {
		return fmt.Errorf("node %s: restart ovs-vswitchd: %w", n.Name, err)
	}
	if err := proc.Until(ctx, 10*time.Second, func() bool {
		_, err := n.Exec(ctx, "ip", "link", "show", UnderlayBridge)
		return err == nil
	}); err != nil {
		return fmt.Errorf("node %s: %s did not come back: %w", n.Name, UnderlayBridge, err)
	}
	if _, err := n.Ofctl(ctx, "add-flow", UnderlayBridge, "priority=0,actions=NORMAL"); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	return runAll(ctx, [][]string{
		{"ip", "-n", n.NetNS, "addr", "replace", n.Addr.String(), "dev", UnderlayBridge},
		{"ip", "-n", n.NetNS, "link", "set", UnderlayBridge, "up"},
	})
}

// stopOVS stops a node's daemons found through their pidfiles: ovs-vswitchd with exit --cleanup (a
// SIGTERM leaves tap devices behind), SIGKILL if that fails; then ovsdb-server.
func stopOVS(dir string) error {
	var errs []error
	if pid := daemonPID(dir, "ovs-vswitchd"); pid != 0 {
		ctl := filepath.Join(dir, fmt.Sprintf("ovs-vswitchd.%d.ctl", pid))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		env := append(os.Environ(), "OVS_RUNDIR="+dir)
		if _, err := output(ctx, env, "ovs-appctl", "-t", ctl, "exit", "--cleanup"); err != nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		cancel()
		if err := proc.WaitGone(pid, 10*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("ovs-vswitchd %d: %w", pid, err))
		}
	}
	if pid := daemonPID(dir, "ovsdb-server"); pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		if proc.WaitGone(pid, 5*time.Second) != nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			if err := proc.WaitGone(pid, 5*time.Second); err != nil {
				errs = append(errs, fmt.Errorf("ovsdb-server %d: %w", pid, err))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("stop OVS in %s: %v", dir, errs)
	}
	return nil
}

// daemonPID reads <dir>/<daemon>.pid and returns the PID only while that process runs and is that
// daemon: a stale pidfile (e.g. after a reboot) must never get an unrelated process killed.
func daemonPID(dir, daemon string) int {
	pid := proc.ReadPIDFile(filepath.Join(dir, daemon+".pid"))
	if !proc.Alive(pid) {
		return 0
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	// comm is truncated to 15 bytes: both "ovs-vswitchd" and "ovsdb-server" fit.
	if c := strings.TrimSpace(string(comm)); err != nil || c != daemon {
		return 0
	}
	return pid
}

// AttachToUplink makes a host of the lab's own (namespace "<prefix>-<role>") whose eth0 is a port of
// node's underlay bridge br-ul, with the underlay address at the given offset (which must be free in the
// address plan): something that reaches the other nodes through nothing but br-ul's NORMAL switching.
func (l *Lab) AttachToUplink(ctx context.Context, node *Node, role string, offsetInUnderlay int) (*Host, error) {
	ip := offset(l.Underlay, offsetInUnderlay)
	if !l.Underlay.Contains(ip) || ip == l.Underlay.Addr() {
		return nil, fmt.Errorf("lab: offset %d is outside the underlay %s", offsetInUnderlay, l.Underlay)
	}
	h := &Host{Name: role, NetNS: l.NetNSName(role), IP: ip, Addr: netip.PrefixFrom(ip, l.Underlay.Bits()), MAC: macFor(ip)}
	port := "u" + strconv.Itoa(offsetInUnderlay)
	mtu := strconv.Itoa(l.MTU)
	if err := runAll(ctx, [][]string{
		{"ip", "netns", "add", h.NetNS},
		{"ip", "-n", node.NetNS, "link", "add", port, "mtu", mtu, "type", "veth", "peer", "name", Uplink, "mtu", mtu, "netns", h.NetNS},
		{"ip", "-n", h.NetNS, "link", "set", Uplink, "address", h.MAC.String()},
		{"ip", "netns", "exec", h.NetNS, "ethtool", "-K", Uplink, "tx", "off"},
		{"ip", "-n", h.NetNS, "addr", "add", h.Addr.String(), "dev", Uplink},
		{"ip", "-n", h.NetNS, "link", "set", Uplink, "up"},
		{"ip", "-n", h.NetNS, "link", "set", "lo", "up"},
		{"ip", "-n", node.NetNS, "link", "set", port, "up"},
	}); err != nil {
		return nil, err
	}
	if _, err := node.Vsctl(ctx, "add-port", UnderlayBridge, port); err != nil {
		return nil, err
	}
	return h, nil
}
