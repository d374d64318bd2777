package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// The AVX2 roundings of float32 activations to f16 and bf16 for the
// matrix kernels that take them as float32 (f16xAVX2 and bf16xAVX2 in
// main.go), as roundF16 and roundBF16 are for the AVX-512 ones.

// roundLoopAVX2 emits the loop of func(n int, src, dst *float32), 8
// elements at a time and then one at a time (VMOVSS, the other lanes zero):
// round turns the YMM of src's elements into dst's.
func roundLoopAVX2(round func(y reg.VecVirtual)) {
	n := param("n")
	src := param("src")
	dst := param("dst")
	y := YMM()
	Label("loop")
	CMPQ(n, Imm(8))
	JL(LabelRef("tail"))
	VMOVUPS(Mem{Base: src}, y)
	round(y)
	VMOVUPS(y, Mem{Base: dst})
	ADDQ(Imm(32), src)
	ADDQ(Imm(32), dst)
	SUBQ(Imm(8), n)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	VMOVSS(Mem{Base: src}, y.AsX())
	round(y)
	VMOVSS(y.AsX(), Mem{Base: dst})
	ADDQ(Imm(4), src)
	ADDQ(Imm(4), dst)
	DECQ(n)
	JMP(LabelRef("tail"))
	Label("done")
	ret()
}

// roundF16AVX2 emits roundF16AVX512's function with F16C: VCVTPS2PH with
// round to nearest even, then VCVTPH2PS.
func roundF16AVX2() {
	TEXT("roundF16AVX2", NOSPLIT, "func(n int, src *float32, dst *float32)")
	Pragma("noescape")
	Doc("roundF16AVX2 sets dst[i] = ggml.F16ToF32(ggml.F32ToF16(src[i])) for i < n.")
	roundLoopAVX2(func(y reg.VecVirtual) {
		VCVTPS2PH(Imm(0), y, y.AsX())
		VCVTPH2PS(y.AsX(), y)
	})
}

// roundBF16AVX2 emits roundBF16AVX512's function with AVX2: b + 0x7fff +
// (b>>16 & 1) with the low half cleared for a number; for a NaN (|b| >
// 0x7f800000, a signed compare, as |b| < 2^31), b with the quiet bit set
// and the low half cleared.
func roundBF16AVX2() {
	TEXT("roundBF16AVX2", NOSPLIT, "func(n int, src *float32, dst *float32)")
	Pragma("noescape")
	Doc("roundBF16AVX2 sets dst[i] = ggml.BF16ToF32(ggml.F32ToBF16(src[i])) for i < n.")
	c := func(v uint32) reg.VecVirtual {
		g := GP32()
		MOVL(U32(v), g)
		x := XMM()
		VMOVD(g, x)
		y := YMM()
		VPBROADCASTD(x, y)
		return y
	}
	one, bias, hi, abs, inf, quiet := c(1), c(0x7fff), c(0xffff0000), c(0x7fffffff), c(0x7f800000), c(0x400000)
	roundLoopAVX2(func(y reg.VecVirtual) {
		r := YMM()
		VPSRLD(Imm(16), y, r)
		VPAND(one, r, r)
		VPADDD(bias, r, r)
		VPADDD(y, r, r)
		a := YMM()
		VPAND(abs, y, a)
		VPCMPGTD(inf, a, a) // |b| > inf: a NaN
		q := YMM()
		VPOR(quiet, y, q)
		VBLENDVPS(a, q, r, r) // the NaNs take b | quiet
		VPAND(hi, r, y)
	})
}
