package cpu_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

// archSpecs are small random models of each architecture strata runs, with
// head widths other than Embd/Heads where the architecture allows them.
var archSpecs = []model.RandomSpec{
	{Arch: "llama", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Seed: 21},
	{Arch: "llama", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Seed: 22, HeadDim: 32, Tied: true},
	{Arch: "qwen2", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Seed: 23},
	{Arch: "qwen3", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Seed: 24, HeadDim: 32},
	{Arch: "qwen3", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 4, FF: 96, Vocab: 300, Context: 256, Seed: 25, Tied: true},
	{Arch: "phi3", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Seed: 26},
	{Arch: "phi3", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 4, FF: 96, Vocab: 300, Context: 256, Seed: 27, HeadDim: 24},
}

func specName(s model.RandomSpec) string {
	n := fmt.Sprintf("%s-hd%d-kv%d", s.Arch, s.HeadDim, s.HeadsKV)
	if s.Tied {
		n += "-tied"
	}
	return n
}

// gguf64 is a float64 forward pass written from the file alone, by tensor
// name and metadata key as llama.cpp's graphs for llama, qwen2, qwen3 and
// phi3 read them; it shares nothing with model.Load or model.Stage.
type gguf64 struct {
	f                         *gguf.File
	arch                      string
	layers, heads, headsKV    int
	embd, hd, ropeDims        int
	eps, base, mscale         float64
	factors                   []float64 // nil: none
	neox, qkNorm, fusedGateUp bool
}

func newGGUF64(t *testing.T, f *gguf.File) *gguf64 {
	t.Helper()
	arch, err := f.Architecture()
	if err != nil {
		t.Fatal(err)
	}
	u := func(k string) int {
		v, err := f.Uint(arch + "." + k)
		if err != nil {
			t.Fatal(err)
		}
		return int(v)
	}
	fl := func(k string, def float64) float64 {
		if !f.Has(arch + "." + k) {
			return def
		}
		v, err := f.Float(arch + "." + k)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	r := &gguf64{f: f, arch: arch, layers: u("block_count"), heads: u("attention.head_count"), headsKV: u("attention.head_count_kv"), embd: u("embedding_length")}
	r.hd = r.embd / r.heads
	if f.Has(arch + ".attention.key_length") {
		r.hd = u("attention.key_length")
	}
	r.ropeDims = u("rope.dimension_count")
	r.eps = fl("attention.layer_norm_rms_epsilon", 0)
	r.base = fl("rope.freq_base", 10000)
	r.mscale = fl("rope.scaling.attn_factor", 1)
	r.neox = arch != "llama"
	r.qkNorm = arch == "qwen3"
	r.fusedGateUp = arch == "phi3"
	if arch == "phi3" {
		if _, err := f.Tensor("rope_factors_long.weight"); err == nil {
			name := "rope_factors_short.weight"
			if u("context_length") > u("rope.scaling.original_context_length") {
				name = "rope_factors_long.weight"
			}
			r.factors = r.vec(name)
		}
	}
	return r
}

// mat returns tensor name as rows of float64 (a vector as one row); nil when
// the file has no such tensor.
func (r *gguf64) mat(name string) [][]float64 {
	t, err := r.f.Tensor(name)
	if err != nil {
		return nil
	}
	rows, cols := t.Rows(), t.RowLen()
	out := make([][]float64, rows)
	row := make([]float32, cols)
	for i := range out {
		if err := ggml.DequantizeRow(t.Type, t.Row(i), row); err != nil {
			panic(err)
		}
		out[i] = make([]float64, cols)
		for j, v := range row {
			out[i][j] = float64(v)
		}
	}
	return out
}

func (r *gguf64) vec(name string) []float64 {
	m := r.mat(name)
	if m == nil {
		return nil
	}
	return m[0]
}

func mv64(w [][]float64, x []float64) []float64 {
	out := make([]float64, len(w))
	for i, row := range w {
		for j, v := range row {
			out[i] += v * x[j]
		}
	}
	return out
}

func rms64(x, w []float64, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	s := 1 / math.Sqrt(ss/float64(len(x))+eps)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v * s * w[i]
	}
	return out
}

// rope64 rotates the first ropeDims of each of n heads at position pos.
func (r *gguf64) rope64(x []float64, n, pos int) {
	d := r.ropeDims
	for h := 0; h < n; h++ {
		v := x[h*r.hd : (h+1)*r.hd]
		for i := 0; i < d/2; i++ {
			th := float64(pos) * math.Pow(r.base, -2*float64(i)/float64(d))
			if r.factors != nil {
				th /= r.factors[i]
			}
			c, s := math.Cos(th)*r.mscale, math.Sin(th)*r.mscale
			a, b := 2*i, 2*i+1
			if r.neox {
				a, b = i, i+d/2
			}
			v[a], v[b] = v[a]*c-v[b]*s, v[a]*s+v[b]*c
		}
	}
}

// logits runs tokens (positions 0..n-1) and returns every position's logits.
func (r *gguf64) logits(tokens []int32) [][]float64 {
	embd := r.mat("token_embd.weight")
	x := make([][]float64, len(tokens))
	for p, tok := range tokens {
		x[p] = slices.Clone(embd[tok])
	}
	qd, kvd := r.heads*r.hd, r.headsKV*r.hd
	for l := 0; l < r.layers; l++ {
		name := func(s string) string { return fmt.Sprintf("blk.%d.%s", l, s) }
		var wq, wk, wv [][]float64
		if qkv := r.mat(name("attn_qkv.weight")); qkv != nil {
			wq, wk, wv = qkv[:qd], qkv[qd:qd+kvd], qkv[qd+kvd:]
		} else {
			wq, wk, wv = r.mat(name("attn_q.weight")), r.mat(name("attn_k.weight")), r.mat(name("attn_v.weight"))
		}
		var wg, wu [][]float64
		if r.fusedGateUp {
			gu := r.mat(name("ffn_up.weight"))
			wg, wu = gu[:len(gu)/2], gu[len(gu)/2:]
		} else {
			wg, wu = r.mat(name("ffn_gate.weight")), r.mat(name("ffn_up.weight"))
		}
		wo, wd := r.mat(name("attn_output.weight")), r.mat(name("ffn_down.weight"))
		an, fn := r.vec(name("attn_norm.weight")), r.vec(name("ffn_norm.weight"))
		qn, kn := r.vec(name("attn_q_norm.weight")), r.vec(name("attn_k_norm.weight"))
		qb, kb, vb := r.vec(name("attn_q.bias")), r.vec(name("attn_k.bias")), r.vec(name("attn_v.bias"))
		var qs, ks, vs [][]float64
		for p := range x {
			h := rms64(x[p], an, r.eps)
			q, k, v := mv64(wq, h), mv64(wk, h), mv64(wv, h)
			for i := range qb {
				q[i] += qb[i]
			}
			for i := range kb {
				k[i] += kb[i]
				v[i] += vb[i]
			}
			if r.qkNorm {
				for hh := 0; hh < r.heads; hh++ {
					copy(q[hh*r.hd:], rms64(q[hh*r.hd:(hh+1)*r.hd], qn, r.eps))
				}
				for hh := 0; hh < r.headsKV; hh++ {
					copy(k[hh*r.hd:], rms64(k[hh*r.hd:(hh+1)*r.hd], kn, r.eps))
				}
			}
			r.rope64(q, r.heads, p)
			r.rope64(k, r.headsKV, p)
			qs, ks, vs = append(qs, q), append(ks, k), append(vs, v)
		}
		group := r.heads / r.headsKV
		for p := range x {
			att := make([]float64, qd)
			for hh := 0; hh < r.heads; hh++ {
				kh := hh / group * r.hd
				sc := make([]float64, p+1)
				mx := math.Inf(-1)
				for j := range sc {
					for i := 0; i < r.hd; i++ {
						sc[j] += qs[p][hh*r.hd+i] * ks[j][kh+i]
					}
					sc[j] /= math.Sqrt(float64(r.hd))
					mx = max(mx, sc[j])
				}
				var sum float64
				for j := range sc {
					sc[j] = math.Exp(sc[j] - mx)
					sum += sc[j]
				}
				for j := range sc {
					for i := 0; i < r.hd; i++ {
						att[hh*r.hd+i] += sc[j] / sum * vs[j][kh+i]
					}
				}
			}
			o := mv64(wo, att)
			for i := range o {
				x[p][i] += o[i]
			}
			h := rms64(x[p], fn, r.eps)
			g, u := mv64(wg, h), mv64(wu, h)
			for i := range g {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			d := mv64(wd, g)
			for i := range d {
				x[p][i] += d[i]
			}
		}
	}
	out := r.mat("output.weight")
	if out == nil {
		out = embd
	}
	on := r.vec("output_norm.weight")
	logits := make([][]float64, len(x))
	for p := range x {
		logits[p] = mv64(out, rms64(x[p], on, r.eps))
	}
	return logits
}

// TestArchsAgainstFloat64 is the proof that each architecture is computed
// right: a random F32 model run token by token through model.NewStage (F32
// KV) gives every position's logits within 2e-5 relative error of a float64
// forward pass written from the file's tensors and keys alone.
func TestArchsAgainstFloat64(t *testing.T) {
	for _, spec := range archSpecs {
		t.Run(specName(spec), func(t *testing.T) {
			spec.Type = ggml.F32
			f, err := model.RandomFile(spec)
			if err != nil {
				t.Fatal(err)
			}
			m, err := model.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(spec.Seed, 1))
			prompt := randTokens(rng, 24, m.Vocab)
			want := newGGUF64(t, f).logits(prompt)
			ones := make([]int, len(prompt))
			for i := range ones {
				ones[i] = 1
			}
			got := runInterleaved(t, newEngine(t, m, 2, 8, ggml.F32), &seqRun{seq: 1, tokens: prompt}, ones, nil, rng)
			var worst float64
			for p := range want {
				var num, den float64
				for i, w := range want[p] {
					d := float64(got[p][i]) - w
					num += d * d
					den += w * w
				}
				worst = max(worst, math.Sqrt(num/den))
			}
			if worst > 2e-5 {
				t.Fatalf("worst relative error of a position's logits %.3g against float64", worst)
			}
			t.Logf("worst relative error %.3g", worst)
		})
	}
}

// TestArchsLogitsBatchInvariant extends the numerics contract to every
// architecture: a sequence's logits are bit-identical run alone one token at
// a time, in prompt chunks inside batches of other sequences, and with 1 or
// 2 threads.
func TestArchsLogitsBatchInvariant(t *testing.T) {
	for _, spec := range archSpecs {
		if spec.Arch != "qwen3" && spec.Arch != "phi3" {
			continue
		}
		for _, typ := range []ggml.Type{ggml.F32, ggml.Q8_0} {
			t.Run(specName(spec)+"/"+typ.String(), func(t *testing.T) {
				spec.Type = typ
				f, err := model.RandomFile(spec)
				if err != nil {
					t.Fatal(err)
				}
				m, err := model.Load(f)
				if err != nil {
					t.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(3, spec.Seed))
				prompt := randTokens(rng, 30, m.Vocab)
				ones := make([]int, len(prompt))
				for i := range ones {
					ones[i] = 1
				}
				ref := runInterleaved(t, newEngine(t, m, 1, 64, ggml.F16), &seqRun{seq: 1, tokens: prompt}, ones, nil, rng)
				for trial := 0; trial < 4; trial++ {
					threads := 1 + trial%2
					e := newEngine(t, m, threads, 256, ggml.F16)
					var chunks []int
					for n := len(prompt); n > 0; {
						c := min(n, 1+rng.IntN(12))
						chunks = append(chunks, c)
						n -= c
					}
					var others []*seqRun
					for i := 0; i < 1+rng.IntN(8); i++ {
						others = append(others, &seqRun{seq: uint64(10 + i), tokens: randTokens(rng, 1+rng.IntN(30), m.Vocab)})
					}
					got := runInterleaved(t, e, &seqRun{seq: 1, tokens: prompt}, chunks, others, rng)
					pos := 0
					for i, c := range chunks {
						pos += c
						if !slices.Equal(got[i], ref[pos-1]) {
							t.Fatalf("trial %d (threads %d, chunks %v, %d others): logits at position %d differ from the sequence run alone", trial, threads, chunks, len(others), pos-1)
						}
					}
				}
			})
		}
	}
}

// TestArchsPipelineSplitIdentical runs each architecture as one stage and as
// two or three stages passing hidden states: logits are bit-identical.
func TestArchsPipelineSplitIdentical(t *testing.T) {
	for _, spec := range archSpecs {
		if spec.Arch != "qwen3" && spec.Arch != "phi3" {
			continue
		}
		t.Run(specName(spec), func(t *testing.T) {
			spec.Layers, spec.Type = 3, ggml.Q8_0
			f, err := model.RandomFile(spec)
			if err != nil {
				t.Fatal(err)
			}
			m, err := model.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			prompt := randTokens(rand.New(rand.NewPCG(4, spec.Seed)), 11, m.Vocab)
			rows := []model.Row{{Seq: 1, First: true, Tokens: prompt, Blocks: []int32{0}, Logits: true}}
			whole := newEngine(t, m, 2, 8, ggml.F16)
			want, err := whole.stage.Forward(rows, nil)
			if err != nil {
				t.Fatal(err)
			}
			want = slices.Clone(want)
			for _, cuts := range [][]int{{1}, {2}, {1, 2}} {
				bounds := append(append([]int{0}, cuts...), m.Layers)
				var hidden []float32
				for i := 0; i+1 < len(bounds); i++ {
					kv, err := newKV(m, bounds[i+1]-bounds[i])
					if err != nil {
						t.Fatal(err)
					}
					st, err := model.NewStage(m, bounds[i], bounds[i+1], newBackend(whole.pool), kv)
					if err != nil {
						t.Fatal(err)
					}
					out, err := st.Forward(rows, hidden)
					if err != nil {
						t.Fatal(err)
					}
					hidden = slices.Clone(out)
				}
				if !slices.Equal(hidden, want) {
					t.Errorf("split at %v: logits differ from the single stage", cuts)
				}
			}
		})
	}
}
