package kv

import "testing"

// BenchmarkAllocateExtendEnd measures one sequence's life in a busy pool: a
// 100-token allocation, 4 extensions of 16 positions and the end.
func BenchmarkAllocateExtendEnd(b *testing.B) {
	for _, caching := range []bool{false, true} {
		name := "nocache"
		if caching {
			name = "prefixcache"
		}
		b.Run(name, func(b *testing.B) {
			a, err := New(Config{Blocks: 4096, BlockSize: 16, PrefixCaching: caching})
			if err != nil {
				b.Fatal(err)
			}
			// Other live sequences, so the maps are not trivially small.
			for s := range 200 {
				if _, err := a.Allocate(SeqID(1_000_000+s), nil, 100, 0); err != nil {
					b.Fatal(err)
				}
			}
			prompt := make([]int32, 100)
			for i := range prompt {
				prompt[i] = int32(i * 7)
			}
			b.ReportAllocs()
			seq := SeqID(0)
			for b.Loop() {
				seq++
				if _, err := a.Allocate(seq, prompt[:99], 100, 0); err != nil {
					b.Fatal(err)
				}
				for p := 116; p <= 164; p += 16 {
					if err := a.Extend(seq, p); err != nil {
						b.Fatal(err)
					}
				}
				a.Commit(seq, prompt)
				a.End(seq)
			}
		})
	}
}

// BenchmarkOp measures the single operations in a steady pool.
func BenchmarkOp(b *testing.B) {
	a, err := New(Config{Blocks: 4096, BlockSize: 16})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("allocate+end", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := a.Allocate(1, nil, 64, 0); err != nil {
				b.Fatal(err)
			}
			a.End(1)
		}
	})
	b.Run("extend", func(b *testing.B) {
		if _, err := a.Allocate(2, nil, 16, 0); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		p := 16
		for b.Loop() {
			p += 16
			if a.Extend(2, p) != nil { // pool full: start over
				a.End(2)
				if _, err := a.Allocate(2, nil, 16, 0); err != nil {
					b.Fatal(err)
				}
				p = 16
			}
		}
		a.End(2)
	})
	b.Run("check-invariants", func(b *testing.B) {
		for s := range 256 {
			if _, err := a.Allocate(SeqID(10+s), nil, 200, 0); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		for b.Loop() {
			if err := a.CheckInvariants(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
