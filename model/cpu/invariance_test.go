package cpu_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
)

// seqRun is one sequence fed through a stage in chunks.
type seqRun struct {
	seq    uint64
	tokens []int32
	blocks []int32
	done   int // positions already run
}

// runChunks feeds each sequence's tokens in the chunk sizes given, together
// with the other sequences' next chunks in one batch per step, and returns
// the logits of every position of target (requested on each row).
func runInterleaved(t *testing.T, e *engine, target *seqRun, chunks []int, others []*seqRun, rng *rand.Rand) [][]float32 {
	t.Helper()
	var got [][]float32
	for _, c := range chunks {
		var rows []model.Row
		targetRow := -1
		// Others ride before and after the target in random order.
		order := rng.Perm(len(others) + 1)
		for _, i := range order {
			s := target
			n := c
			if i < len(others) {
				s = others[i]
				n = 1 + rng.IntN(5)
			}
			n = min(n, len(s.tokens)-s.done)
			if n == 0 {
				continue
			}
			s.blocks = e.blocksFor(s.blocks, s.done+n)
			if s == target {
				targetRow = len(rows)
			}
			rows = append(rows, model.Row{Seq: s.seq, Pos: s.done, First: s.done == 0, Tokens: s.tokens[s.done : s.done+n], Blocks: s.blocks, Logits: true})
			s.done += n
		}
		logits, err := e.stage.Forward(rows, nil)
		if err != nil {
			t.Fatal(err)
		}
		V := e.m.Vocab
		got = append(got, slices.Clone(logits[targetRow*V:(targetRow+1)*V]))
	}
	return got
}

func randTokens(rng *rand.Rand, n, vocab int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = 3 + rng.Int32N(int32(vocab-3))
	}
	return out
}

// TestLogitsBatchInvariant checks the numerics contract: a sequence's logits
// are bit-identical run alone, inside batches of random other sequences,
// under other prefill chunkings and with 1 or 2 threads.
func TestLogitsBatchInvariant(t *testing.T) {
	for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.BF16, ggml.Q8_0, ggml.Q4_0} {
		t.Run(typ.String(), func(t *testing.T) {
			spec := model.RandomSpec{Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Type: typ, Seed: 7}
			m := randomModel(t, spec)
			rng := rand.New(rand.NewPCG(1, 2))
			prompt := randTokens(rng, 40, m.Vocab)
			// Reference: alone, one token at a time, one thread.
			ones := make([]int, len(prompt))
			for i := range ones {
				ones[i] = 1
			}
			ref := runInterleaved(t, newEngine(t, m, 1, 64, ggml.F16), &seqRun{seq: 1, tokens: prompt}, ones, nil, rng)
			last := ref[len(ref)-1]
			// The portable kernels give the same bits as the SIMD ones.
			cpu.SetPortable(true)
			port := runInterleaved(t, newEngine(t, m, 2, 64, ggml.F16), &seqRun{seq: 1, tokens: prompt}, []int{7, 33}, nil, rng)
			cpu.SetPortable(false)
			if !slices.Equal(port[len(port)-1], last) {
				t.Fatalf("portable kernels: last logits differ from the SIMD kernels'")
			}
			// So do the AVX2 kernels of a CPU without AVX-512.
			cpu.SetAVX2Only(true)
			avx2 := runInterleaved(t, newEngine(t, m, 2, 64, ggml.F16), &seqRun{seq: 1, tokens: prompt}, []int{1, 19, 20}, nil, rng)
			cpu.SetAVX2Only(false)
			if !slices.Equal(avx2[len(avx2)-1], last) {
				t.Fatalf("AVX2 kernels: last logits differ from the AVX-512 kernels'")
			}
			for trial := 0; trial < 6; trial++ {
				threads := 1 + trial%2
				e := newEngine(t, m, threads, 256, ggml.F16)
				var chunks []int
				for n := len(prompt); n > 0; {
					c := min(n, 1+rng.IntN(12))
					chunks = append(chunks, c)
					n -= c
				}
				var others []*seqRun
				for i := 0; i < rng.IntN(16); i++ {
					others = append(others, &seqRun{seq: uint64(10 + i), tokens: randTokens(rng, 1+rng.IntN(40), m.Vocab)})
				}
				got := runInterleaved(t, e, &seqRun{seq: 1, tokens: prompt}, chunks, others, rng)
				if !slices.Equal(got[len(got)-1], last) {
					t.Fatalf("trial %d (threads %d, chunks %v, %d others): last logits differ from the sequence run alone", trial, threads, chunks, len(others))
				}
				// Every chunk boundary's logits equal the reference at that position.
				pos := 0
				for i, c := range chunks {
					pos += c
					if !slices.Equal(got[i], ref[pos-1]) {
						t.Fatalf("trial %d: logits at position %d differ", trial, pos-1)
					}
				}
			}
		})
	}
}

// TestPrefillKVEqualsDecodeKV checks that keys and values written by one
// prefill equal those written token by token.
func TestPrefillKVEqualsDecodeKV(t *testing.T) {
	m := randomModel(t, model.RandomSpec{Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Type: ggml.Q8_0, Seed: 3})
	rng := rand.New(rand.NewPCG(5, 6))
	prompt := randTokens(rng, 37, m.Vocab)
	a, b := newEngine(t, m, 2, 16, ggml.F16), newEngine(t, m, 1, 16, ggml.F16)
	sa, sb := &seqRun{seq: 1, tokens: prompt}, &seqRun{seq: 1, tokens: prompt}
	runInterleaved(t, a, sa, []int{len(prompt)}, nil, rng)
	ones := make([]int, len(prompt))
	for i := range ones {
		ones[i] = 1
	}
	runInterleaved(t, b, sb, ones, nil, rng)
	kd := m.KVDim()
	ka, va, kb, vb := make([]float32, kd), make([]float32, kd), make([]float32, kd), make([]float32, kd)
	for l := 0; l < m.Layers; l++ {
		for p := range prompt {
			a.kv.Read(l, sa.blocks, p, ka, va)
			b.kv.Read(l, sb.blocks, p, kb, vb)
			if !slices.Equal(ka, kb) || !slices.Equal(va, vb) {
				t.Fatalf("layer %d position %d: prefill K/V differ from decode K/V", l, p)
			}
		}
	}
}

// TestPipelineSplitIdentical runs the model as one stage and as two or three
// stages passing hidden states; logits must be bit-identical.
func TestPipelineSplitIdentical(t *testing.T) {
	f := openShared(t, "stories260K-Q8_0.gguf")
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int32{1, 403, 407, 261, 378}
	whole := newEngine(t, m, 2, 8, ggml.F16)
	want, err := whole.stage.Forward([]model.Row{{Seq: 1, First: true, Tokens: prompt, Blocks: []int32{0}, Logits: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want = slices.Clone(want)
	for _, cuts := range [][]int{{2}, {1, 4}, {3, 4}} {
		pool := newEngine(t, m, 2, 8, ggml.F16).pool
		bounds := append(append([]int{0}, cuts...), m.Layers)
		var hidden []float32
		for i := 0; i+1 < len(bounds); i++ {
			kv, err := newKV(m, bounds[i+1]-bounds[i])
			if err != nil {
				t.Fatal(err)
			}
			st, err := model.NewStage(m, bounds[i], bounds[i+1], newBackend(pool), kv)
			if err != nil {
				t.Fatal(err)
			}
			out, err := st.Forward([]model.Row{{Seq: 1, First: true, Tokens: prompt, Blocks: []int32{0}, Logits: true}}, hidden)
			if err != nil {
				t.Fatal(err)
			}
			hidden = slices.Clone(out)
		}
		if !slices.Equal(hidden, want) {
			t.Errorf("split at %v: logits differ from the single stage", cuts)
		}
	}
}
