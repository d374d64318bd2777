package ggml

import (
	"fmt"
	"math"
)

// Type is a tensor element type, numbered as in ggml and GGUF.
type Type uint32

// The tensor types of ggml and GGUF. Values are ggml's enum ggml_type; the
// numbers ggml retired (4, 5, 31-33, 36-38) are not types.
const (
	F32     Type = 0
	F16     Type = 1
	Q4_0    Type = 2
	Q4_1    Type = 3
	Q5_0    Type = 6
	Q5_1    Type = 7
	Q8_0    Type = 8
	Q8_1    Type = 9
	Q2_K    Type = 10
	Q3_K    Type = 11
	Q4_K    Type = 12
	Q5_K    Type = 13
	Q6_K    Type = 14
	Q8_K    Type = 15
	IQ2_XXS Type = 16
	IQ2_XS  Type = 17
	IQ3_XXS Type = 18
	IQ1_S   Type = 19
	IQ4_NL  Type = 20
	IQ3_S   Type = 21
	IQ2_S   Type = 22
	IQ4_XS  Type = 23
	I8      Type = 24
	I16     Type = 25
	I32     Type = 26
	I64     Type = 27
	F64     Type = 28
	IQ1_M   Type = 29
	BF16    Type = 30
	TQ1_0   Type = 34
	TQ2_0   Type = 35
	MXFP4   Type = 39
	NVFP4   Type = 40
	Q1_0    Type = 41
	Q2_0    Type = 42
)

// QK is the number of elements in a Q4_0/Q5_0/Q5_1/Q8_0/Q8_1/IQ4_NL block;
// QKK in a K-quant (and IQ4_XS) super-block.
const (
	QK  = 32
	QKK = 256
)

type typeInfo struct {
	name      string
	blockSize int // elements per block
	typeSize  int // bytes per block
}

// types holds the geometry of every ggml type, as ggml's type_traits
// (blck_size, type_size) give it, so that a file of any type parses and a
// type strata cannot compute is refused by name. Which types strata converts
// is the business of DequantizeRow and QuantizeRow.
var types = map[Type]typeInfo{
	F32:     {"F32", 1, 4},
	F16:     {"F16", 1, 2},
	Q4_0:    {"Q4_0", QK, 2 + QK/2},
	Q4_1:    {"Q4_1", QK, 2 + 2 + QK/2},
	Q5_0:    {"Q5_0", QK, 2 + 4 + QK/2},
	Q5_1:    {"Q5_1", QK, 2 + 2 + 4 + QK/2},
	Q8_0:    {"Q8_0", QK, 2 + QK},
	Q8_1:    {"Q8_1", QK, 2 + 2 + QK},
	Q2_K:    {"Q2_K", QKK, QKK/16 + QKK/4 + 2 + 2},
	Q3_K:    {"Q3_K", QKK, QKK/8 + QKK/4 + 12 + 2},
	Q4_K:    {"Q4_K", QKK, 2 + 2 + 12 + QKK/2},
	Q5_K:    {"Q5_K", QKK, 2 + 2 + 12 + QKK/8 + QKK/2},
	Q6_K:    {"Q6_K", QKK, QKK/2 + QKK/4 + QKK/16 + 2},
	Q8_K:    {"Q8_K", QKK, 4 + QKK + QKK/16*2},
	IQ2_XXS: {"IQ2_XXS", QKK, 2 + QKK/8*2},
	IQ2_XS:  {"IQ2_XS", QKK, 2 + QKK/8*2 + QKK/32},
	IQ3_XXS: {"IQ3_XXS", QKK, 2 + 3*QKK/8},
	IQ1_S:   {"IQ1_S", QKK, 2 + QKK/8 + QKK/16},
	IQ4_NL:  {"IQ4_NL", QK, 2 + QK/2},
	IQ3_S:   {"IQ3_S", QKK, 2 + 13*QKK/32 + QKK/64},
	IQ2_S:   {"IQ2_S", QKK, 2 + QKK/4 + QKK/16},
	IQ4_XS:  {"IQ4_XS", QKK, 2 + 2 + QKK/64 + QKK/2},
	I8:      {"I8", 1, 1},
	I16:     {"I16", 1, 2},
	I32:     {"I32", 1, 4},
	I64:     {"I64", 1, 8},
	F64:     {"F64", 1, 8},
	IQ1_M:   {"IQ1_M", QKK, QKK/8 + QKK/16 + QKK/32},
	BF16:    {"BF16", 1, 2},
	TQ1_0:   {"TQ1_0", QKK, (QKK-4*QKK/64)/5 + QKK/64 + 2},
	TQ2_0:   {"TQ2_0", QKK, QKK/4 + 2},
	MXFP4:   {"MXFP4", QK, 1 + QK/2},
	NVFP4:   {"NVFP4", 64, 64/16 + 64/2},
	Q1_0:    {"Q1_0", 128, 2 + 128/8},
	Q2_0:    {"Q2_0", 64, 2 + 64/4},
}

// Known reports whether t is a ggml type whose block geometry strata knows:
// a file holding it parses, whether or not strata can compute with it.
func (t Type) Known() bool { _, ok := types[t]; return ok }

// String returns ggml's name for t, or "type(N)" for an unknown type.
func (t Type) String() string {
	if ti, ok := types[t]; ok {
		return ti.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize is the number of elements in one block of t (1 for plain floats).
// It is 0 for an unknown type.
func (t Type) BlockSize() int { return types[t].blockSize }

// TypeSize is the number of bytes in one block of t. It is 0 for an unknown type.
func (t Type) TypeSize() int { return types[t].typeSize }

// RowBytes returns the bytes that n elements of t occupy, or an error when t is
// unknown or n is not a whole number of blocks.
func (t Type) RowBytes(n int) (int, error) {
	ti, ok := types[t]
	if !ok {
		return 0, fmt.Errorf("ggml: unknown tensor type %d", uint32(t))
	}
	if n < 0 || n%ti.blockSize != 0 {
		return 0, fmt.Errorf("ggml: %d elements of %s is not a whole number of %d-element blocks", n, ti.name, ti.blockSize)
	}
	return n / ti.blockSize * ti.typeSize, nil
}

// VecDotType is the type activations are converted to before a dot product
// with weights of type t, as ggml's CPU backend does (type_traits_cpu's
// vec_dot_type): Q8_0 blocks for Q4_0, Q5_0, Q8_0 and IQ4_NL, Q8_1 blocks
// (which carry d times the sum of their quants) for Q5_1, Q8_K super-blocks
// for the K-quants and IQ4_XS, and the weight's own half-float type for F16
// and BF16. It is F32 for F32 and for the types strata computes nothing with.
func (t Type) VecDotType() Type {
	switch t {
	case Q4_0, Q5_0, Q8_0, IQ4_NL:
		return Q8_0
	case Q5_1:
		return Q8_1
	case Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS:
		return Q8_K
	case F16:
		return F16
	case BF16:
		return BF16
	}
	return F32
}

// Fallback returns the type llama.cpp's quantizer (llama-quantize) writes
// when asked for t on rows of n elements: t itself when n is a whole number
// of its blocks; for a K-quant or IQ4_XS on rows that are not a multiple of
// 256, IQ4_NL (for Q2_K, Q3_K, IQ4_XS), Q5_0 (Q4_K), Q5_1 (Q5_K) or Q8_0
// (Q6_K); and F16 when even that block does not divide n. F32 is returned
// unchanged.
func (t Type) Fallback(n int) Type {
	if t == F32 || (t.BlockSize() > 0 && n%t.BlockSize() == 0) {
		return t
	}
	switch t {
	case Q2_K, Q3_K, IQ4_XS:
		t = IQ4_NL
	case Q4_K:
		t = Q5_0
	case Q5_K:
		t = Q5_1
	case Q6_K:
		t = Q8_0
	}
	if t.BlockSize() > 0 && n%t.BlockSize() == 0 {
		return t
	}
	return F16
}

// F16ToF32 converts an IEEE 754 half-precision value to float32 exactly.
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: normalise
		e := uint32(127 - 15 + 1)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		mant &= 0x3ff
		return math.Float32frombits(sign | e<<23 | mant<<13)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// F32ToF16 converts f to half precision, rounding to nearest even, as the
// F16C instruction VCVTPS2PH does with rounding mode 0 (which is what ggml's
// CPU backend uses on x86 to convert activations). A NaN keeps its sign and
// the top 10 bits of its payload and is made quiet, as VCVTPS2PH does; ggml's
// software GGML_FP32_TO_FP16 differs only there (it gives sign|0x7e00).
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff { // Inf or NaN
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		r := mant >> shift
		rem := mant & (1<<shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent, which is the right answer
	}
	return sign | uint16(r)
}

// BF16ToF32 converts a bfloat16 value to float32 exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 converts f to bfloat16, rounding to nearest even and keeping NaNs
// quiet, as ggml's GGML_FP32_TO_BF16 does.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 64
	}
	return uint16((b + (0x7fff + (b>>16)&1)) >> 16)
}
