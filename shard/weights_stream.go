package shard

import (
	"context"
	"fmt"

	"github.com/strata-llm/strata/transport/pb"
)

// streamModel fetches a's range from the coordinator (Coordinator.Weights)
// into the data dir and loads it.
func (n *Node) streamModel(ctx context.Context, a *pb.Assign) (*loadedModel, error) {
	return nil, fmt.Errorf("model %s: no local file with that SHA-256, and weight streaming is not implemented yet", a.GetModelSha256())
}
