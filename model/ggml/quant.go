package ggml

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrUnsupported is returned when a conversion is not implemented for a type.
var ErrUnsupported = errors.New("ggml: conversion not supported for this type")

// Block layouts, in bytes. All multi-byte fields are little endian.
//
//	Q4_0 (18):   d f16 | qs[16]: element j in the low nibble of qs[j], element j+16 in the high nibble; value (q-8)*d
//	Q5_0 (22):   d f16 | qh u32 (bit j: bit 4 of element j) | qs[16] as Q4_0's; value (q-16)*d
//	Q5_1 (24):   d f16 | m f16 | qh u32 | qs[16] as Q5_0's; value q*d + m
//	Q8_0 (34):   d f16 | qs[32] int8; value q*d
//	Q8_1 (36):   d f16 | s f16 (d times the sum of the quants) | qs[32] int8; value q*d
//	IQ4_NL (18): d f16 | qs[16] as Q4_0's, 4-bit indices into IQ4Values; value d*level
//	Q2_K (84):   scales[16] (low nibble scale, high nibble min of each 16 elements) | qs[64] 2-bit | d f16 | dmin f16
//	Q3_K (110):  hmask[32] (high bits) | qs[64] (low 2 bits) | scales[12] (16 6-bit scales) | d f16
//	Q4_K (144):  d f16 | dmin f16 | scales[12] (8 6-bit scales, 8 6-bit mins) | qs[128]
//	Q5_K (176):  d f16 | dmin f16 | scales[12] as Q4_K's | qh[32] (high bits) | qs[128] as Q4_K's
//	Q6_K (210):  ql[128] | qh[64] | scales[16] int8 | d f16
//	IQ4_XS (136): d f16 | scales_h u16 | scales_l[4] (8 6-bit scales) | qs[128]: 8 sub-blocks laid out as IQ4_NL's
//	Q8_K (292):  d f32 | qs[256] int8 | bsums[16] int16 (sums of 16 consecutive qs)
//
// The functions documenting each layout element by element are Q5BlockQuant,
// Q3KQuant, Q3KScales, Q4KScaleMin, Q5KQuant and IQ4XSScale, and the
// dequantizers below.
//
// The row functions below slice blocks by Type.TypeSize; these name the
// sizes the code spells out.
const (
	q40Bytes = 2 + QK/2
	q80Bytes = 2 + QK
	q81Bytes = 2 + 2 + QK
	q6KBytes = QKK/2 + QKK/4 + QKK/16 + 2
	q8KBytes = 4 + QKK + QKK/16*2
)

// dequantizers are the block types' dequantizers (one block each); Q4_0,
// Q8_0 and Q8_K are written out in DequantizeRow.
var dequantizers = map[Type]func(blk []byte, y []float32){
	Q5_0:   dequantQ50,
	Q5_1:   dequantQ51,
	Q8_1:   dequantQ81,
	IQ4_NL: dequantIQ4NL,
	Q2_K:   dequantQ2K,
	Q3_K:   dequantQ3K,
	Q4_K:   dequantQ4K,
	Q5_K:   dequantQ5K,
	Q6_K:   dequantQ6K,
	IQ4_XS: dequantIQ4XS,
}

// refQuantizers are the reference quantizers (one block each) of the
// weight types other than Q4_0 and Q8_0.
var refQuantizers = map[Type]func(x []float32, blk []byte){
	Q5_0:   quantQ50Ref,
	Q5_1:   quantQ51Ref,
	IQ4_NL: quantIQ4NL,
	Q2_K:   quantQ2KRef,
	Q3_K:   quantQ3KRef,
	Q4_K:   quantQ4KRef,
	Q5_K:   quantQ5KRef,
	Q6_K:   quantQ6KRef,
	IQ4_XS: quantIQ4XSRef,
}

// checkRow validates that n elements of t fit exactly in nb bytes.
func checkRow(t Type, n, nb int) error {
	want, err := t.RowBytes(n)
	if err != nil {
		return err
	}
	if want != nb {
		return fmt.Errorf("ggml: %d elements of %s take %d bytes, got %d", n, t, want, nb)
	}
	return nil
}

func f16At(b []byte, off int) float32 { return F16ToF32(binary.LittleEndian.Uint16(b[off:])) }

// Q4KScaleMin returns the 6-bit scale and min of sub-block j (0..7) of a Q4_K
// super-block, unpacked from its 12-byte scales field as ggml's get_scale_min_k4 does.
func Q4KScaleMin(j int, scales []byte) (sc, m uint8) {
	if j < 4 {
		return scales[j] & 63, scales[j+4] & 63
	}
	sc = scales[j+4]&0xf | (scales[j-4]>>6)<<4
	m = scales[j+4]>>4 | (scales[j]>>6)<<4
	return sc, m
}

// DequantizeRow converts len(dst) elements of type t, stored in src, to
// float32. It computes exactly what ggml's to_float routines compute on x86-64
// (each product and difference rounded to float32 separately, no fused
// multiply-add, as ggml-base is built without FMA).
func DequantizeRow(t Type, src []byte, dst []float32) error {
	if err := checkRow(t, len(dst), len(src)); err != nil {
		return err
	}
	switch t {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case Q4_0:
		for b := 0; b < len(dst)/QK; b++ {
			blk := src[b*q40Bytes : (b+1)*q40Bytes]
			y := dst[b*QK : (b+1)*QK]
			d := f16At(blk, 0)
			for j := 0; j < QK/2; j++ {
				q := blk[2+j]
				y[j] = float32(int(q&0xf)-8) * d
				y[j+QK/2] = float32(int(q>>4)-8) * d
			}
		}
	case Q8_0:
		for b := 0; b < len(dst)/QK; b++ {
			blk := src[b*q80Bytes : (b+1)*q80Bytes]
			y := dst[b*QK : (b+1)*QK]
			d := f16At(blk, 0)
			for j := range QK {
				y[j] = float32(int8(blk[2+j])) * d
			}
		}
	case Q8_K:
		for b := 0; b < len(dst)/QKK; b++ {
			blk := src[b*q8KBytes : (b+1)*q8KBytes]
			y := dst[b*QKK : (b+1)*QKK]
			d := math.Float32frombits(binary.LittleEndian.Uint32(blk))
			for j := range QKK {
				y[j] = d * float32(int8(blk[4+j]))
			}
		}
	default:
		f, ok := dequantizers[t]
		if !ok {
			return fmt.Errorf("dequantize %s: %w", t, ErrUnsupported)
		}
		n, sz := t.BlockSize(), t.TypeSize()
		for b := 0; b < len(dst)/n; b++ {
			f(src[b*sz:(b+1)*sz], dst[b*n:(b+1)*n])
		}
	}
	return nil
}

// dequantQ81 is q*d for one Q8_1 block (ggml has no to_float for Q8_1;
// tests use this to read activations back).
func dequantQ81(blk []byte, y []float32) {
	d := f16At(blk, 0)
	for j := range QK {
		y[j] = float32(int8(blk[4+j])) * d
	}
}

func dequantQ4K(blk []byte, y []float32) {
	d := f16At(blk, 0)
	dmin := f16At(blk, 2)
	scales := blk[4:16]
	q := blk[16 : 16+QKK/2]
	for j := 0; j < 4; j++ { // 64 elements per step: low nibbles, then high nibbles of 32 bytes
		sc, m := Q4KScaleMin(2*j, scales)
		d1, m1 := d*float32(sc), dmin*float32(m)
		sc, m = Q4KScaleMin(2*j+1, scales)
		d2, m2 := d*float32(sc), dmin*float32(m)
		qq := q[32*j : 32*j+32]
		out := y[64*j : 64*j+64]
		for l := range 32 {
			out[l] = float32(d1*float32(qq[l]&0xf)) - m1
			out[l+32] = float32(d2*float32(qq[l]>>4)) - m2
		}
	}
}

func dequantQ6K(blk []byte, y []float32) {
	ql := blk[0:128]
	qh := blk[128:192]
	sc := blk[192:208]
	d := f16At(blk, 208)
	for h := 0; h < 2; h++ { // two halves of 128 elements
		l4 := ql[64*h : 64*h+64]
		hh := qh[32*h : 32*h+32]
		s := sc[8*h : 8*h+8]
		out := y[128*h : 128*h+128]
		for l := range 32 {
			is := l / 16
			q1 := int(l4[l]&0xf|(hh[l]>>0&3)<<4) - 32
			q2 := int(l4[l+32]&0xf|(hh[l]>>2&3)<<4) - 32
			q3 := int(l4[l]>>4|(hh[l]>>4&3)<<4) - 32
			q4 := int(l4[l+32]>>4|(hh[l]>>6&3)<<4) - 32
			out[l] = float32(d*float32(int8(s[is]))) * float32(q1)
			out[l+32] = float32(d*float32(int8(s[is+2]))) * float32(q2)
			out[l+64] = float32(d*float32(int8(s[is+4]))) * float32(q3)
			out[l+96] = float32(d*float32(int8(s[is+6]))) * float32(q4)
		}
	}
}

// QuantizeRow converts len(src) float32 values to type t in dst, the way
// llama.cpp's quantizer (llama-quantize, without an importance matrix) writes
// model files: ggml's reference routines quantize_row_*_ref for Q4_0, Q5_0,
// Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS (round half away from
// zero for Q8_0, truncation of x/d+8.5 for Q4_0 and x/d+16.5 for Q5_0, the
// K-quants' scale searches computed in float32 as ggml-base computes them),
// quantize_iq4_nl's search for IQ4_NL (see quantIQ4NL), quantize_row_q8_K_ref
// for Q8_K, F16 with round-to-nearest-even and BF16 as GGML_FP32_TO_BF16.
// Quantization with an importance matrix is not supported.
func QuantizeRow(t Type, src []float32, dst []byte) error {
	if err := checkRow(t, len(src), len(dst)); err != nil {
		return err
	}
	switch t {
	case Q8_0:
		for b := 0; b < len(src)/QK; b++ {
			quantQ80Ref(src[b*QK:(b+1)*QK], dst[b*q80Bytes:(b+1)*q80Bytes])
		}
		return nil
	case Q4_0:
		for b := 0; b < len(src)/QK; b++ {
			quantQ40Ref(src[b*QK:(b+1)*QK], dst[b*q40Bytes:(b+1)*q40Bytes])
		}
		return nil
	}
	if f, ok := refQuantizers[t]; ok {
		n, sz := t.BlockSize(), t.TypeSize()
		for b := 0; b < len(src)/n; b++ {
			f(src[b*n:(b+1)*n], dst[b*sz:(b+1)*sz])
		}
		return nil
	}
	return quantizeCommon("quantize", t, src, dst)
}

// QuantizeActivationRow converts len(src) float32 values to type t in dst the
// way ggml's CPU backend converts activations for a matrix multiplication
// (type_traits_cpu from_float) on an x86-64 machine with AVX2 or AVX-512:
//
//   - Q8_0: quantize_row_q8_0's AVX path: amax = max|x|, d = amax/127 stored
//     as f16, multiplier id = 127/amax (not 1/d), q = round-half-to-even(x*id)
//     as _mm256_round_ps does, converted with cvtps2dq and saturating packs.
//   - Q8_1: quantize_row_q8_1's AVX2 path: the quants and d of Q8_0's, and
//     s = f16(d * the sum of the quants).
//   - Q8_K: x86 has no SIMD variant; it is quantize_row_q8_K_ref, as in QuantizeRow.
//   - F16: VCVTPS2PH with round-to-nearest-even (F32ToF16).
//   - BF16: GGML_FP32_TO_BF16 (F32ToBF16).
//   - F32: a copy.
//
// The weight-only types (Q4_0, the K-quants, ...) are never activation
// types; for them this is QuantizeRow.
func QuantizeActivationRow(t Type, src []float32, dst []byte) error {
	if err := checkRow(t, len(src), len(dst)); err != nil {
		return err
	}
	switch t {
	case Q8_0:
		for b := 0; b < len(src)/QK; b++ {
			quantQ80X86(src[b*QK:(b+1)*QK], dst[b*q80Bytes:(b+1)*q80Bytes])
		}
		return nil
	case Q8_1:
		for b := 0; b < len(src)/QK; b++ {
			quantQ81X86(src[b*QK:(b+1)*QK], dst[b*q81Bytes:(b+1)*q81Bytes])
		}
		return nil
	case Q4_0:
		return QuantizeRow(t, src, dst)
	}
	if _, ok := refQuantizers[t]; ok {
		return QuantizeRow(t, src, dst)
	}
	return quantizeCommon("quantize activation", t, src, dst)
}

// quantizeCommon handles the types whose reference and activation conversions agree.
func quantizeCommon(op string, t Type, src []float32, dst []byte) error {
	switch t {
	case F32:
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case F16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
		}
	case BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(v))
		}
	case Q8_K:
		for b := 0; b < len(src)/QKK; b++ {
			quantQ8K(src[b*QKK:(b+1)*QKK], dst[b*q8KBytes:(b+1)*q8KBytes])
		}
	default:
		return fmt.Errorf("%s %s: %w", op, t, ErrUnsupported)
	}
	return nil
}

// cvtt emulates x86 CVTTSS2SI: truncation toward zero, with NaN and values
// outside int32 giving the "integer indefinite" value math.MinInt32.
func cvtt(f float32) int32 {
	if f != f || f >= 2147483648 || f < -2147483648 {
		return math.MinInt32
	}
	return int32(f)
}

// cvtRNE emulates x86 CVTPS2DQ under the default rounding mode: round half to
// even, with NaN and out-of-range values giving math.MinInt32.
func cvtRNE(f float32) int32 {
	r := math.RoundToEven(float64(f))
	if r != r || r >= 2147483648 || r < -2147483648 {
		return math.MinInt32
	}
	return int32(r)
}

// sat8 is the signed saturation of _mm256_packs_epi32 followed by _mm256_packs_epi16.
func sat8(v int32) int8 { return int8(max(-128, min(127, v))) }

// quantQ80Ref is quantize_row_q8_0_ref for one block: d = amax/127,
// id = 1/d, q = roundf(x*id) (half away from zero), stored as C's float to
// int8_t conversion does on x86 (the low byte of cvttss2si).
func quantQ80Ref(x []float32, blk []byte) {
	var amax float32
	for _, v := range x[:QK] {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(blk, F32ToF16(d))
	for j, v := range x[:QK] {
		x0 := v * id
		blk[2+j] = byte(cvtt(float32(math.Round(float64(x0)))))
	}
}

// quantQ80X86 is the AVX/AVX2 quantize_row_q8_0 for one block.
func quantQ80X86(x []float32, blk []byte) {
	var amax float32
	for _, v := range x[:QK] {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	var id float32
	if amax != 0 {
		id = 127 / amax
	}
	binary.LittleEndian.PutUint16(blk, F32ToF16(d))
	for j, v := range x[:QK] {
		blk[2+j] = byte(sat8(cvtRNE(v * id)))
	}
}

// signedMax returns the first value of x with the largest magnitude, sign
// kept, as ggml's Q4_0/Q5_0 reference quantizers pick their scale's source.
func signedMax(x []float32) float32 {
	var amax, mx float32
	for _, v := range x {
		if amax < abs32(v) {
			amax, mx = abs32(v), v
		}
	}
	return mx
}

// quantQ40Ref is quantize_row_q4_0_ref for one block: max is the first value
// of largest magnitude, d = max/-8, id = 1/d, q = min(15, (int8)(x*id+8.5)).
func quantQ40Ref(x []float32, blk []byte) {
	d := signedMax(x[:QK]) / -8
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(blk, F32ToF16(d))
	q4 := func(v float32) uint8 {
		x0 := float32(v*id) + 8.5
		return uint8(min(15, int(int8(cvtt(x0)))))
	}
	for j := 0; j < QK/2; j++ {
		blk[2+j] = q4(x[j]) | q4(x[j+QK/2])<<4
	}
}

// quantQ8K is quantize_row_q8_K_ref for one super-block: max is the first
// value of largest magnitude, iscale = -127/max, q = min(127,
// nearest_int(iscale*x)) where nearest_int rounds half to even through the
// float32 addition of 1.5*2^23, d = 1/iscale, and bsums[j] = sum of qs[16j:16j+16].
// An all-zero block has d = 0, zero quants and (here) zero bsums.
func quantQ8K(x []float32, blk []byte) {
	var amax, mx float32
	for _, v := range x[:QKK] {
		if ax := abs32(v); ax > amax {
			amax, mx = ax, v
		}
	}
	clear(blk[:q8KBytes])
	if amax == 0 {
		return
	}
	iscale := -127 / mx
	qs := blk[4 : 4+QKK]
	for j, v := range x[:QKK] {
		val := float32(iscale*v) + 12582912
		n := int32(math.Float32bits(val)&0x007fffff) - 0x00400000
		qs[j] = byte(int8(min(127, n)))
	}
	for j := range QKK / 16 {
		var sum int16
		for _, q := range qs[16*j : 16*j+16] {
			sum += int16(int8(q))
		}
		binary.LittleEndian.PutUint16(blk[4+QKK+2*j:], uint16(sum))
	}
	binary.LittleEndian.PutUint32(blk, math.Float32bits(1/iscale))
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }
