package cpu_test

import (
	"fmt"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// bench109M is the shape of issue 7's reference model (109.5 M parameters).
func bench109M(typ ggml.Type) model.RandomSpec {
	return model.RandomSpec{Layers: 12, Embd: 768, Heads: 12, HeadsKV: 12, FF: 2048, Vocab: 32000, Context: 2048, Type: typ, Seed: 1}
}

var benchModels = map[ggml.Type]*model.Model{}

func loadBench(b *testing.B, typ ggml.Type) *model.Model {
	b.Helper()
	if m, ok := benchModels[typ]; ok {
		return m
	}
	f, err := model.RandomFile(bench109M(typ))
	if err != nil {
		b.Fatal(err)
	}
	m, err := model.Load(f)
	if err != nil {
		b.Fatal(err)
	}
	benchModels[typ] = m
	return m
}

// BenchmarkForward measures prompt processing of 128 tokens (pp128) and one
// decode step at position 128 (tg), as llama-bench reports them; tok/s is
// the figure to compare.
func BenchmarkForward(b *testing.B) {
	for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.BF16, ggml.Q8_0, ggml.Q4_0} {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%v/threads=%d/pp128", typ, threads), func(b *testing.B) {
				m := loadBench(b, typ)
				e := newEngine(b, m, threads, 16, ggml.F16)
				prompt := make([]int32, 128)
				for i := range prompt {
					prompt[i] = int32(3 + i)
				}
				blocks := e.blocksFor(nil, 129)
				for b.Loop() {
					if _, err := e.stage.Forward([]model.Row{{Seq: 1, First: true, Tokens: prompt, Blocks: blocks, Logits: true}}, nil); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(128*b.N)/b.Elapsed().Seconds(), "tok/s")
			})
			b.Run(fmt.Sprintf("%v/threads=%d/tg", typ, threads), func(b *testing.B) {
				m := loadBench(b, typ)
				e := newEngine(b, m, threads, 16, ggml.F16)
				prompt := make([]int32, 128)
				blocks := e.blocksFor(nil, 129)
				if _, err := e.stage.Forward([]model.Row{{Seq: 1, First: true, Tokens: prompt, Blocks: blocks}}, nil); err != nil {
					b.Fatal(err)
				}
				rows := []model.Row{{Seq: 1, Pos: 128, Tokens: []int32{5}, Blocks: blocks, Logits: true}}
				b.ReportAllocs() // the forward pass allocates nothing per token
				for b.Loop() {
					if _, err := e.stage.Forward(rows, nil); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
			})
		}
	}
}
