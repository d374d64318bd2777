package cpu

import (
	"encoding/binary"

	"github.com/strata-llm/strata/model/ggml"
)

// Block sizes in bytes of the 32-element types added beside Q4_0 and Q8_0;
// layouts are described in package ggml.
const (
	q50Bytes = 22
	q51Bytes = 24
	q81Bytes = 36
	iq4Bytes = 18
)

// dotQ50Q80 is the Q5_0·Q8_0 kernel, in dotQ80Q80's order (ggml's: eight
// lanes): lane l adds, per block, fma(float32(p), float32(f16(w.d)*f16(x.d)),
// lane) with p the exact int32 sum of (q-16)*x.q over elements 4l..4l+3 (q
// the 5-bit quant: low nibble of qs[j%16], high nibble for j >= 16, bit j of
// qh as bit 4); hsum8 folds the lanes.
func dotQ50Q80(n int, w, x []byte) float32 {
	nb := n / ggml.QK
	w, x = w[:nb*q50Bytes], x[:nb*q80Bytes]
	t := f16Table
	var acc [8]float32
	for b := range nb {
		wb := (*[q50Bytes]byte)(w[b*q50Bytes:])
		xb := (*[q80Bytes]byte)(x[b*q80Bytes:])
		qh := binary.LittleEndian.Uint32(wb[2:])
		dd := t[uint16(wb[0])|uint16(wb[1])<<8] * t[uint16(xb[0])|uint16(xb[1])<<8]
		for l := range 4 {
			var lo, hi int32
			for j := 4 * l; j < 4*l+4; j++ {
				lo += (int32(wb[6+j]&0xf) | int32(qh>>j&1)<<4 - 16) * int32(int8(xb[2+j]))
				hi += (int32(wb[6+j]>>4) | int32(qh>>(j+16)&1)<<4 - 16) * int32(int8(xb[18+j]))
			}
			acc[l] = fma32(float32(lo), dd, acc[l])
			acc[l+4] = fma32(float32(hi), dd, acc[l+4])
		}
	}
	return hsum8(&acc)
}

// dotQ51Q81 is the Q5_1·Q8_1 kernel, in ggml_vec_dot_q5_1_q8_1's order: the
// products in dotQ50Q80's eight lanes (q the unsigned 5-bit quant, laid out
// as Q5_0's, and dd = float32(f16(w.d)*f16(x.d))), and beside them one
// float32 sum of the blocks' mins times the sums of their activations
// (Q8_1 carries s = d*sum(q)), ms = fma(f16(w.m), f16(x.s), ms) per block;
// the result is hsum8(lanes) + ms.
func dotQ51Q81(n int, w, x []byte) float32 {
	nb := n / ggml.QK
	w, x = w[:nb*q51Bytes], x[:nb*q81Bytes]
	t := f16Table
	var acc [8]float32
	var ms float32
	for b := range nb {
		wb := (*[q51Bytes]byte)(w[b*q51Bytes:])
		xb := (*[q81Bytes]byte)(x[b*q81Bytes:])
		qh := binary.LittleEndian.Uint32(wb[4:])
		dd := t[uint16(wb[0])|uint16(wb[1])<<8] * t[uint16(xb[0])|uint16(xb[1])<<8]
		for l := range 4 {
			var lo, hi int32
			for j := 4 * l; j < 4*l+4; j++ {
				lo += (int32(wb[8+j]&0xf) | int32(qh>>j&1)<<4) * int32(int8(xb[4+j]))
				hi += (int32(wb[8+j]>>4) | int32(qh>>(j+16)&1)<<4) * int32(int8(xb[20+j]))
			}
			acc[l] = fma32(float32(lo), dd, acc[l])
			acc[l+4] = fma32(float32(hi), dd, acc[l+4])
		}
		ms = fma32(t[uint16(wb[2])|uint16(wb[3])<<8], t[uint16(xb[2])|uint16(xb[3])<<8], ms)
	}
	return hsum8(&acc) + ms
}

// dotIQ4NLQ80 is the IQ4_NL·Q8_0 kernel. Order as dotQ40Q80 (one integer
// sum per block; llama.cpp repacks IQ4_NL matrices of 8k rows on x86 and
// sums them in its 8x8 kernels' order, not matched yet), with the weight
// quants the levels ggml.IQ4Values[i] of the 4-bit indices (low nibbles are
// elements 0..15, high nibbles 16..31). |p| <= 32*127*128, exact in float32.
func dotIQ4NLQ80(n int, w, x []byte) float32 {
	nb := n / ggml.QK
	w, x = w[:nb*iq4Bytes], x[:nb*q80Bytes]
	t := f16Table
	lv := &iq4Levels
	var acc float32
	for b := range nb {
		wb := (*[iq4Bytes]byte)(w[b*iq4Bytes:])
		xb := (*[q80Bytes]byte)(x[b*q80Bytes:])
		var p int32
		for j := range 16 {
			p += lv[wb[2+j]&0xf]*int32(int8(xb[2+j])) + lv[wb[2+j]>>4]*int32(int8(xb[18+j]))
		}
		dd := t[uint16(wb[0])|uint16(wb[1])<<8] * t[uint16(xb[0])|uint16(xb[1])<<8]
		acc = fma32(float32(p), dd, acc)
	}
	return acc
}

// iq4Levels is ggml.IQ4Values widened to int32.
var iq4Levels = func() (l [16]int32) {
	for i, v := range ggml.IQ4Values {
		l[i] = int32(v)
	}
	return l
}()
