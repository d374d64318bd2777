package ggml

import (
	"encoding/binary"
	"math"
)

// Q5BlockQuant returns element j (0..31) of a Q5_0 or Q5_1 block as its
// 5-bit unsigned quant: the low nibble of qs[j] (j < 16) or the high nibble of
// qs[j-16] (j >= 16), with bit j of the little-endian qh word as bit 4.
func Q5BlockQuant(qh uint32, qs []byte, j int) int32 {
	lo := qs[j%16]
	if j >= 16 {
		lo >>= 4
	}
	return int32(lo&0xf) | int32(qh>>j&1)<<4
}

// dequantQ50 is dequantize_row_q5_0 for one block: (q-16)*d.
func dequantQ50(blk []byte, y []float32) {
	d := f16At(blk, 0)
	qh := binary.LittleEndian.Uint32(blk[2:])
	qs := blk[6 : 6+QK/2]
	for j := range QK {
		y[j] = float32(Q5BlockQuant(qh, qs, j)-16) * d
	}
}

// dequantQ51 is dequantize_row_q5_1 for one block: q*d + m, the product
// rounded before the sum.
func dequantQ51(blk []byte, y []float32) {
	d := f16At(blk, 0)
	m := f16At(blk, 2)
	qh := binary.LittleEndian.Uint32(blk[4:])
	qs := blk[8 : 8+QK/2]
	for j := range QK {
		y[j] = float32(float32(Q5BlockQuant(qh, qs, j))*d) + m
	}
}

// putQ5 packs 32 five-bit quants into a Q5_0/Q5_1 block's qh word and qs bytes.
func putQ5(q *[QK]uint8, qh, qs []byte) {
	var h uint32
	for j := range QK / 2 {
		qs[j] = q[j]&0xf | (q[j+16]&0xf)<<4
		h |= uint32(q[j]>>4&1)<<j | uint32(q[j+16]>>4&1)<<(j+16)
	}
	binary.LittleEndian.PutUint32(qh, h)
}

// quantQ50Ref is quantize_row_q5_0_ref for one block: max is the first value
// of largest magnitude, d = max/-16, id = 1/d, q = min(31, (int8)(x*id+16.5)).
func quantQ50Ref(x []float32, blk []byte) {
	d := signedMax(x[:QK]) / -16
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(blk, F32ToF16(d))
	var q [QK]uint8
	for j, v := range x[:QK] {
		q[j] = uint8(min(31, int(int8(cvtt(float32(v*id)+16.5)))))
	}
	putQ5(&q, blk[2:6], blk[6:6+QK/2])
}

// quantQ51Ref is quantize_row_q5_1_ref for one block: d = (max-min)/31,
// m = min, q = (uint8)((x-min)*id + 0.5) with id = 1/d.
func quantQ51Ref(x []float32, blk []byte) {
	lo, hi := float32(math.MaxFloat32), float32(-math.MaxFloat32)
	for _, v := range x[:QK] {
		if v < lo {
			lo = v
		}
		if v > hi {
			hi = v
		}
	}
	d := (hi - lo) / 31
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(blk, F32ToF16(d))
	binary.LittleEndian.PutUint16(blk[2:], F32ToF16(lo))
	var q [QK]uint8
	for j, v := range x[:QK] {
		q[j] = uint8(cvtt(float32((v-lo)*id) + 0.5))
	}
	putQ5(&q, blk[4:8], blk[8:8+QK/2])
}

// quantQ81X86 is the AVX2 quantize_row_q8_1 for one block: the quants and d
// of quantQ80X86, and s = f16(d * float32(sum of the quants)).
func quantQ81X86(x []float32, blk []byte) {
	var amax float32
	for _, v := range x[:QK] {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	var id float32
	if amax != 0 {
		id = 127 / amax
	}
	var sum int32
	for j, v := range x[:QK] {
		q := cvtRNE(v * id)
		sum += q
		blk[4+j] = byte(sat8(q))
	}
	binary.LittleEndian.PutUint16(blk, F32ToF16(d))
	binary.LittleEndian.PutUint16(blk[2:], F32ToF16(d*float32(sum)))
}
