package cpu_test

import (
	"fmt"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// TestDecodeAllocatesNothing: a decode step (one token of a sequence whose
// prompt is cached), alone or beside a prompt chunk of another sequence,
// allocates nothing once the stage's buffers have grown,
// on every architecture's path (soft-capped and sliding attention, experts)
// and both KV types: serving runs it for every stream and token, and
// garbage made there is collected on the same cores.
func TestDecodeAllocatesNothing(t *testing.T) {
	for _, spec := range archSpecs {
		for _, kvType := range []ggml.Type{ggml.F16, ggml.F32} {
			for _, threads := range []int{1, 2} {
				t.Run(fmt.Sprintf("%s/%v/threads=%d", specName(spec), kvType, threads), func(t *testing.T) {
					spec.Type = ggml.Q8_0
					m := randomModel(t, spec)
					e := newEngine(t, m, threads, 64, kvType)
					const prompt, steps = 90, 30 // past every spec's window, and past a softmax chunk
					toks := make([]int32, prompt)
					for i := range toks {
						toks[i] = int32(1 + i%(m.Vocab-1))
					}
					blocks := e.blocksFor(nil, prompt+steps+1)
					if _, err := e.stage.Forward([]model.Row{{Seq: 1, First: true, Tokens: toks, Blocks: blocks}}, nil); err != nil {
						t.Fatal(err)
					}
					pos := prompt
					rows := []model.Row{{Seq: 1, Tokens: []int32{5}, Blocks: blocks, Logits: true}}
					allocs := testing.AllocsPerRun(steps-1, func() {
						rows[0].Pos = pos
						if _, err := e.stage.Forward(rows, nil); err != nil {
							t.Fatal(err)
						}
						pos++
					})
					if allocs != 0 {
						t.Errorf("a decode step allocates %.1f times", allocs)
					}

					// Continuous batching: a decode beside a chunk of a
					// second sequence's prompt, the chunk advancing.
					blocks2 := e.blocksFor(nil, 16*steps)
					pos2 := 0
					rows = []model.Row{{Seq: 1, Tokens: []int32{5}, Blocks: blocks, Logits: true}, {Seq: 2, Tokens: toks[:16], Blocks: blocks2}}
					pos = prompt
					allocs = testing.AllocsPerRun(steps-1, func() {
						rows[0].Pos, rows[1].Pos, rows[1].First = pos, pos2, pos2 == 0
						if _, err := e.stage.Forward(rows, nil); err != nil {
							t.Fatal(err)
						}
						pos, pos2 = pos+1, pos2+16
					})
					if allocs != 0 {
						t.Errorf("a decode and a prompt chunk allocate %.1f times a batch", allocs)
					}
				})
			}
		}
	}
}
