package cpu

import (
	"encoding/binary"

	"github.com/strata-llm/strata/model/ggml"
)

// Block sizes in bytes; layouts are described in package ggml.
const (
	q40Bytes = 18
	q80Bytes = 34
	q4KBytes = 144
	q6KBytes = 210
	q8KBytes = 292
)

// dotQ80Q80 is the Q8_0·Q8_0 kernel.
//
// Order (ggml's on x86: ggml_vec_dot_q8_0_q8_0 with AVX2 for one token,
// llamafile's tinyBLAS_Q0_AVX for batches): eight float32 lanes start at
// +0. For each block in increasing order, with dd = float32(f16(w.d) *
// f16(x.d)) (rounded), lane l becomes fma(float32(p_l), dd, lane l) with a
// single rounding, p_l the exact int32 sum of the products w.q[j]*x.q[j]
// for j = 4l..4l+3. Then hsum8 folds the lanes: ((l0+l4)+(l2+l6)) +
// ((l1+l5)+(l3+l7)). Summing a block into one integer first, as strata did
// before, differs from llama.cpp by a rounding in the last bits, enough to
// flip activation roundings downstream (docs/llamacpp-agreement.md).
func dotQ80Q80(n int, w, x []byte) float32 {
	nb := n / ggml.QK
	w, x = w[:nb*q80Bytes], x[:nb*q80Bytes]
	t := f16Table
	var acc [8]float32
	for b := range nb {
		wb := (*[q80Bytes]byte)(w[b*q80Bytes:])
		xb := (*[q80Bytes]byte)(x[b*q80Bytes:])
		dd := t[uint16(wb[0])|uint16(wb[1])<<8] * t[uint16(xb[0])|uint16(xb[1])<<8]
		for l := range 8 {
			var p int32
			for j := 2 + 4*l; j < 6+4*l; j++ {
				p += int32(int8(wb[j])) * int32(int8(xb[j]))
			}
			acc[l] = fma32(float32(p), dd, acc[l])
		}
	}
	return hsum8(&acc)
}

// hsum8 is ggml's hsum_float_8: ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
func hsum8(a *[8]float32) float32 {
	return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

// dotQ40Q80 is the Q4_0·Q8_0 kernel. Order: one float32 accumulator starts
// at +0; per block, acc = fma(float32(p), float32(f16(w.d)*f16(x.d)), acc)
// with p the exact int32 sum of the block's 32 products, with the weight
// quants q-8 (low nibbles are elements 0..15, high nibbles 16..31).
func dotQ40Q80(n int, w, x []byte) float32 {
	nb := n / ggml.QK
	w, x = w[:nb*q40Bytes], x[:nb*q80Bytes]
	t := f16Table
	var acc float32
	for b := range nb {
		wb := (*[q40Bytes]byte)(w[b*q40Bytes:])
		xb := (*[q80Bytes]byte)(x[b*q80Bytes:])
		var p int32
		for j := range 16 {
			p += (int32(wb[2+j]&0xf)-8)*int32(int8(xb[2+j])) + (int32(wb[2+j]>>4)-8)*int32(int8(xb[18+j]))
		}
		dd := t[uint16(wb[0])|uint16(wb[1])<<8] * t[uint16(xb[0])|uint16(xb[1])<<8]
		acc = fma32(float32(p), dd, acc)
	}
	return acc
}

// dotQ4KQ8K is the Q4_K·Q8_K kernel, in the order of dot_kquant.go's
// kernels (dotQ5KQ8K's, with 4-bit quants).
//
// Order: one float32 accumulator starts at +0. For each super-block in
// increasing order, with d = float32(f16(w.d)*x.d) and dmin =
// float32(f16(w.dmin)*x.d): for each of the 8 sub-blocks s of 32 elements
// in order, acc = fma(float32(scale(s) * sum(q*x.q)), d, acc), q the 4-bit
// quant and scale(s), min(s) the sub-block's 6-bit scale and min; then mins
// = the sum over the 16 groups k of 16 elements of min(k/2) * x.bsums[k],
// and acc = fma(float32(-mins), dmin, acc). A sub-block's scaled sum is at
// most 63*32*15*128 in magnitude and mins at most 16*63*2048, both below
// 2^24, so every conversion to float32 is exact and each fma rounds once.
// The panel kernels (repack_kquant.go) compute the same integers for 16
// rows at once.
func dotQ4KQ8K(n int, w, x []byte) float32 {
	nb := n / ggml.QKK
	w, x = w[:nb*q4KBytes], x[:nb*q8KBytes]
	t := f16Table
	var acc float32
	for b := range nb {
		wb := (*[q4KBytes]byte)(w[b*q4KBytes:])
		xb := x[b*q8KBytes : (b+1)*q8KBytes]
		scales := wb[4:16]
		y := (*[256]byte)(xb[4:])
		yd := q8KScale(xb)
		d := t[binary.LittleEndian.Uint16(wb[0:])] * yd
		dmin := t[binary.LittleEndian.Uint16(wb[2:])] * yd
		for g := range 4 { // 64 elements: sub-block 2g in the low nibbles, 2g+1 in the high
			qs := (*[32]byte)(wb[16+32*g:])
			lo := (*[32]byte)(y[64*g:])
			hi := (*[32]byte)(y[64*g+32:])
			var s0, s1 int32
			for l := range 32 {
				s0 += int32(qs[l]&0xf) * int32(int8(lo[l]))
				s1 += int32(qs[l]>>4) * int32(int8(hi[l]))
			}
			sc0, _ := ggml.Q4KScaleMin(2*g, scales)
			sc1, _ := ggml.Q4KScaleMin(2*g+1, scales)
			acc = fma32(float32(int32(sc0)*s0), d, acc)
			acc = fma32(float32(int32(sc1)*s1), d, acc)
		}
		var mins int32
		for k := range 16 {
			_, m := ggml.Q4KScaleMin(k/2, scales)
			mins += int32(m) * q8KBsum(xb, k)
		}
		acc = fma32(float32(-mins), dmin, acc)
	}
	return acc
}

// dotQ6KQ8K is the Q6_K·Q8_K kernel, in the order of dot_kquant.go's
// kernels.
//
// Order: one float32 accumulator starts at +0. For each super-block in
// increasing order, with d = float32(f16(w.d)*x.d): for each of the 16
// groups g of 16 elements in order, acc = fma(float32(scale(g) *
// sum((q-32)*x.q)), d, acc), q the unsigned 6-bit quant and scale(g) the
// group's int8 scale. A group's scaled sum is at most 128*16*32*128 = 2^23
// in magnitude, so its conversion to float32 is exact and each fma rounds
// once. The panel kernels (repack_kquant.go) compute the same integers for
// 16 rows at once.
func dotQ6KQ8K(n int, w, x []byte) float32 {
	nb := n / ggml.QKK
	w, x = w[:nb*q6KBytes], x[:nb*q8KBytes]
	t := f16Table
	var acc float32
	for b := range nb {
		wb := (*[q6KBytes]byte)(w[b*q6KBytes:])
		xb := x[b*q8KBytes : (b+1)*q8KBytes]
		y := (*[256]byte)(xb[4:])
		d := t[binary.LittleEndian.Uint16(wb[208:])] * q8KScale(xb)
		// Element e = 128h + 32k + l (l < 32) has its low four bits in
		// nibble k/2 of ql[64h + 32(k%2) + l] and its high two at bits 2k
		// of qh[32h + l]; group g = e/16.
		for g := range 16 {
			h, k, l0 := g/8, g%8/2, 16*(g%2)
			ql := (*[16]byte)(wb[64*h+32*(k%2)+l0:])
			qh := (*[16]byte)(wb[128+32*h+l0:])
			ys := (*[16]byte)(y[16*g:])
			shift, hs := 4*(k/2), 2*k
			var s int32
			for l := range 16 {
				q := int32(ql[l]>>shift&0xf|(qh[l]>>hs&3)<<4) - 32
				s += q * int32(int8(ys[l]))
			}
			acc = fma32(float32(int32(int8(wb[192+g]))*s), d, acc)
		}
	}
	return acc
}
