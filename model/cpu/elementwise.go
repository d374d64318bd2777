package cpu

import (
	"math"
	"unsafe"

	"github.com/strata-llm/strata/model/ggml"
)

// Constants of expf: the limits past which it returns 0 and +Inf, 32/ln 2,
// the shift that rounds to an integer, and the polynomial of 2^(r/32).
const (
	expLo      = -0x1.9fe368p6 // below: 0 (e^x < 2^-150)
	expHi      = 0x1.62e42ep6  // above: +Inf
	expInvLn2N = 0x1.71547652b82fep+0 * 32
	expShift   = 0x1.8p+52
	expC0      = 0x1.c6af84b912394p-5 / 32 / 32 / 32
	expC1      = 0x1.ebfce50fac4f3p-3 / 32 / 32
	expC2      = 0x1.62e42ff0c52d6p-1 / 32
)

// expTable holds the bits of 2^(i/32), i < 32, less i<<47 (the exponent
// that expf adds back).
var expTable = [32]uint64{
	0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
	0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
	0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
	0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
	0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
	0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
	0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
	0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
}

// expf returns e^x rounded to float32 as glibc's expf (2.27 and later, from
// ARM's Optimized Routines) computes it, bit for bit, since ggml's flash
// attention calls the C library's expf for every key: in float64, k + r =
// x*32/ln 2 with k an integer (the shift trick, ties to even) and |r| <=
// 1/2; s = 2^(k/32) from expTable with k/32's integer part added to the
// exponent; e^x = s * (C0*r³ + C1*r² + C2*r + 1), the polynomial as
// fma(fma(C0, r, C1), r², fma(C2, r, 1)); one rounding to float32 at the end.
// Its error is below 0.502 ulp, so it is float32(e^x) correctly rounded but
// for about one argument in 1700 (checked against glibc 2.43 on 3 million
// arguments). The SIMD kernels compute the same.
func expf(x float32) float32 {
	switch {
	case x != x:
		return x + x
	case x < expLo:
		return 0
	case x > expHi:
		return float32(math.Inf(1))
	}
	z := float64(expInvLn2N * float64(x))
	kd := float64(z + expShift)
	ki := math.Float64bits(kd)
	r := z - (kd - expShift)
	s := math.Float64frombits(expTable[ki%32] + ki<<47)
	y := math.FMA(math.FMA(expC0, r, expC1), r*r, math.FMA(expC2, r, 1))
	return float32(y * s)
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
	switch {
	case n > 0 && haveElementwise():
		swigluAVX512(n, &gate[0], &up[0])
	case n > 0 && haveElementwiseAVX2():
		swigluAVX2(n, &gate[0], &up[0]) // eight lanes at a time: the same bits
	default:
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

// expSub sets dst[i] = expf(x[i] - sub). The attention's weights kernel
// (softmaxWeightsx{1,2}AVX512) computes its expf with expSubAVX512's code (expZ);
// expSub is how the tests hold that code to expf over every input range,
// the limits included.
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

// convertActivation is ConvertActivation with the SIMD Q8_0 and Q8_1
// quantizers where the CPU has them (the same bytes as
// ggml.QuantizeActivationRow).
func convertActivation(t ggml.Type, src []float32, dst []byte) {
	nb := len(src) / ggml.QK
	if nb > 0 && len(src)%ggml.QK == 0 {
		switch vt := t.VecDotType(); {
		case vt == ggml.Q8_0 && len(dst) == nb*q80Bytes && haveElementwise():
			quantQ80AVX512(nb, &src[0], unsafe.SliceData(dst))
			return
		case vt == ggml.Q8_0 && len(dst) == nb*q80Bytes && haveElementwiseAVX2():
			quantQ80AVX2(nb, &src[0], unsafe.SliceData(dst))
			return
		case vt == ggml.Q8_1 && len(dst) == nb*q81Bytes && haveElementwiseAVX2():
			quantQ81AVX2(nb, &src[0], unsafe.SliceData(dst)) // AVX-512 CPUs too: there is no other
			return
		}
	}
	ConvertActivation(t, src, dst)
}

// haveElementwise reports whether the AVX-512 element-wise kernels run
// (not under avx2Only, which stands for a CPU without AVX-512).
func haveElementwise() bool { return !portableOnly && !avx2Only && haveAVX512 }

// haveElementwiseAVX2 reports whether the AVX2 element-wise kernels (AVX2,
// FMA and F16C: SwiGLU, the Q8_0 and Q8_K quantizers, f32→f16) run where
// the AVX-512 ones do not (and the Q8_1 quantizer, which has no AVX-512
// version, wherever it is true).
func haveElementwiseAVX2() bool { return !portableOnly && haveF16C }
