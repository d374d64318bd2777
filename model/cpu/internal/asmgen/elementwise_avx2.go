package main

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// The element-wise kernels again for CPUs with AVX2, FMA and F16C but no
// AVX-512, which ran them as portable Go (about a quarter of the samples of
// a perf profile of `vs-llamacpp bench` on Q4_0, prompt and generation,
// on an AVX2-only AMD EPYC, session 16): the same operations on eight
// lanes, so the same bits.

// vexpY is vexpZ on eight lanes. Without VSCALEFPS, j*2^n is two exact
// products and one rounding: j*2^h1 (normal: h1 = n>>1 is within ±96)
// times 2^h2 (h2 = n-h1), the only rounding, as VSCALEFPS rounds once.
// Lanes with |n| > 192 are blended to +Inf or 0 afterwards as vexpZ does
// (there the integer n is garbage and so is the product); a NaN n is not
// blended, and j, a NaN with x's payload, is the first operand of both
// products, so it passes through as from VSCALEFPS.
func vexpY(x reg.VecVirtual) reg.VecVirtual {
	at := func(off int) Mem { return vexpTab.Offset(off) }
	bc := func(off int) reg.VecVirtual {
		y := YMM()
		VBROADCASTSS(at(off), y)
		return y
	}
	shift := bc(vxShift)
	z := bc(vxLog2E)
	VFMADD213PS(shift, x, z) // z = x*log2(e) + shift
	n := YMM()
	VSUBPS(shift, z, n) // n = z - shift
	b := YMM()
	VMOVAPS(x, b)
	VFNMADD231PS(bc(vxLn2Hi), n, b) // b = x - n*ln2Hi
	VFNMADD231PS(bc(vxLn2Lo), n, b) // b -= n*ln2Lo
	u := YMM()
	VMULPS(b, b, u)
	p := bc(vxC5)
	VFMADD213PS(bc(vxC4), b, p) // p = C5*b + C4
	q := bc(vxC3)
	VFMADD213PS(bc(vxC2), b, q) // q = C3*b + C2
	VFMADD213PS(q, u, p)        // p = p*u + q
	l := bc(vxC1)
	VFMADD213PS(bc(vxOne), b, l) // l = C1*b + 1
	VFMADD213PS(l, u, p)         // j = p*u + l
	ni, h1 := YMM(), YMM()
	VCVTTPS2DQ(n, ni) // n is an integer: exact where |n| <= 192
	VPSRAD(Imm(1), ni, h1)
	VPSUBD(h1, ni, ni) // h2
	bias := YMM()
	VPBROADCASTD(at(vxBias), bias)
	VPADDD(bias, h1, h1)
	VPADDD(bias, ni, ni)
	VPSLLD(Imm(23), h1, h1) // 2^h1
	VPSLLD(Imm(23), ni, ni) // 2^h2
	res := YMM()
	VMULPS(h1, p, res) // exact
	VMULPS(ni, res, res)
	// |n| > 192: +Inf for n > 0, 0 otherwise.
	a := YMM()
	VANDPS(bc(vxAbs), n, a)
	far := YMM()
	VCMPPS(Imm(0x1e), bc(vx192), a, far) // |n| > 192, ordered
	zero, low := YMM(), YMM()
	VXORPS(zero, zero, zero)
	VCMPPS(Imm(0x12), zero, n, low) // n <= 0, ordered
	alt := bc(vxInf)
	VBLENDVPS(low, zero, alt, alt) // low ? 0 : +Inf
	VBLENDVPS(far, alt, res, res)
	return res
}

// swiGLUAVX2 emits swigluAVX512's function with AVX2 (n a multiple of 8).
func swiGLUAVX2() {
	TEXT("swigluAVX2", NOSPLIT, "func(n int, gate, up *float32)")
	Pragma("noescape")
	Doc("swigluAVX2 sets gate[i] = silu(gate[i]) * up[i] for i < n (a multiple of 8), silu with ggml_v_expf.")
	n := param("n")
	g := param("gate")
	u := param("up")
	sign := bcastConstY(0x80000000)
	one := bcastConstY(0x3f800000)
	Label("loop")
	CMPQ(n, Imm(8))
	JL(LabelRef("done"))
	z := YMM()
	VMOVUPS(Mem{Base: g}, z)
	neg := YMM()
	VXORPS(sign, z, neg)
	e := vexpY(neg)
	VADDPS(one, e, e)
	VDIVPS(e, z, z)
	VMULPS(Mem{Base: u}, z, z)
	VMOVUPS(z, Mem{Base: g})
	ADDQ(Imm(32), g)
	ADDQ(Imm(32), u)
	SUBQ(Imm(8), n)
	JMP(LabelRef("loop"))
	Label("done")
	ret()
}

// quantQ80AVX2 emits quantQ80AVX512's function with AVX2: the same amax
// (VMAXPS in the same pairing up to the last lane), d and id; the int32
// quants saturate to int8 through VPACKSSDW and VPACKSSWB (saturating to
// int16 first changes nothing), and VPERMD puts the packed dwords back in
// element order. With one, it emits quantQ81AVX2, ggml's x86 Q8_1
// quantization (Q5_1's activations; ggml.QuantizeActivationRow): the same
// quants after d and s, s = f16(d * float32(sum)), the sum of the int32
// quants before saturation (wrapping, as Go's int32 sum does on the NaN
// lanes' integer indefinite), d the float32 before its f16 rounding.
func quantQ80AVX2(one bool) {
	name, what, bsz, qoff := "quantQ80AVX2", "Q8_0", 34, 2
	if one {
		name, what, bsz, qoff = "quantQ81AVX2", "Q8_1", 36, 4
	}
	TEXT(name, NOSPLIT, "func(nb int, x *float32, dst *byte)")
	Pragma("noescape")
	Doc(name + " quantizes nb blocks of 32 activations to " + what + ".")
	n := param("nb")
	x := param("x")
	dst := param("dst")
	absMask := bcastConstY(0x7fffffff)
	t := GP32()
	MOVL(U32(0x42fe0000), t) // 127
	c127 := XMM()
	VMOVD(t, c127)
	zero := XMM()
	VXORPS(zero, zero, zero)
	perm := YMM()
	VMOVDQU(q80Perm(), perm)
	Label("loop")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	var v [4]reg.VecVirtual
	var m [4]reg.VecVirtual
	for i := range v {
		v[i], m[i] = YMM(), YMM()
		VMOVUPS(Mem{Base: x, Disp: 32 * i}, v[i])
		VANDPS(absMask, v[i], m[i])
	}
	// quantQ80AVX512 pairs lane i with i+16 (the two ZMM halves), then
	// i+8, i+4, i+2, i+1: the same pairs here (VMAXPS is not commutative
	// on NaN, so the operand order follows the AVX-512 code too).
	VMAXPS(m[2], m[0], m[0])
	VMAXPS(m[3], m[1], m[1])
	VMAXPS(m[1], m[0], m[0])
	xx := XMM()
	VEXTRACTF128(Imm(1), m[0], xx)
	VMAXPS(xx, m[0].AsX(), xx)
	h := XMM()
	VMOVHLPS(xx, xx, h)
	VMAXPS(h, xx, xx)
	VMOVSHDUP(xx, h)
	VMAXSS(h, xx, xx) // amax
	d := XMM()
	VDIVSS(c127, xx, d) // amax / 127
	dh := XMM()
	VCVTPS2PH(Imm(0), d, dh)
	VPEXTRW(Imm(0), dh, Mem{Base: dst})
	nz := XMM()
	VCMPSS(Imm(4), zero, xx, nz) // amax != 0
	id := XMM()
	VDIVSS(xx, c127, id) // 127 / amax
	VANDPS(nz, id, id)   // or 0
	idy := YMM()
	VBROADCASTSS(id, idy)
	for i := range v {
		VMULPS(idy, v[i], v[i])
		VCVTPS2DQ(v[i], v[i])
	}
	if one {
		t, u := YMM(), YMM()
		VPADDD(v[1], v[0], t)
		VPADDD(v[3], v[2], u)
		VPADDD(u, t, t)
		h := XMM()
		VEXTRACTI128(Imm(1), t, h)
		VPADDD(h, t.AsX(), h)
		VPSHUFD(Imm(0x4e), h, t.AsX())
		VPADDD(t.AsX(), h, h)
		VPSHUFD(Imm(0xb1), h, t.AsX())
		VPADDD(t.AsX(), h, h) // the sum, in every lane
		VCVTDQ2PS(h, h)       // exact: at most 32*127 unless a lane is NaN's
		VMULSS(d, h, h)       // d*sum, d not yet rounded to f16
		VCVTPS2PH(Imm(0), h, h)
		VPEXTRW(Imm(0), h, Mem{Base: dst, Disp: 2})
	}
	VPACKSSDW(v[1], v[0], v[0]) // per 128 bits: 0-3 8-11 | 4-7 12-15
	VPACKSSDW(v[3], v[2], v[2]) // 16-19 24-27 | 20-23 28-31
	VPACKSSWB(v[2], v[0], v[0]) // 0-3 8-11 16-19 24-27 | 4-7 12-15 20-23 28-31
	VPERMD(v[0], perm, v[0])
	VMOVDQU(v[0], Mem{Base: dst, Disp: qoff})
	ADDQ(Imm(128), x)
	ADDQ(Imm(uint64(bsz)), dst)
	DECQ(n)
	JMP(LabelRef("loop"))
	Label("done")
	ret()
}

var q80PermMem *Mem

// q80Perm is VPERMD's control that puts quantQ80AVX2's packed dwords in
// order.
func q80Perm() Mem {
	if q80PermMem == nil {
		m := GLOBL("q80PermAVX2", RODATA|NOPTR)
		for i, v := range []uint32{0, 4, 1, 5, 2, 6, 3, 7} {
			DATA(4*i, U32(v))
		}
		q80PermMem = &m
	}
	return *q80PermMem
}

// f32ToF16AVX2 emits f32ToF16AVX512's function with F16C, eight at a time
// (n a multiple of 8; the caller converts the rest).
func f32ToF16AVX2() {
	TEXT("f32ToF16AVX2", NOSPLIT, "func(n int, src *float32, dst *uint16)")
	Pragma("noescape")
	Doc("f32ToF16AVX2 sets dst[i] = ggml.F32ToF16(src[i]) for i < n (a multiple of 8).")
	n := param("n")
	src := param("src")
	dst := param("dst")
	Label("loop")
	CMPQ(n, Imm(8))
	JL(LabelRef("done"))
	y := YMM()
	VMOVUPS(Mem{Base: src}, y)
	VCVTPS2PH(Imm(0), y, Mem{Base: dst})
	ADDQ(Imm(32), src)
	ADDQ(Imm(16), dst)
	SUBQ(Imm(8), n)
	JMP(LabelRef("loop"))
	Label("done")
	ret()
}

// quantQ8KXAVX2 emits quantQ8KXAVX512's function with AVX2: the same
// signed max and min (VMAXPS and VMINPS keep the accumulator on a NaN, as
// there), mx, iscale and quants; the quants are truncated to bytes as
// VPMOVDB truncates (masked to their low byte, then packed without
// saturation by VPACKUSDW and VPACKUSWB, and put back in order by
// VPERMD); the group sums of the stored bytes are exact integers, so
// VPHADDD may add them in any order.
func quantQ8KXAVX2() {
	TEXT("quantQ8KXAVX2", NOSPLIT, "func(nb int, x *float32, dst *byte)")
	Pragma("noescape")
	Doc("quantQ8KXAVX2 quantizes nb super-blocks of 256 activations to Q8_K in the K-quant panel kernels' expanded layout.")
	n := param("nb")
	x := param("x")
	dst := param("dst")
	g := GP32()
	MOVL(U32(math.Float32bits(-127)), g)
	m127 := XMM()
	VMOVD(g, m127)
	MOVL(U32(math.Float32bits(1)), g)
	one := XMM()
	VMOVD(g, one)
	xm := func(v int) Mem { return Mem{Base: x, Disp: 32 * v} }

	Label("loop")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	zero := YMM()
	VPXOR(zero, zero, zero)
	var hi, lo [2]reg.VecVirtual
	for i := range 2 {
		hi[i], lo[i] = YMM(), YMM()
		VMOVDQA(zero, hi[i])
		VMOVDQA(zero, lo[i])
	}
	for v := range 32 {
		z := YMM()
		VMOVUPS(xm(v), z)
		VMAXPS(hi[v%2], z, hi[v%2])
		VMINPS(lo[v%2], z, lo[v%2])
	}
	VMAXPS(hi[1], hi[0], hi[0])
	VMINPS(lo[1], lo[0], lo[0])
	maxS := hmaxY(hi[0], VMAXPS, VMAXSS)
	minS := hmaxY(lo[0], VMINPS, VMINSS)
	amax, mx, is := q8KScale(maxS, minS, zero.AsX(), m127, one, dst)
	isy := YMM()
	VBROADCASTSS(is, isy)
	magic := bcastConstY(0x4b400000) // 1.5*2^23
	var sums [4]reg.VecVirtual       // group sums, four groups an XMM
	for q4 := range 8 {              // 32 quants at a time
		var t, s [4]reg.VecVirtual
		for i := range 4 {
			v := 4*q4 + i
			t[i] = YMM()
			VMULPS(xm(v), isy, t[i])
			VADDPS(magic, t[i], t[i])
			VPAND(q8KConst(0), t[i], t[i])   // the mantissa
			VPSUBD(q8KConst(32), t[i], t[i]) // minus 2^22
			VPMINSD(q8KConst(64), t[i], t[i])
			s[i] = YMM()
			VPSLLD(Imm(24), t[i], s[i])
			VPSRAD(Imm(24), s[i], s[i]) // the stored byte, sign-extended
			VPAND(q8KConst(96), t[i], t[i])
			if i%2 == 1 { // groups 2q4 and 2q4+1: vectors 0+1 and 2+3
				VPADDD(s[i], s[i-1], s[i-1])
				VPACKUSDW(t[i], t[i-1], t[i-1])
			}
		}
		VPACKUSWB(t[2], t[0], t[0])
		perm := YMM()
		VMOVDQU(q80Perm(), perm)
		VPERMD(t[0], perm, t[0])
		VMOVDQU(t[0], Mem{Base: dst, Disp: xKQuants + 32*q4})
		VPHADDD(s[2], s[0], s[0]) // per 128 bits: g0 g0 g1 g1 | …
		if q4%2 == 0 {
			sums[q4/2] = s[0]
			continue
		}
		VPHADDD(s[0], sums[q4/2], sums[q4/2]) // g0 g1 g2 g3 | g0 g1 g2 g3
		h := XMM()
		VEXTRACTI128(Imm(1), sums[q4/2], h)
		VPADDD(h, sums[q4/2].AsX(), h)
		sums[q4/2] = h
	}
	for i, s := range sums {
		c, z := XMM(), XMM()
		VPSLLD(Imm(5), s, c)
		VPXOR(z, z, z)
		VPSUBD(c, z, c) // -32 times the sum
		VMOVDQU(c, Mem{Base: dst, Disp: xKCorr + 16*i})
	}
	p0, p1 := XMM(), XMM()
	VPHADDD(sums[1], sums[0], p0) // groups 2k and 2k+1
	VPHADDD(sums[3], sums[2], p1)
	VPACKSSDW(p1, p0, p0) // at most 32*128 in magnitude: the low words
	VMOVDQU(p0, Mem{Base: dst, Disp: xKSums})
	Label("next")
	ADDQ(U32(1024), x)
	ADDQ(U32(xKBlock), dst)
	DECQ(n)
	JMP(LabelRef("loop"))

	Label("zero")
	zero = YMM()
	VPXOR(zero, zero, zero)
	for off := 0; off+32 <= xKBlock; off += 32 {
		VMOVDQU(zero, Mem{Base: dst, Disp: off})
	}
	VMOVDQU(zero, Mem{Base: dst, Disp: xKBlock - 32})
	JMP(LabelRef("next"))

	// Both +amax and -amax occur: mx is the first value of magnitude amax.
	Label("tie")
	ab := YMM()
	VBROADCASTSS(amax, ab)
	absMask := bcastConstY(0x7fffffff)
	m := GP32()
	base := GP64()
	for v := range 32 {
		a := YMM()
		VANDPS(xm(v), absMask, a)
		VCMPPS(Imm(0), ab, a, a) // |x| == amax, ordered
		VMOVMSKPS(a, m)
		MOVQ(U32(uint32(8*v)), base)
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

var q8KConstMem *Mem

// q8KConst is quantQ8KXAVX2's constants at off: the mantissa mask (0),
// 2^22 (32), 127 (64), 0xff (96), eight dwords each.
func q8KConst(off int) Mem {
	if q8KConstMem == nil {
		m := GLOBL("q8KConstAVX2", RODATA|NOPTR)
		for i, v := range []uint32{0x007fffff, 0x00400000, 127, 0xff} {
			for l := range 8 {
				DATA(32*i+4*l, U32(v))
			}
		}
		q8KConstMem = &m
	}
	return q8KConstMem.Offset(off)
}

// hmaxY reduces the eight lanes of y with op (VMAXPS or VMINPS; no NaNs)
// and returns an XMM whose lane 0 is the result.
func hmaxY(y reg.VecVirtual, op, ops func(...Op)) reg.VecVirtual {
	x := XMM()
	VEXTRACTF128(Imm(1), y, x)
	op(x, y.AsX(), x)
	h := XMM()
	VMOVHLPS(x, x, h)
	op(h, x, x)
	VMOVSHDUP(x, h)
	ops(h, x, x)
	return x
}
