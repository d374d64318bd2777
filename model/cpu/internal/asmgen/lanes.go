package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// blockAVX2Lanes is dotQ80Q80's order — ggml's, eight lanes — with AVX2,
// as ggml's own AVX2 code computes it: each output keeps eight float32
// lanes in a YMM, lane l accumulating the exact integer sum of elements
// 4l..4l+3 of each block with acc = fma(float32(sum), f16(w.d)*f16(x.d),
// acc); at the end hsum8 folds them (foldLanes). wbytes loads the 32
// weights of the block of row r as bytes in element order. With signed
// (weights -128..127), VPMADDUBSW multiplies the weights' magnitudes
// (VPABSB: 0..128, unsigned) by the activations with the weights' signs
// (VPSIGNB): exact for activation quants in -127..127, which is all the
// quantizer makes (see VecDot in package cpu); unsigned weights (Q5_1's
// 0..31) multiply the activations as they are. The pairs (at most
// 2*128*127) are summed in fours by VPMADDWD with ones. The activation
// blocks have xsz bytes with their 32 quants from byte xq (Q8_0: 34, 2;
// Q8_1: 36, 4). With mins (Q5_1's weights on Q8_1), a second accumulator
// per output adds ms = fma(f16(w.m), f16(x.s), ms) per block, w.m the f16
// at byte 2 of the weight block and x.s that of the activation block, and
// the result is hsum8(lanes) + ms: dotQ51Q81's order. This replaced
// sign-extending the quants to words and VPHADDD (0.59-0.82x llama.cpp's
// speed for Q8_0, Q5_0 and Q5_1 on an AVX2-only AMD EPYC, session 16).
func (t *tile) blockAVX2Lanes(wsz, xsz, xq int, mins, signed bool, wbytes func(r, disp int) reg.VecVirtual) {
	ones := bcastConstY(0x00010001)
	acc := make([][]reg.VecVirtual, t.R)
	for r := range acc {
		acc[r] = make([]reg.VecVirtual, t.C)
		for c := range acc[r] {
			acc[r][c] = YMM()
			VXORPS(acc[r][c], acc[r][c], acc[r][c])
		}
	}
	// With mins, lane 2c+1 of ms[r] is output (r, c)'s sum of the mins
	// terms (C <= 2), so that AVX2's 16 registers hold a 2×2 tile.
	ms := make([]reg.VecVirtual, t.R)
	if mins {
		for r := range ms {
			ms[r] = XMM()
			VXORPS(ms[r], ms[r], ms[r])
		}
	}
	Label("loop")
	TESTQ(t.n, t.n)
	JZ(LabelRef("done"))
	// The activations' f16 scales converted once a block, not once a row:
	// without mins dx[c] is column c's d in every lane; with mins xf is
	// columns 0 and 1's d and s in lanes 0..3, and each row's d and m are
	// converted together beside them, so that one VMULPS makes both
	// columns' products d·d and one VFMADD231PS adds m·s to lanes 1 and 3
	// (lanes 0 and 2 of ms gather nothing anyone reads).
	dx := make([]reg.VecVirtual, t.C)
	var xf reg.VecVirtual
	if mins {
		xf = XMM()
		VMOVD(t.x(0, 0), xf)
		if t.C > 1 {
			VPINSRD(Imm(1), t.x(1, 0), xf, xf)
		}
		VCVTPH2PS(xf, xf)
	} else {
		for c := range dx {
			dx[c] = YMM()
			VPBROADCASTW(t.x(c, 0), dx[c].AsX())
			VCVTPH2PS(dx[c].AsX(), dx[c])
		}
	}
	for r := 0; r < t.R; r++ {
		w := wbytes(r, 0)
		aw := w
		if signed {
			aw = YMM()
			VPABSB(w, aw)
		}
		dd := make([]reg.VecVirtual, t.C) // f16(w.d)*f16(x.d) of each column
		if mins {
			wf, p := XMM(), XMM()
			VPBROADCASTD(t.w(r, 0), wf)
			VCVTPH2PS(wf, wf)          // w.d, w.m, w.d, w.m
			VMULPS(xf, wf, p)          // lane 2c: w.d*x.d of column c
			VFMADD231PS(xf, wf, ms[r]) // lane 2c+1: w.m*x.s + ms, rounded once
			for c := range dd {
				dd[c] = YMM()
				if c == 0 {
					VBROADCASTSS(p, dd[c])
				} else {
					VMOVHLPS(p, p, dd[c].AsX())
					VBROADCASTSS(dd[c].AsX(), dd[c])
				}
			}
		} else {
			wd := YMM()
			VPBROADCASTW(t.w(r, 0), wd.AsX())
			VCVTPH2PS(wd.AsX(), wd)
			for c := range dd {
				dd[c] = YMM()
				VMULPS(dx[c], wd, dd[c])
			}
		}
		for c := 0; c < t.C; c++ {
			s := YMM()
			VMOVDQU(t.x(c, xq), s)
			if signed {
				VPSIGNB(w, s, s) // the activations times the weights' signs
			}
			VPMADDUBSW(s, aw, s)
			VPMADDWD(ones, s, s) // lane l: elements 4l..4l+3, exact
			VCVTDQ2PS(s, s)
			VFMADD231PS(dd[c], s, acc[r][c])
		}
	}
	t.advance(wsz, xsz, 1)
	JMP(LabelRef("loop"))
	Label("done")
	op := param("out")
	os := param("os")
	for r := range acc {
		for c := range acc[r] {
			s := foldLanes(acc[r][c])
			if mins {
				m := XMM()
				VPERMILPS(Imm(uint64(0x55*(2*c+1))), ms[r], m) // lane 2c+1
				VADDSS(m, s, s)
			}
			if c == 0 {
				VMOVSS(s, Mem{Base: op, Disp: 4 * r})
			} else {
				VMOVSS(s, Mem{Base: op, Index: os, Scale: 1, Disp: 4 * r})
			}
		}
	}
}

// foldLanes is hsum8 (ggml's hsum_float_8: ((l0+l4)+(l2+l6)) +
// ((l1+l5)+(l3+l7))) of a YMM of eight lanes in order; it returns an XMM
// whose lane 0 is the result.
func foldLanes(y reg.VecVirtual) reg.VecVirtual {
	lo, h := XMM(), XMM()
	VEXTRACTF128(Imm(1), y, lo)
	VADDPS(lo, y.AsX(), lo) // l0+l4, l1+l5, l2+l6, l3+l7
	VMOVHLPS(lo, lo, h)
	VADDPS(h, lo, lo) // (l0+l4)+(l2+l6), (l1+l5)+(l3+l7)
	VMOVSHDUP(lo, h)
	VADDSS(h, lo, lo)
	return lo
}

// xQ80Lanes is the bytes of one block of an activation row expanded for
// q80LanePanel: the float32 scale, eight int32 corrections (-128 times the
// sum of the quants of each group of four) and the 32 int8 quants.
const xQ80Lanes = 68

// q80LanePanel emits q80LanePanel_C: a 16-row Q8_0 panel (the layout of
// panelKernel's Q8_0 panels: per block the 16 f16 scales, then vector k
// holding elements 4k..4k+3 of row i, plus 128, in int32 lane i) against
// C activation rows expanded as xQ80Lanes says, in dotQ80Q80's order for
// every row: lane k of row i starts at the group's correction, VPDPBUSD
// adds the four products of the unsigned weight bytes with the broadcast
// activation bytes (the exact integer sum of the group), and acc[k] =
// fma(float32(sum), f16(w.d)*x.d, acc[k]); at the end acc folds as hsum8.
// Eight accumulators per activation row leave room for two rows at a time:
// the kernel streams the panel once per pair of rows (it stays in cache).
func q80LanePanel(C int) {
	panelText("q80LanePanel", "Q8_0", C, " in ggml's eight-lane order")
	for c0 := 0; c0 < C; c0 += 2 {
		cc := min(2, C-c0)
		nb, wp, xp, xm := panelGroup(c0, cc)
		acc := make([][8]reg.VecVirtual, cc)
		for c := range acc {
			for k := range 8 {
				acc[c][k] = ZMM()
				VXORPS(acc[c][k], acc[c][k], acc[c][k])
			}
		}
		loop, done := fmt.Sprintf("loop%d", c0), fmt.Sprintf("done%d", c0)
		Label(loop)
		TESTQ(nb, nb)
		JZ(LabelRef(done))
		prefetchAhead(wp, 32+8*64)
		wd := ZMM()
		VCVTPH2PS(Mem{Base: wp}, wd)
		dd := make([]reg.VecVirtual, cc)
		for c := range dd {
			dd[c] = ZMM()
			VMULPS_BCST(xm(c, 0), wd, dd[c])
		}
		for k := range 8 {
			wv := ZMM()
			VMOVDQU64(Mem{Base: wp, Disp: 32 + 64*k}, wv)
			for c := range cc {
				s := ZMM()
				VPBROADCASTD(xm(c, 4+4*k), s)
				vpdpbusdBcst(xm(c, 36+4*k), wv, s)
				VCVTDQ2PS(s, s)
				VFMADD231PS(dd[c], s, acc[c][k])
			}
		}
		ADDQ(U32(32+8*64), wp)
		ADDQ(Imm(xQ80Lanes), xp)
		DECQ(nb)
		JMP(LabelRef(loop))
		Label(done)
		out := panelOut(c0, cc)
		for c := range cc {
			a := acc[c]
			foldAccs(a)
			VMOVUPS(a[0], out(c))
		}
	}
	ret()
}

// panelGroup loads a panel kernel's parameters for its group of cc
// activation rows from c0, which kernels that keep many accumulators per
// row take a few at a time, streaming the panel once per group: the block
// count, the weights, and the activations advanced to row c0, with xm(c,
// disp) the address of byte disp of the group's row c (c < cc <= 4).
func panelGroup(c0, cc int) (nb, wp, xp reg.GPVirtual, xm func(c, disp int) Mem) {
	nb = param("nb")
	wp = param("w")
	xp = param("x")
	xs := param("xs")
	if c0 > 0 {
		off := GP64()
		IMUL3Q(Imm(uint64(c0)), xs, off)
		ADDQ(off, xp)
	}
	xs3 := times3("xs", cc)
	xm = func(c, disp int) Mem { return rowAt(xp, xs, xs3, c).Offset(disp) }
	return nb, wp, xp, xm
}

// times3 loads the stride parameter name times 3, for row 3 of a group of
// cc rows (no scaled index is 3), or returns nil where cc <= 3.
func times3(name string, cc int) reg.GPVirtual {
	if cc <= 3 {
		return nil
	}
	s3 := param(name)
	IMUL3Q(Imm(3), s3, s3)
	return s3
}

// rowAt is row c (0..3, 4 or 8) of a group at base with stride s (s3:
// three strides, for row 3).
func rowAt(base, s, s3 reg.GPVirtual, c int) Mem {
	switch c {
	case 0:
		return Mem{Base: base}
	case 3:
		return Mem{Base: base, Index: s3, Scale: 1}
	}
	return Mem{Base: base, Index: s, Scale: uint8(c)}
}

// foldAccs adds eight lane accumulators (one register a lane, as the VNNI
// panels keep them) into a[0] in ggml's hsum_float_8 order:
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
func foldAccs(a [8]reg.VecVirtual) {
	VADDPS(a[4], a[0], a[0])
	VADDPS(a[6], a[2], a[2])
	VADDPS(a[2], a[0], a[0])
	VADDPS(a[5], a[1], a[1])
	VADDPS(a[7], a[3], a[3])
	VADDPS(a[3], a[1], a[1])
	VADDPS(a[1], a[0], a[0])
}

// panelOut loads a panel kernel's output pointer for its group of cc
// activation rows from c0 (os bytes a row) and returns out(c), the output
// of the group's row c.
func panelOut(c0, cc int) (out func(c int) Mem) {
	op, os := param("out"), param("os")
	if c0 > 0 {
		off := GP64()
		IMUL3Q(Imm(uint64(c0)), os, off)
		ADDQ(off, op)
	}
	os3 := times3("os", cc)
	return func(c int) Mem { return rowAt(op, os, os3, c) }
}
