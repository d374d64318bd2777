package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/strata-llm/strata/model/ggml"
)

// TestMatTilesEqualPortable checks the matrix kernels with float32
// activations (f16 and bf16 weights), every R×C shape, against the portable
// kernel on the activations converted to the weights' dot-product type, bit
// for bit, on random rows of awkward sizes.
func TestMatTilesEqualPortable(t *testing.T) {
	testMatTilesEqualPortable(t)
	avx2Only = true
	defer func() { avx2Only = false }()
	testMatTilesEqualPortable(t)
}

func testMatTilesEqualPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 36))
	for _, typ := range []ggml.Type{ggml.F16, ggml.BF16} {
		ts := archMatTiles(typ)
		if ts == nil {
			t.Skipf("%s: no float32-activation kernels on this CPU", typ)
		}
		if !ts.f32x {
			t.Fatalf("%s: archMatTiles returned %s, which takes no float32 activations", typ, ts.name)
		}
		portable, err := VecDotFor(typ)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 255, 768, 1000} {
			t.Run(fmt.Sprintf("%s/%d", ts.name, n), func(t *testing.T) {
				wrow := mustRowBytes(t, typ, n)
				xrow := mustRowBytes(t, typ.VecDotType(), n)
				for R := 1; R <= ts.maxR; R++ {
					for C := 1; C <= ts.maxC; C++ {
						// Rows with a gap between them, to test the strides.
						ws, xs := wrow+6, 4*n+4
						w := make([]byte, R*ws)
						for i := range R {
							copy(w[i*ws:], randRow(t, r, typ, n))
						}
						x := make([]float32, C*xs/4)
						xh := make([][]byte, C) // the same activations as the portable kernel takes them
						for c := range C {
							v := randBytesVec(r, n)
							xh[c] = make([]byte, xrow)
							ConvertActivation(typ, v, xh[c])
							roundActivation(typ, v, x[c*xs/4:c*xs/4+n])
						}
						const os = 5
						out := make([]float32, C*os)
						ts.k[R-1][C-1](n, &w[0], ws, (*byte)(unsafe.Pointer(&x[0])), xs, &out[0], 4*os)
						for i := range R {
							for c := range C {
								var want float32
								withPortable(func() { want = portable(n, w[i*ws:i*ws+wrow], xh[c]) })
								if got := out[c*os+i]; math.Float32bits(got) != math.Float32bits(want) {
									t.Fatalf("%s_%dx%d n=%d out[%d][%d] = %g (%08x), portable %g (%08x)",
										ts.name, R, C, n, i, c, got, math.Float32bits(got), want, math.Float32bits(want))
								}
							}
						}
						for c := range C { // untouched padding
							for i := R; i < os; i++ {
								if out[c*os+i] != 0 {
									t.Fatalf("%s_%dx%d wrote out[%d][%d]", ts.name, R, C, i, c)
								}
							}
						}
					}
				}
				v := randBytesVec(r, n)
				xh := make([]byte, xrow)
				ConvertActivation(typ, v, xh)
				x := make([]float32, n)
				roundActivation(typ, v, x)
				checkRows(t, r, ts, typ, n, (*byte)(unsafe.Pointer(&x[0])), func(w []byte) float32 {
					var want float32
					withPortable(func() { want = portable(n, w, xh) })
					return want
				})
			})
		}
	}
}

// TestRoundActivation checks roundActivation against ggml's conversions for
// every bit pattern class: random bits (NaNs, infinities, subnormals and
// both zeros among them) and the rounding edges, over lengths that leave
// every tail length.
func TestRoundActivation(t *testing.T) {
	testRoundActivation(t)
	avx2Only = true
	defer func() { avx2Only = false }()
	testRoundActivation(t)
}

func testRoundActivation(t *testing.T) {
	for _, typ := range []ggml.Type{ggml.F16, ggml.BF16} {
		if archMatTiles(typ) == nil {
			t.Skipf("%s: no float32-activation kernels on this CPU", typ)
		}
		want := func(f float32) float32 {
			if typ == ggml.F16 {
				return ggml.F16ToF32(ggml.F32ToF16(f))
			}
			return ggml.BF16ToF32(ggml.F32ToBF16(f))
		}
		r := rand.New(rand.NewPCG(37, 38))
		bits := []uint32{0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xff800001, 0x7fbfffff,
			0x3f808000, 0x3f818000, 0x3f808001, 0x3f817fff, 0x7f7f8000, 0x7f7fffff, 0x00008000, 0x00018000,
			0x33800000, 0x33000000, 0x33000001, 0x387fc000, 0x38800000, 0x477ff000, 0x477fefff, 0x477ff001}
		for range 4000 {
			bits = append(bits, r.Uint32())
		}
		src := make([]float32, len(bits))
		for i, b := range bits {
			src[i] = math.Float32frombits(b)
		}
		for _, n := range []int{1, 15, 16, 17, 33, len(src)} {
			dst := make([]float32, n+1)
			dst[n] = 42
			roundActivation(typ, src[:n], dst[:n])
			for i := range n {
				w := want(src[i])
				if math.Float32bits(dst[i]) != math.Float32bits(w) {
					t.Fatalf("%s (avx2Only %v): round(%08x) = %08x, want %08x", typ, avx2Only, bits[i], math.Float32bits(dst[i]), math.Float32bits(w))
				}
			}
			if dst[n] != 42 {
				t.Fatalf("%s n=%d (avx2Only %v): wrote past the end", typ, n, avx2Only)
			}
		}
	}
}
