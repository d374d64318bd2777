package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// lanePanelAVX2Consts is lanePanelAVX2's constants: 0x0f bytes at 0, 0x10
// bytes at 32, int16 ones at 64, 0x80 bytes at 96.
var lanePanelAVX2Consts *Mem

// lanePanelAVX2 emits q50PanelAVX2_C, q51PanelAVX2_C or q80PanelAVX2_C
// for typ "Q5_0", "Q5_1" or "Q8_0": the lane panels' order (q50Panel's,
// q80LanePanel's: dotQ50Q80's, dotQ51Q81's, dotQ80Q80's) with AVX2, for
// CPUs without AVX-512, which ran these types as 2×2 tiles on the stored
// rows — Q5_0 and Q5_1 decoding every block's fifth bits once a row
// (VPSHUFB, VPAND, VPCMPEQB), at 0.94-0.97× llama.cpp's generation for
// Q5_0 on an AMD EPYC Zen 3 (session 18).
//
// The panel's two halves of eight rows run one after the other, each over
// every block (the panel is read twice; it stays in cache). Q5_0 and Q5_1
// read the planes layout (repack_q5.go): weight vector v's bytes are its
// nibbles with bit v of the plane bytes moved to bit 4 and ORed in, the
// unsigned 5-bit quants, 0..31; VPMADDUBSW by the activation bytes (pairs
// at most 2*31*128) and VPMADDWD by ones make each row's lane sum,
// exactly, for any activation bytes, and Q5_0 adds the lane's correction
// (-16 times the sum of its activation quants, expandRow's) to make the
// sum of the signed quants' products. Q8_0's bytes (the quants plus 128)
// are XORed back to the signed quants, whose magnitudes (VPABSB: 0..128,
// unsigned) multiply the activations with the weights' signs (VPSIGNB:
// exact for activation quants in -127..127, all the quantizer makes; see
// VecDot), pairs at most 2*128*127: ggml's AVX2 form, as the Q8_0 tiles
// have it; no correction. Then acc[v] = fma(float32(sum), f16(w.d)*x.d,
// acc[v]); Q5_1 also ms = fma(f16(w.m), x.s, ms). At the end the lanes
// fold as hsum8 (foldAccs), plus ms. The constants are memory operands.
//
// Every accumulator lives in a register while the blocks run: one
// activation row keeps its eight; more rows are taken two at a time, each
// pair in two passes over the blocks of four weight vectors each (eight
// accumulators, the panel read again from cache, the pair's d products made
// again), which park their sums on the stack for the fold. Until session 24
// every row kept its eight accumulators on the stack (a load and a store
// around each FMA): on an AMD EPYC Zen 5 held to AVX2 eight rows ran at
// 0.63× the one-row kernel's rate per row, and Q8_0 prompts at 0.87-0.90×
// llama.cpp's haswell build; two rows at a time run 1.1× the one-row rate
// (BenchmarkPanel, Q8_0 C=8: 32.6 → 53.5 GMAC/s; four at a time, with their
// d products on the stack, 36.5).
//
// With vnni (q50PanelAVXVNNI_C, q51PanelAVXVNNI_C, q80PanelAVXVNNI_C: AVX2
// CPUs with AVX-VNNI) each row's lane sum starts at the lane's correction
// (Q5_0's -16, Q8_0's -128 times the sum of its activation quants; zero for
// Q5_1) and VPDPBUSD adds the products of the unsigned weight bytes (the
// 5-bit quants; Q8_0's quants plus 128, as stored) with the broadcast
// activation bytes: the same exact integer, so the same bits, in one
// instruction where AVX2 takes three (Q5_0, Q8_0's with the sign and the
// magnitude made once a weight vector) or two (Q5_1).
func lanePanelAVX2(C int, typ string, vnni bool) {
	one, q8 := typ == "Q5_1", typ == "Q8_0"
	name, what, size, po, qo := "q50PanelAVX2", "Q5_0", q50PanelBytes, 32, 96
	xsize, xq := xQ80Lanes, 36
	switch {
	case one:
		name, what, size, po, qo = "q51PanelAVX2", "Q5_1", q51PanelBytes, 64, 128
		xsize, xq = 40, 8
	case q8:
		name, what, size, qo = "q80PanelAVX2", "Q8_0", 16*34, 32
	}
	if lanePanelAVX2Consts == nil {
		m := constTable("lanePanelAVX2Consts", splat(0x0f0f0f0f), splat(0x10101010), splat(0x00010001), splat(0x80808080))
		lanePanelAVX2Consts = &m
	}
	k := *lanePanelAVX2Consts
	c0f, c10, ones, c80 := k, k.Offset(32), k.Offset(64), k.Offset(96)
	more := " with AVX2"
	if vnni {
		name, more = avxVNNIName(name)
	}
	panelTextAttr(0, name, what, C, more)
	var accS, msS Mem
	if C > 1 {
		accS = AllocLocal(256 * C) // row c's lane v at 256c + 32v
		if one {
			msS = AllocLocal(32 * C)
		}
	}
	halfLoop("half", func(hr reg.GPVirtual) {
		if C > 1 && one {
			z := YMM()
			VXORPS(z, z, z)
			for c := range C {
				VMOVUPS(z, msS.Offset(32*c))
			}
		}
		for c0 := 0; c0 < C; c0 += lanePanelGroup {
			cc := min(lanePanelGroup, C-c0)
			V := 8 / cc // weight vectors a pass: eight accumulators in registers
			msInRegs := one && cc == 1
			for v0 := 0; v0 < 8; v0 += V {
				nb, wp, xp, xm := panelGroup(c0, cc)
				var acc [lanePanelGroup][8]reg.VecVirtual // [row][v-v0]
				for c := range cc {
					for i := range V {
						acc[c][i] = YMM()
						VXORPS(acc[c][i], acc[c][i], acc[c][i])
					}
				}
				var ms reg.VecVirtual
				if msInRegs {
					ms = YMM()
					VXORPS(ms, ms, ms)
				}
				loop, done := fmt.Sprintf("loop%d_%d", c0, v0), fmt.Sprintf("done%d_%d", c0, v0)
				Label(loop)
				TESTQ(nb, nb)
				JZ(LabelRef(done))
				if c0 == 0 && v0 == 0 {
					prefetchAhead(wp, size)
				}
				wd := YMM()
				VCVTPH2PS(at(Mem{Base: wp}, hr, 2), wd)
				var wm reg.VecVirtual
				if one && v0 == 0 {
					wm = YMM()
					VCVTPH2PS(at(Mem{Base: wp, Disp: 32}, hr, 2), wm)
				}
				var dd [lanePanelGroup]reg.VecVirtual
				for c := range cc {
					dd[c] = YMM()
					VBROADCASTSS(xm(c, 0), dd[c])
					VMULPS(wd, dd[c], dd[c])
					if one && v0 == 0 {
						s := YMM()
						VBROADCASTSS(xm(c, 4), s)
						if msInRegs {
							VFMADD231PS(s, wm, ms)
						} else {
							a := YMM()
							VMOVUPS(msS.Offset(32*(c0+c)), a)
							VFMADD231PS(s, wm, a)
							VMOVUPS(a, msS.Offset(32*(c0+c)))
						}
					}
				}
				var pl reg.VecVirtual
				if !q8 {
					pl = YMM()
					VMOVDQU(at(Mem{Base: wp, Disp: po}, hr, 4), pl)
				}
				for v := v0; v < v0+V; v++ {
					w := YMM()
					var aw reg.VecVirtual
					if q8 {
						VMOVDQU(at(Mem{Base: wp, Disp: qo + 64*v}, hr, 4), w) // the quants plus 128
						if !vnni {
							VPXOR(c80, w, w) // the signed quants
							aw = YMM()
							VPABSB(w, aw)
						}
					} else {
						VMOVDQU(at(Mem{Base: wp, Disp: qo + 64*(v%4)}, hr, 4), w)
						if v >= 4 {
							VPSRLW(Imm(4), w, w)
						}
						VPAND(c0f, w, w)
						b := pl // bit v of the plane bytes, moved to bit 4
						switch {
						case v < 4:
							b = YMM()
							VPSLLW(Imm(uint64(4-v)), pl, b)
						case v > 4:
							b = YMM()
							VPSRLW(Imm(uint64(v-4)), pl, b)
						}
						t := YMM()
						VPAND(c10, b, t)
						VPOR(t, w, w)
					}
					for c := range cc {
						xb := YMM()
						VPBROADCASTD(xm(c, xq+4*v), xb)
						if vnni {
							sum := YMM()
							if one {
								VPXOR(sum, sum, sum)
							} else {
								VPBROADCASTD(xm(c, 4+4*v), sum) // the correction
							}
							vpdpbusdY(xb, w, sum)
							xb = sum
						} else if q8 {
							VPSIGNB(w, xb, xb) // the activation times the weight's sign
							VPMADDUBSW(xb, aw, xb)
						} else {
							VPMADDUBSW(xb, w, xb)
						}
						if !vnni {
							VPMADDWD(ones, xb, xb)
						}
						if !one && !q8 && !vnni {
							cr := YMM()
							VPBROADCASTD(xm(c, 4+4*v), cr)
							VPADDD(cr, xb, xb)
						}
						VCVTDQ2PS(xb, xb)
						VFMADD231PS(dd[c], xb, acc[c][v-v0])
					}
				}
				ADDQ(U32(uint32(size)), wp)
				ADDQ(U32(uint32(xsize)), xp)
				DECQ(nb)
				JMP(LabelRef(loop))
				Label(done)
				if C == 1 {
					op := param("out")
					LEAQ(at(Mem{Base: op}, hr, 4), op) // this half's eight outputs
					foldAccs(acc[0])
					if one {
						VADDPS(ms, acc[0][0], acc[0][0])
					}
					VMOVUPS(acc[0][0], Mem{Base: op})
					continue
				}
				for c := range cc {
					for i := range V {
						VMOVUPS(acc[c][i], accS.Offset(256*(c0+c)+32*(v0+i)))
					}
				}
				if msInRegs {
					VMOVUPS(ms, msS.Offset(32*c0))
				}
			}
		}
		if C == 1 {
			return
		}
		op, os := param("out"), param("os")
		LEAQ(at(Mem{Base: op}, hr, 4), op) // this half's eight outputs
		for c := range C {
			var a [8]reg.VecVirtual
			for v := range a {
				a[v] = YMM()
				VMOVUPS(accS.Offset(256*c+32*v), a[v])
			}
			foldAccs(a)
			if one {
				VADDPS(msS.Offset(32*c), a[0], a[0])
			}
			VMOVUPS(a[0], Mem{Base: op})
			if c+1 < C {
				ADDQ(os, op)
			}
		}
	})
	ret()
}

// lanePanelGroup is how many activation rows lanePanelAVX2 takes at a time:
// with two, a pass's eight accumulators, the pair's d products and the
// weight and activation vectors fit AVX2's sixteen registers.
const lanePanelGroup = 2

// constTable emits a read-only table of YMM constants named name, vector v
// at 32v.
func constTable(name string, vecs ...[8]uint32) Mem {
	m := GLOBL(name, RODATA|NOPTR)
	for v, vec := range vecs {
		for i, x := range vec {
			DATA(32*v+4*i, U32(x))
		}
	}
	return m
}

// splat is x in every dword of a YMM constant.
func splat(x uint32) [8]uint32 { return [8]uint32{x, x, x, x, x, x, x, x} }
