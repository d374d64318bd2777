package cpu

import (
	"encoding/binary"
	"math"

	"github.com/strata-llm/strata/model/ggml"
)

// Block sizes in bytes of the K-quants added beside Q4_K and Q6_K, and of
// IQ4_XS; layouts are described in package ggml.
const (
	q2KBytes  = 84
	q3KBytes  = 110
	q5KBytes  = 176
	iq4XBytes = 136
)

// The kernels of this file share one order, as do dotQ4KQ8K and dotQ6KQ8K
// (dot_quant.go). One float32 accumulator starts
// at +0. For each 256-element super-block in increasing order: integer sums
// of weight quant times activation quant, each exact in int32 and each below
// 2^24 in magnitude so that its conversion to float32 is exact, are folded
// into the accumulator with one fma (a single rounding) each, against a
// float32 factor d = f16(w.d)*x.d rounded once. Which sums, in which order,
// each kernel's comment says. No sum depends on anything but the two rows'
// bytes, so a SIMD kernel reproduces it by computing the same integers.

// q8KScale returns a Q8_K super-block's float32 d.
func q8KScale(xb []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(xb)) }

// q8KBsum returns the sum of the Q8_K super-block's quants 16k..16k+15.
func q8KBsum(xb []byte, k int) int32 { return int32(int16(binary.LittleEndian.Uint16(xb[4+256+2*k:]))) }

// dotQ2KQ8K is the Q2_K·Q8_K kernel. Per super-block: isum = the sum over the
// 16 groups g of 16 elements of (scales[g]&15) * sum(q*x.q), q the 2-bit
// quant; summs = the sum over g of (scales[g]>>4) * x.bsums[g]. Then acc =
// fma(float32(isum), float32(f16(w.d)*x.d), acc) and acc =
// fma(float32(-summs), float32(f16(w.dmin)*x.d), acc). |isum| <= 256*3*15*128
// and |summs| <= 16*15*2048.
func dotQ2KQ8K(n int, w, x []byte) float32 {
	nb := n / ggml.QKK
	w, x = w[:nb*q2KBytes], x[:nb*q8KBytes]
	t := f16Table
	var acc float32
	for b := range nb {
		wb := (*[q2KBytes]byte)(w[b*q2KBytes:])
		xb := x[b*q8KBytes : (b+1)*q8KBytes]
		sc := wb[0:16]
		y := (*[256]byte)(xb[4:])
		var isum, summs int32
		for h := range 2 {
			qs := (*[32]byte)(wb[16+32*h:])
			for j := range 4 {
				shift := 2 * j
				ys := y[128*h+32*j : 128*h+32*j+32]
				var s0, s1 int32
				for l := range 16 {
					s0 += int32(qs[l]>>shift&3) * int32(int8(ys[l]))
					s1 += int32(qs[l+16]>>shift&3) * int32(int8(ys[l+16]))
				}
				g := 8*h + 2*j
				isum += int32(sc[g]&0xf)*s0 + int32(sc[g+1]&0xf)*s1
			}
		}
		for g := range 16 {
			summs += int32(sc[g]>>4) * q8KBsum(xb, g)
		}
		yd := q8KScale(xb)
		d := t[binary.LittleEndian.Uint16(wb[80:])] * yd
		dmin := t[binary.LittleEndian.Uint16(wb[82:])] * yd
		acc = fma32(float32(isum), d, acc)
		acc = fma32(float32(-summs), dmin, acc)
	}
	return acc
}

// dotQ3KQ8K is the Q3_K·Q8_K kernel. Per super-block: isum = the sum over the
// 16 groups g of 16 elements of (scale(g)-32) * sum(q*x.q), q the signed
// 3-bit quant (-4..3); then acc = fma(float32(isum), float32(f16(w.d)*x.d),
// acc). |isum| <= 256*32*4*128.
func dotQ3KQ8K(n int, w, x []byte) float32 {
	nb := n / ggml.QKK
	w, x = w[:nb*q3KBytes], x[:nb*q8KBytes]
	t := f16Table
	var acc float32
	for b := range nb {
		wb := (*[q3KBytes]byte)(w[b*q3KBytes:])
		xb := x[b*q8KBytes : (b+1)*q8KBytes]
		hm := (*[32]byte)(wb[0:])
		scales := ggml.Q3KScales(wb[96:108])
		y := (*[256]byte)(xb[4:])
		var isum int32
		for h := range 2 {
			qs := (*[32]byte)(wb[32+32*h:])
			for j := range 4 {
				shift, bit := 2*j, 4*h+j
				ys := y[128*h+32*j : 128*h+32*j+32]
				var s0, s1 int32
				for l := range 16 {
					q0 := int32(qs[l]>>shift&3) - 4 + 4*int32(hm[l]>>bit&1)
					q1 := int32(qs[l+16]>>shift&3) - 4 + 4*int32(hm[l+16]>>bit&1)
					s0 += q0 * int32(int8(ys[l]))
					s1 += q1 * int32(int8(ys[l+16]))
				}
				g := 8*h + 2*j
				isum += int32(scales[g])*s0 + int32(scales[g+1])*s1
			}
		}
		d := t[binary.LittleEndian.Uint16(wb[108:])] * q8KScale(xb)
		acc = fma32(float32(isum), d, acc)
	}
	return acc
}

// dotQ5KQ8K is the Q5_K·Q8_K kernel. Per super-block, with d =
// float32(f16(w.d)*x.d) and dmin = float32(f16(w.dmin)*x.d): for each of
// the 8 sub-blocks s of 32 elements in order, acc = fma(float32(scale(s) *
// sum(q*x.q)), d, acc), q the unsigned 5-bit quant; then mins = the sum over
// the 16 groups k of 16 elements of min(k/2) * x.bsums[k], and acc =
// fma(float32(-mins), dmin, acc). Each sub-block's sum is at most
// 63*32*31*128 in magnitude, mins at most 16*63*2048 (a whole super-block's
// scaled sum could pass 2^24, hence one fma per sub-block).
func dotQ5KQ8K(n int, w, x []byte) float32 {
	nb := n / ggml.QKK
	w, x = w[:nb*q5KBytes], x[:nb*q8KBytes]
	t := f16Table
	var acc float32
	for b := range nb {
		wb := (*[q5KBytes]byte)(w[b*q5KBytes:])
		xb := x[b*q8KBytes : (b+1)*q8KBytes]
		scales := wb[4:16]
		qh := (*[32]byte)(wb[16:])
		y := (*[256]byte)(xb[4:])
		yd := q8KScale(xb)
		d := t[binary.LittleEndian.Uint16(wb[0:])] * yd
		dmin := t[binary.LittleEndian.Uint16(wb[2:])] * yd
		for g := range 4 { // 64 elements: sub-block 2g in the low nibbles, 2g+1 in the high
			qs := (*[32]byte)(wb[48+32*g:])
			lo := y[64*g : 64*g+32]
			hi := y[64*g+32 : 64*g+64]
			b0, b1 := 2*g, 2*g+1
			var s0, s1 int32
			for l := range 32 {
				s0 += (int32(qs[l]&0xf) | int32(qh[l]>>b0&1)<<4) * int32(int8(lo[l]))
				s1 += (int32(qs[l]>>4) | int32(qh[l]>>b1&1)<<4) * int32(int8(hi[l]))
			}
			sc0, _ := ggml.Q4KScaleMin(b0, scales)
			sc1, _ := ggml.Q4KScaleMin(b1, scales)
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

// dotIQ4XSQ8K is the IQ4_XS·Q8_K kernel. Per super-block, with d =
// float32(f16(w.d)*x.d): for each of the 8 sub-blocks s of 32 elements in
// order, acc = fma(float32((scale(s)-32) * sum(level*x.q)), d, acc), level
// the ggml.IQ4Values entry of the 4-bit index. Each sub-block's sum is at
// most 32*32*127*128 < 2^24 in magnitude.
func dotIQ4XSQ8K(n int, w, x []byte) float32 {
	nb := n / ggml.QKK
	w, x = w[:nb*iq4XBytes], x[:nb*q8KBytes]
	t := f16Table
	lv := &iq4Levels
	var acc float32
	for b := range nb {
		wb := (*[iq4XBytes]byte)(w[b*iq4XBytes:])
		xb := x[b*q8KBytes : (b+1)*q8KBytes]
		sh := binary.LittleEndian.Uint16(wb[2:])
		y := (*[256]byte)(xb[4:])
		d := t[binary.LittleEndian.Uint16(wb[0:])] * q8KScale(xb)
		for s := range 8 {
			qs := (*[16]byte)(wb[8+16*s:])
			ys := y[32*s : 32*s+32]
			var p int32
			for l := range 16 {
				p += lv[qs[l]&0xf]*int32(int8(ys[l])) + lv[qs[l]>>4]*int32(int8(ys[l+16]))
			}
			ls := ggml.IQ4XSScale(sh, wb[4:8], s)
			acc = fma32(float32(ls*p), d, acc)
		}
	}
	return acc
}
