package transport

import (
	"math"
	"math/rand/v2"
	"testing"
)

// randomHidden returns n values in (-8, 8) with random mantissas, cheap
// enough for tens of megabytes under the race detector.
func randomHidden(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	h := make([]float32, n)
	for i := 0; i < n; i += 2 {
		x := r.Uint64()
		h[i] = float32(int32(x)) / (1 << 28)
		if i+1 < n {
			h[i+1] = float32(int32(x>>32)) / (1 << 28)
		}
	}
	return h
}

func TestHiddenRoundTrip(t *testing.T) {
	const perChunkF32 = MaxChunkBytes / 4
	for _, tc := range []struct {
		name       string
		n          int
		wantChunks int
	}{
		{"empty", 0, 0},
		{"one", 1, 1},
		{"one chunk exactly", perChunkF32, 1},
		{"one chunk and one value", perChunkF32 + 1, 2},
		{"10 MB", 10 << 20 / 4, 10},
		{"odd", 3*perChunkF32 + 12345, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := randomHidden(tc.n, uint64(tc.n))
			chunks, err := EncodeHidden(h, F32)
			if err != nil {
				t.Fatal(err)
			}
			if len(chunks) != tc.wantChunks {
				t.Fatalf("got %d chunks, want %d", len(chunks), tc.wantChunks)
			}
			for i, c := range chunks {
				if len(c) > MaxChunkBytes || len(c) == 0 || len(c)%4 != 0 {
					t.Fatalf("chunk %d has %d bytes", i, len(c))
				}
			}
			got, err := DecodeHidden(chunks, F32, tc.n)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(h) {
				t.Fatalf("got %d values, want %d", len(got), len(h))
			}
			for i := range h {
				if math.Float32bits(got[i]) != math.Float32bits(h[i]) {
					t.Fatalf("value %d: got %v, want %v (f32 must be bit-exact)", i, got[i], h[i])
				}
			}
		})
	}
}

func TestHiddenRoundTripBF16(t *testing.T) {
	n := 3*MaxChunkBytes/2 + 7 // values: several chunks of 2-byte elements
	h := randomHidden(n, 7)
	chunks, err := EncodeHidden(h, BF16)
	if err != nil {
		t.Fatal(err)
	}
	if want := (2*n + MaxChunkBytes - 1) / MaxChunkBytes; len(chunks) != want {
		t.Fatalf("got %d chunks, want %d", len(chunks), want)
	}
	got, err := DecodeHidden(chunks, BF16, n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range h {
		if want := BF16ToFloat(FloatToBF16(h[i])); math.Float32bits(got[i]) != math.Float32bits(want) {
			t.Fatalf("value %d: got %v, want %v", i, got[i], want)
		}
		if rel := math.Abs(float64(got[i]-h[i])) / math.Abs(float64(h[i])); h[i] != 0 && rel > 1.0/256 {
			t.Fatalf("value %d: %v -> %v, relative error %g", i, h[i], got[i], rel)
		}
	}
}

func TestFloatToBF16(t *testing.T) {
	for _, tc := range []struct {
		in   uint32 // float32 bits
		want uint16
	}{
		{0x3f800000, 0x3f80}, // 1
		{0xbf800000, 0xbf80}, // -1
		{0x00000000, 0x0000},
		{0x80000000, 0x8000},
		{0x3f808000, 0x3f80}, // tie, even stays
		{0x3f818000, 0x3f82}, // tie, odd rounds up to even
		{0x3f808001, 0x3f81}, // above the tie
		{0x3f807fff, 0x3f80}, // below the tie
		{0x7f800000, 0x7f80}, // +Inf
		{0xff800000, 0xff80}, // -Inf
		{0x7f7fffff, 0x7f80}, // max float rounds to Inf, as in ggml
		{0x7fc00000, 0x7fc0}, // quiet NaN
		{0x7f800001, 0x7fc0}, // signalling NaN becomes quiet, not Inf
		{0xff800001, 0xffc0},
	} {
		if got := FloatToBF16(math.Float32frombits(tc.in)); got != tc.want {
			t.Errorf("FloatToBF16(%#08x) = %#04x, want %#04x", tc.in, got, tc.want)
		}
	}
}

func TestDecodeHiddenErrors(t *testing.T) {
	good, err := EncodeHidden(randomHidden(10, 1), F32)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		chunks [][]byte
		typ    HiddenType
		n      int
	}{
		{"too few values", good, F32, 11},
		{"too many values", good, F32, 9},
		{"negative count", nil, F32, -1},
		{"split element", [][]byte{good[0][:3], good[0][3:]}, F32, 10},
		{"unknown type", good, HiddenType(9), 10},
		{"odd bf16", [][]byte{{1, 2, 3}}, BF16, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := DecodeHidden(tc.chunks, tc.typ, tc.n); err == nil {
				t.Fatalf("got %d values and no error", len(got))
			}
		})
	}
	if _, err := EncodeHidden([]float32{1}, HiddenType(-1)); err == nil {
		t.Fatal("EncodeHidden accepted an unknown type")
	}
}

func BenchmarkEncodeHiddenF32(b *testing.B) {
	h := randomHidden(1<<20, 1)
	b.SetBytes(int64(4 * len(h)))
	for b.Loop() {
		if _, err := EncodeHidden(h, F32); err != nil {
			b.Fatal(err)
		}
	}
}
