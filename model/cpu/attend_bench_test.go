package cpu_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
)

// BenchmarkAttend measures one query's attention over an f16 cache (12
// heads, head dimension 64 or 128, as a 110M-class model decodes) at
// positions 127 and 1023: the scores, the online softmax and the values.
func BenchmarkAttend(b *testing.B) {
	for _, hd := range []int{64, 128} {
		for _, pos := range []int{127, 1023} {
			b.Run(fmt.Sprintf("hd=%d/pos=%d", hd, pos), func(b *testing.B) {
				const heads = 12
				cfg := cpu.KVConfig{Layers: 1, Blocks: (pos + cpu.DefaultBlockSize) / cpu.DefaultBlockSize, Heads: heads, HeadsKV: heads, HeadDim: hd, Type: ggml.F16}
				kv, err := cpu.NewKV(cfg)
				if err != nil {
					b.Fatal(err)
				}
				blocks := make([]int32, cfg.Blocks)
				for i := range blocks {
					blocks[i] = int32(i)
				}
				k, v := make([]float32, heads*hd), make([]float32, heads*hd)
				for p := 0; p <= pos; p++ {
					for i := range k {
						k[i] = float32(math.Sin(float64(p*len(k) + i)))
						v[i] = float32(math.Cos(float64(p*len(k) + 3*i)))
					}
					kv.Store(0, blocks, p, k, v)
				}
				q, out, scratch := make([]float32, heads*hd), make([]float32, heads*hd), make([]float32, pos+1)
				for i := range q {
					q[i] = float32(math.Sin(float64(7 * i)))
				}
				for b.Loop() {
					kv.Attend(0, blocks, 0, pos, 0, heads, 1/float32(math.Sqrt(float64(hd))), q, out, scratch)
				}
			})
		}
	}
}
