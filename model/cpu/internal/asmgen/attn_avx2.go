package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// f16AccAVX2 emits the two element loops of Attend's portable online
// softmax with an f16 accumulator (softmaxValuesF16 in package cpu), for
// CPUs with AVX2, FMA and F16C, eight elements at a time (n a multiple of
// 8; the caller does the rest):
//
//	f16AxpyAVX2(n, acc, v, vs):  acc[i] = f16(fma(f32(v[i]), vs, f32(acc[i])))
//	f16RescaleAVX2(n, acc, ms):  acc[i] = f16(f32(acc[i]) * ms)
//
// f16 to float32 is exact, the FMA and the product round once, and
// VCVTPS2PH with round to nearest even (imm 0) is ggml.F32ToF16 for every
// input: the portable loops' bits.
func f16AccAVX2() {
	for _, axpy := range []bool{true, false} {
		name, sig := "f16RescaleAVX2", "func(n int, acc *uint16, ms float32)"
		if axpy {
			name, sig = "f16AxpyAVX2", "func(n int, acc *uint16, v *uint16, vs float32)"
		}
		TEXT(name, NOSPLIT, sig)
		Pragma("noescape")
		if axpy {
			Doc(name + " sets acc[i] = f16(fma(v[i], vs, acc[i])) for i < n (a multiple of 8).")
		} else {
			Doc(name + " sets acc[i] = f16(acc[i] * ms) for i < n (a multiple of 8).")
		}
		n := param("n")
		ap := param("acc")
		s := XMM()
		if axpy {
			Load(Param("vs"), s)
		} else {
			Load(Param("ms"), s)
		}
		b := YMM()
		VBROADCASTSS(s, b)
		vp := ap
		if axpy {
			vp = param("v")
		}
		Label("loop")
		TESTQ(n, n)
		JZ(LabelRef("done"))
		a := YMM()
		VCVTPH2PS(Mem{Base: ap}, a)
		if axpy {
			x := YMM()
			VCVTPH2PS(Mem{Base: vp}, x)
			VFMADD231PS(b, x, a) // a = x*vs + a, rounded once
			ADDQ(Imm(16), vp)
		} else {
			VMULPS(b, a, a)
		}
		VCVTPS2PH(Imm(0), a, Mem{Base: ap})
		ADDQ(Imm(16), ap)
		SUBQ(Imm(8), n)
		JMP(LabelRef("loop"))
		Label("done")
		ret()
	}
}

// scoreAVX2 emits func(hd int, k *byte, q *byte) float32: one key's f16
// attention score in attnDotF16's order (package cpu) for CPUs with AVX2,
// FMA and F16C, hd a multiple of 64: each group of 16 lanes is a pair of
// YMM registers, the groups fold as g0+g2, g1+g3, g0+g1, and the lanes as
// reduceLanes (upper eight onto lower, then four, two, one).
func scoreAVX2() {
	TEXT("scoreF16AVX2", NOSPLIT, "func(hd int, k *byte, q *byte) float32")
	Pragma("noescape")
	Doc("scoreF16AVX2 returns the f16 attention score of one key with q (hd a multiple of 64).")
	n := param("hd")
	kb := param("k")
	qb := param("q")
	var acc [4][2]reg.VecVirtual
	for g := range acc {
		for h := range acc[g] {
			acc[g][h] = YMM()
			VXORPS(acc[g][h], acc[g][h], acc[g][h])
		}
	}
	Label("loop")
	for g := range 4 {
		for h := range 2 {
			qy, ky := YMM(), YMM()
			VCVTPH2PS(Mem{Base: qb, Disp: 32*g + 16*h}, qy)
			VCVTPH2PS(Mem{Base: kb, Disp: 32*g + 16*h}, ky)
			VFMADD231PS(qy, ky, acc[g][h])
		}
	}
	ADDQ(Imm(128), qb)
	ADDQ(Imm(128), kb)
	SUBQ(Imm(64), n)
	JNZ(LabelRef("loop"))
	for h := range 2 {
		VADDPS(acc[2][h], acc[0][h], acc[0][h])
		VADDPS(acc[3][h], acc[1][h], acc[1][h])
		VADDPS(acc[1][h], acc[0][h], acc[0][h])
	}
	x := acc[0][0]
	VADDPS(acc[0][1], x, x) // lane j += lane j+8
	h4 := XMM()
	VEXTRACTF128(Imm(1), x, h4)
	VADDPS(h4, x.AsX(), h4) // += lane j+4
	h2 := XMM()
	VMOVHLPS(h4, h4, h2)
	VADDPS(h2, h4, h4) // += lane j+2
	h1 := XMM()
	VMOVSHDUP(h4, h1)
	VADDSS(h1, h4, h4) // += lane j+1
	Store(h4, ReturnIndex(0))
	ret()
}

// scoreTail emits func(n int, k *byte, q *byte, sum float64) float32: the
// last n%64 products of attnDotF16 (package cpu), added one by one in
// float64 to sum (the float64 of the first elements' lane sum), rounded to
// float32 at the end — ggml_vec_dot_f16's leftover loop. Each product of
// two f16 values is exact in float32 (VMULSS), so widening it is exact and
// the only roundings are the float64 additions, in element order. Scalar
// VEX code with F16C: AVX2 and AVX-512 machines both run it, so a head
// dimension that is not a multiple of 64 (8, 16, 96, 80…) no longer falls
// to the portable Go loop.
func scoreTail() {
	TEXT("scoreF16Tail", NOSPLIT, "func(n int, k *byte, q *byte, sum float64) float32")
	Pragma("noescape")
	Doc("scoreF16Tail adds the n products of the f16 values at k and q to sum in float64, in order, and rounds the total to float32.")
	n := param("n")
	kb := param("k")
	qb := param("q")
	s := XMM()
	Load(Param("sum"), s)
	g := GP32()
	a, b := XMM(), XMM()
	Label("loop")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	MOVWLZX(Mem{Base: kb}, g)
	VMOVD(g, a)
	VCVTPH2PS(a, a)
	MOVWLZX(Mem{Base: qb}, g)
	VMOVD(g, b)
	VCVTPH2PS(b, b)
	VMULSS(b, a, a)    // exact: f16 × f16 fits a float32
	VCVTSS2SD(a, a, a) // exact
	VADDSD(a, s, s)
	ADDQ(Imm(2), kb)
	ADDQ(Imm(2), qb)
	DECQ(n)
	JMP(LabelRef("loop"))
	Label("done")
	r := XMM()
	VCVTSD2SS(s, r, r)
	Store(r, ReturnIndex(0))
	ret()
}
