package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// BenchmarkTile measures each tile kernel on rows that stay in cache:
// GMAC/s is multiply-adds per second (R*C*n per call).
func BenchmarkTile(b *testing.B) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.BF16, ggml.Q8_0, ggml.Q4_0, ggml.Q5_0, ggml.Q5_1, ggml.IQ4_NL} {
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

// BenchmarkPanel measures each panel kernel on a panel that stays in
// cache: GMAC/s is multiply-adds per second (16*C*n per call).
func BenchmarkPanel(b *testing.B) {
	r := rand.New(rand.NewPCG(45, 46))
	for _, typ := range []ggml.Type{ggml.Q8_0, ggml.Q4_0, ggml.IQ4_NL, ggml.Q5_0, ggml.Q5_1,
		ggml.Q2_K, ggml.Q3_K, ggml.Q4_K, ggml.Q5_K, ggml.Q6_K, ggml.IQ4_XS} {
		ps := archPanels(typ)
		if ps == nil {
			continue
		}
		const n = 2048
		nb := n / panelBlock(typ)
		xb := nb * expandedBlockBytes(typ)
		wrow := mustRowBytes(b, typ, n)
		w := make([]byte, panelRows*wrow)
		for i := range panelRows {
			copy(w[i*wrow:], quantWeights(b, r, typ, n))
		}
		packed := ps.repack(typ, panelRows, n, w)
		for _, C := range []int{1, 4, 8} {
			b.Run(fmt.Sprintf("%s/%d", typ, C), func(b *testing.B) {
				q := make([]byte, mustRowBytes(b, typ.VecDotType(), n))
				x := make([]byte, C*xb)
				for c := range C {
					ConvertActivation(typ, randVec(r, n), q)
					expandRow(typ, nb, q, x[c*xb:])
				}
				out := make([]float32, C*panelRows)
				for b.Loop() {
					ps.k[C-1](nb, &packed[0], &x[0], xb, &out[0], 4*panelRows)
				}
				b.ReportMetric(float64(panelRows*C*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s")
			})
		}
		// The AMX kernel, where this CPU runs one, on 16, 32 and 128 rows
		// (one call splits the panel's nibbles once for all its groups).
		amx := ps.amxKernel()
		if amx == nil {
			continue
		}
		scratch := make([]byte, amxScratch(n/32)+63)
		scratch = scratch[int(-uintptr(unsafe.Pointer(&scratch[0]))&63):][:amxScratch(n/32)]
		amxConfigure(scratch)
		for _, C := range []int{16, 32, 128} {
			b.Run(fmt.Sprintf("%s/amx%d", typ, C), func(b *testing.B) {
				q := make([]byte, mustRowBytes(b, typ.VecDotType(), n))
				x := make([]byte, C*xb)
				for c := range C {
					ConvertActivation(typ, randVec(r, n), q)
					expandRow(typ, nb, q, x[c*xb:])
				}
				out := make([]float32, C*panelRows)
				for b.Loop() {
					amx(1, nb, &packed[0], &x[0], xb, C/amxRows, &out[0], 4*panelRows, &scratch[0])
				}
				b.ReportMetric(float64(panelRows*C*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s")
			})
		}
	}
}

// BenchmarkMatVec measures one activation row against a weight matrix of
// 2048 columns and ~64 MiB, larger than the caches whatever its type,
// through Backend.MatMul on one thread: the weight bytes streamed per second
// bound token generation.
func BenchmarkMatVec(b *testing.B) {
	r := rand.New(rand.NewPCG(43, 44))
	pool := NewPool(1)
	defer pool.Close()
	for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.BF16, ggml.Q8_0, ggml.Q4_0,
		ggml.Q5_0, ggml.Q5_1, ggml.IQ4_NL, ggml.Q2_K, ggml.Q3_K, ggml.Q4_K, ggml.Q5_K, ggml.Q6_K, ggml.IQ4_XS} {
		b.Run(typ.String(), func(b *testing.B) {
			const K = 2048
			wrow := mustRowBytes(b, typ, K)
			N := (64 << 20) / wrow / panelRows * panelRows
			data := make([]byte, N*wrow)
			row := quantWeights(b, r, typ, K)
			for o := range N {
				copy(data[o*wrow:], row)
			}
			w := &model.Weight{Name: "w", Type: typ, Rows: N, Cols: K, Data: data}
			be := NewBackend(pool)
			be.Prepare(w)
			x := randVec(r, K)
			out := make([]float32, N)
			for b.Loop() {
				be.MatMul(w, x, 1, out)
			}
			b.SetBytes(int64(len(data)))
		})
	}
}

// BenchmarkMatMulBatch measures a prompt-sized product, 16 activation rows
// against a 1024×2048 weight matrix (which stays in the caches of most
// CPUs once repacked), through Backend.MatMul on one thread: the kernels'
// GEMM speed in GMAC/s. Run it under STRATA_CPU=avx2 or =portable to
// measure those paths on a CPU that has faster ones.
func BenchmarkMatMulBatch(b *testing.B) {
	r := rand.New(rand.NewPCG(47, 48))
	pool := NewPool(1)
	defer pool.Close()
	const N, K, R = 1024, 2048, 16
	for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.BF16, ggml.Q8_0, ggml.Q4_0, ggml.Q5_0, ggml.Q5_1, ggml.IQ4_NL,
		ggml.Q2_K, ggml.Q3_K, ggml.Q4_K, ggml.Q5_K, ggml.Q6_K, ggml.IQ4_XS} {
		b.Run(typ.String(), func(b *testing.B) {
			wrow := mustRowBytes(b, typ, K)
			data := make([]byte, N*wrow)
			for o := range N {
				copy(data[o*wrow:], quantWeights(b, r, typ, K))
			}
			w := &model.Weight{Name: "w", Type: typ, Rows: N, Cols: K, Data: data}
			be := NewBackend(pool)
			be.Prepare(w)
			x := randVec(r, R*K)
			out := make([]float32, R*N)
			for b.Loop() {
				be.MatMul(w, x, R, out)
			}
			b.ReportMetric(float64(N*K*R)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s")
		})
	}
}
