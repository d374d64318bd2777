package bench

import (
	"context"
	"strings"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// TestSizesMoE: a generated token streams only its chosen experts' bytes,
// ExpertsUsed/Experts of every MoE layer's experts, and all of the rest.
func TestSizesMoE(t *testing.T) {
	spec := model.RandomSpec{Arch: "qwen3moe", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Experts: 8, ExpertsUsed: 2, ExpertFF: 64, Vocab: 300, Context: 256, Type: ggml.Q8_0, Seed: 1}
	f, err := model.RandomFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	_, streamed := sizes(m)
	want := int64(len(m.Output.Data))
	for _, L := range m.LayerWeights {
		for _, w := range []*model.Weight{L.Q, L.K, L.V, L.O, L.Router} {
			want += int64(len(w.Data))
		}
		e := L.Experts[0]
		want += 2 * int64(len(e.Gate.Data)+len(e.Up.Data)+len(e.Down.Data))
	}
	if streamed != want {
		t.Fatalf("streamed %d bytes per token, want %d", streamed, want)
	}
}

// TestRunMoE measures a small mixture-of-experts model in a Q4_K_M-like
// mixture, its experts' down projections in Q6_K where the rule says.
func TestRunMoE(t *testing.T) {
	k, err := ParseKind("Q4_K_M")
	if err != nil {
		t.Fatal(err)
	}
	spec := k.Mix(model.RandomSpec{Arch: "qwen3moe", Layers: 2, Embd: 256, Heads: 4, HeadsKV: 2, HeadDim: 64, FF: 256, Experts: 4, ExpertsUsed: 2, ExpertFF: 256, Vocab: 300, Context: 256, Seed: 1})
	if spec.Types["blk.1.ffn_down_exps.weight"] != ggml.Q6_K {
		t.Fatalf("mixture %v", spec.Types)
	}
	res, err := Run(context.Background(), Config{Spec: spec, Threads: 2, Prompt: 16, Gen: 4, Batches: []int{3}, Reps: 1, KVType: ggml.F16})
	if err != nil {
		t.Fatal(err)
	}
	if res.PP <= 0 || res.TG <= 0 || len(res.Batched) != 1 || res.WeightBytes <= 0 || !strings.Contains(strings.ReplaceAll(strings.ToLower(res.ISA), "_", ""), "q6k") {
		t.Fatalf("result %+v", res)
	}
}

// TestSpecMoE1B: the bench's MoE shape has about 1.1 B parameters.
func TestSpecMoE1B(t *testing.T) {
	s := SpecMoE1B(ggml.Q8_0)
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	layer := int64(s.Experts*3*s.Embd*s.ExpertFF + s.Experts*s.Embd + 2*s.Embd*s.Heads*s.HeadDim + 2*s.Embd*s.HeadsKV*s.HeadDim)
	if p := int64(s.Layers)*layer + 2*int64(s.Vocab*s.Embd); p < 1.0e9 || p > 1.2e9 {
		t.Fatalf("%d parameters", p)
	}
}
