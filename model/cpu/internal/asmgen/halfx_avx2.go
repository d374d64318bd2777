package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// The AVX2 matrix kernels of f16 and bf16 weights with float32 activations
// (f16xAVX2, bf16xAVX2), as f16xAVX512 and bf16xAVX512 are on AVX-512: the
// activations arrive rounded to f16 or bf16 and widened back to float32
// (roundF16AVX2, roundBF16AVX2), so the loop converts only the weights —
// two conversions (bf16: two zero-extensions and two shifts) a step of 16
// elements where halfAVX2 spends four. On an AMD EPYC Zen 5 held to AVX2
// (STRATA_CPU=avx2), BenchmarkForward BF16 tg one thread ran 7.7 % faster
// with the float32 activations and the two-step loop below than with
// halfAVX2's (medians of per-round ratios over 10 alternated runs).

// halfxAVX2 is halfAVX2's order (dotF16's or dotBF16's: lane i%16 of two
// YMM halves, one FMA per element, the tail blended in as the masked
// AVX-512 FMA does) with float32 activations. A one-row tile (a
// matrix-vector product's, the rows kernels) runs two steps an iteration.
func halfxAVX2(t *tile, bf16 bool) {
	wload := func(m Mem, y reg.VecVirtual) {
		if bf16 {
			VPMOVZXWD(m, y)
			VPSLLD(Imm(16), y, y)
		} else {
			VCVTPH2PS(m, y)
		}
	}
	type pair struct{ lo, hi reg.VecVirtual }
	acc := make([][]pair, t.R)
	for r := range acc {
		acc[r] = make([]pair, t.C)
		for c := range acc[r] {
			acc[r][c] = pair{YMM(), YMM()}
			VXORPS(acc[r][c].lo, acc[r][c].lo, acc[r][c].lo)
			VXORPS(acc[r][c].hi, acc[r][c].hi, acc[r][c].hi)
		}
	}
	step := func(s int) {
		xv := make([]pair, t.C)
		for c := range xv {
			xv[c] = pair{YMM(), YMM()}
			VMOVUPS(t.x(c, 64*s), xv[c].lo)
			VMOVUPS(t.x(c, 64*s+32), xv[c].hi)
		}
		for r := 0; r < t.R; r++ {
			wlo, whi := YMM(), YMM()
			wload(t.w(r, 32*s), wlo)
			wload(t.w(r, 32*s+16), whi)
			for c := range xv {
				VFMADD231PS(wlo, xv[c].lo, acc[r][c].lo)
				VFMADD231PS(whi, xv[c].hi, acc[r][c].hi)
			}
		}
	}
	if t.R == 1 && t.C == 1 {
		Label("loopu")
		CMPQ(t.n, Imm(32))
		JL(LabelRef("loop"))
		step(0)
		step(1)
		t.advance(64, 128, 32)
		JMP(LabelRef("loopu"))
	}
	Label("loop")
	CMPQ(t.n, Imm(16))
	JL(LabelRef("tail"))
	step(0)
	t.advance(32, 64, 16)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(t.n, t.n)
	JZ(LabelRef("done"))
	// The weights' n halves copied to a zeroed 32-byte buffer a row (a
	// 16-half load could cross into an unmapped page); the activations'
	// lanes loaded under masks.
	buf := AllocLocal(32 * t.R)
	z := YMM()
	VXORPS(z, z, z)
	for r := 0; r < t.R; r++ {
		VMOVUPS(z, buf.Offset(32*r))
	}
	for r := 0; r < t.R; r++ {
		p := GP64()
		LEAQ(t.w(r, 0), p)
		j := GP64()
		XORQ(j, j)
		h := GP16()
		Label(fmt.Sprintf("copy%d", r))
		MOVW(Mem{Base: p, Index: j, Scale: 2}, h)
		dst := buf.Offset(32 * r)
		dst.Index, dst.Scale = j, 2
		MOVW(h, dst)
		INCQ(j)
		CMPQ(j, t.n)
		JL(LabelRef(fmt.Sprintf("copy%d", r)))
	}
	// Masks for lanes 0..n-1: maskTab + 4*(16-n).
	off := GP64()
	MOVQ(U32(16), off)
	SUBQ(t.n, off)
	tab := GP64()
	LEAQ(maskTab, tab)
	mlo, mhi := YMM(), YMM()
	VMOVDQU(Mem{Base: tab, Index: off, Scale: 4}, mlo)
	VMOVDQU(Mem{Base: tab, Index: off, Scale: 4, Disp: 32}, mhi)
	for r := 0; r < t.R; r++ {
		for hf, m := range []reg.VecVirtual{mlo, mhi} {
			w := YMM()
			wload(buf.Offset(32*r+16*hf), w)
			for c := 0; c < t.C; c++ {
				a := acc[r][c].lo
				if hf == 1 {
					a = acc[r][c].hi
				}
				x := YMM()
				VMASKMOVPS(t.x(c, 32*hf), m, x)
				VFMADD213PS(a, w, x)  // x = w*x + acc
				VBLENDVPS(m, x, a, a) // lanes in the tail take the FMA
			}
		}
	}
	Label("done")
	op := t.outPtr()
	os := t.outStride()
	for r := range acc {
		for c := range acc[r] {
			s := foldY(acc[r][c].lo, acc[r][c].hi)
			if c == 0 {
				VMOVSS(s, Mem{Base: op, Disp: 4 * r})
			} else {
				VMOVSS(s, Mem{Base: op, Index: os, Scale: 1, Disp: 4 * r})
			}
		}
	}
}

func f16xAVX2(t *tile)  { halfxAVX2(t, false) }
func bf16xAVX2(t *tile) { halfxAVX2(t, true) }

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
