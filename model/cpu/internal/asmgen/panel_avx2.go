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
// and, as ggml's AVX2 code does, multiplies the levels' magnitudes
// (VPABSB, once a weight vector) by the activations with the levels' signs
// (VPSIGNB: exact for activation quants in -127..127, all the quantizer
// makes; see VecDot in package cpu), pairs at most 2*127*127, widened to
// int32 vector by vector (two would not fit int16); its exact sum needs no
// correction. Then, per row, acc = fma(float32(sum), f16(w.d)*x.d, acc),
// block by block. The activation rows are taken four at a time (the
// weight vectors made once for four rows), their accumulators on the
// stack where a group has more than two (in registers otherwise); the
// kernel streams the panel once per group (it stays in cache).
//
// With vnni (q40PanelAVXVNNI_C, iq4NLPanelAVXVNNI_C: AVX2 CPUs with
// AVX-VNNI) each row's block sum starts at the block's correction (-8 or
// -128 times the activations' sum, expandRow's) and VPDPBUSD adds the
// products of the unsigned quants (Q4_0's nibbles; IQ4_NL's levels plus
// 128, 1..241) with the broadcast activation bytes, four to an int32, one
// instruction where AVX2 takes two (Q4_0) or four (IQ4_NL): the same exact
// integer, so the same bits.
func q4PanelAVX2(C int, lut, vnni bool) {
	name, what, more := "q40PanelAVX2", "Q4_0", " with AVX2"
	if lut {
		name, what = "iq4NLPanelAVX2", "IQ4_NL"
	}
	if vnni {
		name, more = avxVNNIName(name)
	}
	panelText(name, what, C, more)
	const G = 4
	acc := AllocLocal(64 * G) // row c's half h at 64c + 32h
	for c0 := 0; c0 < C; c0 += G {
		cc := min(G, C-c0)
		nb, wp, xp, x := panelGroup(c0, cc)
		c0f := bcastConstY(0x0f0f0f0f)
		var ones reg.VecVirtual // VPMADDWD's, without VNNI
		if !vnni {
			ones = bcastConstY(0x00010001)
		}
		var tbl reg.VecVirtual
		switch {
		case lut && vnni:
			tbl = YMM()
			VBROADCASTI128(iq4UnsignedTable(), tbl)
		case lut:
			tbl = YMM()
			VBROADCASTI128(iq4SignedTable(), tbl)
		}
		// Up to two rows' accumulators stay in registers, more on the stack.
		inRegs := cc <= 2
		var accR [2][2]reg.VecVirtual // [row][half]
		if inRegs {
			for i := range 2 * cc {
				accR[i/2][i%2] = YMM()
				VXORPS(accR[i/2][i%2], accR[i/2][i%2], accR[i/2][i%2])
			}
		} else {
			z := YMM()
			VXORPS(z, z, z)
			for i := range 2 * cc {
				VMOVUPS(z, acc.Offset(32*i))
			}
		}
		loop, done := fmt.Sprintf("loop%d", c0), fmt.Sprintf("done%d", c0)
		Label(loop)
		TESTQ(nb, nb)
		JZ(LabelRef(done))
		prefetchAhead(wp, 32+4*64)
		for h := range 2 {
			var s, s2 [G]reg.VecVirtual
			if vnni {
				// Two sums a row, the low nibbles' and the high ones', added
				// at the end: two chains of VPDPBUSD, not one of eight
				// (its latency, not its throughput, bounded one chain).
				for c := range cc {
					s[c], s2[c] = YMM(), YMM()
					VPBROADCASTD(x(c, 4), s[c]) // the correction
					VPXOR(s2[c], s2[c], s2[c])
				}
			}
			for j := range 4 {
				q := YMM()
				VMOVDQU(Mem{Base: wp, Disp: 32 + 64*j + 32*h}, q)
				lo, hi := YMM(), YMM()
				VPAND(c0f, q, lo)
				VPSRLW(Imm(4), q, hi)
				VPAND(c0f, hi, hi)
				for k, w := range []reg.VecVirtual{lo, hi} {
					if vnni {
						if lut {
							VPSHUFB(w, tbl, w)
						}
						for c := range cc {
							xb := YMM()
							VPBROADCASTD(x(c, 8+4*j+16*k), xb)
							a := s[c]
							if k == 1 {
								a = s2[c]
							}
							vpdpbusdY(xb, w, a)
						}
						continue
					}
					var aw reg.VecVirtual
					if lut {
						VPSHUFB(w, tbl, w)
						aw = YMM()
						VPABSB(w, aw)
					}
					for c := range cc {
						xb := YMM()
						VPBROADCASTD(x(c, 8+4*j+16*k), xb)
						if lut {
							VPSIGNB(w, xb, xb) // the activation times the level's sign
							VPMADDUBSW(xb, aw, xb)
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
				if vnni {
					VPADDD(s2[c], s[c], s[c])
				}
				if !lut && !vnni {
					VPMADDWD(ones, s[c], s[c])
					corr := YMM()
					VPBROADCASTD(x(c, 4), corr)
					VPADDD(corr, s[c], s[c])
				}
				VCVTDQ2PS(s[c], s[c])
				m := YMM()
				VBROADCASTSS(x(c, 0), m)
				VMULPS(dw, m, m)
				if inRegs {
					VFMADD231PS(m, s[c], accR[c][h])
					continue
				}
				a := YMM()
				VMOVUPS(acc.Offset(64*c+32*h), a)
				VFMADD231PS(m, s[c], a)
				VMOVUPS(a, acc.Offset(64*c+32*h))
			}
		}
		ADDQ(U32(32+4*64), wp)
		ADDQ(Imm(xBlock), xp)
		DECQ(nb)
		JMP(LabelRef(loop))
		Label(done)
		out := panelOut(c0, cc)
		for c := range cc {
			o := out(c)
			for h := range 2 {
				if inRegs {
					VMOVUPS(accR[c][h], o.Offset(32*h))
					continue
				}
				t := YMM()
				VMOVUPS(acc.Offset(64*c+32*h), t)
				VMOVUPS(t, o.Offset(32*h))
			}
		}
	}
	ret()
}
