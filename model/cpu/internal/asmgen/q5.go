package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// q50PanelBytes is a Q5_0 panel block (repack_q5.go in package cpu): 16
// f16 d, eight 64-bit masks of the quants' fifth bits, four vectors of
// nibbles as Q4_0's panels hold them.
const q50PanelBytes = 16 * 22

// q51PanelBytes is a Q5_1 panel block: Q5_0's with the 16 rows' f16 mins
// after their d.
const q51PanelBytes = 16 * 24

// q50Panel emits q50Panel_C: panelKernel's Q4_0 kernel with the fifth bits
// added: each nibble vector gets 16 added to the bytes its mask (KMOVQ)
// selects, which makes the unsigned 5-bit quants, and the activation's
// correction is -16 times its sum. The order is one integer sum per block
// for each row: the order dotQ50Q80 had before it took ggml's eight lanes,
// so archPanels no longer chooses these kernels (nor q51Panel's or
// q51PanelAVX2's) until they are rewritten in the lane order. With one, it emits q51Panel_C, Q5_1's: the quants are the
// unsigned 5-bit ones (the sum starts at zero), and after acc =
// fma(float32(p), f16(w.d)*x.d, acc) comes acc = fma(f16(w.m), x.s, acc),
// the activation block's float32 s where Q5_0's correction is:
// dotQ51Q81's order.
func q50Panel(C int, one bool) {
	name, what, size, off := "q50Panel", "Q5_0", q50PanelBytes, 0
	if one {
		name, what, size, off = "q51Panel", "Q5_1", q51PanelBytes, 32
	}
	TEXT(fmt.Sprintf("%s_%d", name, C), NOSPLIT, panelSignature)
	Pragma("noescape")
	Doc(fmt.Sprintf("%s_%d computes a 16-row panel of %s weights against %d activation rows.", name, C, what, C))
	nb := param("nb")
	wp := param("w")
	px := newPanelRowsX(C)
	acc := make([]reg.VecVirtual, C)
	for c := range acc {
		acc[c] = ZMM()
		VXORPS(acc[c], acc[c], acc[c])
	}
	c0f := bcastConst(0x0f0f0f0f)
	c10 := bcastConst(0x10101010)
	zero := ZMM()
	VPXORD(zero, zero, zero)
	split := C <= 2 // two chains of VPDPBUSD per row, as panelKernel
	Label("loop")
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	dd := ZMM()
	VCVTPH2PS(Mem{Base: wp}, dd)
	s := make([]reg.VecVirtual, C)
	s2 := make([]reg.VecVirtual, C)
	for c := range s {
		s[c] = ZMM()
		if one {
			VPXORD(zero, zero, s[c])
		} else {
			VPBROADCASTD(px.m(c, 4), s[c])
		}
		if split {
			s2[c] = ZMM()
			VPXORD(zero, zero, s2[c])
		}
	}
	for v := range 8 {
		w := ZMM()
		q := Mem{Base: wp, Disp: off + 96 + 64*(v%4)}
		if v < 4 {
			VPANDD(q, c0f, w)
		} else {
			VPSRLW(Imm(4), q, w)
			VPANDD(c0f, w, w)
		}
		k := K()
		KMOVQ(Mem{Base: wp, Disp: off + 32 + 8*v}, k)
		VPADDB(c10, w, k, w)
		xoff := 4 * v
		if v >= 4 {
			xoff = 16 + 4*(v-4)
		}
		for c := range s {
			a := s[c]
			if split && v%2 == 1 {
				a = s2[c]
			}
			vpdpbusdBcst(px.m(c, 8+xoff), w, a)
		}
	}
	for c := range s {
		if split {
			VPADDD(s2[c], s[c], s[c])
		}
		VCVTDQ2PS(s[c], s[c])
		m := ZMM()
		VMULPS_BCST(px.m(c, 0), dd, m)
		VFMADD231PS(m, s[c], acc[c])
	}
	if one {
		wm := ZMM()
		VCVTPH2PS(Mem{Base: wp, Disp: 32}, wm)
		for c := range s {
			VFMADD231PS_BCST(px.m(c, 4), wm, acc[c])
		}
	}
	ADDQ(U32(uint32(size)), wp)
	px.advance(xBlock)
	DECQ(nb)
	JMP(LabelRef("loop"))
	Label("done")
	storePanel(acc)
	ret()
}

// q50AVX2 is the Q5_0 tile kernel for AVX2 (blockAVX2's order, dotQ50Q80's):
// the 16 bytes of a block widened to words give the low nibbles (elements
// 0..15) and the high ones (16..31); each word j of qh's low or high half,
// broadcast, is tested against bit j (q50Bits) and adds 16 where set; then
// 16 is subtracted from every quant.
func q50AVX2(t *tile) { q5AVX2(t, false) }

// q51AVX2 is the Q5_1 tile kernel for AVX2 (blockAVX2Q's order with the
// mins, dotQ51Q81's): q50AVX2's quants from Q5_1's block (d, m, qh, qs)
// without the 16 subtracted, against Q8_1 activations.
func q51AVX2(t *tile) { q5AVX2(t, true) }

// q5AVX2 is q50AVX2, or q51AVX2 with one.
func q5AVX2(t *tile, one bool) {
	if q50Bits == nil {
		m := GLOBL("q50Bits", RODATA|NOPTR)
		for j := range 16 {
			DATA(2*j, U16(uint16(1)<<j))
		}
		q50Bits = &m
	}
	c0f := bcastConstY(0x000f000f)
	c10 := bcastConstY(0x00100010)
	sel := YMM()
	VMOVDQU(*q50Bits, sel)
	wquants := func(r, disp int) (reg.VecVirtual, reg.VecVirtual) {
		off := 0 // Q5_1: qh and qs two bytes on, after m
		if one {
			off = 2
		}
		a, b := YMM(), YMM()
		VPMOVZXBW(t.w(r, disp+off+6), a)
		VPSRLW(Imm(4), a, b)
		VPAND(c0f, a, a)
		for i, v := range []reg.VecVirtual{a, b} {
			h := YMM()
			VPBROADCASTW(t.w(r, disp+off+2+2*i), h)
			VPAND(sel, h, h)
			VPCMPEQW(sel, h, h)
			VPAND(c10, h, h)
			VPADDW(h, v, v)
			if !one {
				VPSUBW(c10, v, v)
			}
		}
		return a, b
	}
	if one {
		t.blockAVX2Lanes(q51Bytes, q81Bytes, 4, true, wquants)
		return
	}
	t.blockAVX2Lanes(q50Bytes, q80, 2, false, wquants)
}

const (
	q51Bytes = 24
	q81Bytes = 36
)

const q50Bytes = 22

// q50Bits is 16 words, word j holding bit j, made by the first q50AVX2.
var q50Bits *Mem

// iq4NLAVX2 is the IQ4_NL tile kernel for AVX2 (blockAVX2's order,
// dotIQ4NLQ80's): the block's 16 bytes split into low nibbles (elements
// 0..15) and high ones (16..31), each looked up in the signed levels
// (VPSHUFB) and sign-extended to words.
func iq4NLAVX2(t *tile) {
	tbl := XMM()
	VMOVDQU(iq4SignedTable(), tbl)
	c0f := bcastConstY(0x0f0f0f0f).AsX()
	t.blockAVX2(iq4NLBytes, func(r, disp int) (reg.VecVirtual, reg.VecVirtual) {
		lo, hi := XMM(), XMM()
		VMOVDQU(t.w(r, disp+2), lo)
		VPSRLW(Imm(4), lo, hi)
		VPAND(c0f, lo, lo)
		VPAND(c0f, hi, hi)
		VPSHUFB(lo, tbl, lo)
		VPSHUFB(hi, tbl, hi)
		a, b := YMM(), YMM()
		VPMOVSXBW(lo, a)
		VPMOVSXBW(hi, b)
		return a, b
	})
}

const iq4NLBytes = 18

// iq4Signed is ggml's 16 IQ4 levels as signed bytes, made by the first
// iq4SignedTable.
var iq4Signed *Mem

// iq4SignedTable returns iq4Signed, making it on the first call.
func iq4SignedTable() Mem {
	if iq4Signed == nil {
		m := GLOBL("iq4LevelsSigned", RODATA|NOPTR)
		for i, v := range iq4Values {
			DATA(i, U8(uint8(v)))
		}
		iq4Signed = &m
	}
	return *iq4Signed
}
