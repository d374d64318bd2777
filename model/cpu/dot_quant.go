package cpu

import (
	"encoding/binary"
	"math"

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
// Order: one float32 accumulator starts at +0. For each block in increasing
// order, p is the exact int32 sum of the 32 products w.q[j]*x.q[j], dd =
// float32(f16(w.d) * f16(x.d)) (rounded), and acc becomes fma(float32(p),
// dd, acc) with a single rounding. |p| < 2^24, so float32(p) is exact. This
// is the order of llama.cpp's repacked CPU kernels (one integer sum per
// block and row), and the one the panel kernels keep for 16 rows at once.
func dotQ80Q80(n int, w, x []byte) float32 {
	nb := n / ggml.QK
	w, x = w[:nb*q80Bytes], x[:nb*q80Bytes]
	t := f16Table
	var acc float32
	for b := range nb {
		wb := (*[q80Bytes]byte)(w[b*q80Bytes:])
		xb := (*[q80Bytes]byte)(x[b*q80Bytes:])
		dd := t[uint16(wb[0])|uint16(wb[1])<<8] * t[uint16(xb[0])|uint16(xb[1])<<8]
		var p int32
		for j := 2; j < q80Bytes; j++ {
			p += int32(int8(wb[j])) * int32(int8(xb[j]))
		}
		acc = fma32(float32(p), dd, acc)
	}
	return acc
}

// dotQ40Q80 is the Q4_0·Q8_0 kernel. Order as dotQ80Q80, with the weight
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

// dotQ4KQ8K is the Q4_K·Q8_K kernel, with the structure of ggml's
// ggml_vec_dot_q4_K_q8_K_generic.
//
// Order: eight float32 lane sums start at +0, and sumf at +0. For each
// super-block in increasing order: aux[l] (l = 0..7) is the exact int32 sum,
// over the 32 groups of 8 elements g, of scale(g/4) * w.q[8g+l] * x.q[8g+l]
// (scale and min are the 6-bit values of the 32-element sub-block); mins is the
// exact sum over the 16 bsums of x of bsum[k]*min(k/2). Then, rounding every
// product and sum to float32: d = f16(w.d)*x.d; sums[l] += d*float32(aux[l])
// for l = 0..7; dmin = f16(w.dmin)*x.d; sumf -= dmin*float32(mins). At the end
// sumf += sums[l] for l = 0..7 in order. All integer sums are below 2^24 in
// magnitude, so their conversions to float32 are exact.
func dotQ4KQ8K(n int, w, x []byte) float32 {
	nb := n / ggml.QKK
	w, x = w[:nb*q4KBytes], x[:nb*q8KBytes]
	t := f16Table
	var sums [8]float32
	var sumf float32
	for b := range nb {
		wb := w[b*q4KBytes : (b+1)*q4KBytes]
		xb := x[b*q8KBytes : (b+1)*q8KBytes]
		scales := wb[4:16]
		q4 := wb[16 : 16+128]
		q8 := xb[4 : 4+256]
		var aux [8]int32
		var sc, mn [8]int32
		for j := range 8 {
			s, m := ggml.Q4KScaleMin(j, scales)
			sc[j], mn[j] = int32(s), int32(m)
		}
		for j := range 4 { // 64 elements: 32 low nibbles (sub-block 2j), 32 high (2j+1)
			qq := q4[32*j : 32*j+32]
			lo := q8[64*j : 64*j+32]
			hi := q8[64*j+32 : 64*j+64]
			for g := range 4 {
				for l := range 8 {
					k := 8*g + l
					aux[l] += sc[2*j] * int32(qq[k]&0xf) * int32(int8(lo[k]))
					aux[l] += sc[2*j+1] * int32(qq[k]>>4) * int32(int8(hi[k]))
				}
			}
		}
		var mins int32
		bs := xb[4+256:]
		for k := range 16 {
			mins += int32(int16(binary.LittleEndian.Uint16(bs[2*k:]))) * mn[k/2]
		}
		yd := math.Float32frombits(binary.LittleEndian.Uint32(xb))
		d := t[binary.LittleEndian.Uint16(wb)] * yd
		for l := range 8 {
			sums[l] += float32(d * float32(aux[l]))
		}
		dmin := t[binary.LittleEndian.Uint16(wb[2:])] * yd
		sumf -= float32(dmin * float32(mins))
	}
	for l := range 8 {
		sumf += sums[l]
	}
	return sumf
}

// dotQ6KQ8K is the Q6_K·Q8_K kernel, with the structure of ggml's
// ggml_vec_dot_q6_K_q8_K_generic.
//
// Order: eight float32 lane sums start at +0. For each super-block in
// increasing order: aux[l] (l = 0..7) is the exact int32 sum, over the 32
// groups of 8 elements g, of scale(g/2) * w.q[8g+l] * x.q[8g+l] (scale is the
// int8 scale of the 16-element group, q the 6-bit value minus 32). Then,
// rounding every product and sum to float32: d = f16(w.d)*x.d; sums[l] +=
// d*float32(aux[l]) for l = 0..7. The result is +0 + sums[0] + ... + sums[7]
// in order. |aux[l]| <= 2^24, so its conversion to float32 is exact.
func dotQ6KQ8K(n int, w, x []byte) float32 {
	nb := n / ggml.QKK
	w, x = w[:nb*q6KBytes], x[:nb*q8KBytes]
	t := f16Table
	var sums [8]float32
	for b := range nb {
		wb := w[b*q6KBytes : (b+1)*q6KBytes]
		xb := x[b*q8KBytes : (b+1)*q8KBytes]
		ql := wb[0:128]
		qh := wb[128:192]
		scales := wb[192:208]
		q8 := xb[4 : 4+256]
		var aux [8]int32
		for h := range 2 { // two halves of 128 elements
			l4 := ql[64*h : 64*h+64]
			hh := qh[32*h : 32*h+32]
			sc := scales[8*h : 8*h+8]
			y := q8[128*h : 128*h+128]
			for k := range 32 {
				is := k / 16
				q1 := int32(l4[k]&0xf|(hh[k]>>0&3)<<4) - 32
				q2 := int32(l4[k+32]&0xf|(hh[k]>>2&3)<<4) - 32
				q3 := int32(l4[k]>>4|(hh[k]>>4&3)<<4) - 32
				q4 := int32(l4[k+32]>>4|(hh[k]>>6&3)<<4) - 32
				l := k % 8
				aux[l] += int32(int8(sc[is])) * q1 * int32(int8(y[k]))
				aux[l] += int32(int8(sc[is+2])) * q2 * int32(int8(y[k+32]))
				aux[l] += int32(int8(sc[is+4])) * q3 * int32(int8(y[k+64]))
				aux[l] += int32(int8(sc[is+6])) * q4 * int32(int8(y[k+96]))
			}
		}
		d := t[binary.LittleEndian.Uint16(wb[208:])] * math.Float32frombits(binary.LittleEndian.Uint32(xb))
		for l := range 8 {
			sums[l] += float32(d * float32(aux[l]))
		}
	}
	var sumf float32
	for l := range 8 {
		sumf += sums[l]
	}
	return sumf
}
