package cpu

import (
	"math/rand/v2"
	"testing"

	"github.com/strata-llm/strata/model/ggml"
)

// BenchmarkExpandRow measures the expansion of one 2048-element Q8_0
// activation row for the Q4_0 and the Q8_0 panels.
func BenchmarkExpandRow(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	const n = 2048
	q := make([]byte, n/32*q80Bytes)
	ConvertActivation(ggml.Q4_0, randVec(r, n), q)
	for _, typ := range []ggml.Type{ggml.Q4_0, ggml.Q8_0} {
		dst := make([]byte, n/32*expandedBlockBytes(typ))
		b.Run(typ.String(), func(b *testing.B) {
			for b.Loop() {
				expandRow(typ, n/32, q, dst)
			}
		})
	}
}

// TestSumInt8 checks the SWAR byte sums against a plain loop, on random
// words and on every byte value in every position.
func TestSumInt8(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	check := func(v uint64) {
		var want8, want4 int32
		for i := range 8 {
			b := int32(int8(v >> (8 * i)))
			want8 += b
			if i < 4 {
				want4 += b
			}
		}
		if got := sumInt8x8(v); got != want8 {
			t.Fatalf("sumInt8x8(%016x) = %d, want %d", v, got, want8)
		}
		if got := sumInt8x4(uint32(v)); got != want4 {
			t.Fatalf("sumInt8x4(%08x) = %d, want %d", uint32(v), got, want4)
		}
	}
	for range 100000 {
		check(r.Uint64())
	}
	for b := range 256 {
		for i := range 8 {
			check(uint64(b) << (8 * i))
			check(^uint64(0)&^(0xff<<(8*i)) | uint64(b)<<(8*i))
		}
	}
	check(0x8080808080808080)
	check(0x7f7f7f7f7f7f7f7f)
}
