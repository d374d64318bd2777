package ggml

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func putF16(b []byte, f float32) { binary.LittleEndian.PutUint16(b, F32ToF16(f)) }

// Hand-built blocks: each case writes a block by its documented layout and
// computes the expected values from the format's formula, element by element.
func TestDequantizeHandBuilt(t *testing.T) {
	type tc struct {
		name string
		typ  Type
		src  []byte
		want []float32
	}
	var cases []tc

	{ // Q4_0: d = 0.5; qs[j] = j (low nibble) | (15-j) (high nibble)
		b := make([]byte, 18)
		putF16(b, 0.5)
		want := make([]float32, 32)
		for j := range 16 {
			b[2+j] = byte(j) | byte(15-j)<<4
			want[j] = float32(j-8) * 0.5
			want[j+16] = float32(15-j-8) * 0.5
		}
		cases = append(cases, tc{"Q4_0", Q4_0, b, want})
	}
	{ // Q8_0: two blocks, d = 0.25 and -2; qs = j-16 and 127-8j
		b := make([]byte, 68)
		putF16(b, 0.25)
		putF16(b[34:], -2)
		want := make([]float32, 64)
		for j := range 32 {
			b[2+j] = byte(int8(j - 16))
			want[j] = float32(j-16) * 0.25
			b[36+j] = byte(int8(127 - 8*j))
			want[32+j] = float32(int8(127-8*j)) * -2
		}
		cases = append(cases, tc{"Q8_0", Q8_0, b, want})
	}
	{ // Q8_K: d = 0.125 (f32); bsums are not read
		b := make([]byte, 292)
		binary.LittleEndian.PutUint32(b, math.Float32bits(0.125))
		want := make([]float32, 256)
		for j := range 256 {
			q := int8(j - 128)
			b[4+j] = byte(q)
			want[j] = float32(q) * 0.125
		}
		cases = append(cases, tc{"Q8_K", Q8_K, b, want})
	}
	{ // Q4_K: d = 0.5, dmin = 0.25, sub-block s has scale 2s+1 (s<4) or 40+s (s>=4), min s or 60-s.
		b := make([]byte, 144)
		putF16(b, 0.5)
		putF16(b[2:], 0.25)
		sc := [8]int{1, 3, 5, 7, 44, 45, 46, 47}
		mn := [8]int{0, 1, 2, 3, 56, 55, 54, 53}
		s := b[4:16]
		for j := range 4 {
			s[j] = byte(sc[j]) | byte(sc[j+4]>>4)<<6
			s[j+4] = byte(mn[j]) | byte(mn[j+4]>>4)<<6
			s[j+8] = byte(sc[j+4]&0xf) | byte(mn[j+4]&0xf)<<4
		}
		want := make([]float32, 256)
		q := func(e int) int { return (e*7 + 3) % 16 }
		for e := range 256 {
			sub := e / 32
			chunk, pos := e/64, e%32
			if sub%2 == 0 {
				b[16+32*chunk+pos] |= byte(q(e))
			} else {
				b[16+32*chunk+pos] |= byte(q(e)) << 4
			}
			want[e] = 0.5*float32(sc[sub])*float32(q(e)) - 0.25*float32(mn[sub])
		}
		cases = append(cases, tc{"Q4_K", Q4_K, b, want})
	}
	{ // Q6_K: d = 0.25, 16-element group g has scale g-8 (int8), q6(e) = (e*5+1)%64.
		b := make([]byte, 210)
		putF16(b[208:], 0.25)
		for g := range 16 {
			b[192+g] = byte(int8(g - 8))
		}
		want := make([]float32, 256)
		for e := range 256 {
			v := (e*5 + 1) % 64
			half, r := e/128, e%128
			quarter, l := r/32, r%32
			// quarters 0,1 use low nibbles of ql[l], ql[l+32]; 2,3 high nibbles; qh bits 2*quarter.
			qlIdx := 64*half + l + 32*(quarter%2)
			if quarter < 2 {
				b[qlIdx] |= byte(v & 0xf)
			} else {
				b[qlIdx] |= byte(v&0xf) << 4
			}
			b[128+32*half+l] |= byte(v>>4) << (2 * quarter)
			want[e] = 0.25 * float32(e/16-8) * float32(v-32)
		}
		cases = append(cases, tc{"Q6_K", Q6_K, b, want})
	}
	{ // Plain floats.
		f32 := make([]byte, 12)
		f16 := make([]byte, 6)
		bf16 := make([]byte, 6)
		vals := []float32{1.5, -0.375, 65504}
		for i, v := range vals {
			binary.LittleEndian.PutUint32(f32[4*i:], math.Float32bits(v))
			binary.LittleEndian.PutUint16(f16[2*i:], F32ToF16(v))
			binary.LittleEndian.PutUint16(bf16[2*i:], uint16(math.Float32bits(v)>>16))
		}
		cases = append(cases,
			tc{"F32", F32, f32, vals},
			tc{"F16", F16, f16, vals},
			tc{"BF16", BF16, bf16, []float32{1.5, -0.375, 65280}})
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

func TestRowSizeErrors(t *testing.T) {
	cases := []struct {
		name string
		err  error
	}{
		{"dequantize short", DequantizeRow(Q8_0, make([]byte, 33), make([]float32, 32))},
		{"dequantize partial block", DequantizeRow(Q4_K, make([]byte, 144), make([]float32, 255))},
		{"quantize long", QuantizeRow(Q8_0, make([]float32, 32), make([]byte, 35))},
		{"activation unknown", QuantizeActivationRow(Type(99), make([]float32, 32), make([]byte, 34))},
	}
	for _, c := range cases {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
	if err := QuantizeRow(IQ2_XXS, make([]float32, 256), make([]byte, 66)); !errors.Is(err, ErrUnsupported) {
		t.Errorf("QuantizeRow(IQ2_XXS) = %v, want ErrUnsupported", err)
	}
	if err := DequantizeRow(IQ2_XXS, make([]byte, 66), make([]float32, 256)); !errors.Is(err, ErrUnsupported) {
		t.Errorf("DequantizeRow(IQ2_XXS) = %v, want ErrUnsupported", err)
	}
}

func randRow(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64()) * float32(math.Exp(r.NormFloat64()))
	}
	return x
}

// TestQuantizeRoundTrip checks |x - dequant(quant(x))| against each format's
// error bound, for both quantizer variants.
func TestQuantizeRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	types := []Type{F32, F16, BF16, Q4_0, Q8_0, Q8_K}
	quantizers := map[string]func(Type, []float32, []byte) error{
		"reference":  QuantizeRow,
		"activation": QuantizeActivationRow,
	}
	for name, quant := range quantizers {
		for _, typ := range types {
			t.Run(name+"/"+typ.String(), func(t *testing.T) {
				n := 512
				bs := typ.BlockSize()
				for trial := range 20 {
					x := randRow(r, n)
					if trial == 0 {
						clear(x[:max(bs, 32)]) // an all-zero block
					}
					nb, _ := typ.RowBytes(n)
					q := make([]byte, nb)
					if err := quant(typ, x, q); err != nil {
						t.Fatal(err)
					}
					y := make([]float32, n)
					if err := DequantizeRow(typ, q, y); err != nil {
						t.Fatal(err)
					}
					for b0 := 0; b0 < n; b0 += bs {
						var amax float64
						for _, v := range x[b0 : b0+bs] {
							amax = max(amax, math.Abs(float64(v)))
						}
						for i := b0; i < b0+bs; i++ {
							err := math.Abs(float64(x[i]) - float64(y[i]))
							var bound float64
							switch typ {
							case F32:
								bound = 0
							case F16:
								bound = math.Abs(float64(x[i]))*0x1p-11 + 0x1p-25
							case BF16:
								bound = math.Abs(float64(x[i])) * 0x1p-8
							case Q8_0: // half a step, plus the f16 rounding of d times 127
								bound = amax/127/2 + amax*0x1p-11*1.01
							case Q8_K:
								bound = amax / 127 / 2 * 1.0001
							case Q4_0: // the clamp at 15 costs up to one step
								bound = amax/8 + amax*0x1p-11*1.01
							}
							if err > bound {
								t.Fatalf("element %d: x=%g got %g, error %g > bound %g", i, x[i], y[i], err, bound)
							}
						}
					}
				}
			})
		}
	}
}

// TestQ80Variants pins the difference between quantize_row_q8_0_ref (roundf:
// half away from zero, id = 1/d) and the x86 activation quantizer
// (round half to even, id = 127/amax) on exact ties.
func TestQ80Variants(t *testing.T) {
	x := make([]float32, 32)
	x[0] = 127 // amax = 127: d = 1 and id = 1 in both variants
	ties := map[int]float32{1: 2.5, 2: -3.5, 3: 0.5, 4: -0.5, 5: 1.5, 6: 126.5, 7: 2.25, 8: -2.75}
	for i, v := range ties {
		x[i] = v
	}
	ref := make([]byte, 34)
	act := make([]byte, 34)
	if err := QuantizeRow(Q8_0, x, ref); err != nil {
		t.Fatal(err)
	}
	if err := QuantizeActivationRow(Q8_0, x, act); err != nil {
		t.Fatal(err)
	}
	q := func(b []byte, i int) int8 { return int8(b[2+i]) }
	wantRef := map[int]int8{0: 127, 1: 3, 2: -4, 3: 1, 4: -1, 5: 2, 6: 127, 7: 2, 8: -3}
	wantAct := map[int]int8{0: 127, 1: 2, 2: -4, 3: 0, 4: 0, 5: 2, 6: 126, 7: 2, 8: -3}
	for i := range wantRef {
		if q(ref, i) != wantRef[i] || q(act, i) != wantAct[i] {
			t.Errorf("x[%d]=%g: ref %d act %d, want ref %d act %d", i, x[i], q(ref, i), q(act, i), wantRef[i], wantAct[i])
		}
	}
	if F16ToF32(binary.LittleEndian.Uint16(ref)) != 1 || F16ToF32(binary.LittleEndian.Uint16(act)) != 1 {
		t.Errorf("d: ref %#04x act %#04x, want 1.0", binary.LittleEndian.Uint16(ref), binary.LittleEndian.Uint16(act))
	}

	// On random data the two agree on d and differ by at most one step,
	// and only where x*id is within a few ulps of a half-integer.
	r := rand.New(rand.NewPCG(7, 8))
	diffs := 0
	for range 2000 {
		x := randRow(r, 32)
		if err := QuantizeRow(Q8_0, x, ref); err != nil {
			t.Fatal(err)
		}
		if err := QuantizeActivationRow(Q8_0, x, act); err != nil {
			t.Fatal(err)
		}
		if ref[0] != act[0] || ref[1] != act[1] {
			t.Fatalf("d differs: ref %x act %x", ref[:2], act[:2])
		}
		var amax float32
		for _, v := range x {
			amax = max(amax, abs32(v))
		}
		for i, v := range x {
			if ref[2+i] == act[2+i] {
				continue
			}
			diffs++
			s := float64(v) * 127 / float64(amax)
			if d := math.Abs(s - math.Floor(s) - 0.5); d > 1e-5 || math.Abs(float64(q(ref, i))-float64(q(act, i))) != 1 {
				t.Errorf("x=%g (x*127/amax=%.9g): ref %d act %d differ away from a tie", v, s, q(ref, i), q(act, i))
			}
		}
	}
	t.Logf("%d of 64000 random quants differ between the variants", diffs)
}

func TestQ8K(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	x := randRow(r, 512)
	x[100] = -50 // the largest magnitude is negative, so iscale = -127/max > 0
	ref := make([]byte, 2*292)
	act := make([]byte, 2*292)
	if err := QuantizeRow(Q8_K, x, ref); err != nil {
		t.Fatal(err)
	}
	if err := QuantizeActivationRow(Q8_K, x, act); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(act, ref); diff != "" {
		t.Fatalf("Q8_K activation and reference quantizers differ:\n%s", diff)
	}
	for b := range 2 {
		blk := ref[292*b : 292*(b+1)]
		d := math.Float32frombits(binary.LittleEndian.Uint32(blk))
		var mx float32
		for _, v := range x[256*b : 256*(b+1)] {
			if abs32(v) > abs32(mx) {
				mx = v
			}
		}
		if want := 1 / (-127 / mx); d != want {
			t.Errorf("block %d: d = %g, want %g", b, d, want)
		}
		for g := range 16 {
			var sum int
			for _, q := range blk[4+16*g : 4+16*g+16] {
				sum += int(int8(q))
			}
			if got := int(int16(binary.LittleEndian.Uint16(blk[260+2*g:]))); got != sum {
				t.Errorf("block %d bsums[%d] = %d, want %d", b, g, got, sum)
			}
		}
		// The element of largest magnitude quantizes to -127 (iscale = -127/max).
		if b == 0 && int8(blk[4+100]) != -127 {
			t.Errorf("q[100] = %d, want -127", int8(blk[4+100]))
		}
	}
	// nearest_int rounds half to even: with max = -127, iscale = 1, so 2.5 -> 2 and 3.5 -> 4.
	y := make([]float32, 256)
	y[0], y[1], y[2], y[3] = -127, 2.5, 3.5, -0.5
	q := make([]byte, 292)
	if err := QuantizeRow(Q8_K, y, q); err != nil {
		t.Fatal(err)
	}
	got := []int8{int8(q[4]), int8(q[5]), int8(q[6]), int8(q[7])}
	if diff := cmp.Diff(got, []int8{-127, 2, 4, 0}); diff != "" {
		t.Errorf("Q8_K ties (-got +want):\n%s", diff)
	}
}

// TestQ40Ref pins quantize_row_q4_0_ref's rules: the signed value of largest
// magnitude maps to 0 (d = max/-8), and x/d+8.5 is truncated then clamped to 15.
func TestQ40Ref(t *testing.T) {
	x := make([]float32, 32)
	x[0] = -8    // max = -8, d = 1, id = 1
	x[1] = 8     // 16.5 -> 16 -> clamped to 15
	x[2] = 0.5   // 0.5+8.5 = 9
	x[3] = -0.49 // 8.01 -> 8
	x[16] = 3    // 11.5 -> 11, the high nibble of qs[0]
	b := make([]byte, 18)
	if err := QuantizeRow(Q4_0, x, b); err != nil {
		t.Fatal(err)
	}
	if d := F16ToF32(binary.LittleEndian.Uint16(b)); d != 1 {
		t.Errorf("d = %g, want 1", d)
	}
	// With d = 1: q = min(15, trunc(x + 8.5)); zeros give 8.
	want := []byte{0 | 11<<4, 15 | 8<<4, 9 | 8<<4, 8 | 8<<4}
	if diff := cmp.Diff(b[2:6], want); diff != "" {
		t.Errorf("qs (-got +want):\n%s", diff)
	}
}
