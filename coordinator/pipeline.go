package coordinator

import "github.com/strata-llm/strata/transport"

// Pipeline carries batches to the stages and their results back. The loop
// calls Dispatch and reads Results; neither blocks the loop.
type Pipeline interface {
	// Stages is the number of stages P (the scheduler keeps P+1 batches in
	// flight by default).
	Stages() int
	// Blocks is the KV pool every stage can hold (the smallest stage's), and
	// BlockSize the positions per block.
	Blocks() int
	BlockSize() int
	// Dispatch queues b for the first stage without blocking; an error means
	// the batch was not sent (the loop fails it at once). The pipeline owns
	// b afterwards.
	Dispatch(b *transport.MicroBatch) error
	// Results delivers one BatchResult per dispatched batch that got an
	// answer (none for ID 0); a batch that never gets one is failed by the
	// scheduler's reclaim deadline. A cluster's pipeline returns nil: its
	// answers reach the engine on the cluster's loop, which the engine runs
	// (engineLedger).
	Results() <-chan *transport.BatchResult
}

// DynamicPipeline is a Pipeline whose stages can go away and come back in
// another shape: a cluster that re-places layers after losing a shard.
type DynamicPipeline interface {
	Pipeline
	// Ready is nil while batches can be dispatched; otherwise it says why
	// not, wrapping ErrNoPipeline once no pipeline could be formed within
	// the cluster's bounded wait.
	Ready() error
	// Version changes whenever the stages were re-placed: every sequence of
	// the old version is gone on the shards, and Stages, Blocks and
	// BlockSize may differ. 0 means never placed.
	Version() uint64
	// Changed is signalled after Ready's answer or Version may have
	// changed (a size-1 channel: signals coalesce). The engine re-reads
	// them only then, never by polling each step; so a change must be
	// visible before its signal is sent.
	Changed() <-chan struct{}
}
