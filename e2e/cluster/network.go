package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ofsdn/ofsdn/internal/proc"
)

// SetMode switches the cluster's pluginMode live (agents re-render; no pod restarts).
func (c *Cluster) SetMode(ctx context.Context, mode networkv1.PluginMode) error {
	patch := fmt.Sprintf(`{"spec":{"pluginMode":%q}}`, mode)
	_, err := c.Net.NetworkV1().ClusterNetworks().Patch(ctx, networkv1.ClusterNetworkName, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("set pluginMode %s: %w", mode, err)
	}
	return nil
}

// UplinkLinger is the lab agents' --uplink-linger.
const UplinkLinger = 3 * time.Second

// SetEncapsulation switches the cluster's encapsulation live and waits until every node's br0 sends the
// way it says: with none, each node's table 90 outputs to the uplink port (every lab node shares one
// segment); with vxlan, none does, and then it waits until the uplink port went too. It returns how long
// the flows took to get there (the linger not counted).
func (c *Cluster) SetEncapsulation(ctx context.Context, encap networkv1.Encapsulation) (time.Duration, error) {
	start := time.Now()
	patch := fmt.Sprintf(`{"spec":{"encapsulation":%q}}`, encap)
	if _, err := c.Net.NetworkV1().ClusterNetworks().Patch(ctx, networkv1.ClusterNetworkName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return 0, fmt.Errorf("set encapsulation %s: %w", encap, err)
	}
	uplink := fmt.Sprintf("output:%d", pipeline.PortUplink)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last string
	for _, n := range c.Nodes {
		err := proc.Until(wctx, 0, func() bool {
			out, err := n.Ofctl(wctx, "dump-flows", "br0", "table=90")
			last = out
			return err == nil && strings.Contains(out, uplink) == (encap == networkv1.EncapsulationNone)
		})
		if err != nil {
			return 0, fmt.Errorf("encapsulation %s: node %s's table 90 never followed: %w\n%s", encap, n.Name, err, last)
		}
	}
	took := time.Since(start)
	if encap == networkv1.EncapsulationNone {
		return took, nil
	}
	// Back at vxlan the uplink port lingers (UplinkLinger), still accepting from the uplink; wait until
	// it went, so the next test finds br0 as it was before any switch.
	fromUplink := fmt.Sprintf("in_port=%d", pipeline.PortUplink)
	for _, n := range c.Nodes {
		err := proc.Until(wctx, 0, func() bool {
			out, err := n.Ofctl(wctx, "dump-flows", "br0", "table=0")
			last = out
			return err == nil && !strings.Contains(out, fromUplink)
		})
		if err != nil {
			return 0, fmt.Errorf("encapsulation vxlan: node %s's uplink port never went after the linger: %w\n%s", n.Name, err, last)
		}
	}
	return took, nil
}

// ChangeNetwork writes a change-network request (join:<ns>, isolate, global) on namespace's NetNamespace,
// waits until the controller carried it out, and returns the namespace's NETID afterwards.
func (c *Cluster) ChangeNetwork(ctx context.Context, namespace, request string) (uint32, error) {
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, networkv1.ChangeNetworkAnnotation, request)
	if _, err := c.Net.NetworkV1().NetNamespaces().Patch(ctx, namespace, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return 0, fmt.Errorf("change-network %s %s: %w", namespace, request, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var netid uint32
	err := proc.Until(ctx, 0, func() bool {
		nn, err := c.Net.NetworkV1().NetNamespaces().Get(ctx, namespace, metav1.GetOptions{})
		if err != nil {
			return false
		}
		_, pending := nn.Annotations[networkv1.ChangeNetworkAnnotation]
		netid = nn.NetID
		return !pending
	})
	if err != nil {
		return 0, fmt.Errorf("change-network %s %s: the controller did not carry it out: %w", namespace, request, err)
	}
	return netid, nil
}

// NetIDs returns the NETID of each namespace.
func (c *Cluster) NetIDs(ctx context.Context, namespaces ...string) (map[string]uint32, error) {
	out := map[string]uint32{}
	for _, ns := range namespaces {
		nn, err := c.Net.NetworkV1().NetNamespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		out[ns] = nn.NetID
	}
	return out, nil
}

// Matrix is who reaches whom: Matrix[from][to] for pod keys.
type Matrix map[string]map[string]bool

// Expected computes the matrix a plugin mode promises: flat modes connect everyone; multitenant connects
// pods of one NETID, and NETID 0 both ways.
func Expected(pods []*Pod, netids map[string]uint32, mode networkv1.PluginMode) Matrix {
	m := Matrix{}
	for _, a := range pods {
		m[a.Key()] = map[string]bool{}
		for _, b := range pods {
			if a == b {
				continue
			}
			va, vb := netids[a.Namespace], netids[b.Namespace]
			m[a.Key()][b.Key()] = mode != networkv1.PluginModeMultitenant || va == vb || va == 0 || vb == 0
		}
	}
	return m
}

// Reachability probes every ordered pair of distinct pods over TCP (16 probes at a time).
func (c *Cluster) Reachability(ctx context.Context, pods []*Pod) Matrix {
	m := Matrix{}
	var mu sync.Mutex
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	// Every row exists before the first probe writes, so the outer map is only read concurrently.
	for _, a := range pods {
		m[a.Key()] = map[string]bool{}
	}
	for _, a := range pods {
		for _, b := range pods {
			if a == b {
				continue
			}
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				r, err := a.Probe(ctx, "tcp", netip.AddrPortFrom(b.IP, TestPort), 0)
				ok := err == nil && strings.HasPrefix(r, b.Key()+" ")
				mu.Lock()
				m[a.Key()][b.Key()] = ok
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return m
}

// Diff lists the pairs where got differs from want.
func (m Matrix) Diff(want Matrix) []string {
	var out []string
	for from, row := range want {
		for to, w := range row {
			if m[from][to] != w {
				out = append(out, fmt.Sprintf("%s → %s: got %v, want %v", from, to, m[from][to], w))
			}
		}
	}
	sort.Strings(out)
	return out
}

// Format prints the matrix with one row per source pod ("x" reaches, "." does not).
func (m Matrix) Format(pods []*Pod) string {
	var b strings.Builder
	for i := range pods {
		fmt.Fprintf(&b, " %2d", i)
	}
	b.WriteString("\n")
	for i, a := range pods {
		for _, p := range pods {
			switch {
			case p == a:
				b.WriteString("  -")
			case m[a.Key()][p.Key()]:
				b.WriteString("  x")
			default:
				b.WriteString("  .")
			}
		}
		fmt.Fprintf(&b, "   %2d %s (%s, %s)\n", i, a.Key(), a.Node, a.IP)
	}
	return b.String()
}

// WaitMatrix probes until the reachability equals want or ctx ends; it returns the last matrix, the
// mismatches (none on success) and how long it took.
func (c *Cluster) WaitMatrix(ctx context.Context, pods []*Pod, want Matrix, timeout time.Duration) (Matrix, []string, time.Duration) {
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		got := c.Reachability(ctx, pods)
		diff := got.Diff(want)
		if len(diff) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return got, diff, time.Since(start)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Encapsulation reads the cluster's encapsulation (vxlan when unset or unreadable).
func (c *Cluster) Encapsulation(ctx context.Context) networkv1.Encapsulation {
	cn, err := c.Net.NetworkV1().ClusterNetworks().Get(ctx, networkv1.ClusterNetworkName, metav1.GetOptions{})
	if err != nil || cn.Spec.Encapsulation == "" {
		return networkv1.EncapsulationVXLAN
	}
	return cn.Spec.Encapsulation
}

// AgentLogTail returns the last lines of a node's agent log.
func (c *Cluster) AgentLogTail(n *Node, lines int) string { return proc.Tail(n.AgentLog, lines) }
