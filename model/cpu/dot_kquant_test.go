package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// newTypes are the weight types added for llama-quantize's mixtures.
var newTypes = []ggml.Type{ggml.Q5_0, ggml.Q5_1, ggml.IQ4_NL, ggml.Q2_K, ggml.Q3_K, ggml.Q5_K, ggml.IQ4_XS}

// f16Fields are the byte offsets of each new type's f16 fields in a block.
var f16Fields = map[ggml.Type][]int{
	ggml.Q5_0: {0}, ggml.Q5_1: {0, 2}, ggml.IQ4_NL: {0},
	ggml.Q2_K: {80, 82}, ggml.Q3_K: {108}, ggml.Q5_K: {0, 2}, ggml.IQ4_XS: {0},
}

// weightsOf returns a weight row of typ: the reference quantizer's bytes for
// a random row, or (raw) random bytes whose f16 fields are set to sane
// values (scales of 0.001..0.011, a Q5_1 min of either sign), so that every
// bit pattern of quants and sub-block scales is exercised.
func weightsOf(t testing.TB, r *rand.Rand, typ ggml.Type, n int, raw bool) []byte {
	t.Helper()
	if !raw {
		return encode(t, typ, randVec(r, n))
	}
	b := make([]byte, mustRowBytes(t, typ, n))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	for blk := 0; blk < len(b); blk += typ.TypeSize() {
		for k, off := range f16Fields[typ] {
			v := float32(0.001 + 0.01*r.Float64())
			if k == 1 && typ == ggml.Q5_1 {
				v = float32(r.NormFloat64() * 0.1)
			}
			binary.LittleEndian.PutUint16(b[blk+off:], ggml.F32ToF16(v))
		}
	}
	return b
}

// activationsOf converts a random row to typ's dot-product type.
func activationsOf(t testing.TB, r *rand.Rand, typ ggml.Type, n int) []byte {
	t.Helper()
	xb := make([]byte, mustRowBytes(t, typ.VecDotType(), n))
	ConvertActivation(typ, randVec(r, n), xb)
	return xb
}

// specDot computes each new kernel's documented order from element-wise
// decoders of the weight and activation blocks, with exactly rounded fma.
func specDot(typ ggml.Type, n int, w, x []byte) float32 {
	f16 := func(b []byte) float32 { return ggml.F16ToF32(binary.LittleEndian.Uint16(b)) }
	var acc float32
	switch typ {
	case ggml.Q5_0, ggml.Q5_1:
		// ggml_vec_dot_q5_0_q8_0 / _q5_1_q8_1 with AVX2: eight float lanes,
		// lane l adding fma(sum over elements 4l..4l+3, dd) per block,
		// hsum_float_8's tree; Q5_1's mins times sums in a float beside them,
		// added last.
		ws, xs := typ.TypeSize(), typ.VecDotType().TypeSize()
		var l [8]float32
		var ms float32
		for b := 0; b < n/32; b++ {
			wb, xb := w[ws*b:ws*(b+1)], x[xs*b:xs*(b+1)]
			for k := range 8 {
				var p int32
				for j := 4 * k; j < 4*k+4; j++ {
					q := ggml.Q5BlockQuant(binary.LittleEndian.Uint32(wb[ws-20:]), wb[ws-16:], j)
					if typ == ggml.Q5_0 {
						q -= 16
					}
					p += q * int32(int8(xb[xs-32+j]))
				}
				l[k] = fmaBig(float32(p), f16(wb)*f16(xb), l[k])
			}
			if typ == ggml.Q5_1 {
				ms = fmaBig(f16(wb[2:]), f16(xb[2:]), ms)
			}
		}
		h := [4]float32{l[4] + l[0], l[5] + l[1], l[6] + l[2], l[7] + l[3]}
		return ((h[0] + h[2]) + (h[1] + h[3])) + ms
	case ggml.IQ4_NL:
		ws, xs := typ.TypeSize(), typ.VecDotType().TypeSize()
		for b := 0; b < n/32; b++ {
			wb, xb := w[ws*b:ws*(b+1)], x[xs*b:xs*(b+1)]
			var p int32
			for j := range 32 {
				v := wb[2+j%16]
				if j >= 16 {
					v >>= 4
				}
				p += int32(ggml.IQ4Values[v&0xf]) * int32(int8(xb[xs-32+j]))
			}
			acc = fmaBig(float32(p), f16(wb)*f16(xb), acc)
		}
		return acc
	}
	ws := typ.TypeSize()
	for b := 0; b < n/256; b++ {
		wb, xb := w[ws*b:ws*(b+1)], x[292*b:292*(b+1)]
		xd := math.Float32frombits(binary.LittleEndian.Uint32(xb))
		xq := func(e int) int32 { return int32(int8(xb[4+e])) }
		bsum := func(k int) int32 { return int32(int16(binary.LittleEndian.Uint16(xb[260+2*k:]))) }
		switch typ {
		case ggml.Q2_K: // q of element e at bits 2*((e%128)/32) of qs[32*(e/128) + e%32]
			var isum, summs int32
			for e := range 256 {
				q := int32(wb[16+32*(e/128)+e%32]>>(2*((e%128)/32))) & 3
				isum += int32(wb[e/16]&0xf) * q * xq(e)
			}
			for k := range 16 {
				summs += int32(wb[k]>>4) * bsum(k)
			}
			acc = fmaBig(float32(isum), f16(wb[80:])*xd, acc)
			acc = fmaBig(float32(-summs), f16(wb[82:])*xd, acc)
		case ggml.Q3_K:
			sc := ggml.Q3KScales(wb[96:108])
			var isum int32
			for e := range 256 {
				isum += int32(sc[e/16]) * ggml.Q3KQuant(wb[0:32], wb[32:96], e) * xq(e)
			}
			acc = fmaBig(float32(isum), f16(wb[108:])*xd, acc)
		case ggml.Q5_K:
			for s := range 8 {
				var p int32
				for e := 32 * s; e < 32*s+32; e++ {
					p += ggml.Q5KQuant(wb[16:48], wb[48:176], e) * xq(e)
				}
				sc, _ := ggml.Q4KScaleMin(s, wb[4:16])
				acc = fmaBig(float32(int32(sc)*p), f16(wb)*xd, acc)
			}
			var mins int32
			for k := range 16 {
				_, m := ggml.Q4KScaleMin(k/2, wb[4:16])
				mins += int32(m) * bsum(k)
			}
			acc = fmaBig(float32(-mins), f16(wb[2:])*xd, acc)
		case ggml.IQ4_XS: // element e: nibble (e%32)/16 of qs[16*(e/32) + e%16]
			for s := range 8 {
				var p int32
				for e := 32 * s; e < 32*s+32; e++ {
					v := wb[8+16*s+e%16]
					if e%32 >= 16 {
						v >>= 4
					}
					p += int32(ggml.IQ4Values[v&0xf]) * xq(e)
				}
				ls := ggml.IQ4XSScale(binary.LittleEndian.Uint16(wb[2:]), wb[4:8], s)
				acc = fmaBig(float32(ls*p), f16(wb)*xd, acc)
			}
		}
	}
	return acc
}

// TestQuantDotOrderMore checks the kernels of the added types bit for bit
// against their documented orders, on quantizer-made and on raw weights.
func TestQuantDotOrderMore(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for _, typ := range newTypes {
		f, err := VecDotFor(typ)
		if err != nil {
			t.Fatal(err)
		}
		sizes := []int{32, 64, 96, 288, 1024}
		if typ.BlockSize() == 256 {
			sizes = []int{256, 512, 768, 2048}
		}
		for _, n := range sizes {
			for trial := range 20 {
				w := weightsOf(t, r, typ, n, trial%2 == 1)
				x := activationsOf(t, r, typ, n)
				got, want := f(n, w, x), specDot(typ, n, w, x)
				if math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("%s n=%d trial %d: %x, want %x", typ, n, trial, got, want)
				}
			}
		}
	}
}

// TestQuantDotAccuracyMore compares the kernels of the added types with a
// float64 dot product of the dequantized weights and the dequantized
// activations. The tolerance is a few float32 roundings of the magnitude
// the kernel sums: for the types with mins, the scaled quants and the mins
// separately (they cancel), and for Q5_1 also the f16 rounding of Q8_1's
// stored sum s, which the kernel multiplies by the block's min.
func TestQuantDotAccuracyMore(t *testing.T) {
	r := rand.New(rand.NewPCG(53, 54))
	for _, typ := range newTypes {
		f, err := VecDotFor(typ)
		if err != nil {
			t.Fatal(err)
		}
		sizes := []int{32, 96, 4096}
		if typ.BlockSize() == 256 {
			sizes = []int{256, 768, 4096}
		}
		vt := typ.VecDotType()
		for _, n := range sizes {
			t.Run(fmt.Sprintf("%s/%d", typ, n), func(t *testing.T) {
				for trial := range 10 {
					w := weightsOf(t, r, typ, n, trial%2 == 1)
					xb := activationsOf(t, r, typ, n)
					dw, dx := decode(t, typ, n, w), decode(t, vt, n, xb)
					// The weights without their mins: the scaled quants alone.
					noMin := slices.Clone(w)
					for blk := 0; blk < len(noMin); blk += typ.TypeSize() {
						switch typ {
						case ggml.Q5_1:
							binary.LittleEndian.PutUint16(noMin[blk+2:], 0)
						case ggml.Q2_K:
							binary.LittleEndian.PutUint16(noMin[blk+82:], 0)
						case ggml.Q5_K:
							binary.LittleEndian.PutUint16(noMin[blk+2:], 0)
						}
					}
					ds := decode(t, typ, n, noMin)
					var want, mag, extra float64
					for i := range n {
						want += float64(dw[i]) * float64(dx[i])
						mag += math.Abs(float64(ds[i])*float64(dx[i])) + math.Abs(float64(dw[i]-ds[i])*float64(dx[i]))
					}
					if typ == ggml.Q5_1 {
						for blk := 0; blk < n/32; blk++ {
							m := ggml.F16ToF32(binary.LittleEndian.Uint16(w[24*blk+2:]))
							s := ggml.F16ToF32(binary.LittleEndian.Uint16(xb[36*blk+2:]))
							extra += math.Abs(float64(m)*float64(s)) * 0x1p-11
						}
					}
					tol := 1e-6*mag*(1+math.Log2(float64(n))) + extra
					got := float64(f(n, w, xb))
					if math.Abs(got-want) > tol {
						t.Fatalf("trial %d: VecDot = %g, want %g ± %g (diff %g)", trial, got, want, tol, got-want)
					}
				}
			})
		}
	}
}

// TestMatMulInvariantMore: MatMul gives every output the bits of the
// one-row dot product, whether the activation rows come one at a time (a
// matrix-vector product, which runs one weight row a tile: Backend.runTile) or
// together, on one worker or two, with the kernels this CPU picks and with
// its AVX2 ones, each with and without the matrix-vector kernels that
// prefetch ahead (aheadEnv), and with the AVX-VNNI ones where the CPU has
// them.
func TestMatMulInvariantMore(t *testing.T) {
	r := rand.New(rand.NewPCG(55, 56))
	p1, p2 := NewPool(1), NewPool(2)
	defer p1.Close()
	defer p2.Close()
	types := append([]ggml.Type{ggml.F32, ggml.F16, ggml.BF16, ggml.Q8_0, ggml.Q4_0}, newTypes...)
	defer func(avx2, ahead, noVNNI bool) { avx2Only, aheadOn, noAVXVNNI = avx2, ahead, noVNNI }(avx2Only, aheadOn, noAVXVNNI)
	for _, set := range []struct{ avx2, ahead, noVNNI bool }{
		{false, false, false}, {false, true, false}, {true, false, false}, {true, true, false}, {true, false, true}, {true, true, true},
	} {
		avx2Only, aheadOn, noAVXVNNI = set.avx2, set.ahead, set.noVNNI
		for _, typ := range types {
			K, N, R := 96, 37, 9
			if typ.BlockSize() == 256 {
				K = 512
			}
			var data []byte
			for range N {
				data = append(data, weightsOf(t, r, typ, K, r.IntN(2) == 0 && f16Fields[typ] != nil)...)
			}
			w := &model.Weight{Name: "w", Type: typ, Rows: N, Cols: K, Data: data}
			x := randVec(r, R*K)
			f, _ := VecDotFor(typ)
			want := make([]float32, R*N)
			for i := range R {
				xb := make([]byte, mustRowBytes(t, typ.VecDotType(), K))
				ConvertActivation(typ, x[i*K:(i+1)*K], xb)
				for o := range N {
					withPortable(func() { want[i*N+o] = f(K, w.Row(o), xb) })
				}
			}
			all := make([]float32, R*N)
			NewBackend(p2).MatMul(w, x, R, all)
			one := make([]float32, R*N)
			be := NewBackend(p1)
			for i := range R {
				be.MatMul(w, x[i*K:(i+1)*K], 1, one[i*N:(i+1)*N])
			}
			if !slices.Equal(all, want) || !slices.Equal(one, want) {
				t.Errorf("%s (%s, ahead %v, noAVXVNNI %v): MatMul outputs differ from the one-row dot products", typ, ISA(typ), aheadOn, noAVXVNNI)
			}
		}
	}
}

// TestMatrixTypesHaveDots: every type model.Load admits has a dot product
// and an activation conversion.
func TestMatrixTypesHaveDots(t *testing.T) {
	for _, typ := range model.MatrixTypes {
		if _, err := VecDotFor(typ); err != nil {
			t.Errorf("%s: %v", typ, err)
		}
		const n = 256 // a whole number of blocks of every type
		ConvertActivation(typ, make([]float32, n), make([]byte, mustRowBytes(t, typ.VecDotType(), n)))
	}
}
