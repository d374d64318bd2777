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

// q50Panel emits q50Panel_C: a 16-row Q5_0 panel (repack_q5.go's layout)
// against C activation rows in dotQ50Q80's order (ggml's eight lanes) for
// every row, the way q80LanePanel does Q8_0's. Weight vector v (v < 4: the
// low nibbles of nibble vector v, elements 4v..4v+3 of each row's block;
// v >= 4: the high nibbles of nibble vector v-4, elements 16+4(v-4)..) gets
// 16 added to the bytes its mask (KMOVQ) selects, which makes the unsigned
// 5-bit quants; lane v of row i starts at the activation's correction for
// group v (-16 times the sum of its four quants, xQ80Lanes's layout with
// 16 for 128), VPDPBUSD adds the four products (the exact integer sum of
// the group), and acc[v] = fma(float32(sum), f16(w.d)*x.d, acc[v]); at the
// end acc folds as hsum8. With one, it emits q51Panel_C, Q5_1's (the
// activations as expandRowQ81 writes them: d, s, the quants): the sums
// start at zero (the quants are unsigned), and beside the lanes ms =
// fma(f16(w.m), x.s, ms) per block, added after the fold: dotQ51Q81's
// order. Eight accumulators per activation row leave room for three rows
// at a time (Q5_0) or two (Q5_1, whose mins take one more register a row):
// the kernel streams the panel once per group of rows, decoding its quants
// again each time. The float work is eight VCVTDQ2PS and eight FMAs per
// block and activation row where the one-sum order had one of each, which
// bounds these kernels' batch speed at about half the one-sum kernels'.
func q50Panel(C int, one bool) {
	name, what, size, off := "q50Panel", "Q5_0", q50PanelBytes, 0
	xsize, xq := xQ80Lanes, 36
	if one {
		name, what, size, off = "q51Panel", "Q5_1", q51PanelBytes, 32
		xsize, xq = 40, 8
	}
	panelText(name, what, C, " in ggml's eight-lane order")
	group := 3 // Q5_0: 24 accumulators; Q5_1's mins take three more registers
	if one {
		group = 2
	}
	for c0 := 0; c0 < C; c0 += group {
		cc := min(group, C-c0)
		nb, wp, xp, xm := panelGroup(c0, cc)
		c0f := bcastConst(0x0f0f0f0f)
		c10 := bcastConst(0x10101010)
		var zero reg.VecVirtual
		if one {
			zero = ZMM()
			VPXORD(zero, zero, zero)
		}
		acc := make([][8]reg.VecVirtual, cc)
		ms := make([]reg.VecVirtual, cc)
		for c := range acc {
			for k := range 8 {
				acc[c][k] = ZMM()
				VXORPS(acc[c][k], acc[c][k], acc[c][k])
			}
			if one {
				ms[c] = ZMM()
				VXORPS(ms[c], ms[c], ms[c])
			}
		}
		loop, done := fmt.Sprintf("loop%d", c0), fmt.Sprintf("done%d", c0)
		Label(loop)
		TESTQ(nb, nb)
		JZ(LabelRef(done))
		prefetchAhead(wp, size)
		wd := ZMM()
		VCVTPH2PS(Mem{Base: wp}, wd)
		dd := make([]reg.VecVirtual, cc)
		for c := range dd {
			dd[c] = ZMM()
			VMULPS_BCST(xm(c, 0), wd, dd[c])
		}
		if one {
			wm := ZMM()
			VCVTPH2PS(Mem{Base: wp, Disp: 32}, wm)
			for c := range ms {
				VFMADD231PS_BCST(xm(c, 4), wm, ms[c]) // ms = w.m*x.s + ms
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
			for c := range cc {
				s := ZMM()
				if one {
					VPXORD(zero, zero, s)
				} else {
					VPBROADCASTD(xm(c, 4+4*v), s)
				}
				vpdpbusdBcst(xm(c, xq+4*v), w, s)
				VCVTDQ2PS(s, s)
				VFMADD231PS(dd[c], s, acc[c][v])
			}
		}
		ADDQ(U32(uint32(size)), wp)
		ADDQ(Imm(uint64(xsize)), xp)
		DECQ(nb)
		JMP(LabelRef(loop))
		Label(done)
		out := panelOut(c0, cc)
		for c := range cc {
			a := acc[c]
			foldAccs(a)
			if one {
				VADDPS(ms[c], a[0], a[0])
			}
			VMOVUPS(a[0], out(c))
		}
	}
	ret()
}

// q50AVX2 is the Q5_0 tile kernel for AVX2 (blockAVX2Lanes, signed:
// dotQ50Q80's order): the block's 16 bytes in both halves of a YMM, the
// upper half shifted right by 4 (VPSRLVD), masked to nibbles: elements
// 0..15 then 16..31; qh broadcast and spread to one byte per bit
// (q5KBits); a clear fifth bit ORs 0xf0 into the nibble (ggml's own AVX2
// trick), which makes the byte the quant minus 16, -16..15.
func q50AVX2(t *tile) { q5AVX2(t, false) }

// q51AVX2 is the Q5_1 tile kernel for AVX2 (blockAVX2Lanes with the mins,
// unsigned: dotQ51Q81's order): q50AVX2's bytes from Q5_1's block (d, m,
// qh, qs) with 0x10 ORed in where the fifth bit is set, 0..31, against
// Q8_1 activations.
func q51AVX2(t *tile) { q5AVX2(t, true) }

// q5AVX2Consts is q5AVX2's constants: VPSRLVD's dword shifts (0 in the
// lower half, 4 in the upper) at 0, 0x0f bytes at 32, 0xf0 bytes at 64.
var q5AVX2Consts *Mem

// q5AVX2 is q50AVX2, or q51AVX2 with one.
func q5AVX2(t *tile, one bool) {
	if q5AVX2Consts == nil {
		m := constTable("q5AVX2Consts", [8]uint32{0, 0, 0, 0, 4, 4, 4, 4}, splat(0x0f0f0f0f), splat(0xf0f0f0f0))
		q5AVX2Consts = &m
	}
	k := *q5AVX2Consts
	bits := q5Bits()
	off := 0 // Q5_1: qh and qs two bytes on, after m
	if one {
		off = 2
	}
	wbytes := func(r, disp int) reg.VecVirtual {
		w := YMM()
		VBROADCASTI128(t.w(r, disp+off+6), w)
		VPSRLVD(k, w, w)
		VPAND(k.Offset(32), w, w)
		hb := YMM()
		VPBROADCASTD(t.w(r, disp+off+2), hb)
		VPSHUFB(bits, hb, hb)
		VPAND(bits.Offset(32), hb, hb)
		VPCMPEQB(bits.Offset(32), hb, hb) // 0xff where the fifth bit is set
		if one {
			VPAND(bits.Offset(64), hb, hb) // 0x10
		} else {
			VPANDN(k.Offset(64), hb, hb) // 0xf0 where it is clear
		}
		VPOR(hb, w, w)
		return w
	}
	if one {
		t.blockAVX2Lanes(q51Bytes, q81Bytes, 4, true, false, wbytes)
		return
	}
	t.blockAVX2Lanes(q50Bytes, q80, 2, false, true, wbytes)
}

const (
	q51Bytes = 24
	q81Bytes = 36
)

const q50Bytes = 22

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

// iq4UnsignedTable is ggml's IQ4 levels plus 128 (1..241) as 16 unsigned
// bytes, in memory for VBROADCASTI128 (iq4Table's, for the AVX-VNNI
// kernels).
func iq4UnsignedTable() Mem {
	if iq4Levels == nil {
		m := GLOBL("iq4Levels128", RODATA|NOPTR)
		for i, v := range iq4Values {
			DATA(i, U8(uint8(int(v)+128)))
		}
		iq4Levels = &m
	}
	return *iq4Levels
}

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
