package agent

import (
	"context"

	"github.com/ofsdn/ofsdn/agent/drops"
	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// Drop attribution's wiring (agent/drops does the work): the OpenFlow session hands packet-ins to
// a.drops, which decodes them against the last synced state and the reconciler's owner index; the
// debug API streams its ring (debugapi.PathDrops). The meters that bound the samples are installed
// when the bridge opens and after every reconnection, before the flows that name them.

// dropSnapshot is what the next sample is decoded against; nil before the first sync.
func (a *Agent) dropSnapshot() *drops.Snapshot {
	last, ok := a.fs.lastSynced()
	if !ok {
		return nil
	}
	snap := &drops.Snapshot{Node: a.cfg.NodeName, State: last.state}
	if _, r, _ := a.health.parts(); r != nil {
		idx := r.OwnerIndex()
		snap.Owners = func(c reconcile.Cookie) []reconcile.Owner { return idx.Lookup(c) }
	}
	return snap
}

// packetIn is the session's OnPacketIn: it never blocks the OpenFlow reader.
func (a *Agent) packetIn(msg []byte) { a.drops.PacketIn(msg) }

// Drops implements debugapi.DropStreamer.
func (d debugBackend) Drops(ctx context.Context, q debugapi.DropQuery, each func(debugapi.Drop) error) error {
	return d.a.drops.Drops(ctx, q, each)
}
