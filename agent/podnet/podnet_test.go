package podnet

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
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
		NetNS: "/var/run/netns/" + pod, HostNetNS: "/var/run/netns/" + node, ContainerID: "c0ffee", IfName: "eth0",
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
	if err := Teardown(cfg.HostNetNS, cfg.ContainerID, cfg.IfName); err != nil {
		t.Fatal(err)
	}
	if err := Teardown(cfg.HostNetNS, cfg.ContainerID, cfg.IfName); err != nil {
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

func TestMark(t *testing.T) {
	for _, tc := range []struct {
		alias, cid, ifName string
		ok                 bool
	}{
		{Mark("abc123", "eth0"), "abc123", "eth0", true},
		{Mark("a/b", "eth0"), "a/b", "eth0", true}, // the interface is after the last slash
		{"ofsdn:abc", "", "", false},
		{"ofsdn:/eth0", "", "", false},
		{"ofsdn:abc/", "", "", false},
		{"cilium:abc/eth0", "", "", false},
		{"", "", "", false},
	} {
		cid, ifName, ok := ParseMark(tc.alias)
		if ok != tc.ok || cid != tc.cid || ifName != tc.ifName {
			t.Errorf("ParseMark(%q) = %q %q %v, want %q %q %v", tc.alias, cid, ifName, ok, tc.cid, tc.ifName, tc.ok)
		}
	}
}

func ipIn(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Setup, Teardown and Check touch only what carries the attachment's mark (or, unmarked, is its own
// host end and that end's peer).
func TestForeignInterfacesAreLeftAlone(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("needs root and network namespaces")
	}
	node := netnsForTest(t, "fnode")
	cfg := func(pod, cid string) Config {
		return Config{NetNS: "/var/run/netns/" + pod, HostNetNS: "/var/run/netns/" + node, ContainerID: cid, IfName: "eth0",
			HostVeth: HostVethName(cid, "eth0"), IP: netip.MustParsePrefix("10.128.0.7/23"), MTU: 1450}
	}
	for _, tc := range []struct {
		name  string
		setup []string // ip commands in the pod namespace (POD) and the node's (NODE)
	}{
		{"a veth with an address", []string{"POD link add eth0 type veth peer name p0", "POD addr add 203.0.113.5/24 dev eth0"}},
		{"a tap", []string{"POD tuntap add eth0 mode tap"}},
		{"another attachment's interface", []string{"POD link add eth0 type veth peer name p0", "POD link set eth0 alias ofsdn:other/eth0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := netnsForTest(t, "f"+strings.ReplaceAll(tc.name[:5], " ", ""))
			for _, c := range tc.setup {
				f := strings.Fields(c)
				ns := map[string]string{"POD": pod, "NODE": node}[f[0]]
				ipIn(t, append([]string{"-n", ns}, f[1:]...)...)
			}
			before := ipIn(t, "-n", pod, "addr", "show", "eth0")
			if _, err := Setup(cfg(pod, "c1")); !errors.Is(err, ErrForeignInterface) {
				t.Fatalf("Setup over %s: %v, want ErrForeignInterface", tc.name, err)
			}
			if after := ipIn(t, "-n", pod, "addr", "show", "eth0"); after != before {
				t.Errorf("the foreign eth0 changed:\n%s\nwas\n%s", after, before)
			}
			if out, _ := exec.Command("ip", "-n", node, "link", "show", HostVethName("c1", "eth0")).CombinedOutput(); !strings.Contains(string(out), "does not exist") {
				t.Errorf("the refused Setup left a host end: %s", out)
			}
		})
	}

	t.Run("a node link with the host end's name", func(t *testing.T) {
		pod := netnsForTest(t, "fsquat")
		name := HostVethName("c2", "eth0")
		ipIn(t, "-n", node, "link", "add", name, "type", "veth", "peer", "name", "sq0")
		ipIn(t, "-n", node, "link", "set", name, "alias", "someone-else")
		if _, err := Setup(cfg(pod, "c2")); !errors.Is(err, ErrForeignInterface) {
			t.Errorf("Setup: %v, want ErrForeignInterface", err)
		}
		if err := Teardown("/var/run/netns/"+node, "c2", "eth0"); !errors.Is(err, ErrForeignInterface) {
			t.Errorf("Teardown: %v, want ErrForeignInterface", err)
		}
		ipIn(t, "-n", node, "link", "show", name)
		ipIn(t, "-n", node, "link", "del", name)
	})

	t.Run("this attachment's leftovers are replaced", func(t *testing.T) {
		pod := netnsForTest(t, "fleft")
		c := cfg(pod, "c3")
		if _, err := Setup(c); err != nil {
			t.Fatal(err)
		}
		ends, err := ListHostEnds(c.HostNetNS)
		if err != nil || len(ends) != 1 || ends[0].ContainerID != "c3" || ends[0].Name != c.HostVeth {
			t.Fatalf("host ends %+v %v, want c3's", ends, err)
		}
		// As if the agent died between creating the pair and marking it: no aliases.
		ipIn(t, "-n", pod, "link", "set", "eth0", "alias", "")
		ipIn(t, "-n", node, "link", "set", c.HostVeth, "alias", "")
		if _, err := Setup(c); err != nil {
			t.Fatalf("Setup over its unmarked leftover: %v", err)
		}
		if err := Check(c); err != nil {
			t.Errorf("Check: %v", err)
		}
		if out := ipIn(t, "-n", pod, "link", "show", "eth0"); !strings.Contains(out, "alias "+Mark("c3", "eth0")) {
			t.Errorf("pod end not marked:\n%s", out)
		}
		ipIn(t, "-n", node, "link", "del", c.HostVeth)
		if err := Check(c); !errors.Is(err, ErrNotAttached) {
			t.Errorf("Check without the host end: %v, want ErrNotAttached", err)
		}
	})

	t.Run("namespaces that are gone", func(t *testing.T) {
		plain := filepath.Join(t.TempDir(), "netns") // what an unmounted netns leaves: a plain file
		if err := os.WriteFile(plain, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, path := range []string{"/var/run/netns/ofsdn-t-no-such-netns", plain} {
			c := cfg("x", "c4")
			c.NetNS = path
			if err := Check(c); !errors.Is(err, ErrNetNSGone) {
				t.Errorf("Check in %s: %v, want ErrNetNSGone", path, err)
			}
		}
	})
}
