package podnet

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// netnsForTest makes a named network namespace that cleanup removes.
func netnsForTest(t *testing.T, suffix string) string {
	t.Helper()
	name := fmt.Sprintf("ofsdn-t-%d-podnet-%s", os.Getpid(), suffix)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name
}

func TestSetupCheckTeardown(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("needs root and network namespaces")
	}
	node, pod := netnsForTest(t, "node"), netnsForTest(t, "pod")
	cfg := Config{
		NetNS: "/var/run/netns/" + pod, HostNetNS: "/var/run/netns/" + node, IfName: "eth0",
		HostVeth: HostVethName("c0ffee", "eth0"), IP: netip.MustParsePrefix("10.128.0.5/23"),
		Gateway: netip.MustParseAddr("10.128.0.1"), ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")},
		MTU: 1450, TxChecksumOff: true,
	}
	if len(cfg.HostVeth) > 15 {
		t.Fatalf("host veth name %q too long", cfg.HostVeth)
	}
	mac, err := Setup(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if mac.String() != "0a:58:0a:80:00:05" {
		t.Errorf("MAC %s", mac)
	}
	routes, _ := exec.Command("ip", "-n", pod, "route").CombinedOutput()
	for _, want := range []string{"default via 10.128.0.1 dev eth0", "10.128.0.0/14 dev eth0 scope link"} {
		if !strings.Contains(string(routes), want) {
			t.Errorf("pod routes lack %q:\n%s", want, routes)
		}
	}
	link, _ := exec.Command("ip", "-n", pod, "link", "show", "eth0").CombinedOutput()
	if !strings.Contains(string(link), "mtu 1450") || !strings.Contains(string(link), "0a:58:0a:80:00:05") {
		t.Errorf("pod eth0: %s", link)
	}
	feat, _ := exec.Command("ip", "netns", "exec", pod, "ethtool", "-k", "eth0").CombinedOutput()
	if !strings.Contains(string(feat), "tx-checksumming: off") {
		t.Errorf("TX checksum offload still on:\n%s", feat)
	}
	if host, _ := exec.Command("ip", "-n", node, "link", "show", cfg.HostVeth).CombinedOutput(); !strings.Contains(string(host), "UP") {
		t.Errorf("host end not up in the node namespace: %s", host)
	}
	if err := Check(cfg); err != nil {
		t.Errorf("Check after Setup: %v", err)
	}
	// The node owns the gateway address (on tun0 in production): its kernel must still not answer the
	// pod's ARP through the veth, or the pod would send to the veth's MAC and bypass br0.
	for _, args := range [][]string{{"tuntap", "add", "tun0", "mode", "tap"}, {"addr", "add", "10.128.0.1/23", "dev", "tun0"}, {"link", "set", "tun0", "up"}} {
		if out, err := exec.Command("ip", append([]string{"-n", node}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	_ = exec.Command("ip", "netns", "exec", pod, "ping", "-c", "1", "-W", "1", "10.128.0.1").Run()
	hostMAC, _ := exec.Command("ip", "netns", "exec", node, "cat", "/sys/class/net/"+cfg.HostVeth+"/address").Output()
	if neigh, _ := exec.Command("ip", "-n", pod, "neigh", "show", "10.128.0.1").CombinedOutput(); strings.Contains(string(neigh), strings.TrimSpace(string(hostMAC))) {
		t.Errorf("the node answered the pod's ARP for its gateway with the host veth's MAC %s: %s", hostMAC, neigh)
	}
	// A retried ADD reconfigures instead of failing.
	if _, err := Setup(cfg); err != nil {
		t.Fatalf("second Setup: %v", err)
	}
	if err := Teardown(cfg.HostNetNS, cfg.HostVeth); err != nil {
		t.Fatal(err)
	}
	if err := Teardown(cfg.HostNetNS, cfg.HostVeth); err != nil {
		t.Fatalf("Teardown must be idempotent: %v", err)
	}
	if err := Check(cfg); err == nil {
		t.Error("Check after Teardown passed")
	}
	cfg.NetNS = "/var/run/netns/ofsdn-t-does-not-exist"
	if _, err := Setup(cfg); !errors.Is(err, ErrNetNSGone) {
		t.Errorf("missing netns: %v", err)
	}
}
