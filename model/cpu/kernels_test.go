package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/strata-llm/strata/model/ggml"
)

// withPortable runs f with the portable kernels forced.
func withPortable(f func()) {
	portableOnly = true
	defer func() { portableOnly = false }()
	f()
}

// randActVec is randBytesVec for activations that are quantized with f16
// scales (Q8_0, Q8_1): its huge values are 100 times, not 1e20, so that a
// block's scale d (its largest magnitude / 127) and Q8_1's s (d times the
// sum of its quants, up to 32*127) stay finite in f16. With
// 1e20, most blocks' scales overflowed to infinity and most outputs of the
// tests of those kernels were NaN on both sides, which hid a wrong
// instruction.
func randActVec(r *rand.Rand, n int) []float32 {
	v := randBytesVec(r, n)
	for i := range v {
		if math.Abs(float64(v[i])) > 1e6 {
			v[i] *= 1e-18
		}
	}
	return v
}

// checkFinite fails t when a portable dot product of finite weights and
// activations is not finite: the test's data overflowed, and comparing NaN
// with NaN would check nothing.
func checkFinite(t testing.TB, what string, v float32) {
	t.Helper()
	if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
		t.Fatalf("%s: portable result %g: the test's data overflowed", what, v)
	}
}

// randBytesVec is a random vector with awkward values mixed in: zeros of
// both signs, tiny and huge magnitudes.
func randBytesVec(r *rand.Rand, n int) []float32 {
	v := randVec(r, n)
	for i := range v {
		switch r.IntN(40) {
		case 0:
			v[i] = 0
		case 1:
			v[i] = float32(math.Copysign(0, -1))
		case 2:
			v[i] *= 1e-30
		case 3:
			v[i] *= 1e20
		}
	}
	return v
}

// randRow is a random weight row of type typ with n elements. Q8_0 rows take
// arbitrary quant bytes (including -128) so that the integer sums are tested
// at their extremes.
func randRow(t testing.TB, r *rand.Rand, typ ggml.Type, n int) []byte {
	t.Helper()
	switch typ {
	case ggml.Q8_0, ggml.Q4_0, ggml.IQ4_NL:
		b := quantWeights(t, r, typ, n)
		bs := typ.TypeSize()
		for blk := 0; blk < len(b); blk += bs {
			if r.IntN(3) == 0 {
				for i := blk + 2; i < blk+bs; i++ {
					b[i] = byte(r.Uint32())
				}
			}
		}
		return b
	case ggml.Q5_1: // raw blocks half the time: every quant and fifth bit
		return weightsOf(t, r, typ, n, r.IntN(2) == 0)
	}
	return encode(t, typ, randBytesVec(r, n))
}

// TestTilesEqualPortable checks every SIMD tile kernel (all R×C shapes)
// against the portable kernel, bit for bit, on random rows of awkward sizes.
func TestTilesEqualPortable(t *testing.T) {
	testTilesEqualPortable(t)
	avx2Only = true
	defer func() { avx2Only = false }()
	testTilesEqualPortable(t)
}

func testTilesEqualPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.BF16, ggml.Q8_0, ggml.Q4_0, ggml.IQ4_NL, ggml.Q5_1} {
		ts := archTiles(typ)
		if ts == nil {
			t.Logf("%s: no SIMD kernels on this CPU (avx2Only %v)", typ, avx2Only)
			continue
		}
		var sizes []int
		if ts.unit == 1 {
			sizes = []int{1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 255, 768, 1000}
		} else {
			for _, nb := range []int{1, 2, 3, 4, 5, 7, 8, 9, 24, 25, 64, 67} {
				sizes = append(sizes, 32*nb)
			}
		}
		portable, err := VecDotFor(typ)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range sizes {
			t.Run(fmt.Sprintf("%s/%s/%d", ts.name, typ, n), func(t *testing.T) {
				wrow := mustRowBytes(t, typ, n)
				vt := typ.VecDotType()
				xrow := mustRowBytes(t, vt, n)
				for R := 1; R <= ts.maxR; R++ {
					for C := 1; C <= ts.maxC; C++ {
						// Rows with a gap between them, to test the strides.
						ws, xs := wrow+3*typ.TypeSize(), xrow+vt.TypeSize()
						w := make([]byte, R*ws)
						x := make([]byte, C*xs)
						for i := range R {
							copy(w[i*ws:], randRow(t, r, typ, n))
						}
						for c := range C {
							if vt == typ {
								copy(x[c*xs:], randRow(t, r, typ, n))
								if typ == ggml.Q8_0 { // activation quants: -127..127, as the quantizer makes them
									for b := c * xs; b < c*xs+xrow; b += q80Bytes {
										for i := b + 2; i < b+q80Bytes; i++ {
											x[i] = byte(max(int8(x[i]), -127))
										}
									}
								}
							} else {
								ConvertActivation(typ, randActVec(r, n), x[c*xs:c*xs+xrow])
								if vt == ggml.Q8_1 && r.IntN(3) == 0 { // raw quants, -128 included
									for b := c * xs; b < c*xs+xrow; b += q81Bytes {
										for i := b + 4; i < b+q81Bytes; i++ {
											x[i] = byte(r.Uint32())
										}
									}
								}
							}
						}
						const os = 5
						out := make([]float32, C*os)
						ts.k[R-1][C-1](n/ts.unit, &w[0], ws, &x[0], xs, &out[0], 4*os)
						for i := range R {
							for c := range C {
								var want float32
								withPortable(func() { want = portable(n, w[i*ws:i*ws+wrow], x[c*xs:c*xs+xrow]) })
								if ts.unit > 1 {
									checkFinite(t, ts.name, want)
								}
								if got := out[c*os+i]; math.Float32bits(got) != math.Float32bits(want) {
									t.Fatalf("%s_%dx%d n=%d out[%d][%d] = %g (%08x), portable %g (%08x)",
										ts.name, R, C, n, i, c, got, math.Float32bits(got), want, math.Float32bits(want))
								}
							}
						}
						for c := range C { // untouched padding
							for i := R; i < os; i++ {
								if out[c*os+i] != 0 {
									t.Fatalf("%s_%dx%d wrote out[%d][%d]", ts.name, R, C, i, c)
								}
							}
						}
					}
				}
				if ts.unit > 1 {
					return // the rows kernels are the float types'
				}
				x := randRow(t, r, vt, n)
				if vt != typ {
					ConvertActivation(typ, randActVec(r, n), x)
				}
				checkRows(t, r, ts, typ, n, &x[0], func(w []byte) float32 {
					var want float32
					withPortable(func() { want = portable(n, w, x) })
					return want
				})
			})
		}
	}
}

// checkRows checks ts's rows kernels (vec and ahead, where it has them) on
// runs of 1 to 9 weight rows of n elements, with a gap between them, against
// one activation row at x: each output equals dot(row), bit for bit, and
// nothing past the run is written.
func checkRows(t *testing.T, r *rand.Rand, ts *tileSet, typ ggml.Type, n int, x *byte, dot func(w []byte) float32) {
	t.Helper()
	wrow := mustRowBytes(t, typ, n)
	for _, k := range []struct {
		name string
		f    rowsFunc
	}{{"rows", ts.vec}, {"rowsAhead", ts.ahead}} {
		if k.f == nil {
			continue
		}
		for rows := 1; rows <= 9; rows++ {
			ws := wrow + 3*typ.TypeSize()
			w := make([]byte, rows*ws)
			for i := range rows {
				copy(w[i*ws:], randRow(t, r, typ, n))
			}
			out := make([]float32, rows+1)
			k.f(n/ts.unit, &w[0], ws, x, &out[0], rows)
			for i := range rows {
				want := dot(w[i*ws : i*ws+wrow])
				if got := out[i]; math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("%s_%s n=%d rows=%d out[%d] = %g (%08x), portable %g (%08x)",
						ts.name, k.name, n, rows, i, got, math.Float32bits(got), want, math.Float32bits(want))
				}
			}
			if out[rows] != 0 {
				t.Fatalf("%s_%s n=%d rows=%d wrote past its run", ts.name, k.name, n, rows)
			}
		}
	}
}

// TestVecDotPortableSwitch checks the VecDot kernels with the SIMD path on
// and off on random inputs.
func TestVecDotPortableSwitch(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 34))
	for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.BF16, ggml.Q8_0, ggml.Q4_0, ggml.IQ4_NL, ggml.Q5_1} {
		f, err := VecDotFor(typ)
		if err != nil {
			t.Fatal(err)
		}
		for range 200 {
			n := 32 * (1 + r.IntN(40))
			w := randRow(t, r, typ, n)
			x := make([]byte, mustRowBytes(t, typ.VecDotType(), n))
			ConvertActivation(typ, randActVec(r, n), x)
			got := f(n, w, x)
			var want float32
			withPortable(func() { want = f(n, w, x) })
			if typ.BlockSize() > 1 {
				checkFinite(t, typ.String(), want)
			}
			if math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("%s n=%d: %s %08x, portable %08x", typ, n, ISA(typ), math.Float32bits(got), math.Float32bits(want))
			}
		}
	}
}

// TestAttendEqualsPortable checks KV.Attend with the SIMD kernels against
// the portable loops, bit for bit, over paged blocks in shuffled order, from
// key 0 and from window starts inside and at the edges of blocks and of the
// SIMD path's chunks.
func TestAttendEqualsPortable(t *testing.T) {
	testAttendEqualsPortable(t)
	avx2Only = true // attendSIMD with the AVX2 kernels (hd a multiple of 8), else the portable loops
	defer func() { avx2Only = false }()
	testAttendEqualsPortable(t)
}

func testAttendEqualsPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 36))
	for _, typ := range []ggml.Type{ggml.F16, ggml.F32} {
		for i, hd := range []int{8, 20, 64, 72, 128, 264} {
			for _, bs := range []int{1, 5, 16, 70} {
				const n = 301
				// Head pairs sharing a KV head, with their own, and an odd head.
				heads := [][2]int{{4, 2}, {3, 3}, {5, 1}}[(i+bs)%3]
				cfg := KVConfig{Layers: 2, Blocks: (n + bs - 1) / bs * 2, BlockSize: bs, Heads: heads[0], HeadsKV: heads[1], HeadDim: hd, Type: typ}
				c, err := NewKV(cfg)
				if err != nil {
					t.Fatal(err)
				}
				blocks := make([]int32, cfg.Blocks)
				for i, p := range r.Perm(cfg.Blocks) {
					blocks[i] = int32(p)
				}
				kvd := cfg.HeadsKV * hd
				for p := range n {
					k, v := randVec(r, kvd), randVec(r, kvd)
					if p%7 == 3 { // large values: the f16 accumulator rounds coarsely
						for i := range v {
							v[i] *= 3000
						}
					}
					c.Store(1, blocks, p, k, v)
				}
				for _, pos := range []int{0, 1, 4, 15, 16, 17, 39, 63, 64, 65, 128, 200, 300} {
					q := randVec(r, cfg.Heads*hd)
					if pos%2 == 0 { // sharper softmax: more new maxima, more rescales
						for i := range q {
							q[i] *= 8
						}
					}
					scale := 1 / float32(math.Sqrt(float64(hd)))
					if pos%3 == 1 { // the queries carry the scale (Gemma)
						scale = 1
					}
					for _, w := range []int{0, 1, 2, 8, 16, 17, 64, 65, 100} {
						lo := 0
						if w > 0 {
							lo = max(0, pos-w+1)
						}
						got := make([]float32, cfg.Heads*hd)
						want := make([]float32, cfg.Heads*hd)
						c.Attend(1, blocks, lo, pos, 0, cfg.Heads, scale, q, got, make([]float32, pos+1-lo))
						withPortable(func() { c.Attend(1, blocks, lo, pos, 0, cfg.Heads, scale, q, want, make([]float32, pos+1-lo)) })
						for i := range got {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("%s hd=%d bs=%d pos=%d lo=%d: out[%d] = %g, portable %g", typ, hd, bs, pos, lo, i, got[i], want[i])
							}
						}
						// Each head alone (both paths), and the heads from 1
						// on (SIMD: pairs formed the other way): the same
						// bits as all heads at once.
						for _, portable := range []bool{false, true} {
							split := make([]float32, cfg.Heads*hd)
							run := func() {
								for h := range cfg.Heads {
									c.Attend(1, blocks, lo, pos, h, h+1, scale, q, split, make([]float32, pos+1-lo))
								}
							}
							rest := make([]float32, cfg.Heads*hd)
							if portable {
								withPortable(run)
							} else {
								run()
								if cfg.Heads > 1 {
									c.Attend(1, blocks, lo, pos, 1, cfg.Heads, scale, q, rest, make([]float32, pos+1-lo))
								}
							}
							for i := range split {
								if math.Float32bits(split[i]) != math.Float32bits(want[i]) {
									t.Fatalf("%s hd=%d bs=%d pos=%d lo=%d: head by head (portable %v), out[%d] = %g, all heads %g", typ, hd, bs, pos, lo, portable, i, split[i], want[i])
								}
								if i >= hd && !portable && cfg.Heads > 1 && math.Float32bits(rest[i]) != math.Float32bits(want[i]) {
									t.Fatalf("%s hd=%d bs=%d pos=%d lo=%d: heads 1.., out[%d] = %g, all heads %g", typ, hd, bs, pos, lo, i, rest[i], want[i])
								}
							}
						}
					}
				}
			}
		}
	}
}

// TestAttendWindowReadsOnlyItsKeys: attention over keys lo..pos equals, bit
// for bit, attention over the same keys and values stored at positions
// 0..pos-lo of another sequence (where blocks and the SIMD path's chunks
// fall elsewhere relative to them), and never reads the keys before lo
// (NaNs there would spread to every output).
func TestAttendWindowReadsOnlyItsKeys(t *testing.T) {
	testAttendWindowReadsOnlyItsKeys(t)
	avx2Only = true
	defer func() { avx2Only = false }()
	testAttendWindowReadsOnlyItsKeys(t)
}

func testAttendWindowReadsOnlyItsKeys(t *testing.T) {
	r := rand.New(rand.NewPCG(37, 38))
	for _, typ := range []ggml.Type{ggml.F16, ggml.F32} {
		for _, hd := range []int{64, 72} {
			for _, bs := range []int{5, 16} {
				const n = 200
				cfg := KVConfig{Layers: 1, Blocks: 2 * ((n + bs - 1) / bs), BlockSize: bs, Heads: 4, HeadsKV: 2, HeadDim: hd, Type: typ}
				c, err := NewKV(cfg)
				if err != nil {
					t.Fatal(err)
				}
				perm := r.Perm(cfg.Blocks)
				a, b := make([]int32, cfg.Blocks/2), make([]int32, cfg.Blocks/2)
				for i := range a {
					a[i], b[i] = int32(perm[i]), int32(perm[len(a)+i])
				}
				kvd := cfg.HeadsKV * hd
				ks, vs := make([][]float32, n), make([][]float32, n)
				for p := range n {
					ks[p], vs[p] = randVec(r, kvd), randVec(r, kvd)
				}
				nan := make([]float32, kvd)
				for i := range nan {
					nan[i] = float32(math.NaN())
				}
				for _, pos := range []int{7, 63, 64, 100, 199} {
					for _, w := range []int{1, 3, 8, 17, 64, 70} {
						lo := max(0, pos-w+1)
						for p := 0; p <= pos; p++ {
							if p < lo {
								c.Store(0, a, p, nan, nan)
							} else {
								c.Store(0, a, p, ks[p], vs[p])
								c.Store(0, b, p-lo, ks[p], vs[p])
							}
						}
						q := randVec(r, cfg.Heads*hd)
						for _, portable := range []bool{false, true} {
							got := make([]float32, cfg.Heads*hd)
							want := make([]float32, cfg.Heads*hd)
							run := func() {
								c.Attend(0, a, lo, pos, 0, cfg.Heads, 0.125, q, got, make([]float32, pos+1-lo))
								c.Attend(0, b, 0, pos-lo, 0, cfg.Heads, 0.125, q, want, make([]float32, pos+1-lo))
							}
							if portable {
								withPortable(run)
							} else {
								run()
							}
							for i := range got {
								if math.Float32bits(got[i]) != math.Float32bits(want[i]) || math.IsNaN(float64(got[i])) {
									t.Fatalf("%s hd=%d bs=%d keys %d..%d (portable %v): out[%d] = %g, from position 0 %g", typ, hd, bs, lo, pos, portable, i, got[i], want[i])
								}
							}
						}
					}
				}
			}
		}
	}
}

// TestPanelsEqualPortable checks the panel kernels (VNNI and AVX2, every
// C, odd and even block counts, row counts that leave a partial panel,
// extreme quants) on repacked weights against the portable kernel on the
// stored rows, bit for bit.
func TestPanelsEqualPortable(t *testing.T) {
	testPanelsEqualPortable(t)
	avx2Only = true
	defer func() { avx2Only, noAVXVNNI = false, false }()
	testPanelsEqualPortable(t) // AVX-VNNI, where the CPU has it
	noAVXVNNI = true
	testPanelsEqualPortable(t)
}

func testPanelsEqualPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(37, 38))
	for _, typ := range []ggml.Type{ggml.Q8_0, ggml.Q4_0, ggml.IQ4_NL} {
		ps := archPanels(typ)
		if ps == nil {
			t.Logf("%s (avx2Only %v, noAVXVNNI %v): no panel kernels on this CPU", typ, avx2Only, noAVXVNNI)
			continue
		}
		portable, err := VecDotFor(typ)
		if err != nil {
			t.Fatal(err)
		}
		for _, nb := range []int{1, 2, 3, 4, 5, 7, 24, 25, 64, 67} {
			n := 32 * nb
			wrow := mustRowBytes(t, typ, n)
			qrow := nb * q80Bytes
			rows := []int{1, 15, 16, 17, 40}[r.IntN(5)]
			w := make([]byte, rows*wrow)
			for i := range rows {
				row := randRow(t, r, typ, n)
				if r.IntN(3) == 0 { // extreme quants, -128 included
					bsz := wrow / nb
					for b := range nb {
						for k := 2; k < bsz; k++ {
							row[b*bsz+k] = byte(r.Uint32())
						}
					}
				}
				copy(w[i*wrow:], row)
			}
			packed := ps.repack(typ, rows, n, w)
			pb := nb * panelBlockBytes(typ)
			if len(packed) != (rows+panelRows-1)/panelRows*pb {
				t.Fatalf("%s: repacked %d bytes for %d rows of %d blocks", typ, len(packed), rows, nb)
			}
			for C := 1; C <= maxPanelC; C++ {
				xb := expandedBlockBytes(typ)
				xs := nb*xb + 24 // a gap between rows, to test the stride
				q := make([]byte, C*qrow)
				x := make([]byte, C*xs)
				for c := range C {
					qc := q[c*qrow : (c+1)*qrow]
					ConvertActivation(typ, randActVec(r, n), qc)
					if r.IntN(3) == 0 { // extreme quants (the quantizer never makes -128)
						for b := range nb {
							for i := 2; i < q80Bytes; i++ {
								qc[b*q80Bytes+i] = byte(max(int8(r.Uint32()), -127))
							}
						}
					}
					expandRow(typ, nb, qc, x[c*xs:c*xs+nb*xb])
				}
				const os = panelRows + 3
				for p := 0; p*panelRows < rows; p++ {
					out := make([]float32, C*os)
					ps.k[C-1](nb, &packed[p*pb], &x[0], xs, &out[0], 4*os)
					for i := range panelRows {
						o := p*panelRows + i
						for c := range C {
							got := out[c*os+i]
							if o >= rows {
								continue // padding: never copied out (NaN where x's scale is infinite)
							}
							var want float32
							withPortable(func() { want = portable(n, w[o*wrow:(o+1)*wrow], q[c*qrow:(c+1)*qrow]) })
							checkFinite(t, ps.name, want)
							if math.Float32bits(got) != math.Float32bits(want) {
								t.Fatalf("%s_%d nb=%d out[%d][%d] = %g (%08x), portable %g (%08x)",
									ps.name, C, nb, o, c, got, math.Float32bits(got), want, math.Float32bits(want))
							}
						}
					}
					for c := range C { // untouched padding
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
}

// TestScoreAVX2EqualsPortable checks the AVX2 one-key score kernel against
// attnDotF16, bit for bit.
func TestScoreAVX2EqualsPortable(t *testing.T) {
	if !haveF16C {
		t.Skip("no AVX2 with F16C")
	}
	r := rand.New(rand.NewPCG(49, 50))
	for _, hd := range []int{64, 128, 256} {
		for range 200 {
			k := encode(t, ggml.F16, randBytesVec(r, hd))
			q := encode(t, ggml.F16, randBytesVec(r, hd))
			got, want := scoreF16AVX2(hd, &k[0], &q[0]), attnDotF16(hd, k, q)
			if math.Float32bits(got) != math.Float32bits(want) && !(math.IsNaN(float64(want)) && math.IsNaN(float64(got))) {
				t.Fatalf("hd=%d: %g (%08x), portable %g (%08x)", hd, got, math.Float32bits(got), want, math.Float32bits(want))
			}
		}
	}
}

// TestScoreRestEqualsPortable checks scoreF16Rest — the vector kernels on
// the first hd&^63 elements, scoreF16Tail's float64 additions on the rest —
// against attnDotF16 bit for bit, on the head dimensions that are not a
// multiple of 64 (the tests' 16, stories260K's 8, Phi-3's 96), through the
// AVX2 kernel and, where the CPU has it, the AVX-512 one.
func TestScoreRestEqualsPortable(t *testing.T) {
	if !haveF16C {
		t.Skip("no AVX2 with F16C")
	}
	r := rand.New(rand.NewPCG(51, 52))
	for _, avx512 := range []bool{false, true} {
		if avx512 && !haveElementwise() {
			continue
		}
		for _, hd := range []int{2, 8, 16, 32, 80, 96, 112, 200} {
			for range 200 {
				k := encode(t, ggml.F16, randBytesVec(r, hd))
				q := encode(t, ggml.F16, randBytesVec(r, hd))
				got, want := scoreF16Rest(hd, k, q, avx512), attnDotF16(hd, k, q)
				if math.Float32bits(got) != math.Float32bits(want) && !(math.IsNaN(float64(want)) && math.IsNaN(float64(got))) {
					t.Fatalf("avx512 %v hd=%d: %g (%08x), portable %g (%08x)", avx512, hd, got, math.Float32bits(got), want, math.Float32bits(want))
				}
			}
		}
	}
}

// TestScores16EqualsPortable checks the sixteen-key and the one-key score
// kernels against the portable attention score, attnDotF16, bit for bit,
// with awkward values.
func TestScores16EqualsPortable(t *testing.T) {
	if !haveElementwise() {
		t.Skip("no AVX-512")
	}
	r := rand.New(rand.NewPCG(47, 48))
	for _, hd := range []int{64, 128, 256} {
		for range 20 {
			stride := 2*hd + 2*r.IntN(3)*16
			keys := encode(t, ggml.F16, randBytesVec(r, 16*stride/2))
			q := encode(t, ggml.F16, randBytesVec(r, hd))
			var out [16]float32
			scoresF16x16AVX512(hd, &keys[0], stride, &q[0], &out[0])
			for k := range 16 {
				want := attnDotF16(hd, keys[k*stride:k*stride+2*hd], q)
				one := scoreF16AVX512(hd, &keys[k*stride], &q[0])
				for _, got := range []float32{out[k], one} {
					if math.Float32bits(got) != math.Float32bits(want) && !(math.IsNaN(float64(want)) && math.IsNaN(float64(got))) {
						t.Fatalf("hd=%d key %d: %g (%08x) and one key %g, portable %g (%08x)", hd, k, out[k], math.Float32bits(out[k]), one, want, math.Float32bits(want))
					}
				}
			}
		}
	}
}
