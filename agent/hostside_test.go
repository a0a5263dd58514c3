package agent

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/agent/nodenet"
	"github.com/ofsdn/ofsdn/agent/policy"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"k8s.io/klog/v2"
)

func TestNodePortsOf(t *testing.T) {
	svcs := []pipeline.ServiceState{
		{Name: "b", ExternalLocal: true, Ports: []pipeline.ServicePort{{Protocol: openflow.IPProtoUDP, NodePort: 30053}, {Protocol: openflow.IPProtoTCP, Port: 80}}},
		{Name: "a", Ports: []pipeline.ServicePort{{Protocol: openflow.IPProtoTCP, NodePort: 30080}, {Protocol: openflow.IPProtoTCP, NodePort: 30080}}},
	}
	want := []nodenet.NodePort{{Protocol: openflow.IPProtoUDP, Port: 30053}, {Protocol: openflow.IPProtoTCP, Port: 30080}}
	if got := nodePortsOf(svcs); !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

// TestHostSyncFlushesWhatConntrackHeldAtStart: the first state's stale entries come from what
// conntrack holds (asked again while that fails, never twice once it worked); later states' from the
// previous state, as before.
func TestHostSyncFlushesWhatConntrackHeldAtStart(t *testing.T) {
	type call struct {
		stale []openflow.ConntrackFlush
	}
	calls := make(chan call, 10)
	h := newHostSync(klog.Background(), func(_ context.Context, _ pipeline.NodeState, _ map[string][]policy.Problem, stale []openflow.ConntrackFlush) error {
		calls <- call{stale}
		return nil
	}, nil)
	old := openflow.ConntrackFlush{Protocol: openflow.IPProtoUDP, Dst: netip.MustParseAddr("172.30.0.53"), DstPort: 53, ReplySrc: netip.MustParseAddr("10.128.0.9")}
	asked := 0
	h.heldStale = func(context.Context, pipeline.NodeState) ([]openflow.ConntrackFlush, error) {
		asked++
		if asked == 1 {
			return nil, errors.New("ovs-vswitchd not answering")
		}
		return []openflow.ConntrackFlush{old}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.run(ctx)
	next := func() call {
		t.Helper()
		select {
		case c := <-calls:
			return c
		case <-time.After(5 * time.Second):
			t.Fatal("no apply")
			return call{}
		}
	}
	st := pipeline.NodeState{LocalSubnet: netip.MustParsePrefix("10.128.0.0/23")}
	h.post(st, nil)
	if c := next(); len(c.stale) != 0 {
		t.Errorf("conntrack unreadable: flushed %v", c.stale)
	}
	h.post(st, nil)
	if c := next(); len(c.stale) != 1 || c.stale[0] != old {
		t.Errorf("second state: flushed %v, want %v", c.stale, old)
	}
	h.post(st, nil)
	if c := next(); len(c.stale) != 0 || asked != 2 {
		t.Errorf("third state: flushed %v, conntrack asked %d times (want 2)", c.stale, asked)
	}
}

// TestHostSyncVerifiesAFlush: after a flush conntrack is read again, sooner then later, and what is
// still stale is flushed again; a check that cannot read conntrack does not end the checks; they stop
// once nothing stale is held.
func TestHostSyncVerifiesAFlush(t *testing.T) {
	calls := make(chan []openflow.ConntrackFlush, 10)
	h := newHostSync(klog.Background(), func(_ context.Context, _ pipeline.NodeState, _ map[string][]policy.Problem, stale []openflow.ConntrackFlush) error {
		calls <- stale
		return nil
	}, nil)
	h.verifyAfter = 10 * time.Millisecond
	old := openflow.ConntrackFlush{Protocol: openflow.IPProtoUDP, Dst: netip.MustParseAddr("172.30.0.53"), DstPort: 53, ReplySrc: netip.MustParseAddr("10.128.0.9")}
	type answer struct {
		held []openflow.ConntrackFlush
		err  error
	}
	// At start, then the checks: unreadable, the entry is back, gone.
	script := []answer{{held: []openflow.ConntrackFlush{old}}, {err: errors.New("ovs-vswitchd busy")},
		{held: []openflow.ConntrackFlush{old}}, {}}
	var mu sync.Mutex
	asked := 0
	h.heldStale = func(context.Context, pipeline.NodeState) ([]openflow.ConntrackFlush, error) {
		mu.Lock()
		defer mu.Unlock()
		a := answer{}
		if asked < len(script) {
			a = script[asked]
		}
		asked++
		return a.held, a.err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.run(ctx)
	h.post(pipeline.NodeState{LocalSubnet: netip.MustParsePrefix("10.128.0.0/23")}, nil)
	for i := range 2 {
		select {
		case stale := <-calls:
			if len(stale) != 1 || stale[0] != old {
				t.Fatalf("flush %d: %v, want %v", i+1, stale, old)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("flush %d never came (conntrack read %d times)", i+1, asked)
		}
	}
	// The next check finds nothing: no apply, and no check after it.
	time.Sleep(500 * time.Millisecond)
	select {
	case stale := <-calls:
		t.Errorf("an apply after the entry stayed gone: %v", stale)
	default:
	}
	mu.Lock()
	defer mu.Unlock()
	if asked != len(script) {
		t.Errorf("conntrack read %d times, want %d (start, a failed check, one that found the entry, one that did not)", asked, len(script))
	}
}

// States posted without a flush (pods coming and going on a busy node) must not put a pending check
// off: the check runs on its schedule however often states arrive.
func TestHostSyncChecksUnderAStreamOfStates(t *testing.T) {
	h := newHostSync(klog.Background(), func(context.Context, pipeline.NodeState, map[string][]policy.Problem, []openflow.ConntrackFlush) error {
		return nil
	}, nil)
	h.verifyAfter = 20 * time.Millisecond
	old := openflow.ConntrackFlush{Protocol: openflow.IPProtoUDP, Dst: netip.MustParseAddr("172.30.0.53"), DstPort: 53, ReplySrc: netip.MustParseAddr("10.128.0.9")}
	var mu sync.Mutex
	asked := 0
	h.heldStale = func(context.Context, pipeline.NodeState) ([]openflow.ConntrackFlush, error) {
		mu.Lock()
		defer mu.Unlock()
		asked++
		if asked == 1 {
			return []openflow.ConntrackFlush{old}, nil // at start: one entry to flush, which arms the check
		}
		return nil, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.run(ctx)
	st := pipeline.NodeState{LocalSubnet: netip.MustParsePrefix("10.128.0.0/23")}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		h.post(st, nil) // every 5 ms, a quarter of the check's delay
		mu.Lock()
		n := asked
		mu.Unlock()
		if n >= 2 {
			return
		}
	}
	t.Fatalf("conntrack read %d times in 5 s of states every 5 ms: the check 20 ms after the flush never ran", asked)
}
