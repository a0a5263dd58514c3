//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/e2e/nodesim"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ofsdn/ofsdn/internal/proc"
)

const helloPort = 9302

// helloPods is how many pods TestEgressFirstPacketsNoLeak starts (OFSDN_E2E_HELLO_PODS overrides it).
func helloPods() int {
	if n, err := strconv.Atoi(os.Getenv("OFSDN_E2E_HELLO_PODS")); err == nil && n > 0 {
		return n
	}
	return 1000
}

// waitHellos waits until every pod in names was heard from, or every one runs and 5 s passed since the
// last of them started (its datagrams are on the wire or lost by then), 2 minutes at most.
func waitHellos(ctx context.Context, client kubernetes.Interface, capture *extCapture, since time.Time, label string, names map[string]bool) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var allRunning time.Time // when every pod was first seen running
	for ctx.Err() == nil {
		heard := map[string]bool{}
		for _, a := range capture.since(since) {
			heard[a.sender] = true
		}
		missing := 0
		for name := range names {
			if !heard[name] {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if allRunning.IsZero() {
			l, err := client.CoreV1().Pods(egressNS).List(ctx, metav1.ListOptions{LabelSelector: "wave=" + label})
			running := 0
			for _, p := range l.Items {
				if p.Status.Phase == corev1.PodRunning {
					running++
				}
			}
			if err == nil && running == len(names) {
				allRunning = time.Now()
			}
		} else if time.Since(allRunning) > 5*time.Second {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestEgressFirstPacketsNoLeak: pods of the egress namespace whose process sends UDP the moment it
// starts — three datagrams within 10 ms, right after the node simulator's CNI ADD returned, as a
// container's first instructions would — on all three nodes, 1,000 of them (in waves of 100, so at
// most 100 pods live at once). The external host records the source address of every datagram: none
// may be a node's address. The CNI ADD returns only once the pod's flows and its namespace's egress
// flows are installed, in one bundle, so the first packet is already classified.
func TestEgressFirstPacketsNoLeak(t *testing.T) {
	ctx := ctxT(t, 30*time.Minute)
	eip := egressLab(t, ctx)
	if _, err := lc.WaitEgressHolder(ctx, egressNS, eip, "", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	capture := captureExternal(t, helloPort)
	// A client of its own, not throttled to 5 requests a second: 1,000 creations would take minutes.
	cfg := lc.API.AdminConfig()
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	total, wave := helloPods(), 100
	dst := netip.AddrPortFrom(lc.Lab.External.IP, helloPort).String()
	start := time.Now()
	var unobserved []string
	logFrom := map[string]int64{}
	for _, n := range lc.Nodes {
		if fi, err := os.Stat(n.AgentLog); err == nil {
			logFrom[n.Name] = fi.Size()
		}
	}
	for w := 0; w*wave < total; w++ {
		n := min(wave, total-w*wave)
		label := fmt.Sprintf("hello-%d", w)
		var wg sync.WaitGroup
		errs := make(chan error, n)
		work := make(chan int)
		for range 16 {
			wg.Go(func() {
				for i := range work {
					node := lc.Nodes[i%len(lc.Nodes)]
					spec := cluster.PodSpec(egressNS, fmt.Sprintf("hello-%d-%d", w, i), node.Name)
					spec.Labels["wave"] = label
					spec.Annotations = map[string]string{nodesim.HelloAnnotation: dst}
					spec.Spec.Containers[0].Ports = nil
					if _, err := client.CoreV1().Pods(egressNS).Create(ctx, spec, metav1.CreateOptions{}); err != nil {
						errs <- err
					}
				}
			})
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		// Every pod of the wave said hello, or every one runs (its process started after its CNI ADD)
		// and 5 s passed since the last started; 2 minutes at most.
		names := map[string]bool{}
		for i := range n {
			names[fmt.Sprintf("%s/hello-%d-%d", egressNS, w, i)] = true
		}
		waitHellos(ctx, client, capture, start, label, names)
		heard := map[string]bool{}
		for _, a := range capture.since(start) {
			heard[a.sender] = true
		}
		for name := range names {
			if !heard[name] {
				unobserved = append(unobserved, name)
			}
		}
		if err := client.CoreV1().Pods(egressNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "wave=" + label}); err != nil {
			t.Fatal(err)
		}
	}
	created := time.Since(start)
	// Every pod gone (their CNI DELs done) before the test ends.
	dctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := proc.Until(dctx, 0, func() bool {
		l, err := lc.Client.CoreV1().Pods(egressNS).List(dctx, metav1.ListOptions{LabelSelector: "wave"})
		return err == nil && len(l.Items) == 0
	}); err != nil {
		t.Errorf("hello pods not all gone: %v", err)
	}
	bySource := map[netip.Addr]int{}
	var leaks []string
	pods := map[string]bool{}
	datagrams := 0
	for _, a := range capture.since(start) {
		if !strings.HasPrefix(a.sender, egressNS+"/hello-") {
			continue
		}
		datagrams++
		pods[a.sender] = true
		bySource[a.src]++
		if a.src != eip {
			leaks = append(leaks, fmt.Sprintf("%s #%d from %s", a.sender, a.seq, a.src))
		}
	}
	t.Logf("%d pods (waves of %d) on %d nodes in %v (+%v to delete them): %d datagrams from %d pods, by source %v; pods not heard from: %d %v",
		total, wave, len(lc.Nodes), created.Round(time.Second), (time.Since(start) - created).Round(time.Second), datagrams, len(pods), bySource,
		len(unobserved), unobserved[:min(len(unobserved), 10)])
	if len(leaks) > 0 {
		t.Errorf("%d datagrams left from an address other than the egress IP %s: %v", len(leaks), eip, leaks[:min(len(leaks), 20)])
	}
	if len(unobserved) > 0 {
		// Where the unheard pods ran, and whether the egress IP moved meanwhile (its datagrams then
		// died with the tunnel to the old holder: lost, never leaked).
		byNode := map[string]int{}
		for _, name := range unobserved {
			var w, i int
			if _, err := fmt.Sscanf(name, egressNS+"/hello-%d-%d", &w, &i); err == nil {
				byNode[lc.Nodes[i%len(lc.Nodes)].Name]++
			}
		}
		var moves []string
		for _, n := range lc.Nodes {
			moves = append(moves, logLinesSince(n.AgentLog, logFrom[n.Name], `"egress IPs move"`)...)
		}
		t.Logf("pods not heard from, by node: %v; egress IP moves during the test: %d\n%s", byNode, len(moves), strings.Join(moves, "\n"))
	}
	// A pod whose three datagrams were all lost (the userspace datapath drops upcalls it cannot serve
	// on a starved machine) tested nothing; too many such and the test says nothing.
	if len(unobserved) > total/20 {
		t.Errorf("%d of %d pods were never heard from: the test did not test them", len(unobserved), total)
	}
}
