package cpu

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/strata-llm/strata/model/ggml"
)

// TestExpfAccuracy: expf is float32(e^x) within one ulp everywhere, and
// exact at the special points.
func TestExpfAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for range 200000 {
		x := float32(r.Float64()*200 - 110)
		got, want := expf(x), float32(math.Exp(float64(x)))
		d := int64(math.Float32bits(got)) - int64(math.Float32bits(want))
		if d < -1 || d > 1 {
			t.Fatalf("expf(%g) = %g, want %g", x, got, want)
		}
	}
	inf := float32(math.Inf(1))
	for _, c := range []struct{ x, want float32 }{{0, 1}, {-inf, 0}, {inf, inf}, {-200, 0}, {200, inf}, {1, float32(math.E)}} {
		if got := expf(c.x); got != c.want {
			t.Errorf("expf(%g) = %g, want %g", c.x, got, c.want)
		}
	}
	// glibc 2.43's expf where it is not float32(e^x) correctly rounded.
	for _, c := range [][2]uint32{{0x4299b370, 0x76ea3aed}, {0x4297446d, 0x760abe82}, {0xc1c3869c, 0x2dd5b4c1},
		{0xc0cb9438, 0x3ae24111}, {0xbf94e3cf, 0x3e9ffde6}, {0x42a7a62c, 0x7bf46db6}, {0xc01112a5, 0x3dd444f5},
		{0xbea97ee9, 0x3f37da1d}, {0xc1c605f5, 0x2d9c6688}, {0xc16f0924, 0x34ae6eab}} {
		x := math.Float32frombits(c[0])
		if got := math.Float32bits(expf(x)); got != c[1] {
			t.Errorf("expf(%g) = %08x, glibc %08x", x, got, c[1])
		}
	}
}

// TestVexpfAccuracy: vexpf, ggml_v_expf, is within ggml's stated bound
// (1.45 ulp plus the final rounding: 2 ulp) of e^x where the result is a
// normal float32, and exact at the special points. (That it is ggml's
// function bit for bit was checked against llama.cpp's SwiGLU output:
// TestDumpVsLlamaCpp, docs/llamacpp-agreement.md.)
func TestVexpfAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(55, 56))
	for range 200000 {
		x := float32(r.Float64()*174 - 87)
		got, want := vexpf(x), float32(math.Exp(float64(x)))
		d := int64(math.Float32bits(got)) - int64(math.Float32bits(want))
		if d < -2 || d > 2 {
			t.Fatalf("vexpf(%g) = %g, want %g (%d ulp)", x, got, want, d)
		}
	}
	inf := float32(math.Inf(1))
	for _, c := range []struct{ x, want float32 }{{0, 1}, {-inf, 0}, {inf, inf}, {-200, 0}, {200, inf}} {
		if got := vexpf(c.x); got != c.want {
			t.Errorf("vexpf(%g) = %g, want %g", c.x, got, c.want)
		}
	}
	if got := vexpf(float32(math.NaN())); got == got {
		t.Errorf("vexpf(NaN) = %g", got)
	}
}

// TestElementwiseEqualsPortable checks the SIMD expSub, SwiGLU and the Q8_0
// and Q8_1 quantizers against the portable code bit for bit: the AVX-512
// kernels where the CPU has them, then the AVX2 ones (SwiGLU and the
// quantizers; expSub has none and stays portable there).
func TestElementwiseEqualsPortable(t *testing.T) {
	eachElementwiseISA(t, testElementwiseEqualsPortable)
}

// eachElementwiseISA runs test with the AVX-512 element-wise kernels where
// the CPU has them, then with the AVX2 ones (avx2Only), and skips t where
// neither runs.
func eachElementwiseISA(t *testing.T, test func(t *testing.T)) {
	ran := false
	if haveElementwise() {
		test(t)
		ran = true
	}
	if haveF16C {
		avx2Only = true
		defer func() { avx2Only = false }()
		test(t)
		ran = true
	}
	if !ran {
		t.Skip("no AVX-512 or AVX2")
	}
}

func testElementwiseEqualsPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(53, 54))
	b := NewBackend(nil)
	for _, n := range []int{1, 5, 16, 17, 31, 64, 100, 2048} {
		for range 20 {
			x := randBytesVec(r, n)
			for i := range x {
				x[i] *= 30
			}
			sub := x[r.IntN(n)]
			got, want := make([]float32, n), make([]float32, n)
			expSub(got, x, sub)
			withPortable(func() { expSub(want, x, sub) })
			cmpBits(t, "expSub", got, want)

			up := randBytesVec(r, n)
			g1 := append([]float32(nil), x...)
			g2 := append([]float32(nil), x...)
			b.SwiGLU(g1, up)
			withPortable(func() { b.SwiGLU(g2, up) })
			cmpBits(t, "SwiGLU", g1, g2)
		}
	}
	// expf at its limits and past them, in both paths.
	lims := []float32{-103.97, -103.98, -104, -150, 88.72, 88.73, 100, 0, float32(math.Copysign(0, -1)), float32(math.Inf(-1)), float32(math.Inf(1)), float32(math.NaN())}
	for len(lims) < 37 {
		lims = append(lims, float32(r.Float64()*240-120))
	}
	e1, e2 := make([]float32, len(lims)), make([]float32, len(lims))
	expSub(e1, lims, 0)
	withPortable(func() { expSub(e2, lims, 0) })
	cmpBits(t, "expSub limits", e1, e2)
	// SwiGLU's exp at its edges: |n| > 192 (|x| above ~133) gives +Inf or
	// 0, and the infinities and NaN pass through, in both paths.
	inf := float32(math.Inf(1))
	edge := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 87.5, 88.8, -87.5, -103.9, -104.5, 133, 134, -133, -134, 200, -200, inf, -inf, float32(math.NaN())}
	for len(edge)%16 != 0 || len(edge) < 48 {
		edge = append(edge, float32(r.Float64()*600-300))
	}
	up := randBytesVec(r, len(edge))
	g1 := append([]float32(nil), edge...)
	g2 := append([]float32(nil), edge...)
	b.SwiGLU(g1, up)
	withPortable(func() { b.SwiGLU(g2, up) })
	cmpBits(t, "SwiGLU edges", g1, g2)
	for _, nb := range []int{1, 2, 3, 24, 64} {
		for range 50 {
			x := randBytesVec(r, 32*nb)
			if r.IntN(4) == 0 {
				clear(x[:32])
			}
			if r.IntN(8) == 0 { // an infinity: scale +Inf, id 0, its quant the integer indefinite (-128)
				// (Not a NaN: Go's max keeps it in the portable amax, VMAXPS
				// may not, so both SIMD quantizers differ there.)
				x[r.IntN(len(x))] = float32(math.Inf(1 - 2*r.IntN(2)))
			}
			// Q8_0 (Q8_0's and Q4_0's activations) and Q8_1 (Q5_1's).
			for _, wt := range []ggml.Type{ggml.Q8_0, ggml.Q5_1} {
				bs := q80Bytes
				if wt == ggml.Q5_1 {
					bs = q81Bytes
				}
				got, want := make([]byte, nb*bs), make([]byte, nb*bs)
				convertActivation(wt, x, got)
				if err := ggml.QuantizeActivationRow(wt.VecDotType(), x, want); err != nil {
					t.Fatal(err)
				}
				for i := range got {
					if got[i] != want[i] {
						t.Fatalf("quantize for %s nb=%d: byte %d = %#x, want %#x", wt, nb, i, got[i], want[i])
					}
				}
			}
		}
	}
}

func cmpBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s n=%d: [%d] = %g (%08x), portable %g (%08x)", what, len(got), i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

// f16Edge are float32 bit patterns around every rounding decision of
// F32ToF16: the 13 (normal) or more (subnormal) dropped bits at, just
// below and just above the halfway point, with odd and even kept bits.
func f16Edge(r *rand.Rand) uint32 {
	hi := r.Uint32() &^ (1<<13 - 1)
	switch r.IntN(8) {
	case 0:
		return hi | 1<<12 // a tie
	case 1:
		return hi | (1<<12 - 1)
	case 2:
		return hi | (1<<12 + 1)
	case 3: // around f16's subnormal and overflow range
		e := uint32(101 + r.IntN(16))
		if r.IntN(2) == 0 {
			e = uint32(140 + r.IntN(5))
		}
		return r.Uint32()&0x807fffff | e<<23
	case 4: // NaNs and infinities, quiet and signalling
		return r.Uint32()&0x807fffff | 0x7f800000&^uint32(r.IntN(2))
	}
	return r.Uint32()
}

// TestF32ToF16EqualsVCVTPS2PH checks the SIMD f32→f16 conversion (KV.Store,
// the attention query) and f16 scaling against ggml.F32ToF16 and the f16
// table, bit for bit, on rounding ties, subnormals, overflow, infinities
// and NaNs. STRATA_EXHAUSTIVE=1 tries all 2^32 inputs.
func TestF32ToF16EqualsVCVTPS2PH(t *testing.T) {
	if !haveF16C {
		t.Skip("no F16C")
	}
	r := rand.New(rand.NewPCG(55, 56))
	defer func() { avx2Only = false }()
	check := func(src []float32) {
		// f32ToF16 as this CPU runs it, then with the AVX2 kernel.
		for _, avx2 := range []bool{false, true} {
			avx2Only = avx2
			got := make([]uint16, len(src))
			f32ToF16(got, src)
			for i, x := range src {
				if want := ggml.F32ToF16(x); got[i] != want {
					t.Fatalf("F32ToF16(%08x) (avx2Only %v): SIMD %04x, portable %04x", math.Float32bits(x), avx2, got[i], want)
				}
			}
		}
		avx2Only = false
	}
	for _, n := range []int{1, 5, 16, 17, 31, 64, 100, 1000} {
		for range 200 {
			src := make([]float32, n)
			for i := range src {
				src[i] = math.Float32frombits(f16Edge(r))
			}
			check(src)
			if !haveElementwise() {
				continue
			}
			h := make([]uint16, n)
			for i := range h {
				h[i] = uint16(r.Uint32())
			}
			scale := float32(r.NormFloat64())
			got, want := make([]float32, n), make([]float32, n)
			f16ScaleAVX512(n, &h[0], scale, &got[0])
			for i, a := range h {
				want[i] = f16Table[a] * scale
			}
			for i := range got {
				g, w := got[i], want[i]
				if math.Float32bits(g) != math.Float32bits(w) && !(g != g && w != w) {
					t.Fatalf("f16 %04x × %g: SIMD %g, portable %g", h[i], scale, g, w)
				}
			}
		}
	}
	if os.Getenv("STRATA_EXHAUSTIVE") == "" {
		return
	}
	src := make([]float32, 1<<16)
	got := make([]uint16, 1<<16)
	for hi := range 1 << 16 {
		for lo := range src {
			src[lo] = math.Float32frombits(uint32(hi)<<16 | uint32(lo))
		}
		f32ToF16(got, src)
		for i, x := range src {
			if want := ggml.F32ToF16(x); got[i] != want {
				t.Fatalf("F32ToF16(%08x): SIMD %04x, portable %04x", math.Float32bits(x), got[i], want)
			}
		}
	}
}
