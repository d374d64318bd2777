package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// blockAVX2Lanes is dotQ80Q80's order — ggml's, eight lanes — with AVX2:
// each output keeps eight float32 lanes in a YMM, lane l accumulating the
// exact integer sum of elements 4l..4l+3 of each block with acc =
// fma(float32(sum), f16(w.d)*f16(x.d), acc); at the end hsum8 folds them.
// The quants are sign-extended to int16, VPMADDWD sums the products in
// pairs and VPHADDD the pairs in fours, which leaves the lanes in the
// order 0 1 4 5 | 2 3 6 7; foldLanes reads them in that order. wquants
// loads the int16 weights of the block of row r (elements 0..15, 16..31).
func (t *tile) blockAVX2Lanes(wsz int, wquants func(r, disp int) (reg.VecVirtual, reg.VecVirtual)) {
	acc := make([][]reg.VecVirtual, t.R)
	for r := range acc {
		acc[r] = make([]reg.VecVirtual, t.C)
		for c := range acc[r] {
			acc[r][c] = YMM()
			VXORPS(acc[r][c], acc[r][c], acc[r][c])
		}
	}
	Label("loop")
	TESTQ(t.n, t.n)
	JZ(LabelRef("done"))
	xd := make([]reg.VecVirtual, t.C)
	for c := range xd {
		h := XMM()
		VPBROADCASTW(t.x(c, 0), h)
		xd[c] = YMM()
		VCVTPH2PS(h, xd[c])
	}
	for r := 0; r < t.R; r++ {
		wa, wb := wquants(r, 0)
		h := XMM()
		VPBROADCASTW(t.w(r, 0), h)
		wd := YMM()
		VCVTPH2PS(h, wd)
		for c := 0; c < t.C; c++ {
			xa, xb := YMM(), YMM()
			VPMOVSXBW(t.x(c, 2), xa)
			VPMOVSXBW(t.x(c, 18), xb)
			VPMADDWD(wa, xa, xa)
			VPMADDWD(wb, xb, xb)
			VPHADDD(xb, xa, xa) // lanes 0 1 4 5 | 2 3 6 7, each exact
			VCVTDQ2PS(xa, xa)
			dd := YMM()
			VMULPS(xd[c], wd, dd)
			VFMADD231PS(dd, xa, acc[r][c])
		}
	}
	t.advance(wsz, q80, 1)
	JMP(LabelRef("loop"))
	Label("done")
	op := param("out")
	os := param("os")
	for r := range acc {
		for c := range acc[r] {
			s := foldLanes(acc[r][c])
			if c == 0 {
				VMOVSS(s, Mem{Base: op, Disp: 4 * r})
			} else {
				VMOVSS(s, Mem{Base: op, Index: os, Scale: 1, Disp: 4 * r})
			}
		}
	}
}

// foldLanes is hsum8 (ggml's hsum_float_8: ((l0+l4)+(l2+l6)) +
// ((l1+l5)+(l3+l7))) of a YMM holding lanes l0 l1 l4 l5 | l2 l3 l6 l7, as
// blockAVX2Lanes leaves them; it returns an XMM whose lane 0 is the result.
func foldLanes(y reg.VecVirtual) reg.VecVirtual {
	lo, hi, t := XMM(), XMM(), XMM()
	VMOVAPS(y.AsX(), lo)
	VEXTRACTF128(Imm(1), y, hi)
	VMOVHLPS(lo, lo, t)
	VADDPS(t, lo, lo) // l0+l4, l1+l5
	VMOVHLPS(hi, hi, t)
	VADDPS(t, hi, hi) // l2+l6, l3+l7
	VADDPS(hi, lo, lo)
	VMOVSHDUP(lo, t)
	VADDSS(t, lo, lo)
	return lo
}
