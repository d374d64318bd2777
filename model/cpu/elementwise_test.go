package cpu

import (
	"math"
	"math/rand/v2"
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
}

// TestElementwiseEqualsPortable checks the SIMD expSub, SwiGLU and Q8_0
// quantizer against the portable code bit for bit.
func TestElementwiseEqualsPortable(t *testing.T) {
	if !haveElementwise() {
		t.Skip("no AVX-512")
	}
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
	for _, nb := range []int{1, 2, 3, 24, 64} {
		for range 50 {
			x := randBytesVec(r, 32*nb)
			if r.IntN(4) == 0 {
				clear(x[:32])
			}
			got, want := make([]byte, nb*q80Bytes), make([]byte, nb*q80Bytes)
			convertActivation(ggml.Q8_0, x, got)
			if err := ggml.QuantizeActivationRow(ggml.Q8_0, x, want); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("quantize nb=%d: byte %d = %#x, want %#x", nb, i, got[i], want[i])
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
