package bench

import (
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
