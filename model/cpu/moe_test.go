package cpu_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
)

// countingBackend counts the MatMul calls and activation rows of each
// weight.
type countingBackend struct {
	*cpu.Backend
	calls, rows map[string]int
}

func (b *countingBackend) MatMul(w *model.Weight, x []float32, rows int, out []float32) {
	b.calls[w.Name]++
	b.rows[w.Name] += rows
	b.Backend.MatMul(w, x, rows, out)
}

// TestMoEStreamsEachExpertOnce: in one forward pass of a batch of several
// sequences, every expert's matrices are multiplied at most once per layer
// (each chosen expert's weights stream once per batch), the router once
// over every token, and the experts' rows add up to ExpertsUsed per token;
// a shared expert's matrices (qwen2moe), with its gate, once over every
// token.
func TestMoEStreamsEachExpertOnce(t *testing.T) {
	for _, spec := range []model.RandomSpec{
		{Arch: "qwen3moe", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Experts: 8, ExpertsUsed: 2, ExpertFF: 32, Vocab: 300, Context: 256, Type: ggml.Q8_0, Seed: 7},
		{Arch: "qwen2moe", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Experts: 8, ExpertsUsed: 2, ExpertFF: 32, SharedFF: 64, Vocab: 300, Context: 256, Type: ggml.Q8_0, Seed: 7},
	} {
		t.Run(spec.Arch, func(t *testing.T) { testMoEStreamsEachExpertOnce(t, spec) })
	}
}

func testMoEStreamsEachExpertOnce(t *testing.T, spec model.RandomSpec) {
	m := randomModel(t, spec)
	pool := cpu.NewPool(2)
	t.Cleanup(pool.Close)
	kv, err := cpu.NewKV(cpu.KVConfig{Layers: m.Layers, Blocks: 16, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: ggml.F16})
	if err != nil {
		t.Fatal(err)
	}
	be := &countingBackend{Backend: cpu.NewBackend(pool), calls: map[string]int{}, rows: map[string]int{}}
	st, err := model.NewStage(m, 0, m.Layers, be, kv)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rows := []model.Row{
		{Seq: 1, First: true, Tokens: randTokens(rng, 20, m.Vocab), Blocks: []int32{0, 1}, Logits: true},
		{Seq: 2, First: true, Tokens: randTokens(rng, 7, m.Vocab), Blocks: []int32{2}, Logits: true},
		{Seq: 3, First: true, Tokens: randTokens(rng, 13, m.Vocab), Blocks: []int32{3}, Logits: true},
	}
	T := model.Tokens(rows)
	if _, err := st.Forward(rows, nil); err != nil {
		t.Fatal(err)
	}
	for l := range m.Layers {
		if n, r := be.calls[fmt.Sprintf("blk.%d.ffn_gate_inp.weight", l)], be.rows[fmt.Sprintf("blk.%d.ffn_gate_inp.weight", l)]; n != 1 || r != T {
			t.Fatalf("layer %d: router multiplied %d times over %d rows, want once over %d", l, n, r, T)
		}
		used := 0
		for _, mat := range []string{"gate", "up", "down"} {
			total := 0
			for e := range m.Experts {
				name := fmt.Sprintf("blk.%d.ffn_%s_exps.weight[%d]", l, mat, e)
				if be.calls[name] > 1 {
					t.Fatalf("%s multiplied %d times in one batch", name, be.calls[name])
				}
				total += be.rows[name]
				if mat == "gate" {
					used += be.calls[name]
				}
			}
			if total != T*m.ExpertsUsed {
				t.Fatalf("layer %d: %s experts saw %d rows, want %d tokens × %d", l, mat, total, T, m.ExpertsUsed)
			}
		}
		if used < 3 {
			t.Fatalf("layer %d: only %d experts chosen over %d tokens: routing is degenerate", l, used, T)
		}
		for _, mat := range []string{"gate_inp_shexp", "gate_shexp", "up_shexp", "down_shexp"} {
			name := fmt.Sprintf("blk.%d.ffn_%s.weight", l, mat)
			want, wantRows := 0, 0
			if spec.Arch == "qwen2moe" {
				want, wantRows = 1, T
			}
			if n, r := be.calls[name], be.rows[name]; n != want || r != wantRows {
				t.Fatalf("layer %d: %s multiplied %d times over %d rows, want %d over %d", l, name, n, r, want, wantRows)
			}
		}
	}
}
