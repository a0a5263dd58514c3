package ovstest

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Pod is a test "pod": a network namespace with eth0, whose veth peer is a port of a bridge of an
// Instance. Tests use it for real packets through real flows.
type Pod struct {
	Name   string
	NetNS  string
	IP     netip.Prefix
	MAC    net.HardwareAddr
	Port   string // the veth end on the bridge
	OFPort int
	inst   *Instance
}

// AddPod creates a pod namespace named after the instance, a veth pair into it (TX checksum offload
// off on the pod side: LAB.md, userspace datapath), and attaches the peer to bridge with the requested
// OpenFlow port number. Cleanup removes the namespace and the port.
func (i *Instance) AddPod(bridge, name string, ip netip.Prefix, mac net.HardwareAddr, ofport int) *Pod {
	i.t.Helper()
	p := &Pod{Name: name, NetNS: i.NetNS + "-" + name, IP: ip, MAC: mac, Port: "v" + name, inst: i}
	if len(p.Port) > 15 {
		i.t.Fatalf("ovstest: pod name %q too long for an interface name", name)
	}
	i.t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", p.NetNS).Run() })
	steps := [][]string{
		{"ip", "netns", "add", p.NetNS},
		{"ip", "-n", i.NetNS, "link", "add", p.Port, "type", "veth", "peer", "name", "eth0", "netns", p.NetNS},
		{"ip", "-n", i.NetNS, "link", "set", p.Port, "up"},
		{"ip", "-n", p.NetNS, "link", "set", "eth0", "address", mac.String()},
		{"ip", "-n", p.NetNS, "link", "set", "eth0", "mtu", "1450"},
		{"ip", "-n", p.NetNS, "addr", "add", ip.String(), "dev", "eth0"},
		{"ip", "-n", p.NetNS, "link", "set", "eth0", "up"},
		{"ip", "-n", p.NetNS, "link", "set", "lo", "up"},
		{"ip", "netns", "exec", p.NetNS, "ethtool", "-K", "eth0", "tx", "off"},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			i.t.Fatalf("ovstest: %s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	if _, err := i.Vsctl("add-port", bridge, p.Port, "--", "set", "Interface", p.Port, "ofport_request="+strconv.Itoa(ofport)); err != nil {
		i.t.Fatalf("ovstest: attach %s: %v", p.Port, err)
	}
	out, err := i.Vsctl("get", "Interface", p.Port, "ofport")
	if err != nil {
		i.t.Fatalf("ovstest: ofport of %s: %v", p.Port, err)
	}
	p.OFPort, _ = strconv.Atoi(strings.TrimSpace(out))
	if p.OFPort != ofport {
		errOut, _ := i.Vsctl("get", "Interface", p.Port, "error")
		i.t.Fatalf("ovstest: %s got ofport %d, want %d (error %s)", p.Port, p.OFPort, ofport, strings.TrimSpace(errOut))
	}
	return p
}

// Exec runs a command inside the pod's namespace.
func (p *Pod) Exec(name string, args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", p.NetNS, name}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), p.NetNS, err, out)
	}
	return string(out), nil
}

// Ping sends count pings at the given interval (ping accepts 0.1 s as root) and returns how many
// were answered.
func (p *Pod) Ping(dst netip.Addr, count int, interval time.Duration) (received int, err error) {
	// Generous: a loaded machine sends late, and a ping that ran out of time would count as loss.
	deadline := int(2*time.Duration(count)*interval/time.Second) + 5
	out, _ := exec.Command("ip", "netns", "exec", p.NetNS, "ping", "-n", "-q",
		"-c", strconv.Itoa(count), "-i", fmt.Sprintf("%.3f", interval.Seconds()), "-w", strconv.Itoa(deadline),
		dst.String()).CombinedOutput()
	// "10 packets transmitted, 10 received, 0% packet loss"
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "packets transmitted") {
			fields := strings.Fields(line)
			for j, f := range fields {
				if strings.HasPrefix(f, "received") && j > 0 {
					return strconv.Atoi(strings.TrimSuffix(fields[j-1], ","))
				}
			}
		}
	}
	return 0, fmt.Errorf("ping %s from %s: no summary: %s", dst, p.Name, out)
}

// Do runs fn on an OS thread inside the pod's network namespace, so the sockets fn opens live there
// (and keep working from any goroutine afterwards). The thread is never returned to the scheduler: it
// exits with the goroutine, namespace and all.
func (p *Pod) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // deliberately never unlocked
		f, err := os.Open(filepath.Join("/run/netns", p.NetNS))
		if err != nil {
			errc <- fmt.Errorf("ovstest: enter %s: %w", p.NetNS, err)
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("ovstest: enter %s: %w", p.NetNS, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
