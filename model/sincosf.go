package model

import "math"

// sinf and cosf are glibc's (2.28 and later) single-precision sine and
// cosine, bit for bit: the algorithm of ARM's Optimized Routines (MIT
// licence), which glibc and llvm-libc adopted, re-implemented here so that
// RoPE's angles equal those ggml's rope takes from the C library. float32
// rounding of Go's float64 math.Sin and math.Cos differs from them in about
// 0.6% of arguments (the C library's results are not always correctly
// rounded), and one ulp in an angle moves the rotated query and key.
// TestSinCosfGlibc pins sample values; the port was checked against glibc
// 2.43 on 1.9 million arguments, every RoPE angle of 4096 positions for head
// dimensions 64 and 128 and bases 1e4 and 1e6 among them.

type sincosfConsts struct {
	hpiInv, hpi        float64
	c0, c1, c2, c3, c4 float64
	s1, s2, s3         float64
}

// sincosfTab holds the polynomials (the cosine's negated in the second
// entry) and π/2 and 2/π (the latter scaled by 2^24).
var sincosfTab = [2]sincosfConsts{
	{0x1.45F306DC9C883p+23, 0x1.921FB54442D18p0, 0x1p0, -0x1.ffffffd0c621cp-2, 0x1.55553e1068f19p-5, -0x1.6c087e89a359dp-10, 0x1.99343027bf8c3p-16, -0x1.555545995a603p-3, 0x1.1107605230bc4p-7, -0x1.994eb3774cf24p-13},
	{0x1.45F306DC9C883p+23, 0x1.921FB54442D18p0, -0x1p0, 0x1.ffffffd0c621cp-2, -0x1.55553e1068f19p-5, 0x1.6c087e89a359dp-10, -0x1.99343027bf8c3p-16, -0x1.555545995a603p-3, 0x1.1107605230bc4p-7, -0x1.994eb3774cf24p-13},
}

// invPio4 is 4/π to 192 bits, eight new bits per entry.
var invPio4 = [24]uint32{
	0xa2, 0xa2f9, 0xa2f983, 0xa2f9836e, 0xf9836e4e, 0x836e4e44, 0x6e4e4415, 0x4e441529,
	0x441529fc, 0x1529fc27, 0x29fc2757, 0xfc2757d1, 0x2757d1f5, 0x57d1f534, 0xd1f534dd, 0xf534ddc0,
	0x34ddc0db, 0xddc0db62, 0xc0db6295, 0xdb629599, 0x6295993c, 0x95993c43, 0x993c4390, 0x3c439041,
}

func sinf(y float32) float32 { return sincosf(y, 0) }
func cosf(y float32) float32 { return sincosf(y, 1) }

// sincosf is sinf (odd = 0) or cosf (odd = 1): reduce y to x in [-π/4, π/4]
// and its quadrant n (one multiply-subtract below 120, 4/π's bits above),
// then the sine or cosine polynomial in float64 as quadrant and function
// pick, rounded once to float32.
func sincosf(y float32, odd int) float32 {
	abstop12 := func(x float32) uint32 { return math.Float32bits(x) >> 20 & 0x7ff }
	x := float64(y)
	p := &sincosfTab[0]
	n, sign := 0, 0
	switch a := abstop12(y); {
	case a < abstop12(0x1.921fb6p-1): // |y| < π/4
		if a < abstop12(0x1p-12) {
			if odd == 1 {
				return 1
			}
			return y
		}
		return sincosfPoly(x, x*x, p, odd)
	case a < abstop12(120):
		r := x * p.hpiInv
		n = int((int32(r) + 0x800000) >> 24)
		x = math.FMA(-float64(n), p.hpi, x)
	case a < abstop12(float32(math.Inf(1))):
		xi := math.Float32bits(y)
		sign = int(xi >> 31)
		arr := invPio4[xi>>26&15:]
		m := (xi&0xffffff | 0x800000) << (xi >> 23 & 7)
		r0 := uint64(m * arr[0])
		r1 := uint64(m) * uint64(arr[4])
		r2 := uint64(m) * uint64(arr[8])
		r0 = (r2>>32 | r0<<32) + r1
		q := (r0 + 1<<61) >> 62
		r0 -= q << 62
		n = int(q)
		x = float64(int64(r0)) * 0x1.921FB54442D18p-62 // 2π·2^-64
	default:
		return float32(math.NaN())
	}
	q := n + sign
	if q&2 != 0 {
		p = &sincosfTab[1]
	}
	if q&3 == 1 || q&3 == 2 {
		x = -x
	}
	return sincosfPoly(x, x*x, p, n^odd)
}

// sincosfPoly evaluates the sine polynomial (n even) or the cosine one.
func sincosfPoly(x, x2 float64, p *sincosfConsts, n int) float32 {
	if n&1 == 0 {
		x3 := x * x2
		s1 := math.FMA(x2, p.s3, p.s2)
		x7 := x3 * x2
		s := math.FMA(x3, p.s1, x)
		return float32(math.FMA(x7, s1, s))
	}
	x4 := x2 * x2
	c2 := math.FMA(x2, p.c4, p.c3)
	c1 := math.FMA(x2, p.c1, p.c0)
	x6 := x4 * x2
	c := math.FMA(x4, p.c2, c1)
	return float32(math.FMA(x6, c2, c))
}
