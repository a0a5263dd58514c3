package attach

import (
	"context"
	"net/netip"
	"sync"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// fakeNode is the view as attachments see it, in memory: ready, subnet 10.128.0.0/23.
type fakeNode struct {
	mu   sync.Mutex
	pods map[string]Pod
	gen  uint64
}

func newFakeNode() *fakeNode { return &fakeNode{pods: map[string]Pod{}} }

func (n *fakeNode) Ready() error { return nil }
func (n *fakeNode) Name() string { return "n1" }
func (n *fakeNode) Subnet() (netip.Prefix, []netip.Prefix, int) {
	return netip.MustParsePrefix("10.128.0.0/23"), []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")}, 1450
}

func (n *fakeNode) Attached(key string) (Pod, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.pods[key]
	return p, ok
}

func (n *fakeNode) Attach(p Pod) uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pods[k8sobj.PodKey(p.Namespace, p.Name)] = p
	n.gen++
	return n.gen
}

func (n *fakeNode) Detach(key, sandbox string) uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p, ok := n.pods[key]; ok && p.SandboxID == sandbox {
		delete(n.pods, key)
	}
	n.gen++
	return n.gen
}

// sandboxes returns the attached pods' sandboxes by key.
func (n *fakeNode) sandboxes() map[string]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]string{}
	for k, p := range n.pods {
		out[k] = p.SandboxID
	}
	return out
}

// fakeFlows installs every generation at once (the flows are the agent's tests' business).
type fakeFlows struct{}

func (fakeFlows) SyncThrough(context.Context, uint64, ...reconcile.Owner) error { return nil }
