package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// The matrix kernels of f16 and bf16 weights take their activations as
// float32 rows that hold values already rounded to f16 or bf16 (roundF16,
// roundBF16): widening a half is exact, so a product equals the one of
// f16AVX512 and bf16AVX512 on the halves, and only the weights need
// converting in the loop.

// loadF32 loads 16 float32s (k nil) or the lanes of k, the others zero.
func loadF32(m Mem, k reg.OpmaskVirtual) reg.VecVirtual {
	z := ZMM()
	if k == nil {
		VMOVUPS(m, z)
	} else {
		VMOVUPS_Z(m, k, z)
	}
	return z
}

// halfLoop is floatLoop for half weights (2 bytes) and float32
// activations, in the same order: 16 elements a step into the same
// accumulators, whatever the unrolling. unroll steps run per iteration;
// with prefetch, each iteration also prefetches the 64 bytes at the same
// offset of the next R weight rows (the next tile of a matrix-vector
// product, whose rows follow these in memory), so that the rows of one tile
// stream in while the previous tile computes.
func (t *tile) halfLoop(unroll int, prefetch bool, wload func(m Mem, k reg.OpmaskVirtual) reg.VecVirtual, fma func(w, x, acc reg.VecVirtual, k reg.OpmaskVirtual)) {
	acc := t.zeroAcc()
	body := func(k reg.OpmaskVirtual, step int) {
		xv := make([]reg.VecVirtual, t.C)
		for c := range xv {
			xv[c] = loadF32(t.x(c, 64*step), k)
		}
		for r := 0; r < t.R; r++ {
			wv := wload(t.w(r, 32*step), k)
			for c := range xv {
				fma(wv, xv[c], acc[r][c], k)
			}
		}
	}
	var pw reg.GPVirtual
	if prefetch {
		pw = GP64()
		IMUL3Q(Imm(uint64(t.R)), t.ws, pw)
		ADDQ(t.wp, pw)
	}
	if unroll > 1 {
		Label("loopu")
		CMPQ(t.n, Imm(uint64(16*unroll)))
		JL(LabelRef("loop"))
		prefetchAhead(t.wp, 32*unroll)
		if prefetch {
			for r := 0; r < t.R; r++ {
				for d := 0; d < 32*unroll; d += 64 {
					PREFETCHT0(rowMem(pw, t.ws, t.ws3, r, d))
				}
			}
			ADDQ(Imm(uint64(32*unroll)), pw)
		}
		for u := range unroll {
			body(nil, u)
		}
		t.advance(32*unroll, 64*unroll, 16*unroll)
		JMP(LabelRef("loopu"))
	}
	Label("loop")
	CMPQ(t.n, Imm(16))
	JL(LabelRef("tail"))
	body(nil, 0)
	t.advance(32, 64, 16)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(t.n, t.n)
	JZ(LabelRef("done"))
	body(tailMask(t.n), 0)
	Label("done")
	t.store(acc)
}

// f16xAVX512 is f16AVX512 with float32 activations: dotF16's order, each
// weight converted with VCVTPH2PS and one FMA per element. A matrix-vector
// tile (C = 1) streams its weights from memory: it runs two steps an
// iteration, and one of several rows prefetches the next tile's rows. A
// one-row tile, which MatMul runs for a single activation row (Backend.runTile),
// is one sequential stream that the hardware prefetcher follows better
// than software prefetches (measured: see prefetchTile).
func f16xAVX512(t *tile) { t.halfLoop(matVecUnroll(t), prefetchTile(t), cvtF16, fmaMasked) }

// bf16xAVX512 is bf16AVX512 with float32 activations: dotBF16's order,
// each weight widened (bf16 << 16) and one FMA per element; unrolled and
// prefetching as f16xAVX512.
func bf16xAVX512(t *tile) { t.halfLoop(matVecUnroll(t), prefetchTile(t), widenBF16, fmaMasked) }

// prefetchTile reports whether halfLoop prefetches the next tile's rows: for
// a matrix-vector tile of several rows only. Their R interleaved streams
// defeat the hardware prefetcher (without the prefetches a 4×1 tile read
// 16 GB/s where it reads 26 with them, AMD EPYC Zen 5, one thread); a
// one-row tile is a single stream it follows on its own, faster still
// without them (BenchmarkForward BF16 tg 95 tok/s against 89 with them).
func prefetchTile(t *tile) bool { return t.C == 1 && t.R > 1 }

// matVecUnroll is halfLoop's steps an iteration: 2 for a matrix-vector tile
// (a 64-byte line of each weight row), 1 otherwise.
func matVecUnroll(t *tile) int {
	if t.C == 1 {
		return 2
	}
	return 1
}

// cvtF16 loads 16 f16s (k nil) or the lanes of k as float32s.
func cvtF16(m Mem, k reg.OpmaskVirtual) reg.VecVirtual {
	z := ZMM()
	if k == nil {
		VCVTPH2PS(m, z)
	} else {
		VCVTPH2PS_Z(m, k, z)
	}
	return z
}

// widenBF16 loads 16 bf16s (k nil) or the lanes of k as float32s.
func widenBF16(m Mem, k reg.OpmaskVirtual) reg.VecVirtual {
	z := ZMM()
	if k == nil {
		VPMOVZXWD(m, z)
	} else {
		VPMOVZXWD_Z(m, k, z)
	}
	VPSLLD(Imm(16), z, z)
	return z
}

// roundLoop emits the loop of func(n int, src, dst *float32) over 16
// elements at a time, the tail masked: round turns the ZMM of src's
// elements into dst's.
func roundLoop(round func(z reg.VecVirtual)) {
	n := param("n")
	src := param("src")
	dst := param("dst")
	z := ZMM()
	Label("loop")
	CMPQ(n, Imm(16))
	JL(LabelRef("tail"))
	VMOVUPS(Mem{Base: src}, z)
	round(z)
	VMOVUPS(z, Mem{Base: dst})
	ADDQ(Imm(64), src)
	ADDQ(Imm(64), dst)
	SUBQ(Imm(16), n)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	k := tailMask(n)
	VMOVUPS_Z(Mem{Base: src}, k, z)
	round(z)
	VMOVUPS(z, k, Mem{Base: dst})
	Label("done")
	ret()
}

// roundF16 emits func(n int, src, dst *float32): dst[i] = the float32 value
// of ggml.F32ToF16(src[i]) (VCVTPS2PH with round to nearest even, then
// VCVTPH2PS, both exact as f32ToF16AVX512 and f16AVX512 use them).
func roundF16() {
	TEXT("roundF16AVX512", NOSPLIT, "func(n int, src *float32, dst *float32)")
	Pragma("noescape")
	Doc("roundF16AVX512 sets dst[i] = float32(ggml.F32ToF16(src[i])) for i < n.")
	roundLoop(func(z reg.VecVirtual) {
		VCVTPS2PH(Imm(0), z, z.AsY())
		VCVTPH2PS(z.AsY(), z)
	})
}

// roundBF16 emits func(n int, src, dst *float32): dst[i] = the float32
// value of ggml.F32ToBF16(src[i]): b + 0x7fff + (b>>16 & 1), the low half
// cleared, for a number; for a NaN, b with the quiet bit (0x400000) set and
// the low half cleared.
func roundBF16() {
	TEXT("roundBF16AVX512", NOSPLIT, "func(n int, src *float32, dst *float32)")
	Pragma("noescape")
	Doc("roundBF16AVX512 sets dst[i] = ggml.BF16ToF32(ggml.F32ToBF16(src[i])) for i < n.")
	c := func(v uint32) reg.VecVirtual {
		g := GP32()
		MOVL(U32(v), g)
		z := ZMM()
		VPBROADCASTD(g, z)
		return z
	}
	one, bias, hi, abs, inf, quiet := c(1), c(0x7fff), c(0xffff0000), c(0x7fffffff), c(0x7f800000), c(0x400000)
	roundLoop(func(z reg.VecVirtual) {
		r := ZMM()
		VPSRLD(Imm(16), z, r)
		VPANDD(one, r, r)
		VPADDD(bias, r, r)
		VPADDD(z, r, r)
		a := ZMM()
		VPANDD(abs, z, a)
		nan := K()
		VPCMPUD(Imm(6), inf, a, nan) // a > inf: a NaN
		VPORD(quiet, z, nan, r)
		VPANDD(hi, r, z)
	})
}
