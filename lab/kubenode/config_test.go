package kubenode

import (
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// What the node's files say is what the package doc promises kubelet needed.
func TestNodeConfigs(t *testing.T) {
	n := &Node{cfg: Config{Name: "node1", NetNS: "ofsdn-lab-1-1-node1", IP: netip.MustParseAddr("198.51.100.11"), Dir: "/d",
		ClientCAFile: "/d/ca.crt", ClusterDNS: []string{"172.30.0.10"}, SandboxImage: "lab.ofsdn.test/pause:3.10.1",
		Mounts: map[string]string{"/var/run/openvswitch": "/ovs"}}, cgroups: []string{"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/memory"}}
	var kc map[string]any
	if err := yaml.Unmarshal([]byte(n.kubeletConfig()), &kc); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]any{
		"cgroupDriver": "cgroupfs", "cgroupRoot": "/ofsdn-lab-1-1-node1", "failCgroupV1": false, "failSwapOn": false,
		"protectKernelDefaults": true, "address": "198.51.100.11", "resolvConf": "/d/resolv.conf",
		"containerRuntimeEndpoint": "unix:///d/containerd.sock", "clusterDomain": "cluster.local",
	} {
		if kc[key] != want {
			t.Errorf("KubeletConfiguration %s = %v, want %v", key, kc[key], want)
		}
	}
	if dns, _ := kc["clusterDNS"].([]any); len(dns) != 1 || dns[0] != "172.30.0.10" {
		t.Errorf("clusterDNS %v", kc["clusterDNS"])
	}
	if authz, _ := kc["authorization"].(map[string]any); authz["mode"] != "Webhook" {
		t.Errorf("authorization %v", kc["authorization"])
	}
	cd := n.containerdConfig()
	for _, want := range []string{`restrict_oom_score_adj = true`, `SystemdCgroup = false`, `snapshotter = "overlayfs"`,
		`sandbox_image = "lab.ofsdn.test/pause:3.10.1"`, `address = "/d/containerd.sock"`, `root = "/d/containerd/root"`} {
		if !strings.Contains(cd, want) {
			t.Errorf("containerd's config lacks %s:\n%s", want, cd)
		}
	}
	setup := n.nodeSetup()
	for _, want := range []string{
		"hostname 'node1'",
		"mount -t sysfs sysfs /sys",
		"mount --bind '/ovs' '/var/run/openvswitch'",
		"mount --bind '/d/host/etc/cni/net.d' '/etc/cni/net.d'",
		"mount --make-rshared /",
		"mount --bind '/d/sysctl/vm.overcommit_memory' '/proc/sys/vm/overcommit_memory'",
		"echo $$ > '/sys/fs/cgroup/memory/ofsdn-lab-1-1-node1/runtime/cgroup.procs'",
		"exec containerd --config '/d/containerd.toml'",
	} {
		if !strings.Contains(setup, want) {
			t.Errorf("the node's setup lacks %q:\n%s", want, setup)
		}
	}
	// The cgroups are bound back before anything is mounted over them, and rshared comes after every bind.
	if strings.Index(setup, "--rbind /sys/fs/cgroup") > strings.Index(setup, "mount -t sysfs") ||
		strings.Index(setup, "--make-rshared") < strings.LastIndex(setup, "/etc/openvswitch") {
		t.Errorf("the node's setup is out of order:\n%s", setup)
	}
	if q("it's") != `'it'\''s'` {
		t.Errorf("q quotes %q", q("it's"))
	}
}
