package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// AVX2 panel kernels for Q2_K, Q3_K and IQ4_XS: the VNNI kernels' panels
// (q23KPanel, iq4XSPanel) read as q4KPanelAVX2 reads Q4_K's, each 64-byte
// vector as two YMM halves of eight rows, in the same order per row.

// wordPair makes each dword lane of sc, a sign- or zero-extended byte,
// hold its value in both 16-bit words, for VPMADDWD.
func wordPair(sc reg.VecVirtual) {
	t := YMM()
	VPSLLD(Imm(16), sc, t)
	VPBLENDW(Imm(0xaa), t, sc, sc) // the odd words from t
}

// q23KPanelAVX2 emits q2KPanelAVX2_C, or q3KPanelAVX2_C when three is set:
// q23KPanel's order with AVX2. For each half of the panel's rows and each
// group g of 16 elements: the four weight vectors (L shifted right by 2j,
// masked to two bits; Q3_K ORs in 4 where its high bit is set: bit g/2 of
// plane vector 4(g%2)+j moved to bit 2 and masked), and for each activation row the int16 sums
// of four VPMADDUBSW (weights 0..7 times activations -128..127: at most
// 4*2*7*128 in magnitude), Q3_K's correction -4 times the group's
// activation sum (at most 8192 in magnitude) added to the low word of each
// lane, widened by VPMADDWD with the group's scale in both words, which
// is scale(g) times the group's exact sum; those add into the row's int32
// isum on the stack. Then acc = fma(float32(isum), f16(w.d)*x.d, acc), and
// for Q2_K the mins as q23KPanel computes them (VPMULLD of each min with
// the group's correction -32 times its sum, the total shifted right by 5),
// acc = fma(float32(-summs), f16(w.dmin)*x.d, acc).
//
// For more than two activation rows the groups run as a loop over their
// eight pairs (unrolled they made 17-18 KB of code for eight rows; see
// q4KPanelAVX2): the activation pointers move on 32 bytes a pair, the rows'
// corrections are copied to the stack first, isum starts at zero, and
// Q3_K's plane bit p moves to bit 2 by a shift count kept on the stack.
//
// With vnni (q2KPanelAVXVNNI_C, q3KPanelAVXVNNI_C, C >= 2: AVX2 CPUs with
// AVX-VNNI) each row's group sum starts at Q3_K's correction (-4 times the
// group's activation sum; zero for Q2_K) and VPDPBUSD adds the products of
// the four weight vectors (0..3, Q3_K's 0..7) with the activation bytes;
// VPMULLD by the group's scale then makes scale(g) times the exact sum, the
// integer VPMADDWD makes: the same bits, one instruction a vector and row
// where AVX2 takes two, and none of the int16 correction's three.
func q23KPanelAVX2(C int, three, vnni bool) {
	name, what, size, loff, scoff := "q2KPanelAVX2", "Q2_K", q2KPanelBytes, 320, 64
	if three {
		name, what, size, loff, scoff = "q3KPanelAVX2", "Q3_K", q3KPanelBytes, q3KL, 32
	}
	more := " with AVX2"
	if vnni {
		name, more = avxVNNIName(name)
	}
	nb, wp, px, acc, dm := panelHeadAVX2More(name, what, C, more)
	isum := AllocLocal(32 * C)
	looped := C > 2
	var corrs, count Mem
	if looped {
		corrs = AllocLocal(64 * C) // row c's 16 corrections at 64c
		if three {
			count = AllocLocal(16) // the plane bit p, in the m128 VPSRLW reads
		}
	}
	c03 := bcastConstY(0x03030303)
	var c04, lowW, c0f reg.VecVirtual
	if three {
		c04 = bcastConstY(0x04040404)
		if !vnni {
			lowW = bcastConstY(0x0000ffff)
		}
	} else {
		c0f = bcastConstY(0x0000000f)
	}
	Label("loop")
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	prefetchAhead(wp, size)
	rowScalesAVX2(wp, 0, px, C, dm)
	if looped {
		for c := range C {
			for h := range 2 {
				t := YMM()
				VMOVDQU(px.m(c, xKCorr+32*h), t)
				VMOVDQU(t, corrs.Offset(64*c+32*h))
			}
		}
	}
	halfLoop("half", func(hr reg.GPVirtual) {
		// group emits the group k groups on from wg, ws and the activation
		// pointers: its L, scales and quants; planeBit ORs in Q3_K's high
		// bits, corr is row c's correction, and first stores isum
		// without adding.
		group := func(k int, wg, ws reg.GPVirtual, planeBit func(j int, w reg.VecVirtual), corr func(c int) Mem, first bool) {
			L := YMM()
			VMOVDQU(at(Mem{Base: wg, Disp: loff + 64*k}, hr, 4), L)
			var w [4]reg.VecVirtual
			for j := range w {
				w[j] = YMM()
				if j == 0 {
					VPAND(c03, L, w[j])
				} else {
					VPSRLW(Imm(uint64(2*j)), L, w[j])
					VPAND(c03, w[j], w[j])
				}
				if three {
					planeBit(j, w[j])
				}
			}
			sc := YMM()
			if three {
				VPMOVSXBD(at(Mem{Base: ws, Disp: scoff + 16*k}, hr, 1), sc)
			} else {
				VPMOVZXBD(at(Mem{Base: ws, Disp: scoff + 16*k}, hr, 1), sc)
				VPAND(c0f, sc, sc)
			}
			if !vnni {
				wordPair(sc)
			}
			for c := range C {
				if vnni {
					sum := YMM()
					if three {
						VPBROADCASTD(corr(c), sum)
						VPSRAD(Imm(3), sum, sum)
					} else {
						VPXOR(sum, sum, sum)
					}
					for j := range w {
						xb := YMM()
						VPBROADCASTD(px.m(c, xKQuants+16*k+4*j), xb)
						vpdpbusdY(xb, w[j], sum)
					}
					VPMULLD(sc, sum, sum)
					if !first {
						VPADDD(isum.Offset(32*c), sum, sum)
					}
					VMOVDQU(sum, isum.Offset(32*c))
					continue
				}
				var sum reg.VecVirtual
				for j := range w {
					xb := YMM()
					VPBROADCASTD(px.m(c, xKQuants+16*k+4*j), xb)
					VPMADDUBSW(xb, w[j], xb)
					if j == 0 {
						sum = xb
					} else {
						VPADDW(xb, sum, sum)
					}
				}
				if three {
					cr := YMM()
					VPBROADCASTD(corr(c), cr)
					VPSRAD(Imm(3), cr, cr)
					VPAND(lowW, cr, cr)
					VPADDW(cr, sum, sum)
				}
				VPMADDWD(sc, sum, sum)
				if !first {
					VPADDD(isum.Offset(32*c), sum, sum)
				}
				VMOVDQU(sum, isum.Offset(32*c))
			}
		}
		var wg, ws, cg reg.GPVirtual
		if !looped {
			for g := range 16 {
				group(g, wp, wp, func(j int, w reg.VecVirtual) {
					orPlaneBitAVX2(at(Mem{Base: wp, Disp: q3KPlanes + 64*(4*(g%2)+j)}, hr, 4), g/2, 2, c04, w)
				}, func(c int) Mem { return px.m(c, xKCorr+4*g) }, g == 0)
			}
		} else {
			z := YMM()
			VPXOR(z, z, z)
			for c := range C {
				VMOVDQU(z, isum.Offset(32*c))
			}
			wg, ws, cg = GP64(), GP64(), GP64() // wp + 128p, wp + 32p, 8p
			MOVQ(wp, wg)
			MOVQ(wp, ws)
			XORQ(cg, cg)
			if three {
				MOVQ(cg, count)
			}
			Label("pairs")
			for k := range 2 { // group g = 2p+k
				group(k, wg, ws, func(j int, w reg.VecVirtual) {
					t := YMM()
					VMOVDQU(at(Mem{Base: wp, Disp: q3KPlanes + 64*(4*k+j)}, hr, 4), t)
					VPSRLW(count, t, t)
					VPSLLW(Imm(2), t, t)
					VPAND(c04, t, t)
					VPOR(t, w, w)
				}, func(c int) Mem { return at(corrs.Offset(64*c+4*k), cg, 1) }, false)
			}
			ADDQ(U32(128), wg)
			ADDQ(Imm(32), ws)
			px.advance(32)
			if three {
				ADDQ(Imm(1), count)
			}
			ADDQ(Imm(8), cg)
			CMPQ(cg, Imm(64))
			JL(LabelRef("pairs"))
			px.advance(-256)
		}
		for c := range C {
			s := YMM()
			VCVTDQ2PS(isum.Offset(32*c), s)
			fmaAcc(s, at(dm.Offset(64*c), hr, 4), at(acc.Offset(64*c), hr, 4), false)
		}
		if three {
			return
		}
		// The mins: ms[c] = sum over g of min(g) * corr(c, g).
		ms := make([]reg.VecVirtual, C)
		mins := func(g int, ws reg.GPVirtual, corr func(c int) Mem, first bool) {
			mn := YMM()
			VPMOVZXBD(at(Mem{Base: ws, Disp: scoff + 16*g}, hr, 1), mn)
			VPSRLD(Imm(4), mn, mn)
			for c := range C {
				t := YMM()
				VPBROADCASTD(corr(c), t)
				VPMULLD(mn, t, t)
				if first {
					ms[c] = t
				} else {
					VPADDD(t, ms[c], ms[c])
				}
			}
		}
		if !looped {
			for g := range 16 {
				mins(g, wp, func(c int) Mem { return px.m(c, xKCorr+4*g) }, g == 0)
			}
		} else {
			for c := range C {
				ms[c] = YMM()
				VPXOR(ms[c], ms[c], ms[c])
			}
			MOVQ(wp, ws)
			XORQ(cg, cg)
			Label("mins")
			mins(0, ws, func(c int) Mem { return at(corrs.Offset(64*c), cg, 1) }, false)
			ADDQ(Imm(16), ws)
			ADDQ(Imm(4), cg)
			CMPQ(cg, Imm(64))
			JL(LabelRef("mins"))
		}
		wdm := YMM()
		VCVTPH2PS(at(Mem{Base: wp, Disp: 32}, hr, 2), wdm)
		for c := range C {
			VPSRAD(Imm(5), ms[c], ms[c])
			VCVTDQ2PS(ms[c], ms[c])
			dmin := YMM()
			VBROADCASTSS(px.m(c, 0), dmin)
			VMULPS(wdm, dmin, dmin)
			fmaAcc(ms[c], dmin, at(acc.Offset(64*c), hr, 4), false)
		}
	})
	ADDQ(U32(uint32(size)), wp)
	px.advance(xKBlock)
	DECQ(nb)
	JMP(LabelRef("loop"))
	Label("done")
	storePanelAVX2(C, acc)
	ret()
}

// iq4XSPanelAVX2 emits iq4XSPanelAVX2_C: iq4XSPanel's order with AVX2.
// The nibbles are looked up in the signed levels (-127..113, VPSHUFB).
// VPMADDUBSW needs one unsigned operand and its pairs must stay within
// int16: it takes the activations' magnitudes (VPABSB: 0..128, unsigned)
// and the levels with the activations' signs (VPSIGNB: a level is never
// -128, so its negation is exact), each pair at most 2*127*128 in
// magnitude; VPMADDWD with the sub-block's scale in both words widens
// every vector's pairs to int32 at once, and their sum is scale(s) times
// the sub-block's exact sum, folded in with one fma per row as foldSum
// does. The activation rows are taken four at a time, each group
// rebuilding the weight vectors, so that the sums stay in registers.
//
// For more than two activation rows the sub-blocks run as a loop (see
// q4KPanelAVX2), the activation pointers moving on 32 bytes a sub-block.
//
// With vnni (iq4XSPanelAVXVNNI_C, C >= 2: AVX2 CPUs with AVX-VNNI) the
// nibbles are looked up in the levels plus 128 (1..241, unsigned) and each
// row's sub-block sum starts at -128 times its activations' sum (four times
// the two 16-element corrections, as iq4XSPanel does) and VPDPBUSD adds
// the products, two chains (the low nibbles', the high ones') added at the
// end; VPMULLD by the scales makes scale(s) times the exact sum, the
// integer VPMADDWD makes: the same bits, one instruction a vector and row
// where AVX2 takes five. In the loop a second set of activation pointers
// moves on 8 bytes a sub-block, over the corrections.
func iq4XSPanelAVX2(C int, vnni bool) {
	name, more := "iq4XSPanelAVX2", " with AVX2"
	if vnni {
		name, more = avxVNNIName(name)
	}
	nb, wp, px, acc, dm := panelHeadAVX2More(name, "IQ4_XS", C, more)
	c0f := bcastConstY(0x0f0f0f0f)
	tbl := YMM()
	if vnni {
		VBROADCASTI128(iq4UnsignedTable(), tbl)
	} else {
		VBROADCASTI128(iq4SignedTable(), tbl)
	}
	// corr(c, s) is the address of the first of activation row c's two
	// corrections of sub-block s (s = 0 in the loop, pc moving on).
	var pc *panelRowsX
	corr := func(c, s int) Mem { return px.m(c, xKCorr+8*s) }
	if vnni && C > 2 {
		pc = &panelRowsX{xp: GP64(), xs: px.xs, xs3: px.xs3}
		corr = func(c, s int) Mem { return pc.m(c, xKCorr) }
	}
	Label("loop")
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	prefetchAhead(wp, iq4XSPanelBytes)
	rowScalesAVX2(wp, 0, px, C, dm)
	// sub emits the sub-block s on from ws (scales, 16 bytes a sub-block),
	// wq (quants, 256) and the activation pointers (32).
	sub := func(s int, ws, wq reg.GPVirtual) {
		halfLoop(fmt.Sprintf("sub%d", s), func(hr reg.GPVirtual) {
			sc := YMM()
			VPMOVSXBD(at(Mem{Base: ws, Disp: 32 + 16*s}, hr, 1), sc)
			if !vnni {
				wordPair(sc)
			}
			for c0 := 0; c0 < C; c0 += 4 {
				cs := min(4, C-c0)
				sum := make([]reg.VecVirtual, cs)
				sum2 := make([]reg.VecVirtual, cs)
				if vnni {
					for i := range cs {
						sum[i], sum2[i] = YMM(), YMM()
						t := YMM()
						VPBROADCASTD(corr(c0+i, s), sum[i])
						VPBROADCASTD(corr(c0+i, s).Offset(4), t)
						VPADDD(t, sum[i], sum[i])
						VPSLLD(Imm(2), sum[i], sum[i])
						VPXOR(sum2[i], sum2[i], sum2[i])
					}
				}
				for j := range 4 {
					q := YMM()
					VMOVDQU(at(Mem{Base: wq, Disp: 160 + 256*s + 64*j}, hr, 4), q)
					for k := range 2 { // low nibbles: elements 4j.., high: 16+4j..
						w := YMM()
						if k == 0 {
							VPAND(c0f, q, w)
						} else {
							VPSRLW(Imm(4), q, w)
							VPAND(c0f, w, w)
						}
						VPSHUFB(w, tbl, w)
						for i := range cs {
							if vnni {
								xb := YMM()
								VPBROADCASTD(px.m(c0+i, xKQuants+32*s+4*j+16*k), xb)
								a := sum[i]
								if k == 1 {
									a = sum2[i]
								}
								vpdpbusdY(xb, w, a)
								continue
							}
							xb, ax := YMM(), YMM()
							VPBROADCASTD(px.m(c0+i, xKQuants+32*s+4*j+16*k), xb)
							VPABSB(xb, ax)
							VPSIGNB(xb, w, xb) // the level times the activation's sign
							VPMADDUBSW(xb, ax, xb)
							VPMADDWD(sc, xb, xb)
							if j == 0 && k == 0 {
								sum[i] = xb
							} else {
								VPADDD(xb, sum[i], sum[i])
							}
						}
					}
				}
				for i := range cs {
					c := c0 + i
					if vnni {
						VPADDD(sum2[i], sum[i], sum[i])
						VPMULLD(sc, sum[i], sum[i])
					}
					VCVTDQ2PS(sum[i], sum[i])
					fmaAcc(sum[i], at(dm.Offset(64*c), hr, 4), at(acc.Offset(64*c), hr, 4), false)
				}
			}
		})
	}
	if C <= 2 {
		for s := range 8 {
			sub(s, wp, wp)
		}
	} else {
		ws, wq := GP64(), GP64()
		MOVQ(wp, ws)
		MOVQ(wp, wq)
		if pc != nil {
			MOVQ(px.xp, pc.xp)
			if C > 4 {
				pc.xp4 = GP64()
				MOVQ(px.xp4, pc.xp4)
			}
		}
		countLoop("subs", 8, func() {
			sub(0, ws, wq)
			ADDQ(Imm(16), ws)
			ADDQ(U32(256), wq)
			px.advance(32)
			if pc != nil {
				pc.advance(8)
			}
		})
		px.advance(-256)
	}
	ADDQ(U32(iq4XSPanelBytes), wp)
	px.advance(xKBlock)
	DECQ(nb)
	JMP(LabelRef("loop"))
	Label("done")
	storePanelAVX2(C, acc)
	ret()
}
