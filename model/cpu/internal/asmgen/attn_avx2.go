package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
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
