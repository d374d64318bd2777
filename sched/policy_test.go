package sched

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestDecodesBeforeRunningPrefill pins the batching policy against a prefill
// already running, not only a new admission (TestDecodesFirst): a
// sequence's decode takes its token of the budget before the next chunk of
// another sequence's long prompt, which gets what is left. Otherwise a long
// prompt stalls every running stream for as many batches as it has chunks.
func TestDecodesBeforeRunningPrefill(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxBatchTokens = 4 }) // one stage: 2 batches in flight
	h.add(1, 2, 5)
	h.add(2, 10, 2)
	type row struct {
		Request       RequestID
		Pos, N        int
		First, Sample bool
	}
	shape := func(b Batch) []row {
		var out []row
		for _, r := range b.Rows {
			out = append(out, row{r.Request, r.Pos, len(r.Tokens), r.First, r.Sample})
		}
		return out
	}
	out := h.step()
	if len(out.Batches) != 2 {
		t.Fatalf("%d batches, want 2 (the in-flight limit)", len(out.Batches))
	}
	// 1 is admitted whole; 2's prompt starts in the same batch and
	// continues in the next: it is a running prefill from now on.
	want := [][]row{
		{{1, 0, 2, true, true}, {2, 0, 2, true, false}},
		{{2, 2, 4, false, false}},
	}
	for i, b := range out.Batches {
		if diff := cmp.Diff(shape(b), want[i]); diff != "" {
			t.Fatalf("step 1, batch %d (-got +want):\n%s", i, diff)
		}
	}
	h.complete(out.Batches[0], 9) // 1's first token: its decode is due
	out = h.step()
	if len(out.Batches) != 1 {
		t.Fatalf("%d batches, want 1 (one slot free)", len(out.Batches))
	}
	if diff := cmp.Diff(shape(out.Batches[0]), []row{{1, 2, 1, false, true}, {2, 6, 3, false, false}}); diff != "" {
		t.Fatalf("the decode of 1 must come first and 2's chunk take the 3 tokens left (-got +want):\n%s", diff)
	}
}
