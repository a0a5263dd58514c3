package agent

import (
	"context"
	"fmt"
	"strconv"

	"github.com/ofsdn/ofsdn/flows/pipeline"
)

// Bridge external_ids the agent keeps across restarts.
const (
	extRound           = "ofsdn-round"
	extPipelineVersion = "ofsdn-pipeline-version"
)

// roundStore is where a bridge keeps its round (ovsdb.Client).
type roundStore interface {
	BridgeExternalIDs(ctx context.Context, bridge string) (map[string]string, error)
	SetBridgeExternalIDs(ctx context.Context, bridge string, set map[string]string) error
}

// NextRound picks this run's round from the one stored on the bridge: the next, never 0 (0 marks
// flows no agent installed).
func NextRound(stored string) uint16 {
	r, err := strconv.ParseUint(stored, 10, 16)
	if err != nil {
		return 1
	}
	next := uint16(r) + 1
	if next == 0 {
		next = 1
	}
	return next
}

// beginRound reads the bridge's round and returns the one this run uses.
func beginRound(ctx context.Context, db roundStore, bridge string) (uint16, error) {
	ext, err := db.BridgeExternalIDs(ctx, bridge)
	if err != nil {
		return 0, fmt.Errorf("read round of %s: %w", bridge, err)
	}
	return NextRound(ext[extRound]), nil
}

// commitRound records the round (and pipeline version) once its flows are installed and the older
// rounds' flows deleted: a crash before this point makes the next run start from the same old round,
// whose leftovers it deletes too.
func commitRound(ctx context.Context, db roundStore, bridge string, round uint16) error {
	return db.SetBridgeExternalIDs(ctx, bridge, map[string]string{extRound: strconv.Itoa(int(round)),
		extPipelineVersion: strconv.Itoa(int(pipeline.PipelineVersion))})
}
