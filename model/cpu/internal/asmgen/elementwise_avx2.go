package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// The element-wise kernels again for CPUs with AVX2, FMA and F16C but no
// AVX-512, which ran them as portable Go (a quarter of a Q4_0 prompt's
// time on an AVX2-only AMD EPYC, session 16): the same operations on eight
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
	VPBROADCASTD(vexpBias(), bias)
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

var vexpBiasMem *Mem

// vexpBias is the dword 127, a float32 exponent's bias.
func vexpBias() Mem {
	if vexpBiasMem == nil {
		m := GLOBL("vexpBias", RODATA|NOPTR)
		DATA(0, U32(127))
		vexpBiasMem = &m
	}
	return *vexpBiasMem
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
// element order.
func quantQ80AVX2() {
	TEXT("quantQ80AVX2", NOSPLIT, "func(nb int, x *float32, dst *byte)")
	Pragma("noescape")
	Doc("quantQ80AVX2 quantizes nb blocks of 32 activations to Q8_0.")
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
	VCVTPS2PH(Imm(0), d, d)
	VPEXTRW(Imm(0), d, Mem{Base: dst})
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
	VPACKSSDW(v[1], v[0], v[0]) // per 128 bits: 0-3 8-11 | 4-7 12-15
	VPACKSSDW(v[3], v[2], v[2]) // 16-19 24-27 | 20-23 28-31
	VPACKSSWB(v[2], v[0], v[0]) // 0-3 8-11 16-19 24-27 | 4-7 12-15 20-23 28-31
	VPERMD(v[0], perm, v[0])
	VMOVDQU(v[0], Mem{Base: dst, Disp: 2})
	ADDQ(Imm(128), x)
	ADDQ(Imm(34), dst)
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
