package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// fmaBig is a*b+c computed exactly and rounded once to float32.
func fmaBig(a, b, c float32) float32 {
	if math.IsInf(float64(a), 0) || math.IsInf(float64(b), 0) || math.IsInf(float64(c), 0) ||
		a != a || b != b || c != c {
		return float32(float64(a)*float64(b) + float64(c))
	}
	x := new(big.Float).SetPrec(400).SetFloat64(float64(a))
	x.Mul(x, new(big.Float).SetPrec(400).SetFloat64(float64(b)))
	x.Add(x, new(big.Float).SetPrec(400).SetFloat64(float64(c)))
	f, _ := x.Float32()
	if f == 0 {
		// big.Float has no signed zero for an exact cancellation; IEEE gives +0
		// unless both a*b and c are -0.
		if math.Signbit(float64(a)) != math.Signbit(float64(b)) && math.Signbit(float64(c)) && (a == 0 || b == 0) {
			return float32(math.Copysign(0, -1))
		}
		if x.Sign() == 0 {
			return 0
		}
	}
	return f
}

// TestFMA32 checks ggml.FMA32 (fma32 here) against the exact sum rounded once.
func TestFMA32(t *testing.T) {
	cases := [][3]float32{
		// a*b = 2^-24 - 2^-70, c = 1+2^-23: the float64 sum rounds onto the
		// float32 midpoint 1+2^-23+2^-24, which would tie to even (up); the
		// exact sum is below it.
		{0x1.000002p-12, 0x1.fffffcp-13, 1 + 0x1p-23},
		{-0x1.000002p-12, 0x1.fffffcp-13, -1 - 0x1p-23},
		{0x1.000002p-12, 0x1.000002p-12, 1},
		{0x1p-75, 0x1p-75, 0},          // underflows to float32 subnormal range
		{0x1.8p-75, 0x1.000002p-74, 0}, // subnormal result with rounding
		{0x1p-70, 0x1.000002p-70, -0x1p-140},
		{3, 5, -15},
		{float32(math.Copysign(0, -1)), 1, float32(math.Copysign(0, -1))},
		{0, -1, 0},
		{math.MaxFloat32, 2, -math.MaxFloat32},
		{math.MaxFloat32, 1, 0x1p103},
		{math.MaxFloat32, 1, 0x1.000002p103},
		{float32(math.Inf(1)), 0, 1},
		{float32(math.Inf(1)), 1, float32(math.Inf(-1))},
	}
	r := rand.New(rand.NewPCG(11, 12))
	randF := func(scale int) float32 {
		m := float32(r.Float64()*2 - 1)
		return float32(math.Ldexp(float64(m), r.IntN(2*scale+1)-scale))
	}
	for range 200000 {
		a, b := randF(40), randF(40)
		c := randF(80)
		cases = append(cases, [3]float32{a, b, c})
		// Near cancellation, where rounding boundaries are dense.
		p := float32(a * b)
		cases = append(cases, [3]float32{a, b, -p}, [3]float32{a, b, -math.Nextafter32(p, 0) + randF(10)*0x1p-30*p})
		// Subnormal results.
		cases = append(cases, [3]float32{randF(4) * 0x1p-70, randF(4) * 0x1p-70, randF(4) * 0x1p-140})
	}
	for _, c := range cases {
		got, want := fma32(c[0], c[1], c[2]), fmaBig(c[0], c[1], c[2])
		if math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
			t.Fatalf("fma32(%x, %x, %x) = %x, want %x", c[0], c[1], c[2], got, want)
		}
	}
	if got := fma32(0x1.000002p-12, 0x1.fffffcp-13, 1+0x1p-23); got != 1+0x1p-23 {
		t.Fatalf("midpoint case: got %x", got)
	}
}

// dotF32Spec is the documented f32 order written out plainly.
func dotF32Spec(a, b []float32, mulAdd func(a, b, c float32) float32) float32 {
	var lane [16]float32
	for i := range a {
		lane[i%16] = mulAdd(a[i], b[i], lane[i%16])
	}
	for _, w := range []int{8, 4, 2, 1} {
		for j := 0; j < w; j++ {
			lane[j] = lane[j] + lane[j+w]
		}
	}
	return lane[0]
}

func randVec(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * math.Exp(r.NormFloat64()))
	}
	return x
}

func encode(t testing.TB, typ ggml.Type, x []float32) []byte {
	t.Helper()
	nb, err := typ.RowBytes(len(x))
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, nb)
	if err := ggml.QuantizeRow(typ, x, b); err != nil {
		t.Fatal(err)
	}
	return b
}

func decode(t testing.TB, typ ggml.Type, n int, b []byte) []float32 {
	t.Helper()
	y := make([]float32, n)
	if err := ggml.DequantizeRow(typ, b, y); err != nil {
		t.Fatal(err)
	}
	return y
}

// TestFloatDotOrder checks the f32, f16 and bf16 kernels bit for bit against
// the documented order (one FMA per element), for n = 0..67.
func TestFloatDotOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	mul := func(a, b, c float32) float32 { return c + float32(a*b) }
	for n := 0; n <= 67; n++ {
		for range 20 {
			a, b := randVec(r, n), randVec(r, n)
			want := dotF32Spec(a, b, fmaBig)
			if got := DotF32(a, b); math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("n=%d: DotF32 = %x, want %x", n, got, want)
			}
			if got := dotF32Bytes(n, encode(t, ggml.F32, a), encode(t, ggml.F32, b)); math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("n=%d: F32 VecDot = %x, want %x", n, got, want)
			}
			for _, typ := range []ggml.Type{ggml.F16, ggml.BF16} {
				wa, wb := encode(t, typ, a), encode(t, typ, b)
				da, db := decode(t, typ, n, wa), decode(t, typ, n, wb)
				want := dotF32Spec(da, db, fmaBig)
				if typ == ggml.F16 { // products exact: a rounded product then an add gives the same
					if mw := dotF32Spec(da, db, mul); mw != want {
						t.Fatalf("n=%d: f16 mul+add %x != FMA %x", n, mw, want)
					}
				}
				f, err := VecDotFor(typ)
				if err != nil {
					t.Fatal(err)
				}
				if got := f(n, wa, wb); math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("n=%d: %s VecDot = %x, want %x", n, typ, got, want)
				}
			}
		}
	}
}

// TestBF16DotIsFMA: a bf16 product is added with one rounding, in the
// portable kernel, the SIMD dot and MatMul's tiles alike, where a rounded
// product then an add would differ: a product of half float32's smallest
// subnormal added to that subnormal (a tie, rounded to even: 2^-148, where
// rounding the product first gives 0 and the sum 2^-149), and a product
// that overflows float32 added to a large negative sum (2^126, not +Inf).
func TestBF16DotIsFMA(t *testing.T) {
	const n = 40 // lane 0 holds elements 0, 16 and 32; the rest are zero
	for _, tc := range []struct {
		w, x [3]float32
		want float32
	}{
		{[3]float32{0x1p-74, 0x1p-75, 0}, [3]float32{0x1p-75, 0x1p-75, 0}, 0x1p-148},
		{[3]float32{-0x1.8p64, 0x1p64, 0}, [3]float32{0x1p63, 0x1p64, 0}, 0x1p126},
	} {
		w, x := make([]float32, n), make([]float32, n)
		for i := range 3 {
			w[16*i], x[16*i] = tc.w[i], tc.x[i]
		}
		wb, xb := encode(t, ggml.BF16, w), encode(t, ggml.BF16, x)
		f, err := VecDotFor(ggml.BF16)
		if err != nil {
			t.Fatal(err)
		}
		var portable float32
		withPortable(func() { portable = f(n, wb, xb) })
		if got := f(n, wb, xb); got != tc.want || portable != tc.want {
			t.Errorf("bf16 dot %g·%g: %s %g, portable %g, want %g", tc.w, tc.x, ISA(ggml.BF16), got, portable, tc.want)
		}
		pool := NewPool(1)
		be := NewBackend(pool)
		const N = 5 // rows, each the same weights: one-row and batched tiles
		rows := make([]byte, 0, N*len(wb))
		for range N {
			rows = append(rows, wb...)
		}
		wt := &model.Weight{Name: "w", Type: ggml.BF16, Rows: N, Cols: n, Data: rows}
		be.Prepare(wt)
		for _, B := range []int{1, 3} {
			xs := make([]float32, 0, B*n)
			for range B {
				xs = append(xs, x...)
			}
			out := make([]float32, B*N)
			be.MatMul(wt, xs, B, out)
			for i, got := range out {
				if got != tc.want {
					t.Errorf("bf16 MatMul (%s) of %d rows: out[%d] = %g, want %g", ISA(ggml.BF16), B, i, got, tc.want)
					break
				}
			}
		}
		pool.Close()
	}
}

// TestDotF32Deterministic: the result is a function of the inputs only —
// the same with different backing arrays and a longer b.
func TestDotF32Deterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	a, b := randVec(r, 1000), randVec(r, 1001)
	want := DotF32(a, b[:1000])
	a2 := append([]float32(nil), a...)
	for range 3 {
		if got := DotF32(a2, b); got != want {
			t.Fatalf("DotF32 = %x, want %x", got, want)
		}
	}
}

// quantWeights returns a random weight row of type typ: through the reference
// quantizer where there is one, otherwise random block bytes with sane scales.
func quantWeights(t testing.TB, r *rand.Rand, typ ggml.Type, n int) []byte {
	t.Helper()
	switch typ {
	case ggml.Q4_K, ggml.Q6_K:
		nb, _ := typ.RowBytes(n)
		b := make([]byte, nb)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		for blk := 0; blk < nb; blk += typ.TypeSize() {
			d := float32(0.001 + 0.01*r.Float64())
			if typ == ggml.Q4_K {
				binary.LittleEndian.PutUint16(b[blk:], ggml.F32ToF16(d))
				binary.LittleEndian.PutUint16(b[blk+2:], ggml.F32ToF16(d*float32(r.Float64())))
			} else {
				binary.LittleEndian.PutUint16(b[blk+208:], ggml.F32ToF16(d))
			}
		}
		return b
	}
	return encode(t, typ, randVec(r, n))
}

// TestVecDotAccuracy compares every kernel with a float64 dot product of the
// dequantized weights and the dequantized activations.
func TestVecDotAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	sizes := map[ggml.Type][]int{
		ggml.Q4_0: {32, 64, 96, 256 + 32, 4096},
		ggml.Q8_0: {32, 64, 96, 256 + 32, 4096},
		ggml.Q4_K: {256, 512, 768, 4096},
		ggml.Q6_K: {256, 512, 768, 4096},
	}
	for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.BF16} {
		for n := 1; n <= 67; n++ {
			sizes[typ] = append(sizes[typ], n)
		}
		sizes[typ] = append(sizes[typ], 4096)
	}
	for typ, ns := range sizes {
		f, err := VecDotFor(typ)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			t.Run(fmt.Sprintf("%s/%d", typ, n), func(t *testing.T) {
				for range 10 {
					w := quantWeights(t, r, typ, n)
					xf := randVec(r, n)
					vt := typ.VecDotType()
					xb := make([]byte, mustRowBytes(t, vt, n))
					ConvertActivation(typ, xf, xb)
					dw, dx := decode(t, typ, n, w), decode(t, vt, n, xb)
					var want, mag float64
					for i := range n {
						want += float64(dw[i]) * float64(dx[i])
						mag += math.Abs(float64(dw[i]) * float64(dx[i]))
					}
					tol := 1e-6 * mag * (1 + math.Log2(float64(n)))
					if typ == ggml.Q4_K { // dmin*min is subtracted after the sum: cancellation
						tol *= 20
					}
					got := float64(f(n, w, xb))
					if math.Abs(got-want) > tol {
						t.Fatalf("VecDot = %g, want %g ± %g (diff %g)", got, want, tol, got-want)
					}
				}
			})
		}
	}
}

func mustRowBytes(t testing.TB, typ ggml.Type, n int) int {
	t.Helper()
	nb, err := typ.RowBytes(n)
	if err != nil {
		t.Fatal(err)
	}
	return nb
}

// TestBlockDotOrder checks the block kernels bit for bit against their
// documented orders, written out from element-wise decoders.
func TestBlockDotOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 20))
	f16 := func(b []byte) float32 { return ggml.F16ToF32(binary.LittleEndian.Uint16(b)) }
	q80 := func(x []byte, e int) int32 { return int32(int8(x[e/32*34+2+e%32])) }
	q8K := func(x []byte, e int) int32 { return int32(int8(x[e/256*292+4+e%256])) }

	spec32 := func(n int, w, x []byte, wq func(e int) int32, wd func(b int) float32) float32 {
		var acc float32
		for b := 0; b < n/32; b++ {
			dd := wd(b) * f16(x[34*b:])
			var p int32
			for e := 32 * b; e < 32*b+32; e++ {
				p += wq(e) * q80(x, e)
			}
			acc = fmaBig(float32(p), dd, acc)
		}
		return acc
	}
	// ggml's Q8_0·Q8_0 order (ggml_vec_dot_q8_0_q8_0 with AVX2, and
	// llamafile's tinyBLAS_Q0_AVX for batches): eight float lanes, lane l
	// adding fma(sum of the products of elements 4l..4l+3, dd) per block,
	// then hsum_float_8's tree.
	spec80 := func(n int, w, x []byte) float32 {
		var l [8]float32
		for b := 0; b < n/32; b++ {
			dd := f16(w[34*b:]) * f16(x[34*b:])
			for k := range 8 {
				var p int32
				for e := 32*b + 4*k; e < 32*b+4*k+4; e++ {
					p += q80(w, e) * q80(x, e)
				}
				l[k] = fmaBig(float32(p), dd, l[k])
			}
		}
		lo := [4]float32{l[4] + l[0], l[5] + l[1], l[6] + l[2], l[7] + l[3]}
		lo2 := [2]float32{lo[0] + lo[2], lo[1] + lo[3]}
		return lo2[0] + lo2[1]
	}
	for _, n := range []int{32, 64, 96, 288, 1024, 1056} {
		for range 20 {
			xb := make([]byte, n/32*34)
			ConvertActivation(ggml.Q8_0, randVec(r, n), xb)

			w8 := quantWeights(t, r, ggml.Q8_0, n)
			want := spec80(n, w8, xb)
			if got := dotQ80Q80(n, w8, xb); math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("Q8_0 n=%d: %x, want %x", n, got, want)
			}
			if got := vecDotQ80(n, w8, xb); math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("Q8_0 n=%d: %x, want %x", n, got, want)
			}
			w4 := quantWeights(t, r, ggml.Q4_0, n)
			q40 := func(e int) int32 {
				v := w4[e/32*18+2+e%16]
				if e%32 >= 16 {
					v >>= 4
				}
				return int32(v&0xf) - 8
			}
			want = spec32(n, w4, xb, q40, func(b int) float32 { return f16(w4[18*b:]) })
			if got := dotQ40Q80(n, w4, xb); math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("Q4_0 n=%d: %x, want %x", n, got, want)
			}
			if got := vecDotQ40(n, w4, xb); math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("Q4_0 n=%d: %x, want %x", n, got, want)
			}
		}
	}

	for _, n := range []int{256, 512, 768} {
		for range 20 {
			xb := make([]byte, n/256*292)
			ConvertActivation(ggml.Q4_K, randVec(r, n), xb)
			xd := func(b int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(xb[292*b:])) }
			bsum := func(b, k int) int32 { return int32(int16(binary.LittleEndian.Uint16(xb[292*b+260+2*k:]))) }

			// Q4_K: element e of super-block b is nibble (e%64)/32 of qs[32*(e/64) + e%32].
			w := quantWeights(t, r, ggml.Q4_K, n)
			var sumf float32
			for b := 0; b < n/256; b++ {
				blk := w[144*b:]
				d, dmin := f16(blk)*xd(b), f16(blk[2:])*xd(b)
				for s := range 8 {
					var p int32
					for e := 32 * s; e < 32*s+32; e++ {
						v := int32(blk[16+32*(e/64)+e%32])
						if (e%64)/32 == 1 {
							v >>= 4
						}
						p += (v & 0xf) * q8K(xb, 256*b+e)
					}
					sc, _ := ggml.Q4KScaleMin(s, blk[4:16])
					sumf = fmaBig(float32(int32(sc)*p), d, sumf)
				}
				var mins int32
				for k := range 16 {
					_, m := ggml.Q4KScaleMin(k/2, blk[4:16])
					mins += bsum(b, k) * int32(m)
				}
				sumf = fmaBig(float32(-mins), dmin, sumf)
			}
			if got := dotQ4KQ8K(n, w, xb); math.Float32bits(got) != math.Float32bits(sumf) {
				t.Fatalf("Q4_K n=%d: %x, want %x", n, got, sumf)
			}

			// Q6_K: element e = 128h + 32k + l has low bits in ql[64h + l + 32(k%2)]
			// (nibble k/2) and high bits (qh[32h + l] >> 2k) & 3.
			w = quantWeights(t, r, ggml.Q6_K, n)
			sumf = 0
			for b := 0; b < n/256; b++ {
				blk := w[210*b:]
				d := f16(blk[208:]) * xd(b)
				for g := range 16 {
					var p int32
					for e := 16 * g; e < 16*g+16; e++ {
						h, k, l := e/128, (e%128)/32, e%32
						lo := int32(blk[64*h+l+32*(k%2)])
						if k >= 2 {
							lo >>= 4
						}
						hi := int32(blk[128+32*h+l]>>(2*k)) & 3
						p += ((lo & 0xf) | hi<<4 - 32) * q8K(xb, 256*b+e)
					}
					sumf = fmaBig(float32(int32(int8(blk[192+g]))*p), d, sumf)
				}
			}
			if got := dotQ6KQ8K(n, w, xb); math.Float32bits(got) != math.Float32bits(sumf) {
				t.Fatalf("Q6_K n=%d: %x, want %x", n, got, sumf)
			}
		}
	}
}

func TestVecDotForUnsupported(t *testing.T) {
	if _, err := VecDotFor(ggml.Q8_K); err == nil {
		t.Error("VecDotFor(Q8_K): no error")
	}
}

func TestConvertActivationPanicsOnSize(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	ConvertActivation(ggml.Q8_0, make([]float32, 32), make([]byte, 33))
}

func BenchmarkVecDot(b *testing.B) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.BF16, ggml.Q8_0, ggml.Q4_0, ggml.Q4_K, ggml.Q6_K,
		ggml.Q5_0, ggml.Q5_1, ggml.IQ4_NL, ggml.Q2_K, ggml.Q3_K, ggml.Q5_K, ggml.IQ4_XS} {
		for _, n := range []int{768, 2048} {
			b.Run(fmt.Sprintf("%s/%d", typ, n), func(b *testing.B) {
				w := quantWeights(b, r, typ, n)
				xb := make([]byte, mustRowBytes(b, typ.VecDotType(), n))
				ConvertActivation(typ, randVec(r, n), xb)
				f, err := VecDotFor(typ)
				if err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(len(w) + len(xb)))
				var s float32
				for b.Loop() {
					s += f(n, w, xb)
				}
				sink = s
			})
		}
	}
}

var sink float32

// TestAttnDotF16Order checks attnDotF16 against ggml_vec_dot_f16's order
// written out for one and a half blocks of 64 (hd = 96): per lane l,
// ((p[l]+p[l+32]) + (p[l+16]+p[l+48])), each sum rounded to float32; the
// lanes folded as reduceLanes; the last 32 products added in float64. It
// also shows that the order matters: on these inputs it differs from dotF16
// (the matrix kernels' order) somewhere.
func TestAttnDotF16Order(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	const hd = 96
	differs := false
	for range 2000 {
		k := encode(t, ggml.F16, randBytesVec(r, hd))
		q := encode(t, ggml.F16, randBytesVec(r, hd))
		p := make([]float32, hd)
		for i := range p {
			p[i] = f16Table[binary.LittleEndian.Uint16(k[2*i:])] * f16Table[binary.LittleEndian.Uint16(q[2*i:])]
		}
		var lane [lanes]float32
		for l := range lanes {
			lane[l] = float32(p[l]+p[l+32]) + float32(p[l+16]+p[l+48])
		}
		sum := float64(reduceLanes(&lane))
		for i := 64; i < hd; i++ {
			sum += float64(p[i])
		}
		want := float32(sum)
		if got := attnDotF16(hd, k, q); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("attnDotF16 = %g (%08x), want %g (%08x)", got, math.Float32bits(got), want, math.Float32bits(want))
		}
		if dotF16(64, k, q) != attnDotF16(64, k, q) {
			differs = true
		}
	}
	if !differs {
		t.Error("attnDotF16 and dotF16 agree on every input: the test inputs do not exercise the order")
	}
}
