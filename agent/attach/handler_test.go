package attach

import (
	"sync"
	"testing"
)

func TestKeyedMutex(t *testing.T) {
	var k keyedMutex
	// Different keys are held at once (a second sandbox's ADD does not wait for the first).
	ua, ub := k.lock("a"), k.lock("b")
	// The same key excludes: a second holder gets it only after the first unlocked.
	var order []string
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		u := k.lock("a")
		mu.Lock()
		order = append(order, "second")
		mu.Unlock()
		u()
	}()
	mu.Lock()
	order = append(order, "first")
	mu.Unlock()
	ua()
	<-done
	ub()
	if len(order) != 2 || order[0] != "first" {
		t.Fatalf("order %v: the same key was held twice at once", order)
	}
	if len(k.locks) != 0 {
		t.Errorf("%d keys left after every holder unlocked", len(k.locks))
	}
}
