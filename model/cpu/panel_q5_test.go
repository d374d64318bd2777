package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// q50Weights returns rows Q5_0 rows of n elements: quantized random rows
// or raw random blocks (every quant and fifth bit) with sane scales.
func q50Weights(t testing.TB, r *rand.Rand, rows, n int) []byte {
	t.Helper()
	var w []byte
	for range rows {
		w = append(w, weightsOf(t, r, ggml.Q5_0, n, r.IntN(2) == 0)...)
	}
	return w
}

// TestQ50PanelsEqualPortable checks the Q5_0 and Q5_1 panel kernels (VNNI
// on masks and AVX2 on planes; every C from 1 to 8, odd and even block counts, odd
// row counts and partial panels, extreme quants) on repacked weights
// against the portable kernel on the stored rows, bit for bit.
func TestQ50PanelsEqualPortable(t *testing.T) {
	defer func() { avx2Only, noAVXVNNI = false, false }()
	// AVX-512; AVX2 with AVX-VNNI where the CPU has it; AVX2 alone.
	for _, set := range []struct{ avx2, noVNNI bool }{{false, false}, {true, false}, {true, true}} {
		avx2Only, noAVXVNNI = set.avx2, set.noVNNI
		for _, typ := range []ggml.Type{ggml.Q5_0, ggml.Q5_1} {
			t.Run(fmt.Sprintf("%s/avx2Only=%v/noAVXVNNI=%v", typ, set.avx2, set.noVNNI), func(t *testing.T) { testQ5PanelsEqualPortable(t, typ) })
		}
	}
}

func testQ5PanelsEqualPortable(t *testing.T, typ ggml.Type) {
	ps := archPanels(typ)
	if ps == nil {
		t.Skipf("%s: no panel kernels on this CPU", typ)
	}
	portable, err := VecDotFor(typ)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(75, 76))
	for i, nb := range []int{1, 2, 3, 5, 7, 24, 25} {
		n := ggml.QK * nb
		wrow := mustRowBytes(t, typ, n)
		qrow := mustRowBytes(t, typ.VecDotType(), n)
		qoff := qrow/nb - 32                       // the quants' offset in an activation block
		rows := []int{1, 7, 15, 16, 17, 33, 40}[i] // odd counts: partial panels
		var w []byte
		for range rows {
			w = append(w, weightsOf(t, r, typ, n, r.IntN(2) == 0)...)
		}
		packed := ps.repack(typ, rows, n, w)
		pb := nb * panelBlockBytes(typ)
		if len(packed) != (rows+panelRows-1)/panelRows*pb {
			t.Fatalf("repacked %d bytes for %d rows of %d blocks", len(packed), rows, nb)
		}
		xb := expandedBlockBytes(typ)
		for C := 1; C <= maxPanelC; C++ {
			xs := nb*xb + 12
			q := make([]byte, C*qrow)
			x := make([]byte, C*xs)
			for c := range C {
				qc := q[c*qrow : (c+1)*qrow]
				ConvertActivation(typ, randActVec(r, n), qc)
				if r.IntN(3) == 0 {
					for b := range nb {
						for i := qoff; i < qrow/nb; i++ {
							qc[b*qrow/nb+i] = byte(r.Uint32())
						}
					}
				}
				expandRow(typ, nb, qc, x[c*xs:c*xs+nb*xb])
			}
			const os = panelRows + 3
			for p := 0; p*panelRows < rows; p++ {
				out := make([]float32, C*os)
				ps.k[C-1](nb, &packed[p*pb], &x[0], xs, &out[0], 4*os)
				for i := range min(panelRows, rows-p*panelRows) {
					o := p*panelRows + i
					for c := range C {
						var want float32
						withPortable(func() { want = portable(n, w[o*wrow:(o+1)*wrow], q[c*qrow:(c+1)*qrow]) })
						checkFinite(t, ps.name, want)
						if got := out[c*os+i]; math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("%s_%d nb=%d out[%d][%d] = %g (%08x), portable %g (%08x)",
								ps.name, C, nb, o, c, got, math.Float32bits(got), want, math.Float32bits(want))
						}
					}
				}
				for c := range C {
					for i := panelRows; i < os; i++ {
						if out[c*os+i] != 0 {
							t.Fatalf("%s_%d wrote out[%d][%d]", ps.name, C, i, c)
						}
					}
				}
			}
		}
	}
}

// TestQ50TilesEqualPortable checks the AVX2 Q5_0 tile kernels (every R×C,
// strided rows) against the portable kernel, bit for bit.
func TestQ50TilesEqualPortable(t *testing.T) {
	ts := archTiles(ggml.Q5_0)
	if ts == nil {
		t.Skip("Q5_0: no tile kernels on this CPU")
	}
	r := rand.New(rand.NewPCG(79, 80))
	for _, nb := range []int{1, 2, 3, 9, 24, 67} {
		n := ggml.QK * nb
		wrow, xrow := nb*q50Bytes, nb*q80Bytes
		for R := 1; R <= ts.maxR; R++ {
			for C := 1; C <= ts.maxC; C++ {
				ws, xs := wrow+5, xrow+7
				w := make([]byte, R*ws)
				x := make([]byte, C*xs)
				for i := range R {
					copy(w[i*ws:], q50Weights(t, r, 1, n))
				}
				for c := range C {
					ConvertActivation(ggml.Q5_0, randActVec(r, n), x[c*xs:c*xs+xrow])
				}
				const os = 3
				out := make([]float32, C*os)
				ts.k[R-1][C-1](nb, &w[0], ws, &x[0], xs, &out[0], 4*os)
				for i := range R {
					for c := range C {
						want := dotQ50Q80(n, w[i*ws:i*ws+wrow], x[c*xs:c*xs+xrow])
						checkFinite(t, ts.name, want)
						if got := out[c*os+i]; math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("%s_%dx%d nb=%d out[%d][%d] = %g, portable %g", ts.name, R, C, nb, i, c, got, want)
						}
					}
				}
			}
		}
	}
}

// TestQ50MatMulEqualsPortable: MatMul of Q5_0, Q5_1 and IQ4_NL matrices (the
// VNNI panels, then the AVX2 tiles or the portable kernel) gives the
// portable kernel's bits whatever the activation rows and workers.
func TestQ50MatMulEqualsPortable(t *testing.T) {
	testQ50MatMulEqualsPortable(t)
	avx2Only = true
	defer func() { avx2Only, noAVXVNNI = false, false }()
	testQ50MatMulEqualsPortable(t) // AVX-VNNI, where the CPU has it
	noAVXVNNI = true
	testQ50MatMulEqualsPortable(t)
}

func testQ50MatMulEqualsPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(77, 78))
	p1, p2 := NewPool(1), NewPool(2)
	defer p1.Close()
	defer p2.Close()
	for _, typ := range []ggml.Type{ggml.Q5_0, ggml.Q5_1, ggml.IQ4_NL} {
		for _, shape := range [][2]int{{37, 96}, {64, 288}, {200, 64}} {
			N, K := shape[0], shape[1]
			var data []byte
			for range N {
				data = append(data, weightsOf(t, r, typ, K, r.IntN(2) == 0)...)
			}
			w := &model.Weight{Name: "w", Type: typ, Rows: N, Cols: K, Data: data}
			for _, R := range []int{1, 3, 8, 9, 19} {
				t.Run(fmt.Sprintf("%s/%dx%d/%d", typ, N, K, R), func(t *testing.T) {
					x := randActVec(r, R*K)
					want := make([]float32, R*N)
					withPortable(func() { NewBackend(p1).MatMul(w, x, R, want) })
					for _, v := range want {
						checkFinite(t, typ.String(), v)
					}
					for _, p := range []*Pool{p1, p2} {
						got := make([]float32, R*N)
						NewBackend(p).MatMul(w, x, R, got)
						if !sameBits(got, want) {
							t.Fatalf("%s (%d workers): MatMul differs from the portable kernel", ISA(typ), p.Workers())
						}
					}
				})
			}
		}
	}
}

// TestQ50PlanesTransposeMasks checks the planes layout against the masks
// one on the same random blocks (every fifth bit, partial panels): plane
// byte p has bit v set exactly when mask v has bit p, and every other byte
// is the same.
func TestQ50PlanesTransposeMasks(t *testing.T) {
	r := rand.New(rand.NewPCG(77, 78))
	for _, typ := range []ggml.Type{ggml.Q5_0, ggml.Q5_1} {
		for _, rows := range []int{1, 16, 23} {
			const nb = 3
			var w []byte
			for range rows {
				w = append(w, weightsOf(t, r, typ, nb*ggml.QK, true)...)
			}
			masks := repackQ50(typ, rows, nb*ggml.QK, w, false)
			planes := repackQ50(typ, rows, nb*ggml.QK, w, true)
			pbb, off := q50PanelBytes, 0
			if typ == ggml.Q5_1 {
				pbb, off = q51PanelBytes, 2
			}
			for blk := 0; blk < len(masks)/pbb; blk++ {
				m, p := masks[blk*pbb:(blk+1)*pbb], planes[blk*pbb:(blk+1)*pbb]
				bits := m[16*off+32 : 16*off+96]
				for i := range m {
					if i >= 16*off+32 && i < 16*off+96 {
						continue
					}
					if m[i] != p[i] {
						t.Fatalf("%s rows=%d block %d: byte %d differs: %#x, %#x", typ, rows, blk, i, m[i], p[i])
					}
				}
				for b := range 64 {
					var want byte
					for v := range 8 {
						want |= (bits[8*v+b/8] >> (b % 8) & 1) << v
					}
					if got := p[16*off+32+b]; got != want {
						t.Fatalf("%s rows=%d block %d: plane byte %d = %08b, want %08b", typ, rows, blk, b, got, want)
					}
				}
			}
		}
	}
}
