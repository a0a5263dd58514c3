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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	total, wave := helloPods(), 100
	dst := netip.AddrPortFrom(lc.Lab.External.IP, helloPort).String()
	start := time.Now()
	var unobserved []string
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
					if _, err := lc.Client.CoreV1().Pods(egressNS).Create(ctx, spec, metav1.CreateOptions{}); err != nil {
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
		// Every pod of the wave said hello (its process ran), or 2 minutes passed.
		names := map[string]bool{}
		for i := range n {
			names[fmt.Sprintf("%s/hello-%d-%d", egressNS, w, i)] = true
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		_ = proc.Until(wctx, 0, func() bool {
			heard := map[string]bool{}
			for _, a := range capture.since(start) {
				heard[a.sender] = true
			}
			for name := range names {
				if !heard[name] {
					return false
				}
			}
			return true
		})
		cancel()
		heard := map[string]bool{}
		for _, a := range capture.since(start) {
			heard[a.sender] = true
		}
		for name := range names {
			if !heard[name] {
				unobserved = append(unobserved, name)
			}
		}
		if err := lc.Client.CoreV1().Pods(egressNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "wave=" + label}); err != nil {
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
	// A pod whose three datagrams were all lost (the userspace datapath drops upcalls it cannot serve
	// on a starved machine) tested nothing; too many such and the test says nothing.
	if len(unobserved) > total/20 {
		t.Errorf("%d of %d pods were never heard from: the test did not test them", len(unobserved), total)
	}
}
