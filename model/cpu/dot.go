package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/strata-llm/strata/model/ggml"
)

// VecDot computes the dot product of one weight row (n elements of the weight
// type, raw bytes from the GGUF mapping) with one activation row already
// converted to the weight type's VecDotType (raw bytes).
//
// n must be a multiple of the weight type's block size, and w and x must hold
// at least the row bytes of n elements of their types; shorter slices panic.
// The result depends only on n and the bytes of w and x: the reduction order
// of every kernel is fixed (see the kernel's comment) so that a SIMD
// implementation can reproduce it bit for bit. A Q8_0 activation row holds
// quants in -127..127, as ConvertActivation makes them from finite
// activations (a NaN or infinite one quantizes to x86's integer
// indefinite, -128, in a row whose results are meaningless anyway): the
// AVX2 Q8_0 and Q5_0 kernels multiply the activations by the weights'
// signs, which a -128 activation would overflow, so only such a row may
// differ from the portable kernels' bits.
type VecDot func(n int, w, x []byte) float32

// VecDotFor returns the dot-product kernel for weights of type t.
func VecDotFor(t ggml.Type) (VecDot, error) {
	switch t {
	case ggml.F32:
		return vecDotF32, nil
	case ggml.F16:
		return vecDotF16, nil
	case ggml.BF16:
		return vecDotBF16, nil
	case ggml.Q4_0:
		return vecDotQ40, nil
	case ggml.Q8_0:
		return vecDotQ80, nil
	case ggml.Q5_0:
		return vecDotQ50, nil
	case ggml.Q5_1:
		return vecDotQ51, nil
	case ggml.IQ4_NL:
		return vecDotIQ4NL, nil
	case ggml.Q2_K:
		return dotQ2KQ8K, nil
	case ggml.Q3_K:
		return dotQ3KQ8K, nil
	case ggml.Q4_K:
		return dotQ4KQ8K, nil
	case ggml.Q5_K:
		return dotQ5KQ8K, nil
	case ggml.Q6_K:
		return dotQ6KQ8K, nil
	case ggml.IQ4_XS:
		return dotIQ4XSQ8K, nil
	}
	return nil, fmt.Errorf("cpu: no dot product for weights of type %s", t)
}

// ConvertActivation converts the activation row src to t.VecDotType() in dst,
// the way ggml's CPU backend converts activations on x86-64 with AVX2/AVX-512
// (ggml.QuantizeActivationRow). dst must be exactly the row bytes of len(src)
// elements of t.VecDotType(); a mismatch, or a type without a dot product,
// panics: the caller sizes buffers from the model's dimensions once.
func ConvertActivation(t ggml.Type, src []float32, dst []byte) {
	if err := ggml.QuantizeActivationRow(t.VecDotType(), src, dst); err != nil {
		panic(fmt.Sprintf("cpu: convert activation for %s weights: %v", t, err))
	}
}

// lanes is the number of float32 accumulators of the float kernels: one
// AVX-512 register.
const lanes = 16

// reduceLanes folds the 16 lane accumulators in a fixed tree: for w = 8, 4, 2,
// 1 in turn, lane[j] += lane[j+w] for j < w; the result is lane[0]. Every
// addition is a float32 addition, rounded.
func reduceLanes(acc *[lanes]float32) float32 {
	for w := lanes / 2; w >= 1; w /= 2 {
		for j := range w {
			acc[j] += acc[j+w]
		}
	}
	return acc[0]
}

// DotF32 returns the dot product of a and b (len(a) elements; b must be at
// least as long). This is the f32·f32 scheme, also used for attention.
//
// Order: 16 float32 lane accumulators start at +0; element i is added to lane
// i%16, in increasing i, as acc = fma(a[i], b[i], acc) with a single rounding
// to float32 (VFMADD231PS; a tail shorter than 16 is a masked FMA on lanes
// 0..r-1). Then the lanes are folded as in reduceLanes: lane[j] += lane[j+8]
// for j < 8, then +4, +2, +1; the result is lane[0].
func DotF32(a, b []float32) float32 {
	b = b[:len(a)]
	if ts := tilesFor(ggml.F32); ts != nil && len(a) > 0 {
		return ts.one(len(a), (*byte)(unsafe.Pointer(&a[0])), (*byte)(unsafe.Pointer(&b[0])))
	}
	return dotF32(a, b)
}

func dotF32(a, b []float32) float32 {
	var acc [lanes]float32
	i := 0
	for ; i+lanes <= len(a); i += lanes {
		aa, bb := (*[lanes]float32)(a[i:]), (*[lanes]float32)(b[i:])
		for l := range lanes {
			p := float64(aa[l]) * float64(bb[l]) // fma32, inlined
			if s := p + float64(acc[l]); ggml.FMA32Fast(s) {
				acc[l] = float32(s)
			} else {
				acc[l] = ggml.FMA32Slow(p, float64(acc[l]), s)
			}
		}
	}
	for l := 0; i < len(a); i, l = i+1, l+1 {
		acc[l] = fma32(a[i], b[i], acc[l])
	}
	return reduceLanes(&acc)
}

// dotF32Bytes is DotF32 on little-endian float32 rows.
func dotF32Bytes(n int, w, x []byte) float32 {
	w, x = w[:4*n], x[:4*n]
	var acc [lanes]float32
	i := 0
	for ; i+lanes <= n; i += lanes {
		ww, xx := (*[4 * lanes]byte)(w[4*i:]), (*[4 * lanes]byte)(x[4*i:])
		for l := range lanes {
			a := math.Float32frombits(binary.LittleEndian.Uint32(ww[4*l:]))
			b := math.Float32frombits(binary.LittleEndian.Uint32(xx[4*l:]))
			p := float64(a) * float64(b) // fma32, inlined
			if s := p + float64(acc[l]); ggml.FMA32Fast(s) {
				acc[l] = float32(s)
			} else {
				acc[l] = ggml.FMA32Slow(p, float64(acc[l]), s)
			}
		}
	}
	for l := 0; i < n; i, l = i+1, l+1 {
		a := math.Float32frombits(binary.LittleEndian.Uint32(w[4*i:]))
		b := math.Float32frombits(binary.LittleEndian.Uint32(x[4*i:]))
		acc[l] = fma32(a, b, acc[l])
	}
	return reduceLanes(&acc)
}

// dotF16 is the f16·f16 kernel. Order as DotF32, with each element converted
// to float32 exactly first. The product of two f16 values is exact in
// float32, so acc + float32(a*b) rounds once and equals the FMA.
func dotF16(n int, w, x []byte) float32 {
	w, x = w[:2*n], x[:2*n]
	t := f16Table
	var acc [lanes]float32
	i := 0
	for ; i+lanes <= n; i += lanes {
		ww, xx := (*[2 * lanes]byte)(w[2*i:]), (*[2 * lanes]byte)(x[2*i:])
		for l := range lanes {
			a := t[uint16(ww[2*l])|uint16(ww[2*l+1])<<8]
			b := t[uint16(xx[2*l])|uint16(xx[2*l+1])<<8]
			acc[l] += float32(a * b)
		}
	}
	for l := 0; i < n; i, l = i+1, l+1 {
		a := t[binary.LittleEndian.Uint16(w[2*i:])]
		b := t[binary.LittleEndian.Uint16(x[2*i:])]
		acc[l] += float32(a * b)
	}
	return reduceLanes(&acc)
}

// attnDotF16 is the f16 attention score (query·key), in the order of
// ggml_vec_dot_f16 as ggml's AVX-512 build computes it for its CPU flash
// attention: the first n&^63 elements go to four groups of 16 float32 lanes,
// element i into group (i/16)%4, lane i%16, as acc = fma(a, b, acc) (the
// product of two f16 values is exact, so this is one rounded addition); the
// groups fold as g0 += g2, g1 += g3, g0 += g1, lane by lane, and g0's lanes
// as in reduceLanes. The other n%64 products are then added one by one in
// float64 to that sum, and the float64 total is rounded to float32. So a
// head dimension of 64 sums ((p0+p2)+(p1+p3)) per lane, not a lane's four
// products in turn as dotF16 (the matrix kernels' order) does.
func attnDotF16(n int, k, q []byte) float32 {
	k, q = k[:2*n], q[:2*n]
	t := f16Table
	var acc [4][lanes]float32
	np := n &^ 63
	for i := 0; i < np; i += 64 {
		for g := range 4 {
			kk, qq := (*[2 * lanes]byte)(k[2*(i+16*g):]), (*[2 * lanes]byte)(q[2*(i+16*g):])
			for l := range lanes {
				a := t[uint16(kk[2*l])|uint16(kk[2*l+1])<<8]
				b := t[uint16(qq[2*l])|uint16(qq[2*l+1])<<8]
				acc[g][l] += float32(a * b)
			}
		}
	}
	for l := range lanes {
		acc[0][l] += acc[2][l]
		acc[1][l] += acc[3][l]
	}
	for l := range lanes {
		acc[0][l] += acc[1][l]
	}
	sum := float64(reduceLanes(&acc[0]))
	for i := np; i < n; i++ {
		a := t[binary.LittleEndian.Uint16(k[2*i:])]
		b := t[binary.LittleEndian.Uint16(q[2*i:])]
		sum += float64(a * b)
	}
	return float32(sum)
}

// dotBF16 is the bf16·bf16 kernel. Order as DotF32, each product added
// with one rounding (an FMA; fma32 here, VFMADD in the SIMD kernels). The
// product of two bf16 values is exact in float32 unless it overflows or
// falls below float32's normal range, so for ordinary inputs this is also
// a rounded product then an add. It was that (VMULPS then VADDPS) until
// the FMA, one instruction where that took two, made bf16 prompts 1.26×
// (one thread) and 1.29× (two) faster: BenchmarkForward pp128, medians of
// 5 alternated rounds, AMD EPYC Zen 5. TestBF16DotIsFMA holds the cases
// where the two differ.
func dotBF16(n int, w, x []byte) float32 {
	w, x = w[:2*n], x[:2*n]
	var acc [lanes]float32
	i := 0
	for ; i+lanes <= n; i += lanes {
		ww, xx := (*[2 * lanes]byte)(w[2*i:]), (*[2 * lanes]byte)(x[2*i:])
		for l := range lanes {
			a := math.Float32frombits(uint32(ww[2*l])<<16 | uint32(ww[2*l+1])<<24)
			b := math.Float32frombits(uint32(xx[2*l])<<16 | uint32(xx[2*l+1])<<24)
			acc[l] = fma32(a, b, acc[l])
		}
	}
	for l := 0; i < n; i, l = i+1, l+1 {
		a := math.Float32frombits(uint32(binary.LittleEndian.Uint16(w[2*i:])) << 16)
		b := math.Float32frombits(uint32(binary.LittleEndian.Uint16(x[2*i:])) << 16)
		acc[l] = fma32(a, b, acc[l])
	}
	return reduceLanes(&acc)
}

// f16Table maps every half-precision bit pattern to its float32 value.
var f16Table = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = ggml.F16ToF32(uint16(i))
	}
	return &t
}()

// fma32 is ggml.FMA32: a*b+c rounded once to float32, as VFMADD computes
// it (the hot loops below inline its fast path, ggml.FMA32Fast).
func fma32(a, b, c float32) float32 { return ggml.FMA32(a, b, c) }
