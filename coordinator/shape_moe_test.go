package coordinator

import (
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// TestShapeCountsExperts: placement weighs a mixture-of-experts layer by
// its real bytes, every expert of its 3-D tensors and the router included,
// counted here from the loaded model's views rather than tensor names.
func TestShapeCountsExperts(t *testing.T) {
	for _, spec := range []model.RandomSpec{
		{Arch: "qwen3moe", Layers: 3, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Experts: 8, ExpertsUsed: 2, ExpertFF: 64, Vocab: 300, Context: 256, Type: ggml.Q8_0, Seed: 5},
		{Arch: "mixtral", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Experts: 4, ExpertsUsed: 2, Vocab: 300, Context: 256, Type: ggml.Q4_K, Seed: 6},
	} {
		t.Run(spec.Arch, func(t *testing.T) {
			f, err := model.RandomFile(spec)
			if err != nil {
				t.Fatal(err)
			}
			m, err := model.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			shape, err := ShapeFromModel(f, m, "sha", ggml.F16, 16, 512)
			if err != nil {
				t.Fatal(err)
			}
			for i, L := range m.LayerWeights {
				var want, experts int64
				for _, w := range L.Matrices() {
					want += int64(len(w.Data))
				}
				for _, e := range L.Experts {
					experts += int64(len(e.Gate.Data) + len(e.Up.Data) + len(e.Down.Data))
				}
				for _, v := range [][]float32{L.AttnNorm, L.FFNNorm, L.QNorm, L.KNorm} {
					want += 4 * int64(len(v)) // the random file's norms are F32
				}
				if shape.LayerBytes[i] != want {
					t.Errorf("layer %d: %d bytes, want %d", i, shape.LayerBytes[i], want)
				}
				if dense := want - experts; experts < 2*dense {
					t.Errorf("layer %d: experts %d bytes beside %d others: not an MoE layer", i, experts, dense)
				}
			}
		})
	}
}
