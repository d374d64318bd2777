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

// SwiGLU implements model.Backend as ggml's ggml_vec_swiglu_f32 computes it
// on AVX-512: each full group of 16 elements is gate[i] / (1 + vexpf(-gate[i]))
// * up[i] (vexpf: ggml_v_expf), the last len(gate)%16 are gate[i] / (1 +
// expf(-gate[i])) * up[i] (ggml calls the C library's expf there); each
// operation rounded to float32. Which elements take which exp depends only on
// the FFN width.
func (b *Backend) SwiGLU(gate, up []float32) {
	up = up[:len(gate)]
	n := len(gate) &^ 15
	if n > 0 && haveElementwise() {
		swigluAVX512(n, &gate[0], &up[0])
	} else {
		for i, g := range gate[:n] {
			gate[i] = g / (1 + vexpf(0-g)) * up[i]
		}
	}
	for i := n; i < len(gate); i++ {
		g := gate[i]
		gate[i] = g / (1 + expf(-g)) * up[i]
	}
}

// Constants of vexpf, ARM's optimized-routines expf as ggml_v_expf writes it.
const (
	vexpShift = 0x1.8p23      // adding it rounds to an integer
	vexpLog2E = 0x1.715476p+0 // log2(e)
	vexpLn2Hi = 0x1.62e4p-1   // ln 2, high part
	vexpLn2Lo = 0x1.7f7d1cp-20
	vexpC5    = 0x1.0e4020p-7
	vexpC4    = 0x1.573e2ep-5
	vexpC3    = 0x1.555e66p-3
	vexpC2    = 0x1.fffdb6p-2
	vexpC1    = 0x1.ffffecp-1
)

// vexpf is ggml_v_expf on AVX-512 (its SiLU's exp; max error 1.45 ulp +
// 0.5), one lane of it: n = round(x*log2(e)) by the shift trick, b = x -
// n*ln2 in two FMAs, j = 1 + b*C1 + b²*(C2 + b*C3) + b⁴*(C4 + b*C5) in the
// FMA order of ggml's source, the result j*2^n (VSCALEFPS: one rounding);
// |n| > 192 gives +Inf above and 0 below.
func vexpf(x float32) float32 {
	z := fma32(x, vexpLog2E, vexpShift)
	n := z - vexpShift
	b := fma32(-n, vexpLn2Lo, fma32(-n, vexpLn2Hi, x))
	u := float32(b * b)
	j := fma32(fma32(fma32(vexpC5, b, vexpC4), u, fma32(vexpC3, b, vexpC2)), u, fma32(vexpC1, b, 1))
	switch {
	case n != n:
		return n
	case n > 192:
		return float32(math.Inf(1))
	case n < -192:
		return 0
	}
	return float32(math.Ldexp(float64(j), int(n)))
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
