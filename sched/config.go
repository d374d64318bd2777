package sched

import (
	"fmt"
	"time"

	"github.com/strata-llm/strata/kv"
)

// Config sets the scheduler's limits.
type Config struct {
	// KV sizes the block pool (the smallest stage's capacity). With sliding
	// groups (KV.Groups > 1), a row at position p reads positions from
	// p-KV.Window+1 on in the sliding layers, and the blocks of the sliding
	// tables before that are released as it is emitted.
	KV kv.Config
	// Stages is the number of pipeline stages P.
	Stages int
	// MaxInFlight bounds the batches dispatched and not yet retired; 0 means
	// Stages + 1.
	MaxInFlight int
	// MaxBatchTokens is a micro-batch's token budget (decodes count one each).
	MaxBatchTokens int
	// MaxBatchRows bounds the sequences in one micro-batch.
	MaxBatchRows int
	// MaxModelLen is the model's context: prompt + generated tokens.
	MaxModelLen int
	// MaxWaiting and MaxWaitingTokens bound the waiting queue (requests, and
	// their prompt tokens); Add refuses beyond them.
	MaxWaiting       int
	MaxWaitingTokens int
	// QueueTimeout bounds the wait from arrival to first admission; 0 means
	// none.
	QueueTimeout time.Duration
	// RequestTimeout is the deadline of a request that brings none, counted
	// from its arrival; 0 means none.
	RequestTimeout time.Duration
	// ReclaimTimeout fails a batch with no result or failure report this
	// long after dispatch.
	ReclaimTimeout time.Duration
	// MaxRetries is how many times a request is requeued after lost work
	// before it fails.
	MaxRetries int
	// WatermarkBlocks is kept free when admitting while other sequences run,
	// so running decodes can grow without preempting the newcomer at once.
	WatermarkBlocks int
	// FirstSeq is the first sequence ID handed out: above the persisted
	// high-water mark.
	FirstSeq SeqID
}

// DefaultConfig returns the configuration strata starts from.
func DefaultConfig() Config {
	return Config{
		KV: kv.DefaultConfig(),
		// One stage: a single-shard cluster; the coordinator sets the real P.
		Stages: 1,
		// Stages + 1: one batch per stage keeps every stage busy, one more
		// covers the trip back to the coordinator.
		MaxInFlight: 0,
		// 512 tokens: on the CPU shards this project targets, a 512-token
		// batch takes a few hundred milliseconds per stage, so a long prompt
		// delays running decodes by one chunk at most (llama-server stalled
		// streams by admitting whole prompts at once).
		MaxBatchTokens: 512,
		// 256 rows: vLLM's max_num_seqs; beyond it per-row overheads dominate.
		MaxBatchRows: 256,
		// 4096: the demo model's context; the coordinator sets the model's.
		MaxModelLen: 4096,
		// 1024 requests and 1 Mi tokens: a queue longer than that cannot be
		// served within the default timeouts anyway, so 429 early.
		MaxWaiting:       1024,
		MaxWaitingTokens: 1 << 20,
		// 60 s: a client waiting longer for its first token has likely gone.
		QueueTimeout: 60 * time.Second,
		// 10 min: generous for long generations on CPUs, yet bounded.
		RequestTimeout: 10 * time.Minute,
		// 30 s: far above a healthy batch's round trip (seconds at most), so
		// only truly lost work is reclaimed; low enough that a lost
		// completion does not pin blocks for long.
		ReclaimTimeout: 30 * time.Second,
		// 2: a request survives one broken pipeline and its re-plan; a third
		// loss says the request itself is the problem.
		MaxRetries: 2,
		// 4 blocks: with 16-position blocks, room for 4 decodes to cross a
		// block boundary before anyone is preempted.
		WatermarkBlocks: 4,
		// 1: 0 is never a sequence ID, so a zero value shows a bug.
		FirstSeq: 1,
	}
}

// inFlight is the effective MaxInFlight.
func (c Config) inFlight() int {
	if c.MaxInFlight == 0 {
		return c.Stages + 1
	}
	return c.MaxInFlight
}

// Validate reports the first field that is out of range.
func (c Config) Validate() error {
	if err := c.KV.Validate(); err != nil {
		return fmt.Errorf("sched: KV: %w", err)
	}
	for _, f := range []struct {
		name string
		v    int
		min  int
	}{
		{"Stages", c.Stages, 1},
		{"MaxInFlight", c.MaxInFlight, 0},
		{"MaxBatchTokens", c.MaxBatchTokens, 1},
		{"MaxBatchRows", c.MaxBatchRows, 1},
		{"MaxModelLen", c.MaxModelLen, 2},
		{"MaxWaiting", c.MaxWaiting, 1},
		{"MaxWaitingTokens", c.MaxWaitingTokens, 1},
		{"MaxRetries", c.MaxRetries, 0},
		{"WatermarkBlocks", c.WatermarkBlocks, 0},
	} {
		if f.v < f.min {
			return fmt.Errorf("sched: %s must be >= %d, got %d", f.name, f.min, f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"QueueTimeout", c.QueueTimeout},
		{"RequestTimeout", c.RequestTimeout},
	} {
		if f.v < 0 {
			return fmt.Errorf("sched: %s must be >= 0, got %v", f.name, f.v)
		}
	}
	if c.ReclaimTimeout <= 0 {
		return fmt.Errorf("sched: ReclaimTimeout must be > 0, got %v", c.ReclaimTimeout)
	}
	if c.FirstSeq == 0 {
		return fmt.Errorf("sched: FirstSeq must be >= 1, got 0")
	}
	return nil
}
