package ggml

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestTypeGeometry pins each type's block size and bytes to ggml's
// (ggml_blck_size and ggml_type_size, from the static_asserts on the block
// structs in ggml-common.h), and its name.
func TestTypeGeometry(t *testing.T) {
	cases := []struct {
		typ         Type
		id          uint32
		name        string
		block, size int
	}{
		{F32, 0, "F32", 1, 4},
		{F16, 1, "F16", 1, 2},
		{Q4_0, 2, "Q4_0", 32, 18},
		{Q4_1, 3, "Q4_1", 32, 20},
		{Q5_0, 6, "Q5_0", 32, 22},
		{Q5_1, 7, "Q5_1", 32, 24},
		{Q8_0, 8, "Q8_0", 32, 34},
		{Q8_1, 9, "Q8_1", 32, 36},
		{Q2_K, 10, "Q2_K", 256, 84},
		{Q3_K, 11, "Q3_K", 256, 110},
		{Q4_K, 12, "Q4_K", 256, 144},
		{Q5_K, 13, "Q5_K", 256, 176},
		{Q6_K, 14, "Q6_K", 256, 210},
		{Q8_K, 15, "Q8_K", 256, 292},
		{IQ2_XXS, 16, "IQ2_XXS", 256, 66},
		{IQ2_XS, 17, "IQ2_XS", 256, 74},
		{IQ3_XXS, 18, "IQ3_XXS", 256, 98},
		{IQ1_S, 19, "IQ1_S", 256, 50},
		{IQ4_NL, 20, "IQ4_NL", 32, 18},
		{IQ3_S, 21, "IQ3_S", 256, 110},
		{IQ2_S, 22, "IQ2_S", 256, 82},
		{IQ4_XS, 23, "IQ4_XS", 256, 136},
		{I8, 24, "I8", 1, 1},
		{I16, 25, "I16", 1, 2},
		{I32, 26, "I32", 1, 4},
		{I64, 27, "I64", 1, 8},
		{F64, 28, "F64", 1, 8},
		{IQ1_M, 29, "IQ1_M", 256, 56},
		{BF16, 30, "BF16", 1, 2},
		{TQ1_0, 34, "TQ1_0", 256, 54},
		{TQ2_0, 35, "TQ2_0", 256, 66},
		{MXFP4, 39, "MXFP4", 32, 17},
		{NVFP4, 40, "NVFP4", 64, 36},
		{Q1_0, 41, "Q1_0", 128, 18},
		{Q2_0, 42, "Q2_0", 64, 18},
	}
	for _, c := range cases {
		if uint32(c.typ) != c.id || c.typ.String() != c.name || c.typ.BlockSize() != c.block || c.typ.TypeSize() != c.size || !c.typ.Known() {
			t.Errorf("%s: id %d block %d size %d known %v, want %d %s %d %d", c.typ, uint32(c.typ), c.typ.BlockSize(), c.typ.TypeSize(), c.typ.Known(), c.id, c.name, c.block, c.size)
		}
	}
	if len(types) != len(cases) {
		t.Errorf("%d types known, %d pinned", len(types), len(cases))
	}
	for _, id := range []uint32{4, 5, 31, 32, 33, 36, 37, 38, 43, 99} { // retired or future
		if Type(id).Known() {
			t.Errorf("type %d is known", id)
		}
	}
}

// TestVecDotType pins the activation formats to ggml's type_traits_cpu
// vec_dot_type, and Fallback to llama-quantize's choice for rows that are
// not whole super-blocks.
func TestVecDotTypeAndFallback(t *testing.T) {
	vdt := map[Type]Type{
		F32: F32, F16: F16, BF16: BF16,
		Q4_0: Q8_0, Q5_0: Q8_0, Q8_0: Q8_0, IQ4_NL: Q8_0,
		Q5_1: Q8_1,
		Q2_K: Q8_K, Q3_K: Q8_K, Q4_K: Q8_K, Q5_K: Q8_K, Q6_K: Q8_K, IQ4_XS: Q8_K,
	}
	for typ, want := range vdt {
		if got := typ.VecDotType(); got != want {
			t.Errorf("%s.VecDotType() = %s, want %s", typ, got, want)
		}
	}
	fb := []struct {
		typ  Type
		n    int
		want Type
	}{
		{Q4_K, 512, Q4_K}, {Q4_K, 288, Q5_0}, {Q5_K, 288, Q5_1}, {Q6_K, 64, Q8_0},
		{Q2_K, 96, IQ4_NL}, {Q3_K, 96, IQ4_NL}, {IQ4_XS, 96, IQ4_NL},
		{Q4_K, 100, F16}, {Q8_0, 100, F16}, {Q8_0, 96, Q8_0}, {F32, 7, F32}, {F16, 7, F16},
	}
	for _, c := range fb {
		if got := c.typ.Fallback(c.n); got != c.want {
			t.Errorf("%s.Fallback(%d) = %s, want %s", c.typ, c.n, got, c.want)
		}
	}
}

// putQ5Quants writes 32 five-bit quants into a Q5_0/Q5_1 block's qh word and
// qs bytes by the documented layout.
func putQ5Quants(q func(j int) int, qh, qs []byte) {
	var h uint32
	for j := range 32 {
		v := q(j)
		if j < 16 {
			qs[j] |= byte(v & 0xf)
		} else {
			qs[j-16] |= byte(v&0xf) << 4
		}
		h |= uint32(v>>4) << j
	}
	binary.LittleEndian.PutUint32(qh, h)
}

// TestDequantizeHandBuiltMore extends TestDequantizeHandBuilt to the types
// added for llama-quantize's mixtures: blocks written field by field from
// the layout, values from the format's formula. Every element has its own
// quant pattern and every group its own scale, so a wrong shift, nibble or
// bit position changes some value.
func TestDequantizeHandBuiltMore(t *testing.T) {
	type tc struct {
		name string
		typ  Type
		src  []byte
		want []float32
	}
	var cases []tc

	{ // Q5_0: d = 0.5, q(j) = (7j+3)%32; value (q-16)*d
		b := make([]byte, 22)
		putF16(b, 0.5)
		q := func(j int) int { return (7*j + 3) % 32 }
		putQ5Quants(q, b[2:6], b[6:22])
		want := make([]float32, 32)
		for j := range 32 {
			want[j] = float32(q(j)-16) * 0.5
		}
		cases = append(cases, tc{"Q5_0", Q5_0, b, want})
	}
	{ // Q5_1: d = 0.25, m = -1.5, q(j) = (11j+5)%32; value q*d + m
		b := make([]byte, 24)
		putF16(b, 0.25)
		putF16(b[2:], -1.5)
		q := func(j int) int { return (11*j + 5) % 32 }
		putQ5Quants(q, b[4:8], b[8:24])
		want := make([]float32, 32)
		for j := range 32 {
			want[j] = float32(q(j))*0.25 - 1.5
		}
		cases = append(cases, tc{"Q5_1", Q5_1, b, want})
	}
	{ // Q8_1: d = 0.5, s (not read) = 3; value q*d
		b := make([]byte, 36)
		putF16(b, 0.5)
		putF16(b[2:], 3)
		want := make([]float32, 32)
		for j := range 32 {
			b[4+j] = byte(int8(5*j - 77))
			want[j] = float32(5*j-77) * 0.5
		}
		cases = append(cases, tc{"Q8_1", Q8_1, b, want})
	}
	levels := []float32{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}
	{ // IQ4_NL: d = -2, index(j) = (5j+1)%16; value d*level
		b := make([]byte, 18)
		putF16(b, -2)
		idx := func(j int) int { return (5*j + 1) % 16 }
		want := make([]float32, 32)
		for j := range 32 {
			if j < 16 {
				b[2+j] |= byte(idx(j))
			} else {
				b[2+j-16] |= byte(idx(j)) << 4
			}
			want[j] = -2 * levels[idx(j)]
		}
		cases = append(cases, tc{"IQ4_NL", IQ4_NL, b, want})
	}
	{ // IQ4_XS: d = 0.125, sub-block s has 6-bit scale sc[s], index(e) = (3e+e/32)%16;
		// value (d*(sc-32))*level
		b := make([]byte, 136)
		putF16(b, 0.125)
		sc := [8]int{0, 63, 17, 40, 33, 5, 58, 31}
		var sh uint16
		for s := range 8 {
			b[4+s/2] |= byte(sc[s]&0xf) << (4 * (s % 2))
			sh |= uint16(sc[s]>>4) << (2 * s)
		}
		binary.LittleEndian.PutUint16(b[2:], sh)
		idx := func(e int) int { return (3*e + e/32) % 16 }
		want := make([]float32, 256)
		for e := range 256 {
			s, l := e/32, e%32
			if l < 16 {
				b[8+16*s+l] |= byte(idx(e))
			} else {
				b[8+16*s+l-16] |= byte(idx(e)) << 4
			}
			want[e] = 0.125 * float32(sc[s]-32) * levels[idx(e)]
		}
		cases = append(cases, tc{"IQ4_XS", IQ4_XS, b, want})
	}
	{ // Q2_K: d = 0.5, dmin = 0.25; group g of 16 has scale (7g+1)%16 (low nibble)
		// and min (5g+2)%16 (high nibble); q(e) = (3e+e/7)%4 at bits 2*((e%128)/32)
		// of qs[32*(e/128) + e%32]; value d*scale*q - dmin*min
		b := make([]byte, 84)
		putF16(b[80:], 0.5)
		putF16(b[82:], 0.25)
		sc := func(g int) int { return (7*g + 1) % 16 }
		mn := func(g int) int { return (5*g + 2) % 16 }
		for g := range 16 {
			b[g] = byte(sc(g) | mn(g)<<4)
		}
		q := func(e int) int { return (3*e + e/7) % 4 }
		want := make([]float32, 256)
		for e := range 256 {
			b[16+32*(e/128)+e%32] |= byte(q(e)) << (2 * ((e % 128) / 32))
			want[e] = 0.5*float32(sc(e/16))*float32(q(e)) - 0.25*float32(mn(e/16))
		}
		cases = append(cases, tc{"Q2_K", Q2_K, b, want})
	}
	{ // Q3_K: d = 0.25; group g has 6-bit scale s(g) = (13g+5)%64, low nibble in
		// byte g (g<8) or the high nibble of byte g-8, high bits at 2*(g/4) of
		// byte 8+g%4; q(e) in -4..3 has q+4's low bits at 2*((e%128)/32) of
		// qs[32*(e/128) + e%32] and q+4's bit 2 at bit e/32 of hmask[e%32];
		// value d*(s-32)*q
		b := make([]byte, 110)
		putF16(b[108:], 0.25)
		s := func(g int) int { return (13*g + 5) % 64 }
		for g := range 16 {
			if g < 8 {
				b[96+g] |= byte(s(g) & 0xf)
			} else {
				b[96+g-8] |= byte(s(g)&0xf) << 4
			}
			b[96+8+g%4] |= byte(s(g)>>4) << (2 * (g / 4))
		}
		q := func(e int) int { return (5*e+e/9)%8 - 4 }
		want := make([]float32, 256)
		for e := range 256 {
			v := q(e) + 4
			b[32+32*(e/128)+e%32] |= byte(v&3) << (2 * ((e % 128) / 32))
			b[e%32] |= byte(v>>2) << (e / 32)
			want[e] = 0.25 * float32(s(e/16)-32) * float32(q(e))
		}
		cases = append(cases, tc{"Q3_K", Q3_K, b, want})
	}
	{ // Q5_K: d = 0.5, dmin = 0.25, scales and mins packed as Q4_K's;
		// q(e) = (7e+3)%32: low nibble (e%64 < 32) or high nibble of
		// qs[32*(e/64) + e%32], bit 4 at bit e/32 of qh[e%32]; value d*sc*q - dmin*min
		b := make([]byte, 176)
		putF16(b, 0.5)
		putF16(b[2:], 0.25)
		sc := [8]int{1, 3, 5, 7, 44, 45, 46, 63}
		mn := [8]int{0, 1, 2, 3, 56, 55, 54, 17}
		s := b[4:16]
		for j := range 4 {
			s[j] = byte(sc[j]) | byte(sc[j+4]>>4)<<6
			s[j+4] = byte(mn[j]) | byte(mn[j+4]>>4)<<6
			s[j+8] = byte(sc[j+4]&0xf) | byte(mn[j+4]&0xf)<<4
		}
		q := func(e int) int { return (7*e + 3) % 32 }
		want := make([]float32, 256)
		for e := range 256 {
			if e%64 < 32 {
				b[48+32*(e/64)+e%32] |= byte(q(e) & 0xf)
			} else {
				b[48+32*(e/64)+e%32] |= byte(q(e)&0xf) << 4
			}
			b[16+e%32] |= byte(q(e)>>4) << (e / 32)
			want[e] = 0.5*float32(sc[e/32])*float32(q(e)) - 0.25*float32(mn[e/32])
		}
		cases = append(cases, tc{"Q5_K", Q5_K, b, want})
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := make([]float32, len(c.want))
			if err := DequantizeRow(c.typ, c.src, got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(got, c.want); diff != "" {
				t.Errorf("DequantizeRow(%s) mismatch (-got +want):\n%s", c.typ, diff)
			}
		})
	}
}

// TestQuantizeRoundTripMore checks dequant(quant(x)) for the types added for
// llama-quantize's mixtures: on heavy-tailed rows, every element's error
// within a bound set by the format's bits, relative to the largest magnitude
// of its block (32 elements, or 256 for the super-block types); on Gaussian
// rows, the relative RMS error under a bound about 1.25 times what the
// format gives (each bit halves it). All-zero, constant and one-hot blocks
// round-trip too.
func TestQuantizeRoundTripMore(t *testing.T) {
	cases := []struct {
		typ      Type
		maxRel   float64 // |error| / block amax
		rmsBound float64 // Gaussian rows: sqrt(sum err² / sum x²)
	}{
		{Q5_0, 1.0/16 + 0x1p-11*1.01, 0.054}, // clamped at 15: up to one step
		{Q5_1, 1.0 / 16, 0.048},
		{IQ4_NL, 0.15, 0.095},
		{Q2_K, 0.5, 0.37},
		{Q3_K, 0.25, 0.19},
		{Q4_K, 1.0 / 8, 0.09},
		{Q5_K, 1.0 / 16, 0.045},
		{Q6_K, 1.0 / 32, 0.023},
		{IQ4_XS, 0.15, 0.095},
	}
	r := rand.New(rand.NewPCG(21, 22))
	for _, c := range cases {
		t.Run(c.typ.String(), func(t *testing.T) {
			n := 1024
			bs := c.typ.BlockSize()
			roundTrip := func(x []float32) []float32 {
				q := make([]byte, mustRow(t, c.typ, len(x)))
				if err := QuantizeRow(c.typ, x, q); err != nil {
					t.Fatal(err)
				}
				aq := make([]byte, len(q))
				if err := QuantizeActivationRow(c.typ, x, aq); err != nil || string(aq) != string(q) {
					t.Fatalf("QuantizeActivationRow differs from QuantizeRow for a weight type (%v)", err)
				}
				y := make([]float32, len(x))
				if err := DequantizeRow(c.typ, q, y); err != nil {
					t.Fatal(err)
				}
				return y
			}
			for trial := range 20 {
				x := randRow(r, n)
				switch trial {
				case 0:
					clear(x[:bs]) // all zero
				case 1:
					for i := range bs {
						x[i] = 0.75 // constant
					}
				case 2:
					clear(x[:bs])
					x[bs/3] = -3 // one-hot
				}
				y := roundTrip(x)
				for b0 := 0; b0 < n; b0 += bs {
					var amax float64
					for _, v := range x[b0 : b0+bs] {
						amax = max(amax, math.Abs(float64(v)))
					}
					for i := b0; i < b0+bs; i++ {
						if err := math.Abs(float64(x[i]) - float64(y[i])); err > c.maxRel*amax {
							t.Fatalf("trial %d element %d: x=%g got %g, error %g > %g (block amax %g)", trial, i, x[i], y[i], err, c.maxRel*amax, amax)
						}
					}
				}
			}
			var se, sx float64
			for range 8 {
				x := make([]float32, 4096)
				for i := range x {
					x[i] = float32(r.NormFloat64())
				}
				y := roundTrip(x)
				for i := range x {
					e := float64(x[i]) - float64(y[i])
					se += e * e
					sx += float64(x[i]) * float64(x[i])
				}
			}
			if rms := math.Sqrt(se / sx); rms > c.rmsBound {
				t.Errorf("relative RMS error %.4f > %.4f", rms, c.rmsBound)
			} else {
				t.Logf("relative RMS error %.4f (bound %.4f)", rms, c.rmsBound)
			}
		})
	}
}

func mustRow(t *testing.T, typ Type, n int) int {
	t.Helper()
	nb, err := typ.RowBytes(n)
	if err != nil {
		t.Fatal(err)
	}
	return nb
}

// TestQ5Ref pins quantize_row_q5_0_ref's and quantize_row_q5_1_ref's
// rounding: Q5_0 truncates x/d+16.5 and clamps at 31, with d = max/-16 for
// the signed value of largest magnitude; Q5_1 truncates (x-min)/d+0.5 with
// d = (max-min)/31.
func TestQ5Ref(t *testing.T) {
	x := make([]float32, 32)
	x[0] = -16   // max = -16: d = 1, id = 1
	x[1] = 16    // 32.5 -> 32 -> clamped to 31
	x[2] = 0.5   // 17
	x[3] = -0.49 // 16.01 -> 16
	x[17] = 3.4  // 19.9 -> 19 (bit 4 set: qh bit 17)
	b := make([]byte, 22)
	if err := QuantizeRow(Q5_0, x, b); err != nil {
		t.Fatal(err)
	}
	if d := F16ToF32(binary.LittleEndian.Uint16(b)); d != 1 {
		t.Errorf("Q5_0 d = %g, want 1", d)
	}
	qh := binary.LittleEndian.Uint32(b[2:])
	got := []int32{Q5BlockQuant(qh, b[6:], 0), Q5BlockQuant(qh, b[6:], 1), Q5BlockQuant(qh, b[6:], 2), Q5BlockQuant(qh, b[6:], 3), Q5BlockQuant(qh, b[6:], 17), Q5BlockQuant(qh, b[6:], 5)}
	if diff := cmp.Diff(got, []int32{0, 31, 17, 16, 19, 16}); diff != "" {
		t.Errorf("Q5_0 quants (-got +want):\n%s", diff)
	}

	for i := range x {
		x[i] = 1 + float32(i%2)*0.5 // min 1, max 1.5
	}
	x[4] = 32 // max: d = 1, id = 1
	x[5] = 2.5
	x[20] = 17.49
	b = make([]byte, 24)
	if err := QuantizeRow(Q5_1, x, b); err != nil {
		t.Fatal(err)
	}
	if d, m := F16ToF32(binary.LittleEndian.Uint16(b)), F16ToF32(binary.LittleEndian.Uint16(b[2:])); d != 1 || m != 1 {
		t.Errorf("Q5_1 d = %g, m = %g, want 1 and 1", d, m)
	}
	qh = binary.LittleEndian.Uint32(b[4:])
	// (x-1)+0.5 truncated: 0.5 -> 0 (1), 1.0 -> 1 (1.5), 31.5 -> 31, 2 -> 2, 16.99 -> 16
	got = []int32{Q5BlockQuant(qh, b[8:], 0), Q5BlockQuant(qh, b[8:], 1), Q5BlockQuant(qh, b[8:], 4), Q5BlockQuant(qh, b[8:], 5), Q5BlockQuant(qh, b[8:], 20)}
	if diff := cmp.Diff(got, []int32{0, 1, 31, 2, 16}); diff != "" {
		t.Errorf("Q5_1 quants (-got +want):\n%s", diff)
	}
}

// TestIQ4Levels pins best_index_int8's choice: the nearest level, the upper
// one on an exact tie, the ends for values beyond them.
func TestIQ4Levels(t *testing.T) {
	v := IQ4Values
	for i := range 16 {
		if got := bestIndexIQ4(float32(v[i])); got != uint8(i) {
			t.Errorf("level %d: index %d, want %d", v[i], got, i)
		}
	}
	for i := range 15 {
		mid := (float32(v[i]) + float32(v[i+1])) / 2
		if got := bestIndexIQ4(mid); got != uint8(i+1) {
			t.Errorf("midpoint %g of %d and %d: index %d, want %d (upper)", mid, v[i], v[i+1], got, i+1)
		}
		if got := bestIndexIQ4(math.Nextafter32(mid, -1000)); got != uint8(i) {
			t.Errorf("just below midpoint %g: index %d, want %d", mid, got, i)
		}
	}
	if bestIndexIQ4(-1000) != 0 || bestIndexIQ4(1000) != 15 {
		t.Error("values beyond the levels do not map to the ends")
	}
	// A block whose largest magnitude is 127 quantizes exactly onto the grid:
	// d = 1 and every element is a level.
	x := make([]float32, 32)
	for j := range x {
		x[j] = float32(v[(7*j+3)%16])
	}
	x[5] = -127
	b := make([]byte, 18)
	if err := QuantizeRow(IQ4_NL, x, b); err != nil {
		t.Fatal(err)
	}
	y := make([]float32, 32)
	if err := DequantizeRow(IQ4_NL, b, y); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(y, x); diff != "" {
		t.Errorf("levels do not round-trip (-got +want):\n%s", diff)
	}
}

// TestQ81Activation: the Q8_1 activation quants and d are Q8_0's, and s is
// f16(d * the sum of the quants), with d = amax/127 not yet rounded to f16.
func TestQ81Activation(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for trial := range 50 {
		x := randRow(r, 128)
		if trial == 0 {
			clear(x[:32])
		}
		q8 := make([]byte, 4*34)
		q81 := make([]byte, 4*36)
		if err := QuantizeActivationRow(Q8_0, x, q8); err != nil {
			t.Fatal(err)
		}
		if err := QuantizeActivationRow(Q8_1, x, q81); err != nil {
			t.Fatal(err)
		}
		for b := range 4 {
			a, c := q8[34*b:34*b+34], q81[36*b:36*b+36]
			if string(a[:2]) != string(c[:2]) || string(a[2:]) != string(c[4:]) {
				t.Fatalf("trial %d block %d: Q8_1 d or quants differ from Q8_0's", trial, b)
			}
			var sum int32
			for _, v := range c[4:] {
				sum += int32(int8(v))
			}
			var amax float32
			for _, v := range x[32*b : 32*b+32] {
				amax = max(amax, abs32(v))
			}
			d := amax / 127 // before its rounding to f16
			if got, want := binary.LittleEndian.Uint16(c[2:]), F32ToF16(d*float32(sum)); got != want {
				t.Fatalf("trial %d block %d: s = %#04x, want %#04x (d %g, sum %d)", trial, b, got, want, d, sum)
			}
		}
	}
}

// TestQuantizeDeterministic: the same row gives the same bytes whatever
// the destination held, and every block is independent of its neighbours.
func TestQuantizeDeterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	for _, typ := range []Type{Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS} {
		t.Run(typ.String(), func(t *testing.T) {
			n := 2 * QKK
			x := randRow(r, n)
			a := make([]byte, mustRow(t, typ, n))
			b := make([]byte, len(a))
			for i := range b {
				b[i] = 0xa5
			}
			if err := QuantizeRow(typ, x, a); err != nil {
				t.Fatal(err)
			}
			if err := QuantizeRow(typ, x, b); err != nil {
				t.Fatal(err)
			}
			if string(a) != string(b) {
				t.Fatal("the destination's old bytes leak into the result")
			}
			half := make([]byte, len(a)/2)
			if err := QuantizeRow(typ, x[n/2:], half); err != nil {
				t.Fatal(err)
			}
			if string(half) != string(a[len(a)/2:]) {
				t.Fatal("the second half quantized alone differs")
			}
		})
	}
}

func ExampleType_Fallback() {
	// llama-quantize's Q4_K_M on a 64-wide model (stories260K): rows of 64
	// cannot hold 256-element super-blocks.
	for _, typ := range []Type{Q4_K, Q6_K, Q3_K} {
		fmt.Println(typ, "->", typ.Fallback(64))
	}
	// Output:
	// Q4_K -> Q5_0
	// Q6_K -> Q8_0
	// Q3_K -> IQ4_NL
}
