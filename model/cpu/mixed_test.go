package cpu_test

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

// mixSpec is a random Llama whose rows llama-quantize splits two ways: Embd
// 256 holds whole super-blocks, FF 288 (ffn_down's rows) does not, so
// ffn_down takes the fallback type of whatever the mixture asks for.
func mixSpec(typ ggml.Type, tied bool, types map[string]ggml.Type) model.RandomSpec {
	return model.RandomSpec{Layers: 2, Embd: 256, Heads: 4, HeadsKV: 2, FF: 288, Vocab: 320, Context: 256,
		Type: typ, Tied: tied, Seed: 9, Types: types}
}

// mixes are files shaped as llama-quantize writes its mixtures (per-tensor
// types, fallbacks for rows that are not a multiple of 256, float or
// quantized heads, tied quantized embeddings), with the type each tensor
// must end up in.
var mixes = []struct {
	name string
	spec model.RandomSpec
	want map[string]ggml.Type
}{
	{"Q4_K_M", mixSpec(ggml.Q4_K, false, map[string]ggml.Type{"attn_v.weight": ggml.Q6_K, "blk.0.ffn_down.weight": ggml.Q6_K, "output.weight": ggml.Q6_K}),
		map[string]ggml.Type{"token_embd.weight": ggml.Q4_K, "blk.1.attn_q.weight": ggml.Q4_K, "blk.1.attn_v.weight": ggml.Q6_K,
			"blk.0.ffn_down.weight": ggml.Q8_0, "blk.1.ffn_down.weight": ggml.Q5_0, "output.weight": ggml.Q6_K}},
	{"Q4_K_M tied", mixSpec(ggml.Q4_K, true, map[string]ggml.Type{"attn_v.weight": ggml.Q6_K, "token_embd.weight": ggml.Q6_K}),
		map[string]ggml.Type{"token_embd.weight": ggml.Q6_K, "blk.0.ffn_gate.weight": ggml.Q4_K, "blk.0.ffn_down.weight": ggml.Q5_0}},
	{"Q5_K_M F16 head", mixSpec(ggml.Q5_K, false, map[string]ggml.Type{"attn_v.weight": ggml.Q6_K, "output.weight": ggml.F16}),
		map[string]ggml.Type{"token_embd.weight": ggml.Q5_K, "blk.0.attn_k.weight": ggml.Q5_K, "blk.0.ffn_down.weight": ggml.Q5_1, "output.weight": ggml.F16}},
	{"Q3_K_M F32 head", mixSpec(ggml.Q3_K, false, map[string]ggml.Type{"attn_v.weight": ggml.Q5_K, "attn_output.weight": ggml.Q4_K, "ffn_down.weight": ggml.Q4_K, "output.weight": ggml.F32}),
		map[string]ggml.Type{"token_embd.weight": ggml.Q3_K, "blk.0.attn_v.weight": ggml.Q5_K, "blk.1.ffn_up.weight": ggml.Q3_K, "blk.1.ffn_down.weight": ggml.Q5_0, "output.weight": ggml.F32}},
	{"Q2_K", mixSpec(ggml.Q2_K, false, map[string]ggml.Type{"attn_v.weight": ggml.Q3_K, "ffn_down.weight": ggml.Q3_K, "output.weight": ggml.Q6_K}),
		map[string]ggml.Type{"token_embd.weight": ggml.Q2_K, "blk.0.attn_v.weight": ggml.Q3_K, "blk.0.ffn_down.weight": ggml.IQ4_NL}},
	{"IQ4_XS", mixSpec(ggml.IQ4_XS, false, map[string]ggml.Type{"output.weight": ggml.Q6_K}),
		map[string]ggml.Type{"token_embd.weight": ggml.IQ4_XS, "blk.1.attn_q.weight": ggml.IQ4_XS, "blk.1.ffn_down.weight": ggml.IQ4_NL}},
	{"Q6_K", mixSpec(ggml.Q6_K, false, nil), map[string]ggml.Type{"blk.0.attn_q.weight": ggml.Q6_K, "blk.0.ffn_down.weight": ggml.Q8_0}},
	// Q8_0 and Q4_0, whose paths match llama.cpp's, calibrate the bounds.
	{"Q8_0", mixSpec(ggml.Q8_0, false, nil), nil},
	{"Q4_0", mixSpec(ggml.Q4_0, false, nil), nil},
	{"Q5_0", mixSpec(ggml.Q5_0, false, nil), map[string]ggml.Type{"blk.0.ffn_down.weight": ggml.Q5_0}},
	{"Q5_1", mixSpec(ggml.Q5_1, false, nil), map[string]ggml.Type{"blk.0.ffn_down.weight": ggml.Q5_1}},
	{"IQ4_NL", mixSpec(ggml.IQ4_NL, false, nil), map[string]ggml.Type{"blk.0.ffn_down.weight": ggml.IQ4_NL}},
}

// f32Twin returns f with every tensor dequantized to F32: the same model
// with exactly the weights of f, computed without quantized activations.
func f32Twin(t *testing.T, f *gguf.File) *gguf.File {
	t.Helper()
	var ts []gguf.WriteTensor
	for _, tn := range f.Tensors {
		vals := make([]float32, tn.Elements())
		if err := ggml.DequantizeRow(tn.Type, tn.Data, vals); err != nil {
			t.Fatalf("%s: %v", tn.Name, err)
		}
		data := make([]byte, 4*len(vals))
		if err := ggml.QuantizeRow(ggml.F32, vals, data); err != nil {
			t.Fatal(err)
		}
		ts = append(ts, gguf.WriteTensor{Name: tn.Name, Type: ggml.F32, Dims: tn.Dims, Data: data})
	}
	var buf bytes.Buffer
	if err := gguf.Write(&buf, f.KV, ts); err != nil {
		t.Fatal(err)
	}
	g, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestMixedFilesAgainstF32 loads each mixture as llama-quantize would write
// it and runs a prompt and greedy steps through model.NewStage on the CPU
// backend, beside the same model with every matrix dequantized to F32.
// The two differ only by the activations' 8-bit quantization (Q8_K, Q8_0,
// Q8_1), so their logits must stay close, in units of the F32 logits'
// spread (their standard deviation): at most 0.08 and on average 0.016
// over 6 steps of 320 logits. On this spec the Q8_0 and Q4_0 files, whose
// arithmetic matches llama.cpp's, differ from their twins by up to 0.044
// (mean 0.009), and the K-quants, whose Q8_K activations have one scale per
// 256 elements, by up to 0.056 (mean 0.012). The greedy token must be the
// F32 model's unless the F32 margin there is within twice the bound. The
// mixed model's logits are also the same bits whether the prompt runs token
// by token on one worker or in chunks beside other sequences on two.
func TestMixedFilesAgainstF32(t *testing.T) {
	const maxDiff, meanDiff = 0.08, 0.016
	for _, mix := range mixes {
		t.Run(mix.name, func(t *testing.T) {
			f, err := model.RandomFile(mix.spec)
			if err != nil {
				t.Fatal(err)
			}
			for name, typ := range mix.want {
				tn, err := f.Tensor(name)
				if err != nil {
					t.Fatal(err)
				}
				if tn.Type != typ {
					t.Fatalf("%s is %s, want %s", name, tn.Type, typ)
				}
			}
			m, err := model.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := model.Load(f32Twin(t, f))
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(3, 4))
			prompt := randTokens(rng, 12, m.Vocab)
			eq, ef := newEngine(t, m, 2, 16, ggml.F16), newEngine(t, ref, 2, 16, ggml.F16)
			var bq, bf []int32
			rows := func(blocks []int32, pos int, toks []int32) []model.Row {
				return []model.Row{{Seq: 1, Pos: pos, First: pos == 0, Tokens: toks, Blocks: blocks, Logits: true}}
			}
			toks, pos := prompt, 0
			var worst, sum float64
			var count int
			for step := range 6 {
				bq, bf = eq.blocksFor(bq, pos+len(toks)), ef.blocksFor(bf, pos+len(toks))
				lq, err := eq.stage.Forward(rows(bq, pos, toks), nil)
				if err != nil {
					t.Fatal(err)
				}
				lf, err := ef.stage.Forward(rows(bf, pos, toks), nil)
				if err != nil {
					t.Fatal(err)
				}
				var mean, sq float64
				for _, v := range lf {
					mean += float64(v)
				}
				mean /= float64(len(lf))
				for _, v := range lf {
					sq += (float64(v) - mean) * (float64(v) - mean)
				}
				spread := math.Sqrt(sq / float64(len(lf)))
				for i := range lf {
					d := math.Abs(float64(lq[i])-float64(lf[i])) / spread
					worst = max(worst, d)
					sum += d
					count++
				}
				gq, gf := argmax(lq), argmax(lf)
				if gq != gf {
					if margin := float64(lf[gf]-lf[gq]) / spread; margin > 2*maxDiff {
						t.Errorf("step %d: greedy token %d, F32 model's %d with margin %.3g spreads", step, gq, gf, margin)
					}
				}
				pos += len(toks)
				toks = []int32{gf}
			}
			t.Logf("|logit difference| / spread: max %.4f, mean %.5f", worst, sum/float64(count))
			if worst > maxDiff || sum/float64(count) > meanDiff {
				t.Errorf("logits differ from the F32 model's by up to %.4f spreads (mean %.5f); bound %g (mean %g)", worst, sum/float64(count), maxDiff, meanDiff)
			}

			// Batch and thread invariance of the mixed model.
			ones := make([]int, len(prompt))
			for i := range ones {
				ones[i] = 1
			}
			alone := runInterleaved(t, newEngine(t, m, 1, 64, ggml.F16), &seqRun{seq: 1, tokens: prompt}, ones, nil, rng)
			others := []*seqRun{{seq: 7, tokens: randTokens(rng, 9, m.Vocab)}, {seq: 8, tokens: randTokens(rng, 20, m.Vocab)}}
			mixed := runInterleaved(t, newEngine(t, m, 2, 64, ggml.F16), &seqRun{seq: 1, tokens: prompt}, []int{5, 7}, others, rng)
			if !slices.Equal(mixed[0], alone[4]) || !slices.Equal(mixed[1], alone[11]) {
				t.Errorf("logits differ between one token at a time on one worker and chunks beside other sequences on two")
			}
		})
	}
}
