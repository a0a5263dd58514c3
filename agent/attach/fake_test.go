package attach

import (
	"context"
	"net/netip"
	"sort"
	"sync"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// fakeNode is the view as attachments see it, in memory: ready, subnet 10.128.0.0/23.
type fakeNode struct {
	mu   sync.Mutex
	pods map[string]Pod
	nets map[string]NetAttachment
	gen  uint64
}

func newFakeNode() *fakeNode {
	return &fakeNode{pods: map[string]Pod{}, nets: map[string]NetAttachment{}}
}

func (n *fakeNode) AttachNetwork(a NetAttachment) uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nets[a.Key()] = a
	n.gen++
	return n.gen
}

func (n *fakeNode) DetachNetwork(key, sandbox string) uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	if a, ok := n.nets[key]; ok && a.SandboxID == sandbox {
		delete(n.nets, key)
	}
	n.gen++
	return n.gen
}

func (n *fakeNode) NetAttachments(podKey, sandbox string) []NetAttachment {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []NetAttachment
	for _, a := range n.nets {
		if k8sobj.PodKey(a.Namespace, a.Name) == podKey && a.SandboxID == sandbox {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IfName < out[j].IfName })
	return out
}

func (n *fakeNode) AllNetAttachments() []NetAttachment {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []NetAttachment
	for _, a := range n.nets {
		out = append(out, a)
	}
	return out
}

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
