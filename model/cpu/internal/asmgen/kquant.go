package main

import (
	"fmt"

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
	q6KPanelBytes = 3360
	xKBlock       = 340
	xKSums        = 4
	xKCorr        = 20
	xKQuants      = 84
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

func (p *panelRowsX) advance(bytes int) {
	ADDQ(U32(uint32(bytes)), p.xp)
	if p.xp4 != nil {
		ADDQ(U32(uint32(bytes)), p.xp4)
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
	TEXT(fmt.Sprintf("%s_%d", name, C), NOSPLIT, panelSignature)
	Pragma("noescape")
	Doc(fmt.Sprintf("%s_%d computes a 16-row panel of %s weights against %d activation rows.", name, C, what, C))
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

// q4KPanel emits q4KPanel_C. Per super-block: d for each row; for each
// sub-block s, its 16 scales widened to float32, the eight quant vectors of
// its nibbles (the low ones of sub-block pair s/2's bytes for even s, the
// high ones for odd s), and for each activation row the int32 sum of
// eight VPDPBUSD (two chains of four when C <= 2, added at the end: the
// same integer) folded in with foldSum; then the mins: four VPDPWSSD of
// the rows' (min(2k), min(2k+1)) words with the row's 32-element sums, and
// acc = fma(-float32(mins), f16(w.dmin)*x.d, acc).
func q4KPanel(C int) {
	nb, wp, px, acc := panelHead("q4KPanel", "Q4_K", C)
	c0f := bcastConst(0x0f0f0f0f)
	zero := ZMM()
	VPXORD(zero, zero, zero)
	split := C <= 2
	Label("loop")
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	d := rowScales(wp, 0, px, C)
	for s := range 8 {
		var v [8]reg.VecVirtual
		for j := range v {
			v[j] = ZMM()
			m := Mem{Base: wp, Disp: 320 + 512*(s/2) + 64*j}
			if s%2 == 0 {
				VPANDD(m, c0f, v[j])
			} else {
				VPSRLW(Imm(4), m, v[j])
				VPANDD(c0f, v[j], v[j])
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
	ADDQ(U32(q4KPanelBytes), wp)
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
