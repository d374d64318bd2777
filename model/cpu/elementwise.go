package cpu

import (
	"math"
	"unsafe"

	"github.com/strata-llm/strata/model/ggml"
)

// Constants of expf.
const (
	expLo = -104.5 // expf(x) rounds to +0 below: e^-104.5 < 2^-150
	expHi = 89     // expf(x) overflows to +Inf above: e^89 > 2^128
	ln2Hi = math.Ln2
	ln2Lo = 2.3190468138462996e-17 // ln 2 - ln2Hi
)

// expC holds the Taylor coefficients 1/i! of e^r, i = 0..11.
var expC = func() (c [12]float64) {
	f := 1.0
	for i := range c {
		if i > 0 {
			f *= float64(i)
		}
		c[i] = 1 / f
	}
	return c
}()

// expf returns e^x rounded to float32, computed in float64 in an order the
// SIMD kernels reproduce bit for bit: x is clamped to [expLo, expHi]; k =
// round-to-even(x*log2(e)); r = fma(-k, ln2Lo, fma(-k, ln2Hi, x)); p is the
// degree-11 Taylor polynomial of e^r by Horner's rule with FMAs; the result
// is float32(p * 2^k). Its error before the final rounding is below 1e-15
// relative, so it is float32(e^x) correctly rounded but for rare ties.
func expf(x float32) float32 {
	if x != x {
		return x
	}
	h := min(max(float64(x), expLo), expHi)
	k := math.RoundToEven(h * math.Log2E)
	r := math.FMA(-k, ln2Hi, h)
	r = math.FMA(-k, ln2Lo, r)
	p := expC[11]
	for i := 10; i >= 0; i-- {
		p = math.FMA(p, r, expC[i])
	}
	return float32(math.Ldexp(p, int(k)))
}

// SwiGLU implements model.Backend: gate[i] = gate[i] / (1 + expf(-gate[i])) *
// up[i], each operation rounded to float32.
func (b *Backend) SwiGLU(gate, up []float32) {
	up = up[:len(gate)]
	if len(gate) == 0 {
		return
	}
	if haveElementwise() {
		swigluAVX512(len(gate), &gate[0], &up[0])
		return
	}
	for i, g := range gate {
		gate[i] = g / (1 + expf(-g)) * up[i]
	}
}

// expSub sets dst[i] = expf(x[i] - sub).
func expSub(dst, x []float32, sub float32) {
	dst = dst[:len(x)]
	if len(x) == 0 {
		return
	}
	if haveElementwise() {
		expSubAVX512(len(x), &x[0], sub, &dst[0])
		return
	}
	for i, v := range x {
		dst[i] = expf(v - sub)
	}
}

// convertActivation is ConvertActivation with the SIMD Q8_0 quantizer where
// the CPU has one (the same bytes as ggml.QuantizeActivationRow).
func convertActivation(t ggml.Type, src []float32, dst []byte) {
	if t.VecDotType() == ggml.Q8_0 && haveElementwise() && len(src)%ggml.QK == 0 && len(dst) == len(src)/ggml.QK*q80Bytes {
		if len(src) > 0 {
			quantQ80AVX512(len(src)/ggml.QK, &src[0], unsafe.SliceData(dst))
		}
		return
	}
	ConvertActivation(t, src, dst)
}

// haveElementwise reports whether the AVX-512 element-wise kernels run
// (not under avx2Only, which stands for a CPU without AVX-512).
func haveElementwise() bool { return !portableOnly && !avx2Only && haveAVX512 }
