package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// q4PanelAVX2 emits q40PanelAVX2_C, or iq4NLPanelAVX2_C with lut:
// panelKernel's Q4_0 (IQ4_NL) panels and expanded activations, in its
// order, with AVX2 — for CPUs without AVX-512, which ran these types on
// their stored rows (2×2 tiles widening every byte to a word) at 0.3× of
// llama.cpp's repacked AVX2 kernels (AMD EPYC with AVX2 only, session 16).
//
// Each 64-byte panel vector is read as two YMM halves of eight rows.
// Q4_0: VPMADDUBSW multiplies the nibbles (0..15, unsigned) by the
// broadcast activation bytes (-128..127), pairs at most 2*15*128; the
// eight vectors of a block add up in int16 (at most 16*15*128 = 30720, so
// no sum saturates), VPMADDWD by ones widens each row's two words to its
// int32 sum, which adds to the block's correction (-8 times the
// activations' sum): the block's exact integer, as VPDPBUSD makes it.
// IQ4_NL looks the nibbles up in the signed levels (-127..113, VPSHUFB)
// and multiplies the activations' magnitudes (VPABSB, 0..128) by the
// levels with the activations' signs (VPSIGNB; no level is -128), pairs at
// most 2*127*128, widened to int32 vector by vector (two would not fit
// int16); its exact sum needs no correction. Then, per row, acc =
// fma(float32(sum), f16(w.d)*x.d, acc), block by block. The activation
// rows are taken two at a time, both halves' accumulators in registers;
// the kernel streams the panel once per pair (it stays in cache).
func q4PanelAVX2(C int, lut bool) {
	name, what := "q40PanelAVX2", "Q4_0"
	if lut {
		name, what = "iq4NLPanelAVX2", "IQ4_NL"
	}
	TEXT(fmt.Sprintf("%s_%d", name, C), NOSPLIT, panelSignature)
	Pragma("noescape")
	Doc(fmt.Sprintf("%s_%d computes a 16-row panel of %s weights against %d activation rows with AVX2.", name, C, what, C))
	for c0 := 0; c0 < C; c0 += 2 {
		cc := min(2, C-c0)
		nb, wp, xp, xm := panelGroup(c0)
		c0f := bcastConstY(0x0f0f0f0f)
		ones := bcastConstY(0x00010001)
		var tbl reg.VecVirtual
		if lut {
			tbl = YMM()
			VBROADCASTI128(iq4SignedTable(), tbl)
		}
		var acc [2][2]reg.VecVirtual // [half][row]
		for h := range 2 {
			for c := range cc {
				acc[h][c] = YMM()
				VXORPS(acc[h][c], acc[h][c], acc[h][c])
			}
		}
		loop, done := fmt.Sprintf("loop%d", c0), fmt.Sprintf("done%d", c0)
		Label(loop)
		TESTQ(nb, nb)
		JZ(LabelRef(done))
		for h := range 2 {
			var s [2]reg.VecVirtual
			for j := range 4 {
				q := YMM()
				VMOVDQU(Mem{Base: wp, Disp: 32 + 64*j + 32*h}, q)
				lo, hi := YMM(), YMM()
				VPAND(c0f, q, lo)
				VPSRLW(Imm(4), q, hi)
				VPAND(c0f, hi, hi)
				for k, w := range []reg.VecVirtual{lo, hi} {
					if lut {
						VPSHUFB(w, tbl, w)
					}
					for c := range cc {
						xb := YMM()
						VPBROADCASTD(xm(c, 8+4*j+16*k), xb)
						if lut {
							ax := YMM()
							VPABSB(xb, ax)
							VPSIGNB(xb, w, xb) // the level times the activation's sign
							VPMADDUBSW(xb, ax, xb)
							VPMADDWD(ones, xb, xb)
						} else {
							VPMADDUBSW(xb, w, xb)
						}
						switch {
						case j == 0 && k == 0:
							s[c] = xb
						case lut:
							VPADDD(xb, s[c], s[c])
						default:
							VPADDW(xb, s[c], s[c])
						}
					}
				}
			}
			dw := YMM()
			VCVTPH2PS(Mem{Base: wp, Disp: 16 * h}, dw)
			for c := range cc {
				if !lut {
					VPMADDWD(ones, s[c], s[c])
					corr := YMM()
					VPBROADCASTD(xm(c, 4), corr)
					VPADDD(corr, s[c], s[c])
				}
				VCVTDQ2PS(s[c], s[c])
				m := YMM()
				VBROADCASTSS(xm(c, 0), m)
				VMULPS(dw, m, m)
				VFMADD231PS(m, s[c], acc[h][c])
			}
		}
		ADDQ(U32(32+4*64), wp)
		ADDQ(Imm(xBlock), xp)
		DECQ(nb)
		JMP(LabelRef(loop))
		Label(done)
		op, os := panelOut(c0)
		for c := range cc {
			for h := range 2 {
				VMOVUPS(acc[h][c], outRow(op, os, c).Offset(32*h))
			}
		}
	}
	ret()
}
