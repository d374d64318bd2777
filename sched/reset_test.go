package sched

import (
	"testing"

	"github.com/strata-llm/strata/kv"
)

// TestResetOntoNewPipeline: a new placement ends every live sequence with a
// tombstone, ignores the old batches' results, readmits the requests as new
// sequences that recompute their tokens, and fails a waiting request the new
// pool can never hold.
func TestResetOntoNewPipeline(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxInFlight = 1 })
	h.add(1, 6, 10) // runs
	out := h.step()
	rows := rowsOf(out, 1)
	if len(rows) != 1 || !rows[0].First {
		t.Fatalf("rows %+v", rows)
	}
	oldSeq := rows[0].Seq
	h.complete(out.Batches[0], 7) // one token generated
	out = h.step()                // its decode is now in flight
	inflight := out.Batches[0]
	h.add(2, 40, 20) // fits 64 positions now, not the 8×4 of the new pool

	if err := h.s.Reset(kv.Config{Blocks: 8, BlockSize: 4}, 2); err != nil {
		t.Fatal(err)
	}
	h.check()
	h.complete(inflight, 9) // the old pipeline's late result: ignored
	out = h.step()
	if r := h.tombs[oldSeq]; r != Preempted {
		t.Fatalf("old sequence %d tombstone %v, want preempted", oldSeq, r)
	}
	if r := h.ends[2]; r != Failed {
		t.Fatalf("request 2 (too big for the new pool) ended %v, want failed", r)
	}
	rows = rowsOf(out, 1)
	if len(rows) != 1 || !rows[0].First || rows[0].Seq <= oldSeq || len(rows[0].Tokens) != 7 {
		t.Fatalf("readmitted rows %+v: want a first row of a new sequence recomputing 6 prompt + 1 generated tokens", rows)
	}
	if got := h.s.Stats().KV.Total; got != 8 {
		t.Fatalf("pool after reset: %d blocks", got)
	}
	if h.s.Stats().Retries != 0 {
		t.Fatalf("a reset counted %d retries", h.s.Stats().Retries)
	}
	// Paused: deadlines and updates go on, no batches.
	h.s.SetPaused(true)
	h.complete(out.Batches[0], 5)
	if out := h.step(); len(out.Batches) != 0 {
		t.Fatalf("paused scheduler dispatched %d batches", len(out.Batches))
	}
	h.s.SetPaused(false)
	if out := h.step(); len(rowsOf(out, 1)) != 1 {
		t.Fatal("no decode after resuming")
	}
	if got := h.toks[1]; len(got) != 2 || got[0] != 7 || got[1] != 5 {
		t.Fatalf("request 1 tokens %v, want [7 5]", got)
	}
}
