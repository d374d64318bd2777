package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// softmaxWeights emits chunkWeights (package cpu) for H heads (1 or 2), the
// weights pass of one chunk of at most 64 keys:
//
//	func(n int, s, ms, vs, m, sum *float32, scale float32)
//
// Head h's n scores are at s + h*64 elements, its weights go to ms and vs
// at the same offsets, its running maximum and sum are m[h] and sum[h].
// For each key, in order: x = s*scale; a new maximum (x > M) gets
// e = M-x, M = x, and weights ms = expf(e), vs = 1; any other key gets
// e = x-M and ms = 1, vs = expf(e); then sum = fma(sum, ms, vs).
//
// The running maximum is a prefix maximum, 16 keys a vector: a scan within
// the vector over the scores with NaNs as -Inf (VMAXPS keeps its second
// source, the earlier keys, on ties, as x > M keeps M), then the carried M; M before each key is the
// scan shifted by one lane. Exactly the scalar loop's M, so e and the
// weights are its bits (expZ is expSubAVX512's). The sum stays a chain of
// one operation per key in key order: additions where no key of the chunk
// set a new maximum (fma(sum, 1, vs) is sum + vs), FMAs otherwise; the
// heads' chains are interleaved.
func softmaxWeights(H int) {
	wk := weightsHead(fmt.Sprintf("softmaxWeightsx%dAVX512", H), H, func() reg.VecVirtual { return ZMM() })
	n, sp, msp, vsp, carry, news, left, off, at := wk.n, wk.sp, wk.msp, wk.vsp, wk.carry, wk.news, wk.left, wk.off, wk.at
	scale := ZMM()
	VBROADCASTSS(wk.scale, scale)
	bcst := func(bits uint32) reg.VecVirtual {
		g, z := GP32(), ZMM()
		MOVL(U32(bits), g)
		VPBROADCASTD(g, z)
		return z
	}
	negInf, one, last := bcst(0xff800000), bcst(0x3f800000), bcst(15)

	Label("vector")
	k := tailMask(left) // left <= 64: BZHI keeps all 32 bits from 32 on
	for h := range H {
		x := ZMM()
		VMOVAPS(negInf, x) // lanes past n: -Inf, which changes no maximum
		VMOVUPS(at(sp, h), k, x)
		VMULPS(scale, x, x)
		// The scan skips NaN scores as x > M does: as -Inf. (VMAXPS
		// returns its second source, the earlier keys, on a NaN there too,
		// so a NaN earlier key would spread.)
		p, kq := ZMM(), K()
		VMOVAPS(x, p)
		VCMPPS(Imm(0x03), x, x, kq) // unordered
		VMOVAPS(negInf, kq, p)
		for _, sh := range []int{1, 2, 4, 8} {
			t := ZMM()
			VALIGND(Imm(uint64(16-sh)), negInf, p, t) // p moved up sh lanes
			VMAXPS(t, p, p)
		}
		VMAXPS(carry[h], p, p)
		e := ZMM()
		VALIGND(Imm(15), carry[h], p, e) // M before each key
		VPERMPS(p, last, carry[h])
		kn := K()
		VCMPPS(Imm(0x1e), e, x, kn) // x > M, ordered: a new maximum
		d := ZMM()
		VSUBPS(e, x, d)
		VSUBPS(x, e, kn, d) // M - x where x is the new maximum
		w := expZ(d)
		msv, vsv := ZMM(), ZMM()
		VMOVAPS(one, msv)
		VMOVAPS(w, kn, msv)
		VMOVAPS(w, vsv)
		VMOVAPS(one, kn, vsv)
		VMOVUPS(msv, k, at(msp, h))
		VMOVUPS(vsv, k, at(vsp, h))
		g := GP32()
		KMOVW(kn, g)
		ORL(g, news)
	}
	ADDQ(Imm(64), off)
	SUBQ(Imm(16), left)
	JG(LabelRef("vector"))
	weightsTail(H, n, msp, vsp, news, carry)
}

// softmaxChunk is package cpu's: the keys a weights pass takes at most,
// and the elements from head 0's scores and weights to head 1's.
const softmaxChunk = 64

// weightsKernel is what weightsHead sets up for a weights kernel: the
// parameters n, s, ms and vs, the scale (an XMM), each head's carried
// maximum broadcast (carry), news (the new-maximum masks, ORed) zeroed,
// left = n and off = 0 (the vector's byte offset) for the loop over
// vectors, and at, the address of head h's vector at base.
type weightsKernel struct {
	n, sp, msp, vsp, news, left, off reg.GPVirtual
	scale                            reg.VecVirtual
	carry                            [2]reg.VecVirtual
	at                               func(base reg.GPVirtual, h int) Mem
}

// weightsHead starts weights kernel name (softmaxWeights,
// softmaxWeightsAVX2) of H heads with vectors from vec.
func weightsHead(name string, H int, vec func() reg.VecVirtual) weightsKernel {
	TEXT(name, NOSPLIT, "func(n int, s, ms, vs, m, sum *float32, scale float32)")
	Pragma("noescape")
	Doc(name + fmt.Sprintf(" computes the online-softmax weights of n (1..64) keys' scores of %d heads and carries their running maximum and sum.", H))
	var k weightsKernel
	k.n = param("n")
	k.sp, k.msp, k.vsp = param("s"), param("ms"), param("vs")
	k.scale = XMM()
	Load(Param("scale"), k.scale)
	mp := param("m")
	for h := range H {
		k.carry[h] = vec()
		VBROADCASTSS(Mem{Base: mp, Disp: 4 * h}, k.carry[h])
	}
	k.news = GP32()
	XORL(k.news, k.news)
	k.left, k.off = GP64(), GP64()
	MOVQ(k.n, k.left)
	XORQ(k.off, k.off)
	off := k.off
	k.at = func(base reg.GPVirtual, h int) Mem {
		return Mem{Base: base, Index: off, Scale: 1, Disp: 4 * softmaxChunk * h}
	}
	return k
}

// weightsTail ends a weights kernel (softmaxWeights, softmaxWeightsAVX2):
// it stores each head's carried maximum (lane 0 of carry[h]) and carries
// the running sum over the chunk's n keys, one operation per key in key
// order, the heads' chains interleaved: additions where no key of the
// chunk set a new maximum (news zero: fma(sum, 1, vs) is sum + vs), FMAs
// otherwise.
func weightsTail(H int, n, msp, vsp, news reg.GPVirtual, carry [2]reg.VecVirtual) {
	mp := param("m")
	for h := range H {
		VMOVSS(carry[h].AsX(), Mem{Base: mp, Disp: 4 * h})
	}
	sump := param("sum")
	var sum [2]reg.VecVirtual
	for h := range H {
		sum[h] = XMM()
		VMOVSS(Mem{Base: sump, Disp: 4 * h}, sum[h])
	}
	i := GP64()
	XORQ(i, i)
	key := func(h int) Mem { return Mem{Base: vsp, Index: i, Scale: 4, Disp: 4 * softmaxChunk * h} }
	TESTL(news, news)
	JNZ(LabelRef("fma"))
	Label("add")
	for h := range H {
		VADDSS(key(h), sum[h], sum[h])
	}
	INCQ(i)
	CMPQ(i, n)
	JL(LabelRef("add"))
	JMP(LabelRef("done"))
	Label("fma")
	for h := range H {
		w := XMM()
		VMOVSS(Mem{Base: msp, Index: i, Scale: 4, Disp: 4 * softmaxChunk * h}, w)
		VFMADD213SS(key(h), w, sum[h]) // sum = ms*sum + vs
	}
	INCQ(i)
	CMPQ(i, n)
	JL(LabelRef("fma"))
	Label("done")
	for h := range H {
		VMOVSS(sum[h], Mem{Base: sump, Disp: 4 * h})
	}
	ret()
}
