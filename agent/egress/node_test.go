package egress

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// fakeView is View over a generation counter.
type fakeView struct {
	mu  sync.Mutex
	gen uint64
}

func (v *fakeView) Change(f func()) uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	f()
	v.gen++
	return v.gen
}

func (v *fakeView) NodeIP() netip.Addr { return netip.MustParseAddr("198.51.100.11") }

// fakeSync records what the flow loop was asked.
type fakeSync struct {
	mu       sync.Mutex
	triggers int
	through  []uint64
	owners   [][]reconcile.Owner
}

func (s *fakeSync) Trigger() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.triggers++
}

func (s *fakeSync) SyncThrough(_ context.Context, gen uint64, owners ...reconcile.Owner) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.through = append(s.through, gen)
	s.owners = append(s.owners, owners)
	return nil
}

func newTestNode(t *testing.T) (*Node, *Inputs, *fakeView, *fakeSync) {
	t.Helper()
	in, view, sync := NewInputs(DefaultPort), &fakeView{}, &fakeSync{}
	n := NewNode(NodeConfig{NodeName: "n1", StateDir: t.TempDir(), Logger: klog.Background()},
		NodeDeps{Inputs: in, View: view, Sync: sync})
	return n, in, view, sync
}

// TestHeldReachTheSnapshot: the membership's held IPs go into the Inputs in a generation of the view's,
// and the membership waits for the egress owner's flows of exactly that generation.
func TestHeldReachTheSnapshot(t *testing.T) {
	n, in, view, sync := newTestNode(t)
	held := []netip.Addr{netip.MustParseAddr("198.51.100.40")}
	if err := (flows{n}).SetHeld(context.Background(), held); err != nil {
		t.Fatal(err)
	}
	var st pipeline.NodeState
	in.Fill(&st)
	if !slices.Equal(st.Egress.Held, held) {
		t.Errorf("held %v, want %v", st.Egress.Held, held)
	}
	if len(sync.through) != 1 || sync.through[0] != view.gen || !slices.Equal(sync.owners[0], []reconcile.Owner{pipeline.EgressOwner}) {
		t.Errorf("synced through %v for %v, want generation %d for the egress owner", sync.through, sync.owners, view.gen)
	}
}

// TestPodFlowsWaitForTheNamespacesEgress: a pod's CNI ADD waits for its namespace's egress owners
// too, once an informer filed the namespace's egress IP; a pod's Network interface does not.
func TestPodFlowsWaitForTheNamespacesEgress(t *testing.T) {
	n, _, view, sync := newTestNode(t)
	netns, _, _, _ := n.Handlers()
	netns.AddFunc(&networkv1.NetNamespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}, NetName: "a", NetID: 10, EgressIPs: []networkv1.EgressIP{"198.51.100.40"}})
	if sync.triggers != 1 || view.gen != 1 {
		t.Fatalf("after an informer's change: %d triggers, generation %d", sync.triggers, view.gen)
	}
	pod := pipeline.PodOwner("a", "p")
	if err := n.PodFlows().SyncThrough(context.Background(), 1, pod); err != nil {
		t.Fatal(err)
	}
	if want := []reconcile.Owner{pod, pipeline.EgressNamespaceOwner("a")}; !slices.Equal(sync.owners[0], want) {
		t.Errorf("a pod of an egress namespace waits for %v, want %v", sync.owners[0], want)
	}
	other := pipeline.PodOwner("b", "p")
	if err := n.PodFlows().SyncThrough(context.Background(), 1, other); err != nil {
		t.Fatal(err)
	}
	if want := []reconcile.Owner{other}; !slices.Equal(sync.owners[1], want) {
		t.Errorf("a pod of another namespace waits for %v, want %v", sync.owners[1], want)
	}
}
