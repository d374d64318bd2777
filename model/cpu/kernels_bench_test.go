package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/strata-llm/strata/model/ggml"
)

// BenchmarkTile measures each tile kernel on rows that stay in cache:
// GMAC/s is multiply-adds per second (R*C*n per call).
func BenchmarkTile(b *testing.B) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.BF16, ggml.Q8_0, ggml.Q4_0} {
		ts := archTiles(typ)
		if ts == nil {
			continue
		}
		const n = 2048
		for _, rc := range [][2]int{{1, 1}, {4, 1}, {4, 4}} {
			R, C := rc[0], rc[1]
			b.Run(fmt.Sprintf("%s/%dx%d", typ, R, C), func(b *testing.B) {
				wrow := mustRowBytes(b, typ, n)
				vt := typ.VecDotType()
				xrow := mustRowBytes(b, vt, n)
				w := make([]byte, R*wrow)
				for i := range R {
					copy(w[i*wrow:], quantWeights(b, r, typ, n))
				}
				x := make([]byte, C*xrow)
				for c := range C {
					ConvertActivation(typ, randVec(r, n), x[c*xrow:(c+1)*xrow])
				}
				out := make([]float32, R*C)
				k := ts.k[R-1][C-1]
				for b.Loop() {
					k(n/ts.unit, &w[0], wrow, &x[0], xrow, &out[0], 4*R)
				}
				b.ReportMetric(float64(R*C*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s")
			})
		}
	}
}

// BenchmarkMatVec measures one activation row against a weight matrix larger
// than the caches (2048×8192), on one thread: the weight bytes streamed per
// second bound token generation.
func BenchmarkMatVec(b *testing.B) {
	r := rand.New(rand.NewPCG(43, 44))
	for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.Q8_0, ggml.Q4_0} {
		b.Run(typ.String(), func(b *testing.B) {
			const K, N = 2048, 8192
			wrow := mustRowBytes(b, typ, K)
			w := make([]byte, N*wrow)
			row := quantWeights(b, r, typ, K)
			for o := range N {
				copy(w[o*wrow:], row)
			}
			x := make([]byte, mustRowBytes(b, typ.VecDotType(), K))
			ConvertActivation(typ, randVec(r, K), x)
			out := make([]float32, N)
			ts := tilesFor(typ)
			dot, _ := VecDotFor(typ)
			for b.Loop() {
				if ts == nil {
					for o := range N {
						out[o] = dot(K, w[o*wrow:(o+1)*wrow], x)
					}
					continue
				}
				for o := 0; o < N; o += 4 {
					ts.k[3][0](K/ts.unit, &w[o*wrow], wrow, &x[0], 0, &out[o], 4)
				}
			}
			b.SetBytes(int64(len(w)))
		})
	}
}
