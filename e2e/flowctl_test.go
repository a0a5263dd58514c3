//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// flowctl against the running lab: live traces through every node's ovs-vswitchd (reached through the
// API server's node proxy), the same traces offline from dumps, drift repair seen through flowctl diff
// and the agents' metrics, and the DaemonSet's probes asked with the manifest's own values.

// runFlowctl runs the flowctl binary as a cluster admin does, from the root namespace (outside every
// node): it reaches the nodes only through the API server.
func runFlowctl(ctx context.Context, args ...string) (string, error) {
	return runFlowctlWith(ctx, lc.API.KubeconfigPath(), args...)
}

// runFlowctlWith runs flowctl from the root namespace with kubeconfig's credentials.
func runFlowctlWith(ctx context.Context, kubeconfig string, args ...string) (string, error) {
	args = append(args, "--kubeconfig", kubeconfig)
	cmd := exec.CommandContext(ctx, filepath.Join(lc.BinDir, "flowctl"), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("flowctl %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// agentContainer is the agent container of deploy/agent/daemonset.yaml.
func agentContainer(t *testing.T) *corev1.Container {
	t.Helper()
	root, err := kubelab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.AgentContainer(filepath.Join(root, "deploy", "agent", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// probeURL is where kubelet sends an HTTP probe of the agent on node n: the probe's host (for a
// hostNetwork pod, the pod's IP is the node's), its port resolved through the container's named ports.
func probeURL(t *testing.T, c *corev1.Container, p *corev1.Probe, n *cluster.Node) string {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Fatal("not an HTTP probe")
	}
	g := p.HTTPGet
	port := g.Port.IntValue()
	if g.Port.Type == intstr.String {
		for _, cp := range c.Ports {
			if cp.Name == g.Port.StrVal {
				port = int(cp.ContainerPort)
			}
		}
	}
	host := g.Host
	if host == "" {
		host = n.IP.String()
	}
	scheme := strings.ToLower(string(g.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	return fmt.Sprintf("%s://%s:%d%s", scheme, host, port, g.Path)
}

// httpGet asks an agent's TLS server as kubelet's probes do (no certificate check), with a bearer token
// when one is given.
func httpGet(ctx context.Context, url string, timeout time.Duration, token ...string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	for _, t := range token {
		req.Header.Set("Authorization", "Bearer "+t)
	}
	resp, err := cluster.AgentHTTPClient(timeout).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), nil
}

// TestAgentProbes asks every agent's /healthz and /readyz exactly as the DaemonSet's probes would, then
// restarts one agent: liveness answers while it starts, readiness only once it has synced, and the
// CNI STATUS verb says the same.
func TestAgentProbes(t *testing.T) {
	needsStandIn(t, "stops the agent's process to watch its probes fail; there kubelet restarts it on its own")
	ctx := ctxT(t, 3*time.Minute)
	c := agentContainer(t)
	timeout := time.Duration(c.LivenessProbe.TimeoutSeconds) * time.Second
	for _, n := range lc.Nodes {
		for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
			url := probeURL(t, c, p, n)
			code, body, err := httpGet(ctx, url, timeout)
			if err != nil || code != http.StatusOK {
				t.Errorf("%s on %s: HTTP %d, %v\n%s", url, n.Name, code, err, body)
			}
		}
		if err := cniStatus(ctx, n); err != nil {
			t.Errorf("CNI STATUS on %s: %v", n.Name, err)
		}
	}

	n := lc.Nodes[len(lc.Nodes)-1]
	lc.StopAgent(n, true)
	if err := cniStatus(ctx, n); err == nil {
		t.Error("CNI STATUS succeeded with the agent down")
	}
	if err := lc.StartAgent(n); err != nil {
		t.Fatal(err)
	}
	live, ready := probeURL(t, c, c.LivenessProbe, n), probeURL(t, c, c.ReadinessProbe, n)
	var sawStarting bool
	deadline := time.Now().Add(90 * time.Second)
	for {
		// readyz first: once it answers the server listens, so healthz is judged on a listening server
		// (asked the other way round, healthz could be refused just before the server came up).
		rcode, rbody, rerr := httpGet(ctx, ready, timeout)
		lcode, _, lerr := httpGet(ctx, live, timeout)
		if rerr == nil && rcode == http.StatusOK {
			if lerr != nil || lcode != http.StatusOK {
				t.Errorf("ready but not live: %d %v", lcode, lerr)
			}
			break
		}
		if rerr == nil && rcode == http.StatusServiceUnavailable {
			sawStarting = true
			if !strings.Contains(rbody, "[-]") || lerr != nil || lcode != http.StatusOK {
				t.Errorf("starting agent: readyz %d %q, healthz %d %v", rcode, rbody, lcode, lerr)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted agent on %s never became ready: %d %v\n%s", n.Name, rcode, rerr, rbody)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("restarted agent seen not ready before ready: %v", sawStarting)
	if err := cniStatus(ctx, n); err != nil {
		t.Errorf("CNI STATUS after the restart: %v", err)
	}
}

// cniStatus runs the installed plugin's STATUS verb on a node, as a runtime does: STATUS is CNI 1.1.0's,
// so a runtime that speaks it picks 1.1.0 from the conflist's cniVersions (cniVersion stays 1.0.0 for
// runtimes such as containerd 1.6 that know no more).
func cniStatus(ctx context.Context, n *cluster.Node) error {
	conf, err := os.ReadFile(filepath.Join(n.CNIConfDir, "80-ofsdn.conflist"))
	if err != nil {
		return err
	}
	var list struct {
		CNIVersion  string            `json:"cniVersion"`
		CNIVersions []string          `json:"cniVersions"`
		Name        string            `json:"name"`
		Plugins     []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(conf, &list); err != nil {
		return err
	}
	if !slices.Contains(list.CNIVersions, "1.1.0") {
		return fmt.Errorf("the conflist offers CNI versions %v, no 1.1.0 for STATUS", list.CNIVersions)
	}
	list.CNIVersion = "1.1.0"
	var plugin map[string]any
	if err := json.Unmarshal(list.Plugins[0], &plugin); err != nil {
		return err
	}
	plugin["cniVersion"], plugin["name"] = list.CNIVersion, list.Name
	stdin, _ := json.Marshal(plugin)
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", n.NetNS, filepath.Join(n.CNIBinDir, "ofsdn"))
	cmd.Env = append(os.Environ(), "CNI_COMMAND=STATUS", "CNI_PATH="+n.CNIBinDir)
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	return nil
}

// metrics is one scrape: series ("name{k="v",...}") → value.
type metrics map[string]float64

var seriesRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$`)

// scrape reads an agent's /metrics as Prometheus does: over TLS with a ServiceAccount token allowed get
// on /metrics (README, "The node API").
func scrape(t *testing.T, ctx context.Context, n *cluster.Node) metrics {
	t.Helper()
	c := agentContainer(t)
	var port int32
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			port = p.ContainerPort
		}
	}
	token, err := lc.NodeAPIToken(ctx, "prometheus", "ofsdn-metrics-reader")
	if err != nil {
		t.Fatal(err)
	}
	code, body, err := httpGet(ctx, fmt.Sprintf("https://%s:%d/metrics", n.IP, port), 5*time.Second, token)
	if err != nil || code != http.StatusOK {
		t.Fatalf("scrape %s: %d %v", n.Name, code, err)
	}
	m := metrics{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		g := seriesRE.FindStringSubmatch(line)
		if g == nil {
			t.Fatalf("%s: unreadable metrics line %q", n.Name, line)
		}
		v, err := strconv.ParseFloat(g[3], 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", n.Name, line, err)
		}
		m[g[1]+g[2]] = v
	}
	return m
}

// get returns a series' value (0 when absent).
func (m metrics) get(name string, labels ...string) float64 {
	key := name
	if len(labels) > 0 {
		var parts []string
		for i := 0; i+1 < len(labels); i += 2 {
			parts = append(parts, fmt.Sprintf("%s=%q", labels[i], labels[i+1]))
		}
		sort.Strings(parts) // the exposition sorts labels by name
		key += "{" + strings.Join(parts, ",") + "}"
	}
	return m[key]
}

// has reports whether any series of the family is present.
func (m metrics) has(name string) bool {
	for k := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			return true
		}
	}
	return false
}

// TestAgentMetrics scrapes a running agent: every family is there, and the counts move as pods come and go.
func TestAgentMetrics(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	n := lc.Nodes[1]
	before := scrape(t, ctx, n)
	for _, fam := range []string{"ofsdn_agent_sync_duration_seconds_bucket", "ofsdn_agent_flow_mods_total", "ofsdn_agent_bundles_total",
		"ofsdn_agent_bundle_failures_total", "ofsdn_agent_flows", "ofsdn_agent_groups", "ofsdn_agent_drift_checks_total",
		"ofsdn_agent_openflow_connections_total", "ofsdn_agent_ovs_session_up", "ofsdn_agent_pods", "ofsdn_agent_remote_nodes",
		"ofsdn_agent_services", "ofsdn_agent_failing_owners", "ofsdn_agent_ready", "process_resident_memory_bytes"} {
		if !before.has(fam) {
			t.Errorf("%s: no %s", n.Name, fam)
		}
	}
	if got := before.get("ofsdn_agent_remote_nodes"); got != float64(len(lc.Nodes)-1) {
		t.Errorf("remote nodes %v, want %d", got, len(lc.Nodes)-1)
	}
	if before.get("ofsdn_agent_ready") != 1 || before.get("ofsdn_agent_ovs_session_up", "session", "openflow") != 1 ||
		before.get("ofsdn_agent_ovs_session_up", "session", "ovsdb") != 1 || before.get("ofsdn_agent_openflow_connections_total") < 1 {
		t.Errorf("ready/sessions: %v %v %v %v", before.get("ofsdn_agent_ready"), before.get("ofsdn_agent_ovs_session_up", "session", "openflow"),
			before.get("ofsdn_agent_ovs_session_up", "session", "ovsdb"), before.get("ofsdn_agent_openflow_connections_total"))
	}

	pods := runPods(t, ctx, "metrics", []string{"e2e-metrics", "e2e-metrics-b"}, []*cluster.Node{n})
	mid := scrape(t, ctx, n)
	added := float64(len(pods))
	if d := mid.get("ofsdn_agent_pods") - before.get("ofsdn_agent_pods"); d != added {
		t.Errorf("pods gauge moved by %v, want %v", d, added)
	}
	if d := mid.get("ofsdn_agent_cni_requests_total", "verb", "ADD", "result", "ok") - before.get("ofsdn_agent_cni_requests_total", "verb", "ADD", "result", "ok"); d != added {
		t.Errorf("ADD ok moved by %v, want %v", d, added)
	}
	if d := mid.get("ofsdn_agent_cni_request_duration_seconds_count", "verb", "ADD", "result", "ok") -
		before.get("ofsdn_agent_cni_request_duration_seconds_count", "verb", "ADD", "result", "ok"); d != added {
		t.Errorf("ADD latency observations moved by %v, want %v", d, added)
	}
	// Each pod owns its anti-spoofing, routing, ARP and hairpin flows: at least 4 more pod flows each.
	if d := mid.get("ofsdn_agent_flows", "category", "pod") - before.get("ofsdn_agent_flows", "category", "pod"); d < 4*added {
		t.Errorf("pod flows moved by %v, want at least %v", d, 4*added)
	}
	if d := mid.get("ofsdn_agent_flow_mods_total", "op", "add") - before.get("ofsdn_agent_flow_mods_total", "op", "add"); d < 4*added {
		t.Errorf("flow adds moved by %v", d)
	}
	if d := mid.get("ofsdn_agent_bundles_total") - before.get("ofsdn_agent_bundles_total"); d < 1 {
		t.Errorf("bundles moved by %v", d)
	}
	// A new tenant's isolation flow (multitenant mode): both namespaces have a VNID of their own.
	if d := mid.get("ofsdn_agent_flows", "category", "vnid") - before.get("ofsdn_agent_flows", "category", "vnid"); d != 2 {
		t.Errorf("tenant flows moved by %v, want 2 (one per new VNID)", d)
	}
	for _, p := range pods {
		if err := lc.DeletePod(ctx, p.Namespace, p.Name); err != nil {
			t.Fatal(err)
		}
	}
	after := scrape(t, ctx, n)
	if after.get("ofsdn_agent_pods") != before.get("ofsdn_agent_pods") || after.get("ofsdn_agent_flows", "category", "pod") != before.get("ofsdn_agent_flows", "category", "pod") {
		t.Errorf("after deleting the pods: %v pods, %v pod flows; before %v, %v", after.get("ofsdn_agent_pods"),
			after.get("ofsdn_agent_flows", "category", "pod"), before.get("ofsdn_agent_pods"), before.get("ofsdn_agent_flows", "category", "pod"))
	}
	if d := after.get("ofsdn_agent_cni_requests_total", "verb", "DEL", "result", "ok") - mid.get("ofsdn_agent_cni_requests_total", "verb", "DEL", "result", "ok"); d < added {
		t.Errorf("DEL ok moved by %v, want at least %v", d, added)
	}
}

// TestDriftRepairAndDiff tampers with a node's bridge behind its agent's back with ovs-ofctl: a pod's
// flow deleted, another's actions changed, a service's group deleted (OVS deletes the flow that sends
// to it too), a foreign flow added. flowctl diff (through the API server) names each with its owner;
// the agent's periodic drift check puts back exactly those five entries (its repair counter moves by
// five) and flowctl diff is empty after.
func TestDriftRepairAndDiff(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	n := lc.Nodes[0]
	const ns = "e2e-drift"
	pods := runPods(t, ctx, "drift", []string{ns}, []*cluster.Node{n})
	p := pods[0]
	p2, err := lc.RunPod(ctx, cluster.PodSpec(ns, "drift2", n.Name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.DeletePod(context.Background(), ns, "drift2") })
	svc := createService(t, ctx, ns, "web", corev1.ServiceSpec{Selector: map[string]string{"app": p.Name},
		Ports: []corev1.ServicePort{tcpPort("http", 80, cluster.TestPort)}})
	waitEndpoints(t, ctx, p2.NetNS, "tcp", clusterIP(svc, 80), 1, time.Minute)

	diff := func() (*debugapi.Diff, error) {
		out, err := runFlowctl(ctx, "diff", "--node", n.Name, "-o", "json")
		var d debugapi.Diff
		if jerr := json.Unmarshal([]byte(out), &d); jerr != nil {
			return nil, fmt.Errorf("%v (flowctl: %v)", jerr, err)
		}
		return &d, nil
	}
	if d, err := diff(); err != nil || len(d.Entries) != 0 {
		t.Fatalf("drift before tampering: %+v %v", d, err)
	}
	// One of the service's groups, from the bridge.
	groups, err := n.Ofctl(ctx, "dump-groups", "br0")
	if err != nil {
		t.Fatal(err)
	}
	gm := regexp.MustCompile(`group_id=(\d+),type=select,bucket=[^\n]*0x1f90->NXM_NX_REG5`).FindStringSubmatch(groups)
	if gm == nil {
		t.Fatalf("no select group towards port %d:\n%s", cluster.TestPort, groups)
	}
	before := scrape(t, ctx, n)
	for _, cmd := range [][]string{
		{"del-flows", "br0", "--strict", fmt.Sprintf("table=70,priority=200,arp,arp_tpa=%s", p.IP)},
		{"mod-flows", "br0", "--strict", fmt.Sprintf("table=60,priority=200,ip,nw_dst=%s,actions=drop", p2.IP)},
		{"del-groups", "br0", "group_id=" + gm[1]},
		{"add-flow", "br0", "cookie=0x8000000deadbeef,table=100,priority=7,in_port=4077,actions=drop"},
	} {
		if out, err := n.Ofctl(ctx, cmd[0], cmd[1], cmd[2:]...); err != nil {
			t.Fatalf("ovs-ofctl %v: %v\n%s", cmd, err, out)
		}
	}
	// The diff right after tampering (the agent's next check may already have repaired some).
	if d, err := diff(); err != nil {
		t.Fatal(err)
	} else {
		for _, e := range d.Entries {
			t.Logf("drift: %s %s %s %s%s", e.Owner, e.State, e.Kind, e.Desired, e.Installed)
			switch {
			case e.State == "missing" && e.Kind == "flow" && e.Owner != "pod/"+p.Key() &&
				!(strings.HasPrefix(e.Owner, "svc/"+ns+"/web:") && strings.Contains(e.Desired, "actions=group:"+gm[1])):
			case e.State == "different" && e.Owner != "pod/"+p2.Key():
			case e.State == "missing" && e.Kind == "group" && !strings.HasPrefix(e.Owner, "svc/"+ns+"/web:"):
			case e.State == "unexpected" && !strings.Contains(e.Installed, "in_port=4077"):
			default:
				continue
			}
			t.Errorf("drift entry with the wrong owner: %+v", e)
		}
	}
	// The periodic check repairs it (the e2e agents check every few seconds).
	deadline := time.Now().Add(time.Minute)
	for {
		d, err := diff()
		if err == nil && len(d.Entries) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("drift not repaired within a minute: %+v %v", d, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	after := scrape(t, ctx, n)
	if got := after.get("ofsdn_agent_drift_repairs_total", "trigger", "periodic") - before.get("ofsdn_agent_drift_repairs_total", "trigger", "periodic"); got != 5 {
		t.Errorf("drift repairs sent %v messages, want exactly the 5 tampered entries", got)
	}
	logs, _ := os.ReadFile(n.AgentLog)
	for _, owner := range []string{"pod/" + p.Key(), "pod/" + p2.Key(), "svc/" + ns + "/web:http"} {
		if !strings.Contains(string(logs), owner+" (") {
			t.Errorf("the agent's log names no repair of %s", owner)
		}
	}
	// And the data path works again.
	if _, err := p2.Probe(ctx, "tcp", netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80), 0); err != nil {
		t.Errorf("service after repair: %v", err)
	}

	// A restarted ovs-vswitchd has lost every flow and group: the reconnect's drift check puts back
	// exactly the desired state, counted under its own trigger.
	clean, err := diff()
	if err != nil {
		t.Fatal(err)
	}
	if err := n.RestartVswitchd(ctx); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(time.Minute)
	for {
		m := scrape(t, ctx, n)
		d, err := diff()
		if err == nil && len(d.Entries) == 0 && m.get("ofsdn_agent_drift_checks_total", "trigger", "reconnect") > after.get("ofsdn_agent_drift_checks_total", "trigger", "reconnect") {
			want := float64(clean.DesiredFlows + clean.DesiredGroups)
			if got := m.get("ofsdn_agent_drift_repairs_total", "trigger", "reconnect") - after.get("ofsdn_agent_drift_repairs_total", "trigger", "reconnect"); got != want {
				t.Errorf("the reconnect repair sent %v messages, want the %v desired flows and groups", got, want)
			}
			if got := m.get("ofsdn_agent_openflow_connections_total") - after.get("ofsdn_agent_openflow_connections_total"); got != 1 {
				t.Errorf("OpenFlow connections moved by %v, want 1", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reconnect repair within a minute: %+v %v", d, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if _, err := p2.Probe(ctx, "tcp", netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80), 0); err != nil {
		t.Errorf("service after the restart: %v", err)
	}
	// Leave the lab as found: the restarted ovs-vswitchd's tunnel neighbour cache full again (the agent
	// fills it from the kernel's neighbours, which traffic to the peers refreshes).
	deadline = time.Now().Add(time.Minute)
	for {
		for _, peer := range lc.Nodes {
			if peer != n {
				_, _ = n.Exec(ctx, "ping", "-n", "-q", "-c", "1", "-W", "1", peer.IP.String())
			}
		}
		wrong := wrongNeighbours(t, ctx, n)
		if len(wrong) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tunnel neighbours of %s a minute after its ovs-vswitchd restarted: %v", n.Name, wrong)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
