package ggml

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestF16RoundTripAll(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		f := F16ToF32(h)
		got := F32ToF16(f)
		want := h
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			want = h | 0x200 // NaNs come back quiet
			if f == f {
				t.Fatalf("F16ToF32(%#04x) = %v, want NaN", h, f)
			}
		}
		if got != want {
			t.Fatalf("F32ToF16(F16ToF32(%#04x)) = %#04x, want %#04x (f32 %v)", h, got, want, f)
		}
	}
}

// f16Ref converts f to half precision with correct rounding, using float64
// arithmetic that is exact for every float32 input.
func f16Ref(f float32) uint16 {
	var sign uint16
	if math.Signbit(float64(f)) {
		sign = 0x8000
	}
	a := math.Abs(float64(f))
	if math.IsNaN(a) {
		return sign | 0x7e00 | uint16(math.Float32bits(f)>>13&0x3ff)
	}
	if a >= 65520 { // 65504 + half an ulp (16), a tie that rounds to the even Inf
		return sign | 0x7c00
	}
	exp := -14 // subnormal spacing 2^-24 below 2^-14
	if a >= 0x1p-14 {
		_, e := math.Frexp(a) // a = m * 2^e, m in [0.5, 1)
		exp = e - 1
	}
	ulp := math.Ldexp(1, exp-10)
	q := math.RoundToEven(a / ulp) // exact division by a power of two
	v := q * ulp
	if v == 0 {
		return sign
	}
	// Encode v, now exactly representable in half precision.
	if v < 0x1p-14 {
		return sign | uint16(v/0x1p-24)
	}
	m, e := math.Frexp(v)
	return sign | uint16(e-1+15)<<10 | uint16(m*2048)&0x3ff
}

func TestF32ToF16Rounding(t *testing.T) {
	check := func(f float32) {
		t.Helper()
		if got, want := F32ToF16(f), f16Ref(f); got != want {
			t.Fatalf("F32ToF16(%g [%#08x]) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
	edges := []float32{
		0, float32(math.Copysign(0, -1)), 1, -1, 65504, 65519.99, 65520, 65536, 1e10,
		float32(math.Inf(1)), float32(math.Inf(-1)),
		0x1p-14, 0x1p-24, 0x1p-25, 0x1.000002p-25, 0x1.8p-24, 0x1p-26, 0x1.ffcp-15, 0x1.ffep-15,
		1 + 0x1p-11, 1 + 0x3p-11, 1 + 0x1p-11 + 0x1p-23, 2049, 2051, 4097,
		math.SmallestNonzeroFloat32, math.MaxFloat32,
	}
	for _, f := range edges {
		check(f)
		check(-f)
	}
	// Around every half value and every midpoint between neighbours.
	for i := range 0x7c00 {
		lo := F16ToF32(uint16(i))
		for _, f := range []float32{lo, math.Nextafter32(lo, 0), math.Nextafter32(lo, 1e9)} {
			check(f)
			check(-f)
		}
		if i+1 < 0x7c00 {
			mid := float32((float64(lo) + float64(F16ToF32(uint16(i+1)))) / 2) // exact: 12 bits
			for _, f := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1e9)} {
				check(f)
				check(-f)
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		check(math.Float32frombits(r.Uint32()))
		// Values in and near half's range are the interesting ones.
		check(math.Float32frombits(r.Uint32N(0x10000000) + 0x30000000))
	}
}

// bf16Ref rounds f to bfloat16 by comparing distances to its two neighbours.
func bf16Ref(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40
	}
	lo := uint16(b >> 16)
	if b&0xffff == 0 {
		return lo
	}
	hi := lo + 1
	val := func(h uint16) float64 {
		if h&0x7fff == 0x7f80 {
			return math.Copysign(0x1p128, float64(f)) // Inf as the next step of the grid
		}
		return float64(BF16ToF32(h))
	}
	dl := math.Abs(float64(f) - val(lo))
	dh := math.Abs(float64(f) - val(hi))
	switch {
	case dl < dh:
		return lo
	case dh < dl:
		return hi
	case lo&1 == 0:
		return lo
	}
	return hi
}

func TestF32ToBF16(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		f := BF16ToF32(h)
		want := h
		if f != f {
			want = h | 0x40
		}
		if got := F32ToBF16(f); got != want {
			t.Fatalf("F32ToBF16(BF16ToF32(%#04x)) = %#04x, want %#04x", h, got, want)
		}
	}
	edges := []uint32{0x3f808000, 0x3f818000, 0x3f808001, 0x3f817fff, 0x7f7f8000, 0x7f7fffff, 0x7f7f7fff, 0x00008000, 0x00018000, 0x7f800001, 0xff800001}
	r := rand.New(rand.NewPCG(3, 4))
	for range 200000 {
		edges = append(edges, r.Uint32())
	}
	for _, b := range edges {
		f := math.Float32frombits(b)
		if got, want := F32ToBF16(f), bf16Ref(f); got != want {
			t.Fatalf("F32ToBF16(%g [%#08x]) = %#04x, want %#04x", f, b, got, want)
		}
	}
}
