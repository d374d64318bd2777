package ggml

import "math"

// FMA32 returns a*b+c rounded once to float32 (round to nearest even), as
// VFMADD231SS computes it and as ggml's C code gets it wherever the
// compiler contracts a*b+c into an FMA (its dot products' lanes, RoPE).
//
// The product of two float32 values is exact in float64, so only the sum can
// round. s = p+c in float64 rounds correctly to float32 unless s lands
// exactly on a float32 rounding boundary (a midpoint) while the exact sum did
// not, or the result is a float32 subnormal. Those cases take the slow path:
// the float64 sum is redone with round-to-odd (TwoSum gives the exact error),
// after which rounding to float32 is correct, since float64 carries more than
// 24+2 bits.
func FMA32(a, b, c float32) float32 {
	p := float64(a) * float64(b)
	s := p + float64(c)
	if FMA32Fast(s) {
		return float32(s)
	}
	return FMA32Slow(p, float64(c), s)
}

// FMA32Fast reports whether rounding the float64 sum s to float32 rounds the
// exact sum correctly. The low 29 bits of a float64 mantissa are what float32
// rounding drops; the pattern 1 followed by zeros is a float32 midpoint, which
// may hide a rounding of the float64 sum. |s| < 2^-126 (but non-zero) is the
// float32 subnormal range, where more bits are dropped.
func FMA32Fast(s float64) bool {
	bits := math.Float64bits(s)
	return bits&(1<<29-1) != 1<<28 && (bits&^(1<<63) >= 0x3810000000000000 || s == 0)
}

// FMA32Slow is FMA32 where FMA32Fast(s) fails, for s = p+c, p = a*b.
func FMA32Slow(p, c, s float64) float32 {
	if math.IsInf(s, 0) || math.IsNaN(s) {
		return float32(s)
	}
	// TwoSum: s+e == p+c exactly.
	bb := s - p
	e := (p - (s - bb)) + (c - bb)
	if e == 0 {
		return float32(s)
	}
	bits := math.Float64bits(s)
	if bits&1 == 0 { // round to odd: step one float64 ulp toward the exact sum
		if (e > 0) == (s > 0) {
			bits++
		} else {
			bits--
		}
		s = math.Float64frombits(bits)
	}
	return float32(s)
}
