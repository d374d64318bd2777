package ggml

import (
	"fmt"
	"math"
)

// Type is a tensor element type, numbered as in ggml and GGUF.
type Type uint32

// The types strata reads. Values are ggml's enum ggml_type.
const (
	F32  Type = 0
	F16  Type = 1
	Q4_0 Type = 2
	Q8_0 Type = 8
	Q4_K Type = 12
	Q6_K Type = 14
	Q8_K Type = 15
	BF16 Type = 30
)

// QK is the number of elements in a Q4_0/Q8_0 block; QKK in a K-quant super-block.
const (
	QK  = 32
	QKK = 256
)

type typeInfo struct {
	name      string
	blockSize int // elements per block
	typeSize  int // bytes per block
}

var types = map[Type]typeInfo{
	F32:  {"F32", 1, 4},
	F16:  {"F16", 1, 2},
	BF16: {"BF16", 1, 2},
	Q4_0: {"Q4_0", QK, 2 + QK/2},
	Q8_0: {"Q8_0", QK, 2 + QK},
	Q4_K: {"Q4_K", QKK, 2 + 2 + 12 + QKK/2},
	Q6_K: {"Q6_K", QKK, QKK/2 + QKK/4 + QKK/16 + 2},
	Q8_K: {"Q8_K", QKK, 4 + QKK + QKK/16*2},
}

// Known reports whether strata can read tensors of type t.
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
// with weights of type t, as ggml's CPU backend does: 8-bit blocks for the
// 32-element quantized types, 8-bit super-blocks for K-quants, and the weight's
// own half-float type for F16 and BF16.
func (t Type) VecDotType() Type {
	switch t {
	case Q4_0, Q8_0:
		return Q8_0
	case Q4_K, Q6_K:
		return Q8_K
	case F16:
		return F16
	case BF16:
		return BF16
	}
	return F32
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
