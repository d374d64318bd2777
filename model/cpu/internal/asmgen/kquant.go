package main

import (
	"fmt"
	"math"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// K-quant panel kernels. Q4_K and Q6_K weights are repacked
// (repack_kquant.go in package cpu) into panels of 16 rows, one 256-element
// super-block after another, each row's quants four to an int32 lane; the
// activation rows are Q8_K super-blocks expanded to xKBlock bytes (float32
// d, eight int16 32-element sums, sixteen int32 corrections -32 times each
// 16-element sum, the 256 quants). Both kernels keep the order of their
// portable kernels (dotQ4KQ8K, dotQ6KQ8K) for each of the 16 rows: an exact
// int32 sum per sub-block (VPDPBUSD of the unsigned weight quants with
// four activation quants broadcast), converted to float32 and multiplied
// by the sub-block's scale (both exact below 2^24), then one FMA into the
// row's accumulator with d = f16(w.d)*x.d; Q4_K's mins last, their int32
// sum by VPDPWSSD of the mins with the 32-element sums.
const (
	q4KPanelBytes = 2368
	q5KPanelBytes = q4KPanelBytes + 8*64 // Q4_K's panel, then the fifth bits' masks
	// The planes layout of Q5_K (the AVX2 kernels', and the VNNI ones'
	// without AMX): Q4_K's head, the eight plane vectors, then the nibbles,
	// so that a kernel reads each super-block front to back.
	q5KPlanes, q5KPlaneQuants = 320, 320 + 8*64
	q6KPanelBytes             = 3360
	iq4XSPanelBytes           = 32 + 8*16 + 8*256
	q2KPanelBytes             = 64 + 256 + 16*64
	q3KPanelBytes             = 32 + 256 + 16*64 + 16*32
	// Q3_K's high bits as planes, then its L vectors (repack_kquant.go).
	q3KPlanes, q3KL = 288, 288 + 8*64
	xKBlock         = 340
	xKSums          = 4
	xKCorr          = 20
	xKQuants        = 84
)

// vpdpwssdBcst emits VPDPWSSD with its second signed-word operand a dword
// in memory broadcast to every lane.
func vpdpwssdBcst(m Mem, u, acc Op) {
	Instruction(&ir.Instruction{
		Opcode:   "VPDPWSSD",
		Suffixes: []string{"BCST"},
		Operands: []Op{m, u, acc},
		Inputs:   []Op{m, u, acc},
		Outputs:  []Op{acc},
		ISA:      []string{"AVX512_VNNI"},
	})
}

// panelRowsX addresses the C activation rows of a panel kernel: x, x+xs,
// …, up to eight.
type panelRowsX struct {
	xp, xs, xs3, xp4 reg.GPVirtual
}

func newPanelRowsX(C int) *panelRowsX {
	p := &panelRowsX{xp: param("x"), xs: param("xs")}
	if C > 3 {
		p.xs3 = GP64()
		LEAQ(Mem{Base: p.xs, Index: p.xs, Scale: 2}, p.xs3)
	}
	if C > 4 {
		p.xp4 = GP64()
		LEAQ(Mem{Base: p.xp, Index: p.xs, Scale: 4}, p.xp4)
	}
	return p
}

// m returns the address of byte disp of activation row c.
func (p *panelRowsX) m(c, disp int) Mem {
	if c < 4 {
		return rowMem(p.xp, p.xs, p.xs3, c, disp)
	}
	return rowMem(p.xp4, p.xs, p.xs3, c-4, disp)
}

// advance moves the rows on by bytes (back, where negative).
func (p *panelRowsX) advance(bytes int) {
	for _, r := range []reg.GPVirtual{p.xp, p.xp4} {
		switch {
		case r == nil:
		case bytes < 0:
			SUBQ(U32(uint32(-bytes)), r)
		default:
			ADDQ(U32(uint32(bytes)), r)
		}
	}
}

// storePanel writes acc[c] (the panel's 16 outputs of activation row c) to
// out + c*os.
func storePanel(acc []reg.VecVirtual) {
	op := param("out")
	os := param("os")
	C := len(acc)
	var os3, op4 reg.GPVirtual
	if C > 3 {
		os3 = GP64()
		LEAQ(Mem{Base: os, Index: os, Scale: 2}, os3)
	}
	if C > 4 {
		op4 = GP64()
		LEAQ(Mem{Base: op, Index: os, Scale: 4}, op4)
	}
	for c := range acc {
		if c < 4 {
			VMOVUPS(acc[c], rowMem(op, os, os3, c, 0))
		} else {
			VMOVUPS(acc[c], rowMem(op4, os, os3, c-4, 0))
		}
	}
}

// bcastConst returns a ZMM with the dword v in every lane.
func bcastConst(v uint32) reg.VecVirtual {
	g := GP32()
	MOVL(U32(v), g)
	z := ZMM()
	VPBROADCASTD(g, z)
	return z
}

// panelHead emits a K-quant panel kernel's entry: its TEXT, the super-block
// count, the panel pointer, the activation rows and C zeroed accumulators.
func panelHead(name, what string, C int) (nb, wp reg.GPVirtual, px *panelRowsX, acc []reg.VecVirtual) {
	panelText(name, what, C, "")
	nb = param("nb")
	wp = param("w")
	px = newPanelRowsX(C)
	acc = make([]reg.VecVirtual, C)
	for c := range acc {
		acc[c] = ZMM()
		VXORPS(acc[c], acc[c], acc[c])
	}
	return nb, wp, px, acc
}

// rowScales returns, for each activation row c, f16(w.d)*x_c.d: the panel's
// 16 f16 values at w+off converted, times row c's float32 d, broadcast.
func rowScales(wp reg.GPVirtual, off int, px *panelRowsX, C int) []reg.VecVirtual {
	wd := ZMM()
	VCVTPH2PS(Mem{Base: wp, Disp: off}, wd)
	d := make([]reg.VecVirtual, C)
	for c := range d {
		d[c] = ZMM()
		VMULPS_BCST(px.m(c, 0), wd, d[c])
	}
	return d
}

// foldSum adds one sub-block's exact int32 sums s (row c's) into acc:
// acc = fma(float32(s) * scale, d, acc), the product exact.
func foldSum(s, scale, d, acc reg.VecVirtual) {
	VCVTDQ2PS(s, s)
	VMULPS(scale, s, s)
	VFMADD231PS(d, s, acc)
}

// q4KPanel emits q4KPanel_C, or q5KPanel_C when five is set. Per
// super-block: d for each row; for each sub-block s, its 16 scales widened
// to float32, the eight quant vectors of its nibbles (the low ones of
// sub-block pair s/2's bytes for even s, the high ones for odd s; Q5_K adds
// 16 to the bytes whose fifth bit its mask sets, with VPADDB under the
// mask, as q50Panel does), and for each activation row the int32 sum of
// eight VPDPBUSD (two chains of four when C <= 2, added at the end: the
// same integer) folded in with foldSum; then the mins: four VPDPWSSD of
// the rows' (min(2k), min(2k+1)) words with the row's 32-element sums, and
// acc = fma(-float32(mins), f16(w.dmin)*x.d, acc). Q5_K's order is
// Q4_K's (dotQ5KQ8K, dotQ4KQ8K).
//
// With planes (q5KPlanePanel_C, for CPUs without AMX, whose AMX kernel
// reads the masks): the fifth bits come from the panels' planes
// (repack_kquant.go), bit s of the plane's bytes shifted to bit 4 and
// ORed in under 0x10 by one VPTERNLOGD. On an AMD EPYC Zen 4 the masks
// held the mask kernel's matrix-vector product to a third of Q4_K's bytes
// per second (perf annotate of BenchmarkMatVec/Q5_K: most of the samples
// on the KMOVQ loads and the masked VPADDB after them).
func q4KPanel(C int, five, planes bool) {
	name, what, size := "q4KPanel", "Q4_K", q4KPanelBytes
	if five {
		name, what, size = "q5KPanel", "Q5_K", q5KPanelBytes
	}
	qoff := 320 // the nibbles
	if planes {
		name, qoff = "q5KPlanePanel", q5KPlaneQuants
	}
	nb, wp, px, acc := panelHead(name, what, C)
	c0f := bcastConst(0x0f0f0f0f)
	var c10 reg.VecVirtual
	if five {
		c10 = bcastConst(0x10101010)
	}
	zero := ZMM()
	VPXORD(zero, zero, zero)
	split := C <= 2
	Label("loop")
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	prefetchAhead(wp, size)
	d := rowScales(wp, 0, px, C)
	for s := range 8 {
		var v [8]reg.VecVirtual
		for j := range v {
			v[j] = ZMM()
			m := Mem{Base: wp, Disp: qoff + 512*(s/2) + 64*j}
			if s%2 == 0 {
				VPANDD(m, c0f, v[j])
			} else {
				VPSRLW(Imm(4), m, v[j])
				VPANDD(c0f, v[j], v[j])
			}
			switch {
			case planes:
				orPlaneBit(Mem{Base: wp, Disp: q5KPlanes + 64*j}, s, 4, c10, v[j])
			case five:
				k := K()
				KMOVQ(Mem{Base: wp, Disp: q4KPanelBytes + 64*s + 8*j}, k)
				VPADDB(c10, v[j], k, v[j])
			}
		}
		sc := ZMM()
		VPMOVZXBD(Mem{Base: wp, Disp: 64 + 16*s}, sc)
		VCVTDQ2PS(sc, sc)
		for c := range C {
			// Zeroed from zero, never from themselves: avo would take a
			// register that xors itself for one live across the loop.
			sum := ZMM()
			VPXORD(zero, zero, sum)
			var sum2 reg.VecVirtual
			if split {
				sum2 = ZMM()
				VPXORD(zero, zero, sum2)
			}
			for j := range v {
				a := sum
				if split && j%2 == 1 {
					a = sum2
				}
				vpdpbusdBcst(px.m(c, xKQuants+32*s+4*j), v[j], a)
			}
			if split {
				VPADDD(sum2, sum, sum)
			}
			foldSum(sum, sc, d[c], acc[c])
		}
	}
	var mv [4]reg.VecVirtual
	for k := range mv {
		mv[k] = ZMM()
		VPMOVZXBW(Mem{Base: wp, Disp: 192 + 32*k}, mv[k])
	}
	dmin := ZMM()
	VCVTPH2PS(Mem{Base: wp, Disp: 32}, dmin)
	for c := range C {
		mins := ZMM()
		VPXORD(zero, zero, mins)
		for k := range mv {
			vpdpwssdBcst(px.m(c, xKSums+4*k), mv[k], mins)
		}
		VCVTDQ2PS(mins, mins)
		dm := ZMM()
		VMULPS_BCST(px.m(c, 0), dmin, dm)
		VFNMADD231PS(dm, mins, acc[c]) // acc - mins*dm, rounded once
	}
	ADDQ(U32(uint32(size)), wp)
	px.advance(xKBlock)
	DECQ(nb)
	JMP(LabelRef("loop"))
	Label("done")
	storePanel(acc)
	ret()
}

// q6KPanel emits q6KPanel_C. Per super-block: d for each row; for each
// group g of 16 elements, the four weight vectors (elements 4k..4k+3 of
// the group, k < 4) rebuilt from A, B and H (low nibbles and high bit
// pairs; see repack_kquant.go), the 16 int8 scales widened to float32, and
// for each activation row the int32 sum started at the correction -32 times
// the group's activation sum (the quants are stored plus 32), four
// VPDPBUSD, folded in with foldSum.
func q6KPanel(C int) {
	nb, wp, px, acc := panelHead("q6KPanel", "Q6_K", C)
	m0f := bcastConst(0x0f0f0f0f)
	m33 := bcastConst(0x33333333)
	Label("loop")
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	prefetchAhead(wp, q6KPanelBytes)
	d := rowScales(wp, 0, px, C)
	// sel is VPTERNLOGD's bitwise m0f ? src : dst, dst = the register
	// operand: the low nibble of each byte from src, the high from dst.
	sel := func(src Op, dst reg.VecVirtual) { VPTERNLOGD(Imm(0xb8), src, m0f, dst) }
	for g := range 16 {
		base := 288 + 192*g
		A := Mem{Base: wp, Disp: base}
		B := Mem{Base: wp, Disp: base + 64}
		H := Mem{Base: wp, Disp: base + 128}
		// hlo keeps the high bits of elements k and 8+k at bits 0-1 and
		// 4-5 of each byte, hhi those of 4+k and 12+k at bits 2-3 and 6-7;
		// shifted into bits 4-5 with zeros above, they complete the
		// nibbles. Bits that a word shift carries across bytes land in
		// the low nibble, which sel takes from the nibble source.
		hlo, hhi := ZMM(), ZMM()
		VPANDD(H, m33, hlo)
		VPANDND(H, m33, hhi)
		w0 := ZMM()
		VPSLLW(Imm(4), hlo, w0)
		sel(A, w0)
		w1, a1 := ZMM(), ZMM()
		VPSLLW(Imm(2), hhi, w1)
		VPSRLW(Imm(4), A, a1)
		sel(a1, w1)
		w2 := hlo
		sel(B, w2)
		w3, b1 := ZMM(), ZMM()
		VPSRLW(Imm(2), hhi, w3)
		VPSRLW(Imm(4), B, b1)
		sel(b1, w3)
		w := [4]reg.VecVirtual{w0, w1, w2, w3}
		sc := ZMM()
		VPMOVSXBD(Mem{Base: wp, Disp: 32 + 16*g}, sc)
		VCVTDQ2PS(sc, sc)
		for c := range C {
			sum := ZMM()
			VPBROADCASTD(px.m(c, xKCorr+4*g), sum)
			for k := range w {
				vpdpbusdBcst(px.m(c, xKQuants+16*g+4*k), w[k], sum)
			}
			foldSum(sum, sc, d[c], acc[c])
		}
	}
	ADDQ(U32(q6KPanelBytes), wp)
	px.advance(xKBlock)
	DECQ(nb)
	JMP(LabelRef("loop"))
	Label("done")
	storePanel(acc)
	ret()
}

// iq4Table returns a ZMM holding, in each 16-byte lane, ggml's IQ4 levels
// plus 128 as unsigned bytes (1..241): VPSHUFB of a nibble vector with it
// gives the unsigned quants VPDPBUSD takes.
func iq4Table() reg.VecVirtual {
	t := ZMM()
	VBROADCASTI32X4(iq4UnsignedTable(), t)
	return t
}

// iq4Values is ggml's kvalues_iq4nl (ggml.IQ4Values).
var iq4Values = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// iq4Levels is the 16 levels plus 128, made by the first iq4Table.
var iq4Levels *Mem

// iq4XSPanel emits iq4XSPanel_C. Per super-block: d for each row; for each
// sub-block s, its 16 scales (minus 32) widened to float32, its four
// vectors of bytes split into low nibbles (elements 4j..4j+3) and high
// ones (16+4j..) and looked up in the levels plus 128, and for each
// activation row the int32 sum started at -128 times the sub-block's
// activation sum (four times the two 16-element corrections -32 times
// theirs), eight VPDPBUSD, folded in with foldSum: dotIQ4XSQ8K's order.
func iq4XSPanel(C int) {
	nb, wp, px, acc := panelHead("iq4XSPanel", "IQ4_XS", C)
	c0f := bcastConst(0x0f0f0f0f)
	tbl := iq4Table()
	split := C <= 2
	zero := ZMM()
	VPXORD(zero, zero, zero)
	Label("loop")
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	prefetchAhead(wp, iq4XSPanelBytes)
	d := rowScales(wp, 0, px, C)
	for s := range 8 {
		var v [8]reg.VecVirtual // v[2j] elements 4j.., v[2j+1] 16+4j..
		for j := range 4 {
			lo, hi := ZMM(), ZMM()
			m := Mem{Base: wp, Disp: 160 + 256*s + 64*j}
			VPSRLW(Imm(4), m, hi)
			VPANDD(m, c0f, lo)
			VPANDD(c0f, hi, hi)
			VPSHUFB(lo, tbl, lo)
			VPSHUFB(hi, tbl, hi)
			v[2*j], v[2*j+1] = lo, hi
		}
		sc := ZMM()
		VPMOVSXBD(Mem{Base: wp, Disp: 32 + 16*s}, sc)
		VCVTDQ2PS(sc, sc)
		for c := range C {
			sum := ZMM()
			VPBROADCASTD(px.m(c, xKCorr+4*(2*s)), sum)
			VPADDD_BCST(px.m(c, xKCorr+4*(2*s+1)), sum, sum)
			VPSLLD(Imm(2), sum, sum)
			var sum2 reg.VecVirtual
			if split {
				sum2 = ZMM()
				VPXORD(zero, zero, sum2)
			}
			for k, w := range v {
				a := sum
				if split && k%2 == 1 {
					a = sum2
				}
				xoff := 4 * (k / 2)
				if k%2 == 1 {
					xoff += 16
				}
				vpdpbusdBcst(px.m(c, xKQuants+32*s+xoff), w, a)
			}
			if split {
				VPADDD(sum2, sum, sum)
			}
			foldSum(sum, sc, d[c], acc[c])
		}
	}
	ADDQ(U32(iq4XSPanelBytes), wp)
	px.advance(xKBlock)
	DECQ(nb)
	JMP(LabelRef("loop"))
	Label("done")
	storePanel(acc)
	ret()
}

// q23KPanel emits q2KPanel_C, or q3KPanel_C when three is set: the
// K-quants of 2-bit parts (repack_kquant.go). Per super-block, for each
// group g of 16 elements: the four weight vectors, L shifted right by 2j
// and masked to two bits (Q3_K ORs in 4 where its high bit is set: bit g/2
// of plane vector 4(g%2)+j moved to bit 2, one VPTERNLOGD), the
// group's scales widened to int32 (Q2_K: the low nibbles; Q3_K: the int8
// scales minus 32), and for each activation row the group's exact sum
// (Q3_K starts it at -4 times the activations' sum: the 16-element
// correction -32 times it, shifted right by 3), four VPDPBUSD, times the
// scale (VPMULLD) added into the row's int32 isum. Then acc =
// fma(float32(isum), f16(w.d)*x.d, acc), and for Q2_K the mins: the sum
// over g of min(g) times the correction -32*sum16(g), shifted right by 5
// (exactly -summs), and acc = fma(float32(-summs), f16(w.dmin)*x.d, acc).
// That is dotQ2KQ8K's and dotQ3KQ8K's order for each row.
func q23KPanel(C int, three bool) {
	name, what, size, loff, scoff := "q2KPanel", "Q2_K", q2KPanelBytes, 320, 64
	if three {
		name, what, size, loff, scoff = "q3KPanel", "Q3_K", q3KPanelBytes, q3KL, 32
	}
	nb, wp, px, acc := panelHead(name, what, C)
	c03 := bcastConst(0x03030303)
	var c04, c0f reg.VecVirtual
	if three {
		c04 = bcastConst(0x04040404)
	} else {
		c0f = bcastConst(0x0000000f)
	}
	zero := ZMM()
	VPXORD(zero, zero, zero)
	Label("loop")
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	prefetchAhead(wp, size)
	isum := make([]reg.VecVirtual, C)
	for c := range isum {
		isum[c] = ZMM()
		VPXORD(zero, zero, isum[c])
	}
	for g := range 16 {
		var w [4]reg.VecVirtual
		L := Mem{Base: wp, Disp: loff + 64*g}
		for j := range w {
			w[j] = ZMM()
			if j == 0 {
				VPANDD(L, c03, w[j])
			} else {
				VPSRLW(Imm(uint64(2*j)), L, w[j])
				VPANDD(c03, w[j], w[j])
			}
			if three {
				orPlaneBit(Mem{Base: wp, Disp: q3KPlanes + 64*(4*(g%2)+j)}, g/2, 2, c04, w[j])
			}
		}
		sc := ZMM()
		if three {
			VPMOVSXBD(Mem{Base: wp, Disp: scoff + 16*g}, sc)
		} else {
			VPMOVZXBD(Mem{Base: wp, Disp: scoff + 16*g}, sc)
			VPANDD(c0f, sc, sc)
		}
		for c := range C {
			sum := ZMM()
			if three {
				VPBROADCASTD(px.m(c, xKCorr+4*g), sum)
				VPSRAD(Imm(3), sum, sum)
			} else {
				VPXORD(zero, zero, sum)
			}
			for j := range w {
				vpdpbusdBcst(px.m(c, xKQuants+16*g+4*j), w[j], sum)
			}
			VPMULLD(sc, sum, sum)
			VPADDD(sum, isum[c], isum[c])
		}
	}
	wd := ZMM()
	VCVTPH2PS(Mem{Base: wp}, wd)
	for c := range C {
		d := ZMM()
		VMULPS_BCST(px.m(c, 0), wd, d)
		VCVTDQ2PS(isum[c], isum[c])
		VFMADD231PS(d, isum[c], acc[c])
	}
	if !three {
		ms := isum // free again: the mins' sums take their registers
		for c := range ms {
			VPXORD(zero, zero, ms[c])
		}
		for g := range 16 {
			mn := ZMM()
			VPMOVZXBD(Mem{Base: wp, Disp: scoff + 16*g}, mn)
			VPSRLD(Imm(4), mn, mn)
			for c := range C {
				t := ZMM()
				VPMULLD_BCST(px.m(c, xKCorr+4*g), mn, t)
				VPADDD(t, ms[c], ms[c])
			}
		}
		VCVTPH2PS(Mem{Base: wp, Disp: 32}, wd)
		for c := range C {
			dm := ZMM()
			VMULPS_BCST(px.m(c, 0), wd, dm)
			VPSRAD(Imm(5), ms[c], ms[c])
			VCVTDQ2PS(ms[c], ms[c])
			VFMADD231PS(dm, ms[c], acc[c])
		}
	}
	ADDQ(U32(uint32(size)), wp)
	px.advance(xKBlock)
	DECQ(nb)
	JMP(LabelRef("loop"))
	Label("done")
	storePanel(acc)
	ret()
}

// foldLevelI is foldLevel for int32 lanes: out[i] = shuf(lo, in[2i+1],
// in[2i]) + shuf(hi, in[2i+1], in[2i]) with VPADDD (any order of integer
// additions gives the same sums).
func foldLevelI(in []reg.VecVirtual, shuf func(...Op), lo, hi uint8) []reg.VecVirtual {
	out := make([]reg.VecVirtual, len(in)/2)
	for i := range out {
		x, y := ZMM(), ZMM()
		shuf(Imm(uint64(lo)), in[2*i+1], in[2*i], x)
		shuf(Imm(uint64(hi)), in[2*i+1], in[2*i], y)
		out[i] = ZMM()
		VPADDD(y, x, out[i])
	}
	return out
}

// quantQ8KX emits func(nb int, x *float32, dst *byte): ggml's Q8_K
// activation quantization (quantize_row_q8_K_ref, as ggml.QuantizeRow
// computes it) of nb super-blocks of 256 floats, written straight into the
// expanded layout of the K-quant panel kernels (expandRowK in package cpu).
// Per super-block: mx is the first value of largest magnitude (NaNs never
// are), iscale = -127/mx, q = min(127, nearest_int(iscale*x)) (the float32
// product, plus 1.5*2^23, its low 23 bits minus 2^22) truncated to a byte,
// d = 1/iscale; an all-zero (or all-NaN) super-block is all zeros. The
// signed max and min of the values give mx unless both +amax and -amax
// occur; then the first value of magnitude amax is searched for. The
// 16-element sums of the stored quants (sign-extended bytes) are reduced
// sixteen at a time as scores16 reduces its keys.
func quantQ8KX() {
	TEXT("quantQ8KXAVX512", NOSPLIT, "func(nb int, x *float32, dst *byte)")
	Pragma("noescape")
	Doc("quantQ8KXAVX512 quantizes nb super-blocks of 256 activations to Q8_K in the K-quant panel kernels' expanded layout.")
	n := param("nb")
	x := param("x")
	dst := param("dst")
	perm := GLOBL("q8KSumsPerm", RODATA|NOPTR) // lane 4q+i (vector q+4i) to lane q+4i
	for k := range 16 {
		DATA(4*k, U32(uint32(4*(k%4)+k/4)))
	}
	absMask := bcastConst(0x7fffffff)
	magic := bcastConst(0x4b400000) // 1.5*2^23
	mant := bcastConst(0x007fffff)
	half := bcastConst(0x00400000)
	c127 := bcastConst(127)
	zero := ZMM()
	VPXORD(zero, zero, zero)
	g := GP32()
	MOVL(U32(math.Float32bits(-127)), g)
	m127 := XMM()
	VMOVD(g, m127)
	MOVL(U32(math.Float32bits(1)), g)
	one := XMM()
	VMOVD(g, one)
	xm := func(v int) Mem { return Mem{Base: x, Disp: 64 * v} }

	Label("loop")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	// Signed max and min, NaNs skipped: VMAXPS returns its second source
	// (the accumulator) when either is NaN.
	var hi, lo [2]reg.VecVirtual
	for i := range 2 {
		hi[i], lo[i] = ZMM(), ZMM()
		VMOVDQA64(zero, hi[i])
		VMOVDQA64(zero, lo[i])
	}
	for v := range 16 {
		z := ZMM()
		VMOVUPS(xm(v), z)
		VMAXPS(hi[v%2], z, hi[v%2])
		VMINPS(lo[v%2], z, lo[v%2])
	}
	VMAXPS(hi[1], hi[0], hi[0])
	VMINPS(lo[1], lo[0], lo[0])
	maxS := hmaxZ(hi[0], VMAXPS, VMAXSS)
	minS := hmaxZ(lo[0], VMINPS, VMINSS)
	amax, mx, is := q8KScale(maxS, minS, zero.AsX(), m127, one, dst)
	isz := ZMM()
	VBROADCASTSS(is, isz)
	q := make([]reg.VecVirtual, 16)
	for v := range 16 {
		t := ZMM()
		VMULPS(xm(v), isz, t)
		VADDPS(magic, t, t)
		VPANDD(mant, t, t)
		VPSUBD(half, t, t)
		VPMINSD(c127, t, t)
		VPMOVDB(t, Mem{Base: dst, Disp: xKQuants + 16*v})
		VPSLLD(Imm(24), t, t)
		VPSRAD(Imm(24), t, t)
		q[v] = t
	}
	z := foldLevelI(q, VSHUFI32X4, 0x44, 0xee)
	u := foldLevelI(z, VSHUFI32X4, 0x88, 0xdd)
	w := foldLevelI(u, VSHUFPS, 0x44, 0xee)
	s := foldLevelI(w, VSHUFPS, 0x88, 0xdd)[0]
	idx := ZMM()
	VMOVDQU32(perm, idx)
	VPERMD(s, idx, s) // lane g: the sum of the quants of group g
	corr := ZMM()
	VPSLLD(Imm(5), s, corr)
	VPSUBD(corr, zero, corr) // -32 times the sum
	VMOVDQU32(corr, Mem{Base: dst, Disp: xKCorr})
	pair := ZMM()
	VPSHUFD(Imm(0xb1), s, pair)
	VPADDD(s, pair, pair)                       // lane 2k: groups 2k and 2k+1
	VPMOVQW(pair, Mem{Base: dst, Disp: xKSums}) // the low word of each qword
	Label("next")
	ADDQ(U32(1024), x)
	ADDQ(U32(xKBlock), dst)
	DECQ(n)
	JMP(LabelRef("loop"))

	Label("zero")
	for off := 0; off+64 <= xKBlock; off += 64 {
		VMOVDQU64(zero, Mem{Base: dst, Disp: off})
	}
	VMOVDQU64(zero, Mem{Base: dst, Disp: xKBlock - 64})
	JMP(LabelRef("next"))

	// Both +amax and -amax occur: mx is the first value of magnitude amax.
	Label("tie")
	ab := ZMM()
	VBROADCASTSS(amax, ab)
	m := GP32()
	base := GP64()
	for v := range 16 {
		a := ZMM()
		VANDPS(xm(v), absMask, a)
		k := K()
		VCMPPS(Imm(0), ab, a, k) // |x| == amax, ordered
		KMOVW(k, m)
		MOVQ(U32(uint32(16*v)), base)
		TESTL(m, m)
		JNZ(LabelRef("found"))
	}
	Label("found")
	TZCNTL(m, m)
	ADDQ(m.As64(), base)
	VMOVSS(Mem{Base: x, Index: base, Scale: 4}, mx)
	JMP(LabelRef("quant"))

	Label("done")
	ret()
}

// q8KScale emits the Q8_K quantizers' scale from a super-block's signed
// max and min (NaNs skipped): amax = max(max, -min); mx = max when it has
// magnitude amax and -amax does not occur, min when only -amax does; an
// amax of 0 jumps to "zero", both signs to "tie", which must set mx and
// come back to "quant". There iscale = m127/mx (-127/mx) and d =
// one/iscale, stored at dst. It returns amax, mx and iscale.
func q8KScale(maxS, minS reg.VecVirtual, zero reg.Register, m127, one reg.VecVirtual, dst reg.GPVirtual) (amax, mx, is reg.VecVirtual) {
	negMin := XMM()
	VXORPS(negMin, negMin, negMin)
	VSUBSS(minS, negMin, negMin) // -min, exact
	amax = XMM()
	VMAXSS(negMin, maxS, amax)
	mx = XMM()
	VUCOMISS(zero, amax)
	JE(LabelRef("zero"))
	VUCOMISS(amax, maxS)
	JNE(LabelRef("negative"))
	VUCOMISS(amax, negMin)
	JE(LabelRef("tie"))
	VMOVAPS(maxS, mx)
	JMP(LabelRef("quant"))
	Label("negative")
	VMOVAPS(minS, mx)
	JMP(LabelRef("quant"))

	Label("quant")
	is = XMM()
	VDIVSS(mx, m127, is) // -127/mx
	d := XMM()
	VDIVSS(is, one, d) // 1/iscale
	VMOVSS(d, Mem{Base: dst})
	return amax, mx, is
}

// hmaxZ reduces the 16 lanes of z with op (VMAXPS or VMINPS; no NaNs) and
// returns an XMM whose lane 0 is the result.
func hmaxZ(z reg.VecVirtual, op, ops func(...Op)) reg.VecVirtual {
	y := YMM()
	VEXTRACTF64X4(Imm(1), z, y)
	op(y, z.AsY(), y)
	x := XMM()
	VEXTRACTF32X4(Imm(1), y, x)
	op(x, y.AsX(), x)
	h := XMM()
	VMOVHLPS(x, x, h)
	op(h, x, x)
	VMOVSHDUP(x, h)
	ops(h, x, x)
	return x
}

// The AVX2 K-quant panel kernels read the same panels as the VNNI ones, each
// 64-byte vector as two YMM halves (rows 0-7, rows 8-15), and keep the same
// order per row. VPMADDUBSW multiplies the unsigned weight quants with the
// signed activation quants in pairs, exactly: a pair sums at most
// 2*15*128 (Q4_K) or 2*63*128 (Q6_K) in magnitude, below int16's bound, and
// so do the int16 sums of eight Q4_K pairs or two Q6_K pairs taken before
// VPMADDWD widens them to int32 (by each row's scale in both words for
// Q4_K, which gives scale(s)*sum exactly; by ones for Q6_K). AVX2 has 16
// registers, so the accumulators and the rows' d live on the stack.

// bcastConstY returns a YMM with the dword v in every lane.
func bcastConstY(v uint32) reg.VecVirtual {
	g := GP32()
	MOVL(U32(v), g)
	y := YMM()
	VMOVD(g, y.AsX())
	VPBROADCASTD(y.AsX(), y)
	return y
}

// panelHeadAVX2 emits an AVX2 K-quant panel kernel's entry: the
// accumulators (row c's half h at acc + 64c + 32h) zeroed on the stack, and
// a stack slot of the same shape for the rows' d.
func panelHeadAVX2(name, what string, C int) (nb, wp reg.GPVirtual, px *panelRowsX, acc, d Mem) {
	return panelHeadAVX2More(name, what, C, " with AVX2")
}

// panelHeadAVX2More is panelHeadAVX2 with more after the doc's type.
func panelHeadAVX2More(name, what string, C int, more string) (nb, wp reg.GPVirtual, px *panelRowsX, acc, d Mem) {
	// Not NOSPLIT: 128*C bytes of stack pass the nosplit limit for C > 6.
	panelTextAttr(0, name, what, C, more)
	nb = param("nb")
	wp = param("w")
	px = newPanelRowsX(C)
	acc = AllocLocal(64 * C)
	d = AllocLocal(64 * C)
	z := YMM()
	VPXOR(z, z, z)
	for i := range 2 * C {
		VMOVDQU(z, acc.Offset(32*i))
	}
	return nb, wp, px, acc, d
}

// rowScalesAVX2 stores f16(w.d)*x_c.d for each activation row c and half h
// at d + 64c + 32h, the panel's f16 values at w+off.
func rowScalesAVX2(wp reg.GPVirtual, off int, px *panelRowsX, C int, d Mem) {
	for h := range 2 {
		wd := YMM()
		VCVTPH2PS(Mem{Base: wp, Disp: off + 16*h}, wd)
		for c := range C {
			t := YMM()
			VBROADCASTSS(px.m(c, 0), t)
			VMULPS(wd, t, t)
			VMOVUPS(t, d.Offset(64*c+32*h))
		}
	}
}

// fmaAcc does acc[c][h] = fma(v, d[c][h], acc[c][h]) on the stack slots;
// neg subtracts the product instead.
func fmaAcc(v reg.VecVirtual, dm Op, acc Mem, neg bool) {
	a := YMM()
	VMOVUPS(acc, a)
	if neg {
		VFNMADD231PS(dm, v, a)
	} else {
		VFMADD231PS(dm, v, a)
	}
	VMOVUPS(a, acc)
}

// halfLoop emits body once as a loop over the two halves of the panel's
// rows: hr is 0, then 8, so that an operand 32h bytes on is
// Mem{Index: hr, Scale: 4}, 16h bytes Scale 2 and 8h bytes Scale 1.
func halfLoop(label string, body func(hr reg.GPVirtual)) {
	hr := GP64()
	XORQ(hr, hr)
	Label(label)
	body(hr)
	ADDQ(Imm(8), hr)
	CMPQ(hr, Imm(16))
	JL(LabelRef(label))
}

// at returns m moved on by hr times scale bytes.
func at(m Mem, hr reg.GPVirtual, scale uint8) Mem {
	m.Index, m.Scale = hr, scale
	return m
}

// storePanelAVX2 copies the stacked accumulators to out + c*os.
func storePanelAVX2(C int, acc Mem) {
	op := param("out")
	os := param("os")
	for c := range C {
		for h := range 2 {
			t := YMM()
			VMOVUPS(acc.Offset(64*c+32*h), t)
			VMOVUPS(t, Mem{Base: op, Disp: 32 * h})
		}
		if c+1 < C {
			ADDQ(os, op)
		}
	}
}

// orPlaneBit ORs into w, in each byte, bit b of the plane vector at pm
// moved to bit to (c: 1<<to in every byte): a word shift where b != to
// (bits it carries across bytes land outside bit to, which c keeps alone)
// and one VPTERNLOGD, w | (t & c).
func orPlaneBit(pm Mem, b, to int, c, w reg.VecVirtual) {
	if b == to {
		VPTERNLOGD(Imm(0xf8), pm, c, w)
		return
	}
	t := ZMM()
	if b < to {
		VPSLLW(Imm(uint64(to-b)), pm, t)
	} else {
		VPSRLW(Imm(uint64(b-to)), pm, t)
	}
	VPTERNLOGD(Imm(0xf8), c, t, w)
}

// orPlaneBitAVX2 is orPlaneBit with AVX2 (a YMM half of the plane vector):
// a load, a shift, an AND and an OR.
func orPlaneBitAVX2(pm Mem, b, to int, c, w reg.VecVirtual) {
	t := YMM()
	if b == to {
		VPAND(pm, c, t)
	} else {
		VMOVDQU(pm, t)
		if b < to {
			VPSLLW(Imm(uint64(to-b)), t, t)
		} else {
			VPSRLW(Imm(uint64(b-to)), t, t)
		}
		VPAND(c, t, t)
	}
	VPOR(t, w, w)
}

// q5BitsAVX2 is the constants with which the AVX2 Q5_0 and Q5_1 tile
// kernels expand their blocks' high bits, made by the first: a VPSHUFB
// control that gives byte b of a broadcast dword the dword's byte b/8
// ([0:32)), the bits 1<<(b%8) ([32:64)) and 0x10 in every byte ([64:96)).
// With them a 32-bit mask (bit b for byte b: a Q5_0 block's qh) becomes
// 0x10 in the bytes whose bit is set.
var q5BitsAVX2 *Mem

func q5Bits() Mem {
	if q5BitsAVX2 == nil {
		m := GLOBL("q5BitsAVX2", RODATA|NOPTR)
		for b := range 96 { // in order: the assembler takes no other
			switch {
			case b < 32:
				DATA(b, U8(uint8(b/8)))
			case b < 64:
				DATA(b, U8(uint8(1)<<(b%8)))
			default:
				DATA(b, U8(0x10))
			}
		}
		q5BitsAVX2 = &m
	}
	return *q5BitsAVX2
}

// q4KPanelAVX2 emits q4KPanelAVX2_C: q4KPanel's order with AVX2; with
// five, q5KPanelAVX2_C for Q5_K, on the planes layout (the fifth bits in
// planes before the nibbles, repack_kquant.go): each nibble vector of
// sub-block s gets bit s of its plane vector's bytes, moved to bit 4 and
// masked, ORed in. A Q5_K quant times an activation quant, paired by
// VPMADDUBSW, is at most 2*31*128 in magnitude, so only four of them (not
// eight, as Q4_K's) are summed in int16; the first four vectors' sums,
// widened by VPMADDWD with the scale, wait on the stack for the last
// four's.
//
// For more than two activation rows the sub-blocks run as a loop over
// their four pairs (low and high nibbles of the same bytes), not unrolled:
// unrolled, the kernel for eight activation rows was 18 KB of code a
// super-block, more than an AMD Zen 3's op cache keeps beside the other
// kernels of a prompt, and ran at half the speed of Q4_0's 4 KB kernel
// (BenchmarkPanel, session 18). The pair loop moves the activation
// pointers on by 64 bytes a pair (back by 256 after it) and shifts the
// planes right by 2p (VPSRLW by a count kept on the stack) before the
// shift by 4 or 3 that puts bit 2p or 2p+1 at bit 4: one instruction more
// per weight vector than a fixed shift, which one or two rows (generation)
// do not pay: they keep the unrolled form.
//
// With vnni (q4KPanelAVXVNNI_C, q5KPanelAVXVNNI_C, C >= 2: AVX2 CPUs with
// AVX-VNNI) VPDPBUSD adds each row's products of the unsigned quants with
// the activation bytes into an int32 sum, all eight vectors of a sub-block
// (no int16 to keep apart: Q5_K needs no second part), in two chains
// (even and odd vectors, added at the end) for up to three rows, whose
// single chains would wait on the instruction's latency; VPMULLD by the
// scale then makes scale(s) times the exact sum, the integer VPMADDWD
// makes: the same bits.
func q4KPanelAVX2(C int, five, vnni bool) {
	name, what, size, qoff := "q4KPanelAVX2", "Q4_K", q4KPanelBytes, 320
	if five {
		name, what, size, qoff = "q5KPanelAVX2", "Q5_K", q5KPanelBytes, q5KPlaneQuants
	}
	more := " with AVX2"
	if vnni {
		name, more = avxVNNIName(name)
	}
	nb, wp, px, acc, dm := panelHeadAVX2More(name, what, C, more)
	chains := 1
	if vnni && C <= 3 {
		chains = 2
	}
	var part, count Mem
	var c10 reg.VecVirtual
	if five {
		if !vnni {
			part = AllocLocal(32 * C)
		}
		if C > 2 {
			count = AllocLocal(16) // the planes' shift, 2p, in the m128 VPSRLW reads
		}
		c10 = bcastConstY(0x10101010)
	}
	c0f := bcastConstY(0x0f0f0f0f)
	Label("loop")
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	prefetchAhead(wp, size)
	rowScalesAVX2(wp, 0, px, C, dm)
	// The sub-block pairs: a loop for more than two activation rows, where
	// weight vectors are shared; unrolled for one or two (generation's
	// matrix-vector products), where the planes' shift by a count costs
	// more than the code's size.
	pair := func(p int, ws, wq reg.GPVirtual, count Mem) {
		for k := range 2 { // sub-block s = 2p+k: the low nibbles, then the high
			halfLoop(fmt.Sprintf("sub%d", 2*max(p, 0)+k), func(hr reg.GPVirtual) {
				sc := YMM() // the rows' scale(s) in both words of their lane (VNNI: in the lane)
				VPMOVZXBD(at(Mem{Base: ws, Disp: 64 + 16*k}, hr, 1), sc)
				if !vnni {
					t := YMM()
					VPSLLD(Imm(16), sc, t)
					VPOR(t, sc, sc)
				}
				sum := make([]reg.VecVirtual, C)
				var sum2 []reg.VecVirtual
				if vnni {
					for c := range sum {
						sum[c] = YMM()
						VPXOR(sum[c], sum[c], sum[c])
					}
					if chains == 2 {
						sum2 = make([]reg.VecVirtual, C)
						for c := range sum2 {
							sum2[c] = YMM()
							VPXOR(sum2[c], sum2[c], sum2[c])
						}
					}
				}
				for j := range 8 {
					w := YMM()
					m := at(Mem{Base: wq, Disp: qoff + 64*j}, hr, 4)
					if k == 0 {
						VPAND(m, c0f, w)
					} else {
						VMOVDQU(m, w)
						VPSRLW(Imm(4), w, w)
						VPAND(c0f, w, w)
					}
					pm := at(Mem{Base: wp, Disp: q5KPlanes + 64*j}, hr, 4)
					switch {
					case five && p >= 0:
						orPlaneBitAVX2(pm, 2*p+k, 4, c10, w)
					case five:
						b := YMM()
						VMOVDQU(pm, b)
						VPSRLW(count, b, b)
						VPSLLW(Imm(uint64(4-k)), b, b)
						VPAND(c10, b, b)
						VPOR(b, w, w)
					}
					for c := range C {
						xb := YMM()
						VPBROADCASTD(px.m(c, xKQuants+64*max(p, 0)+32*k+4*j), xb)
						if vnni {
							a := sum[c]
							if chains == 2 && j%2 == 1 {
								a = sum2[c]
							}
							vpdpbusdY(xb, w, a)
							continue
						}
						VPMADDUBSW(xb, w, xb)
						if j == 0 || (five && j == 4) {
							sum[c] = xb
						} else {
							VPADDW(xb, sum[c], sum[c])
						}
					}
					if five && j == 3 && !vnni {
						for c := range C {
							VPMADDWD(sc, sum[c], sum[c])
							VMOVDQU(sum[c], part.Offset(32*c))
						}
					}
				}
				for c := range C {
					switch {
					case vnni:
						if chains == 2 {
							VPADDD(sum2[c], sum[c], sum[c])
						}
						VPMULLD(sc, sum[c], sum[c]) // scale(s) * the sub-block's sum
					case five:
						VPMADDWD(sc, sum[c], sum[c])
						VPADDD(part.Offset(32*c), sum[c], sum[c])
					default:
						VPMADDWD(sc, sum[c], sum[c])
					}
					VCVTDQ2PS(sum[c], sum[c])
					fmaAcc(sum[c], at(dm.Offset(64*c), hr, 4), at(acc.Offset(64*c), hr, 4), false)
				}
			})
		}
	}
	if C <= 2 {
		for p := range 4 {
			ws, wq := GP64(), GP64()
			LEAQ(Mem{Base: wp, Disp: 32 * p}, ws)
			LEAQ(Mem{Base: wp, Disp: 512 * p}, wq)
			pair(p, ws, wq, Mem{})
		}
	} else {
		ws, wq := GP64(), GP64() // wp + 32p (scales), wp + 512p (nibbles)
		MOVQ(wp, ws)
		MOVQ(wp, wq)
		if five {
			z := GP64()
			XORQ(z, z)
			MOVQ(z, count) // VPSRLW reads the low quadword
		}
		countLoop("pair", 4, func() {
			pair(-1, ws, wq, count)
			ADDQ(Imm(32), ws)
			ADDQ(U32(512), wq)
			px.advance(64)
			if five {
				ADDQ(Imm(2), count)
			}
		})
		px.advance(-256)
	}
	for h := range 2 {
		var mv [4]reg.VecVirtual
		for k := range mv {
			mv[k] = YMM()
			VPMOVZXBW(Mem{Base: wp, Disp: 192 + 32*k + 16*h}, mv[k])
		}
		wdm := YMM()
		VCVTPH2PS(Mem{Base: wp, Disp: 32 + 16*h}, wdm)
		for c := range C {
			var mins reg.VecVirtual
			for k := range mv {
				b := YMM()
				VPBROADCASTD(px.m(c, xKSums+4*k), b)
				VPMADDWD(mv[k], b, b)
				if k == 0 {
					mins = b
				} else {
					VPADDD(b, mins, mins)
				}
			}
			VCVTDQ2PS(mins, mins)
			dmin := YMM()
			VBROADCASTSS(px.m(c, 0), dmin)
			VMULPS(wdm, dmin, dmin)
			fmaAcc(mins, dmin, acc.Offset(64*c+32*h), true)
		}
	}
	ADDQ(U32(uint32(size)), wp)
	px.advance(xKBlock)
	DECQ(nb)
	JMP(LabelRef("loop"))
	Label("done")
	storePanelAVX2(C, acc)
	ret()
}

// countLoop emits body as a loop run n times (n > 0), counted down in a
// register of its own.
func countLoop(label string, n int, body func()) {
	cnt := GP64()
	MOVQ(U32(uint32(n)), cnt)
	Label(label)
	body()
	DECQ(cnt)
	JNZ(LabelRef(label))
}

// q6KPanelAVX2 emits q6KPanelAVX2_C: q6KPanel's order with AVX2. Without
// VPTERNLOGD each weight vector is (nibble & 0x0f) | (shifted high bits &
// 0x30). For more than two activation rows the 16 groups run as a loop
// (unrolled they made 19 KB of code for eight rows; see q4KPanelAVX2),
// the activation pointers moving on 16 bytes a group and the rows'
// corrections, which move on 4, copied to the stack first.
//
// With vnni (q6KPanelAVXVNNI_C, C >= 2: AVX2 CPUs with AVX-VNNI) each
// row's group sum starts at its correction and VPDPBUSD adds the products
// of the unsigned quants (0..63) with the activation bytes, in two chains
// for up to three rows (see q4KPanelAVX2): the same exact integer.
func q6KPanelAVX2(C int, vnni bool) {
	name, more := "q6KPanelAVX2", " with AVX2"
	if vnni {
		name, more = avxVNNIName(name)
	}
	nb, wp, px, acc, dm := panelHeadAVX2More(name, "Q6_K", C, more)
	m0f := bcastConstY(0x0f0f0f0f)
	m30 := bcastConstY(0x30303030)
	var ones reg.VecVirtual
	if !vnni {
		ones = bcastConstY(0x00010001)
	}
	looped := C > 2
	var corrs Mem
	if looped {
		corrs = AllocLocal(64 * C) // row c's 16 corrections at 64c
	}
	Label("loop")
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	prefetchAhead(wp, q6KPanelBytes)
	rowScalesAVX2(wp, 0, px, C, dm)
	// group emits group g's body (g < 0: the loop's, its offsets in wg, ws,
	// cg and the activation pointers).
	group := func(g int, wg, ws reg.GPVirtual, corr func(c int) Mem) {
		halfLoop(fmt.Sprintf("group%d", max(g, 0)), func(hr reg.GPVirtual) {
			a, b, hb := YMM(), YMM(), YMM()
			VMOVDQU(at(Mem{Base: wg, Disp: 288}, hr, 4), a)
			VMOVDQU(at(Mem{Base: wg, Disp: 288 + 64}, hr, 4), b)
			VMOVDQU(at(Mem{Base: wg, Disp: 288 + 128}, hr, 4), hb)
			join := func(lo reg.VecVirtual, shift int) reg.VecVirtual {
				hi := YMM()
				switch {
				case shift > 0:
					VPSLLW(Imm(uint64(shift)), hb, hi)
					VPAND(m30, hi, hi)
				case shift < 0:
					VPSRLW(Imm(uint64(-shift)), hb, hi)
					VPAND(m30, hi, hi)
				default:
					VPAND(m30, hb, hi)
				}
				VPOR(hi, lo, hi)
				return hi
			}
			nib := func(src reg.VecVirtual, high bool) reg.VecVirtual {
				v := YMM()
				if high {
					VPSRLW(Imm(4), src, v)
					VPAND(m0f, v, v)
				} else {
					VPAND(m0f, src, v)
				}
				return v
			}
			w := [4]reg.VecVirtual{
				join(nib(a, false), 4),
				join(nib(a, true), 2),
				join(nib(b, false), 0),
				join(nib(b, true), -2),
			}
			sc := YMM()
			VPMOVSXBD(at(Mem{Base: ws, Disp: 32}, hr, 1), sc)
			VCVTDQ2PS(sc, sc)
			for c := range C {
				if vnni {
					sum := YMM()
					VPBROADCASTD(corr(c), sum)
					var sum2 reg.VecVirtual
					if C <= 3 {
						sum2 = YMM()
						VPXOR(sum2, sum2, sum2)
					}
					for k := range w {
						xb := YMM()
						VPBROADCASTD(px.m(c, xKQuants+16*max(g, 0)+4*k), xb)
						a := sum
						if sum2 != nil && k%2 == 1 {
							a = sum2
						}
						vpdpbusdY(xb, w[k], a)
					}
					if sum2 != nil {
						VPADDD(sum2, sum, sum)
					}
					VCVTDQ2PS(sum, sum)
					VMULPS(sc, sum, sum)
					fmaAcc(sum, at(dm.Offset(64*c), hr, 4), at(acc.Offset(64*c), hr, 4), false)
					continue
				}
				var pair [2]reg.VecVirtual
				for k := range w {
					xb := YMM()
					VPBROADCASTD(px.m(c, xKQuants+16*max(g, 0)+4*k), xb)
					VPMADDUBSW(xb, w[k], xb)
					if k%2 == 0 {
						pair[k/2] = xb
					} else {
						VPADDW(xb, pair[k/2], pair[k/2])
					}
				}
				VPMADDWD(ones, pair[0], pair[0])
				VPMADDWD(ones, pair[1], pair[1])
				VPADDD(pair[1], pair[0], pair[0])
				cr := YMM()
				VPBROADCASTD(corr(c), cr)
				VPADDD(cr, pair[0], pair[0])
				VCVTDQ2PS(pair[0], pair[0])
				VMULPS(sc, pair[0], pair[0])
				fmaAcc(pair[0], at(dm.Offset(64*c), hr, 4), at(acc.Offset(64*c), hr, 4), false)
			}
		})
	}
	if !looped {
		for g := range 16 {
			wg, ws := GP64(), GP64()
			LEAQ(Mem{Base: wp, Disp: 192 * g}, wg)
			LEAQ(Mem{Base: wp, Disp: 16 * g}, ws)
			group(g, wg, ws, func(c int) Mem { return px.m(c, xKCorr+4*g) })
		}
	} else {
		for c := range C {
			for h := range 2 {
				t := YMM()
				VMOVDQU(px.m(c, xKCorr+32*h), t)
				VMOVDQU(t, corrs.Offset(64*c+32*h))
			}
		}
		wg, ws, cg := GP64(), GP64(), GP64() // wp + 192g, wp + 16g, 4g
		MOVQ(wp, wg)
		MOVQ(wp, ws)
		XORQ(cg, cg)
		Label("groups")
		group(-1, wg, ws, func(c int) Mem { return at(corrs.Offset(64*c), cg, 1) })
		ADDQ(U32(192), wg)
		ADDQ(Imm(16), ws)
		px.advance(16)
		ADDQ(Imm(4), cg)
		CMPQ(cg, Imm(64))
		JL(LabelRef("groups"))
		px.advance(-256)
	}
	ADDQ(U32(q6KPanelBytes), wp)
	px.advance(xKBlock)
	DECQ(nb)
	JMP(LabelRef("loop"))
	Label("done")
	storePanelAVX2(C, acc)
	ret()
}
