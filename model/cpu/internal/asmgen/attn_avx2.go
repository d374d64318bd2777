package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// f16AccAVX2 emits the two element loops of Attend's portable online
// softmax with an f16 accumulator (softmaxValuesF16 in package cpu), for
// CPUs with AVX2, FMA and F16C, eight elements at a time (n a multiple of
// 8; the caller does the rest):
//
//	f16AxpyAVX2(n, acc, v, vs):  acc[i] = f16(fma(f32(v[i]), vs, f32(acc[i])))
//	f16RescaleAVX2(n, acc, ms):  acc[i] = f16(f32(acc[i]) * ms)
//
// f16 to float32 is exact, the FMA and the product round once, and
// VCVTPS2PH with round to nearest even (imm 0) is ggml.F32ToF16 for every
// input: the portable loops' bits.
func f16AccAVX2() {
	for _, axpy := range []bool{true, false} {
		name, sig := "f16RescaleAVX2", "func(n int, acc *uint16, ms float32)"
		if axpy {
			name, sig = "f16AxpyAVX2", "func(n int, acc *uint16, v *uint16, vs float32)"
		}
		TEXT(name, NOSPLIT, sig)
		Pragma("noescape")
		if axpy {
			Doc(name + " sets acc[i] = f16(fma(v[i], vs, acc[i])) for i < n (a multiple of 8).")
		} else {
			Doc(name + " sets acc[i] = f16(acc[i] * ms) for i < n (a multiple of 8).")
		}
		n := param("n")
		ap := param("acc")
		s := XMM()
		if axpy {
			Load(Param("vs"), s)
		} else {
			Load(Param("ms"), s)
		}
		b := YMM()
		VBROADCASTSS(s, b)
		vp := ap
		if axpy {
			vp = param("v")
		}
		Label("loop")
		TESTQ(n, n)
		JZ(LabelRef("done"))
		a := YMM()
		VCVTPH2PS(Mem{Base: ap}, a)
		if axpy {
			x := YMM()
			VCVTPH2PS(Mem{Base: vp}, x)
			VFMADD231PS(b, x, a) // a = x*vs + a, rounded once
			ADDQ(Imm(16), vp)
		} else {
			VMULPS(b, a, a)
		}
		VCVTPS2PH(Imm(0), a, Mem{Base: ap})
		ADDQ(Imm(16), ap)
		SUBQ(Imm(8), n)
		JMP(LabelRef("loop"))
		Label("done")
		ret()
	}
}

// scoreAVX2 emits func(hd int, k *byte, q *byte) float32: one key's f16
// attention score in attnDotF16's order (package cpu) for CPUs with AVX2,
// FMA and F16C, hd a multiple of 64: each group of 16 lanes is a pair of
// YMM registers, the groups fold as g0+g2, g1+g3, g0+g1, and the lanes as
// reduceLanes (upper eight onto lower, then four, two, one).
func scoreAVX2() {
	TEXT("scoreF16AVX2", NOSPLIT, "func(hd int, k *byte, q *byte) float32")
	Pragma("noescape")
	Doc("scoreF16AVX2 returns the f16 attention score of one key with q (hd a multiple of 64).")
	x := scoreBodyAVX2(param("hd"), param("k"), param("q"))
	Store(x, ReturnIndex(0))
	ret()
}

// scoresAVX2 emits func(hd int, k *byte, stride int, q *byte, out *float32,
// n int): out[r] = scoreF16AVX2(hd, k + r*stride, q) for r < n (n >= 1),
// the keys of one block scored in one call.
func scoresAVX2() {
	TEXT("scoresF16AVX2", NOSPLIT, "func(hd int, k *byte, stride int, q *byte, out *float32, n int)")
	Pragma("noescape")
	Doc("scoresF16AVX2 sets out[r] to the f16 attention score of the key at k + r*stride with q, for r < n (hd a multiple of 64, n >= 1).")
	kp, stride, op, n := param("k"), param("stride"), param("out"), param("n")
	Label("key")
	kb := GP64() // the body moves its key pointer on
	MOVQ(kp, kb)
	x := scoreBodyAVX2(param("hd"), kb, param("q"))
	VMOVSS(x, Mem{Base: op})
	ADDQ(Imm(4), op)
	ADDQ(stride, kp)
	DECQ(n)
	JNZ(LabelRef("key"))
	ret()
}

// scoreLoops numbers scoreBodyAVX2's loop labels.
var scoreLoops int

// scoreBodyAVX2 emits one key's score of scoreF16AVX2, reading hd
// elements from kb and qb (both moved on past them, n counted down to
// zero), and returns the XMM whose lane 0 holds it.
func scoreBodyAVX2(n, kb, qb reg.GPVirtual) reg.VecVirtual {
	var acc [4][2]reg.VecVirtual
	for g := range acc {
		for h := range acc[g] {
			acc[g][h] = YMM()
			VXORPS(acc[g][h], acc[g][h], acc[g][h])
		}
	}
	loop := fmt.Sprintf("loop%d", scoreLoops)
	scoreLoops++
	Label(loop)
	for g := range 4 {
		for h := range 2 {
			qy, ky := YMM(), YMM()
			VCVTPH2PS(Mem{Base: qb, Disp: 32*g + 16*h}, qy)
			VCVTPH2PS(Mem{Base: kb, Disp: 32*g + 16*h}, ky)
			VFMADD231PS(qy, ky, acc[g][h])
		}
	}
	ADDQ(Imm(128), qb)
	ADDQ(Imm(128), kb)
	SUBQ(Imm(64), n)
	JNZ(LabelRef(loop))
	for h := range 2 {
		VADDPS(acc[2][h], acc[0][h], acc[0][h])
		VADDPS(acc[3][h], acc[1][h], acc[1][h])
		VADDPS(acc[1][h], acc[0][h], acc[0][h])
	}
	x := acc[0][0]
	VADDPS(acc[0][1], x, x) // lane j += lane j+8
	h4 := XMM()
	VEXTRACTF128(Imm(1), x, h4)
	VADDPS(h4, x.AsX(), h4) // += lane j+4
	h2 := XMM()
	VMOVHLPS(h4, h4, h2)
	VADDPS(h2, h4, h4) // += lane j+2
	h1 := XMM()
	VMOVSHDUP(h4, h1)
	VADDSS(h1, h4, h4) // += lane j+1
	return h4
}

// scoreTail emits func(n int, k *byte, q *byte, sum float64) float32: the
// last n%64 products of attnDotF16 (package cpu), added one by one in
// float64 to sum (the float64 of the first elements' lane sum), rounded to
// float32 at the end — ggml_vec_dot_f16's leftover loop. Each product of
// two f16 values is exact in float32 (VMULSS), so widening it is exact and
// the only roundings are the float64 additions, in element order. Scalar
// VEX code with F16C: AVX2 and AVX-512 machines both run it, so a head
// dimension that is not a multiple of 64 (8, 16, 96, 80…) no longer falls
// to the portable Go loop.
func scoreTail() {
	TEXT("scoreF16Tail", NOSPLIT, "func(n int, k *byte, q *byte, sum float64) float32")
	Pragma("noescape")
	Doc("scoreF16Tail adds the n products of the f16 values at k and q to sum in float64, in order, and rounds the total to float32.")
	n := param("n")
	kb := param("k")
	qb := param("q")
	s := XMM()
	Load(Param("sum"), s)
	g := GP32()
	a, b := XMM(), XMM()
	Label("loop")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	MOVWLZX(Mem{Base: kb}, g)
	VMOVD(g, a)
	VCVTPH2PS(a, a)
	MOVWLZX(Mem{Base: qb}, g)
	VMOVD(g, b)
	VCVTPH2PS(b, b)
	VMULSS(b, a, a)    // exact: f16 × f16 fits a float32
	VCVTSS2SD(a, a, a) // exact
	VADDSD(a, s, s)
	ADDQ(Imm(2), kb)
	ADDQ(Imm(2), qb)
	DECQ(n)
	JMP(LabelRef("loop"))
	Label("done")
	r := XMM()
	VCVTSD2SS(s, r, r)
	Store(r, ReturnIndex(0))
	ret()
}

// softmaxValuesAVX2 emits softmaxValues' kernels for CPUs with AVX2, FMA
// and F16C (softmaxF16x1AVX2 … softmaxF32x2AVX2), hd a multiple of 8: the
// same per-key steps in the same order (rescale where ms != 1, then acc =
// round(fma(v_j, vs[j], acc))), each head's accumulator in passes of 32
// elements held in four YMM registers while they last, then of 8 in one.
func softmaxValuesAVX2(f16 bool, H int) {
	vk, rem, accp, vp, one := valueHead(f16, H, "AVX2", 8, " (hd a multiple of 8)")
	vk.load = func(m Mem, _ int, y reg.VecVirtual) {
		if f16 {
			VCVTPH2PS(m, y)
		} else {
			VMOVUPS(m, y)
		}
	}
	vk.store = func(y reg.VecVirtual, _ int, m Mem) {
		if f16 {
			VCVTPS2PH(Imm(0), y, m)
		} else {
			VMOVUPS(y, m)
		}
	}
	for _, U := range []int{4, 1} {
		pass := fmt.Sprintf("pass%d", U)
		Label(pass + "test")
		CMPQ(rem, Imm(uint64(8*U)))
		JL(LabelRef(pass + "end"))
		vk.U = U
		rescales := vk.keys(accp, vp, one, pass)
		SUBQ(Imm(uint64(8*U)), rem)
		JMP(LabelRef(pass + "test"))
		rescales()
		Label(pass + "end")
	}
	ret()
}

// softmaxAVX2Consts is softmaxWeightsAVX2's constants, made by the first:
// the lane numbers 0..7 (int32, for the tail mask) at 0, VPERMPS indices
// that move eight lanes up by one, two and four at 32, 64 and 96 (the
// lanes below repeat lane 0), lane 7 everywhere at 128,
// then -Inf and 1 (float32) at 160 and 164.
var softmaxAVX2Consts *Mem

func softmaxAVX2Const() Mem {
	if softmaxAVX2Consts == nil {
		m := GLOBL("softmaxAVX2Consts", RODATA|NOPTR)
		for i := range 8 { // in order: the assembler takes no other
			DATA(4*i, U32(uint32(i)))
		}
		for j, sh := range []int{1, 2, 4} {
			for i := range 8 {
				DATA(32+32*j+4*i, U32(uint32(max(i-sh, 0))))
			}
		}
		for i := range 8 {
			DATA(128+4*i, U32(7))
		}
		DATA(160, U32(0xff800000))
		DATA(164, U32(0x3f800000))
		softmaxAVX2Consts = &m
	}
	return *softmaxAVX2Consts
}

// expY returns expf (glibc's, as expZ) of the eight float32 lanes of z:
// each half in float64, 2^(k/32) gathered from expTab's 32 entries (AVX2
// has no two-register permute), then the limits and NaN blended in. The
// same operations in the same order as expZ: the same bits.
func expY(z reg.VecVirtual) reg.VecVirtual {
	at := func(off int) Mem { return expTab.Offset(off) }
	tab := GP64()
	LEAQ(at(expTabT), tab)
	bc := func(off int) reg.VecVirtual {
		c := YMM()
		VBROADCASTSD(at(off), c)
		return c
	}
	hiX := XMM()
	VEXTRACTF128(Imm(1), z, hiX)
	lo, hi := YMM(), YMM()
	VCVTPS2PD(z.AsX(), lo)
	VCVTPS2PD(hiX, hi)
	for _, h := range []reg.VecVirtual{lo, hi} {
		zz := YMM()
		VMULPD(bc(expTabInvLn2N), h, zz) // z = x*32/ln 2
		kd := YMM()
		VADDPD(bc(expTabShift), zz, kd) // its low bits hold k
		idx := YMM()
		VANDPD(bc(expTabMask), kd, idx)
		s, all := YMM(), YMM()
		VPCMPEQQ(all, all, all)
		VPXOR(s, s, s)
		VPGATHERQQ(all, Mem{Base: tab, Index: idx, Scale: 8}, s)
		e := YMM()
		VPSLLQ(Imm(47), kd, e)
		VPADDQ(e, s, s) // s = 2^(k/32)
		r := YMM()
		VSUBPD(bc(expTabShift), kd, r)
		VSUBPD(r, zz, r) // r = z - k
		p, q, r2 := bc(expTabC0), bc(expTabC2), YMM()
		VFMADD213PD(bc(expTabC1), r, p)  // C0*r + C1
		VFMADD213PD(bc(expTabOne), r, q) // C2*r + 1
		VMULPD(r, r, r2)
		VFMADD213PD(q, r2, p) // (C0*r + C1)*r² + (C2*r + 1)
		VMULPD(s, p, p)
		VCVTPD2PSY(p, h.AsX())
	}
	out := YMM()
	VINSERTF128(Imm(1), hi.AsX(), lo, out)
	// Below the low limit 0, above the high one +Inf, NaN x+x.
	lim, m := YMM(), YMM()
	VBROADCASTSS(expLim.Offset(0), lim)
	VCMPPS(Imm(0x11), lim, z, m) // z < lo, ordered
	VANDNPS(out, m, out)         // 0 there
	VBROADCASTSS(expLim.Offset(4), lim)
	VCMPPS(Imm(0x1e), lim, z, m) // z > hi, ordered
	inf := YMM()
	VPCMPEQD(inf, inf, inf)
	VPSLLD(Imm(24), inf, inf) // 0xff000000
	VPSRLD(Imm(1), inf, inf)  // 0x7f800000: +Inf
	VBLENDVPS(m, inf, out, out)
	VCMPPS(Imm(0x03), z, z, m) // unordered
	nan := YMM()
	VADDPS(z, z, nan)
	VBLENDVPS(m, nan, out, out)
	return out
}

// softmaxWeightsAVX2 emits softmaxWeights' kernels for CPUs with AVX2, FMA
// and F16C (softmaxWeightsx1AVX2, softmaxWeightsx2AVX2): the same
// computation, eight keys a vector. The tail of a chunk is loaded and
// stored under VMASKMOVPS with a lane mask (lanes past n hold -Inf, which
// changes no maximum); the prefix maximum scans by VPERMPS where the
// AVX-512 kernels shift by VALIGND; the exponentials are expY.
func softmaxWeightsAVX2(H int) {
	wk := weightsHead(fmt.Sprintf("softmaxWeightsx%dAVX2", H), H, func() reg.VecVirtual { return YMM() })
	n, sp, msp, vsp, carry, news, left, off, at, sx := wk.n, wk.sp, wk.msp, wk.vsp, wk.carry, wk.news, wk.left, wk.off, wk.at, wk.scale
	k := softmaxAVX2Const()

	Label("vector")
	lm := YMM() // lanes below left
	VMOVQ(left, lm.AsX())
	VPBROADCASTD(lm.AsX(), lm)
	VPCMPGTD(k, lm, lm)
	for h := range H {
		x, ninf := YMM(), YMM()
		VMASKMOVPS(at(sp, h), lm, x)
		VBROADCASTSS(k.Offset(160), ninf)
		VBLENDVPS(lm, x, ninf, x) // lanes past n: -Inf
		sc := YMM()
		VBROADCASTSS(sx, sc)
		VMULPS(sc, x, x)
		// The scan skips NaN scores as x > M does: as -Inf.
		p, un := YMM(), YMM()
		VCMPPS(Imm(0x03), x, x, un) // unordered
		VBLENDVPS(un, ninf, x, p)
		for j := range 3 {
			// p moved up 1, 2, 4 lanes; the lanes below repeat lane 0,
			// which their prefix maxima already hold: no fill needed.
			t, ix := YMM(), YMM()
			VMOVDQU(k.Offset(32+32*j), ix)
			VPERMPS(p, ix, t)
			VMAXPS(t, p, p)
		}
		VMAXPS(carry[h], p, p)
		e, ix := YMM(), YMM()
		VMOVDQU(k.Offset(32), ix)
		VPERMPS(p, ix, e)
		VBLENDPS(Imm(1), carry[h], e, e) // M before each key
		VMOVDQU(k.Offset(128), ix)
		VPERMPS(p, ix, carry[h])
		kn := YMM()
		VCMPPS(Imm(0x1e), e, x, kn) // x > M, ordered: a new maximum
		d, d2 := YMM(), YMM()
		VSUBPS(e, x, d)
		VSUBPS(x, e, d2)
		VBLENDVPS(kn, d2, d, d) // M - x where x is the new maximum
		w := expY(d)
		one := YMM()
		VBROADCASTSS(k.Offset(164), one)
		msv, vsv := YMM(), YMM()
		VBLENDVPS(kn, w, one, msv)
		VBLENDVPS(kn, one, w, vsv)
		VMASKMOVPS(msv, lm, at(msp, h))
		VMASKMOVPS(vsv, lm, at(vsp, h))
		g := GP32()
		VMOVMSKPS(kn, g)
		ORL(g, news)
	}
	ADDQ(Imm(32), off)
	SUBQ(Imm(8), left)
	JG(LabelRef("vector"))
	weightsTail(H, n, msp, vsp, news, carry)
}
