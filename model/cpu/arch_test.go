package cpu_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
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
	// Five sliding layers over 8 positions, then a global one, then a
	// sliding one: prompts of 24 and more positions cross the window.
	{Arch: "gemma3", Layers: 7, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Seed: 28, HeadDim: 32},
	{Arch: "gemma3", Layers: 7, Embd: 64, Heads: 4, HeadsKV: 1, FF: 96, Vocab: 300, Context: 256, Seed: 29, Tied: true, SlidingWindow: 13, LogitSoftCap: 5},
	// gemma2: every other layer sliding over 8 (or 13) positions, attention
	// scores capped at 1.5 (or llama.cpp's default 50, the key absent),
	// linear RoPE scaling 2 on every layer.
	{Arch: "gemma2", Layers: 7, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Seed: 35, HeadDim: 32, AttnSoftCap: 1.5},
	{Arch: "gemma2", Layers: 7, Embd: 64, Heads: 4, HeadsKV: 1, FF: 96, Vocab: 300, Context: 256, Seed: 36, Tied: true, SlidingWindow: 13, LogitSoftCap: 5, AttnSoftCap: -1},
	// Mixtures of experts: 4 experts, 2 per token (qwen3moe's 48 wide);
	// 6 experts, 3 per token, without renormalised weights.
	{Arch: "qwen3moe", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Seed: 30, HeadDim: 32, ExpertFF: 48},
	{Arch: "mixtral", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Seed: 31},
	{Arch: "qwen3moe", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 4, FF: 96, Vocab: 300, Context: 256, Seed: 32, Tied: true, Experts: 6, ExpertsUsed: 3, ExpertFF: 64, RawExpertWeights: true},
	// qwen2moe: Q/K/V biases, raw expert weights, a shared expert (80 and
	// FF wide) gated by a sigmoid.
	{Arch: "qwen2moe", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Seed: 33, ExpertFF: 48, SharedFF: 80},
	{Arch: "qwen2moe", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 4, FF: 96, Vocab: 300, Context: 256, Seed: 34, Tied: true, Experts: 6, ExpertsUsed: 3, ExpertFF: 32},
}

// moeSpec reports whether s is a mixture-of-experts architecture.
func moeSpec(s model.RandomSpec) bool {
	return s.Arch == "qwen2moe" || s.Arch == "qwen3moe" || s.Arch == "mixtral"
}

func specName(s model.RandomSpec) string {
	n := fmt.Sprintf("%s-hd%d-kv%d", s.Arch, s.HeadDim, s.HeadsKV)
	if moeSpec(s) {
		n += fmt.Sprintf("-e%d", s.Experts)
	}
	if s.Tied {
		n += "-tied"
	}
	return n
}

// gguf64 is a float64 forward pass written from the file alone, by tensor
// name and metadata key as llama.cpp's graphs for llama, qwen2, qwen3, phi3,
// gemma2, gemma3 and the MoE architectures read them; it shares nothing with model.Load or model.Stage.
type gguf64 struct {
	f                         *gguf.File
	arch                      string
	layers, heads, headsKV    int
	embd, hd, ropeDims        int
	eps, base, mscale, scale  float64   // scale: linear RoPE scaling (1: none)
	factors                   []float64 // nil: none
	neox, qkNorm, fusedGateUp bool

	// Mixture of experts: experts per layer (0: dense), chosen per token,
	// whether their weights are renormalised.
	experts, used int
	normW         bool

	// gemma2 and gemma3: the window of the sliding layers (layer l slides
	// when l%period < period-1; 0: none), their RoPE base and scale, the
	// logit cap and the attention score cap (0: none).
	gemma                    bool
	window, period           int
	baseSWA, scaleSWA, cap64 float64
	attnCap                  float64
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
	r.scale = 1
	if f.Has(arch + ".rope.scaling.type") {
		if typ, _ := f.String(arch + ".rope.scaling.type"); typ == "linear" {
			r.scale = fl("rope.scaling.factor", 1)
		}
	}
	r.neox = arch != "llama"
	r.qkNorm = arch == "qwen3" || arch == "gemma3" || arch == "qwen3moe"
	if f.Has(arch + ".expert_count") {
		r.experts, r.used, r.normW = u("expert_count"), u("expert_used_count"), arch != "qwen2moe"
		if f.Has(arch + ".expert_weights_norm") {
			if r.normW, err = f.Bool(arch + ".expert_weights_norm"); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.fusedGateUp = arch == "phi3"
	if arch == "gemma3" {
		r.gemma, r.period = true, 6
		if f.Has(arch + ".attention.sliding_window") {
			r.window = u("attention.sliding_window")
		}
		r.baseSWA, r.scaleSWA = fl("rope.freq_base_swa", 10000), 1
		r.cap64 = fl("final_logit_softcapping", 0)
	}
	if arch == "gemma2" {
		r.gemma, r.period, r.window = true, 2, 4096
		if f.Has(arch + ".attention.sliding_window") {
			r.window = u("attention.sliding_window")
		}
		r.baseSWA, r.scaleSWA = fl("rope.freq_base_swa", r.base), r.scale
		r.cap64, r.attnCap = fl("final_logit_softcapping", 30), fl("attn_logit_softcapping", 50)
	}
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

// rope64 rotates the first ropeDims of each of n heads at position pos with
// the given base and linear scaling.
func (r *gguf64) rope64(x []float64, n, pos int, base, scale float64) {
	d := r.ropeDims
	for h := 0; h < n; h++ {
		v := x[h*r.hd : (h+1)*r.hd]
		for i := 0; i < d/2; i++ {
			th := float64(pos) / scale * math.Pow(base, -2*float64(i)/float64(d))
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

// gelu64 is GELU (tanh approximation) as ggml's CPU computes it: its input
// and its output rounded to half precision, the rest exact.
func gelu64(x float64) float64 {
	if x <= -10 {
		return 0
	}
	if x >= 10 {
		return x
	}
	xh := float64(ggml.F16ToF32(ggml.F32ToF16(float32(x))))
	y := 0.5 * xh * (1 + math.Tanh(math.Sqrt(2/math.Pi)*xh*(1+0.044715*xh*xh)))
	return float64(ggml.F16ToF32(ggml.F32ToF16(float32(y))))
}

// moe64 is layer l's mixture-of-experts FFN of h: the softmax of the
// router's logits, the used most probable experts (ties to the lower ID),
// their probabilities divided by their sum when normW, and the weighted sum
// of those experts' SwiGLU FFNs, each expert read from its slice of the
// 3-D ffn_*_exps tensors; plus, where the layer has ffn_*_shexp tensors,
// the shared expert's SwiGLU FFN times the sigmoid of ffn_gate_inp_shexp·h.
func (r *gguf64) moe64(l int, h []float64) []float64 {
	name := func(s string) string { return fmt.Sprintf("blk.%d.%s", l, s) }
	logits := mv64(r.mat(name("ffn_gate_inp.weight")), h)
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = max(mx, v)
	}
	var sum float64
	p := make([]float64, len(logits))
	for i, v := range logits {
		p[i] = math.Exp(v - mx)
		sum += p[i]
	}
	for i := range p {
		p[i] /= sum
	}
	order := make([]int, len(p))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case p[a] > p[b]:
			return -1
		case p[a] < p[b]:
			return 1
		}
		return 0
	})
	chosen := order[:r.used]
	var wsum float64
	for _, e := range chosen {
		wsum += p[e]
	}
	gate, up, down := r.mat(name("ffn_gate_exps.weight")), r.mat(name("ffn_up_exps.weight")), r.mat(name("ffn_down_exps.weight"))
	ff := len(gate) / r.experts
	out := make([]float64, len(h))
	for _, e := range chosen {
		w := p[e]
		if r.normW {
			w /= wsum
		}
		g, u := mv64(gate[e*ff:(e+1)*ff], h), mv64(up[e*ff:(e+1)*ff], h)
		for i := range g {
			g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
		}
		d := mv64(down[e*r.embd:(e+1)*r.embd], g)
		for i := range out {
			out[i] += w * d[i]
		}
	}
	if gi := r.vec(name("ffn_gate_inp_shexp.weight")); gi != nil {
		var x float64
		for i, v := range gi {
			x += v * h[i]
		}
		w := 1 / (1 + math.Exp(-x))
		g, u := mv64(r.mat(name("ffn_gate_shexp.weight")), h), mv64(r.mat(name("ffn_up_shexp.weight")), h)
		for i := range g {
			g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
		}
		for i, v := range mv64(r.mat(name("ffn_down_shexp.weight")), g) {
			out[i] += w * v
		}
	}
	return out
}

// logits runs tokens (positions 0..n-1) and returns every position's logits.
func (r *gguf64) logits(tokens []int32) [][]float64 {
	embd := r.mat("token_embd.weight")
	x := make([][]float64, len(tokens))
	for p, tok := range tokens {
		x[p] = slices.Clone(embd[tok])
		if r.gemma {
			for i := range x[p] {
				x[p][i] *= math.Sqrt(float64(r.embd))
			}
		}
	}
	qd, kvd := r.heads*r.hd, r.headsKV*r.hd
	for l := 0; l < r.layers; l++ {
		base, scale, window := r.base, r.scale, 0
		if r.window > 0 && l%r.period < r.period-1 {
			base, scale, window = r.baseSWA, r.scaleSWA, r.window
		}
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
		pan, pfn := r.vec(name("post_attention_norm.weight")), r.vec(name("post_ffw_norm.weight"))
		if r.gemma && (pan == nil || pfn == nil) {
			panic("gemma file without post norms")
		}
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
			r.rope64(q, r.heads, p, base, scale)
			r.rope64(k, r.headsKV, p, base, scale)
			qs, ks, vs = append(qs, q), append(ks, k), append(vs, v)
		}
		group := r.heads / r.headsKV
		for p := range x {
			att := make([]float64, qd)
			for hh := 0; hh < r.heads; hh++ {
				kh := hh / group * r.hd
				sc := make([]float64, p+1)
				mx := math.Inf(-1)
				first := 0 // a sliding layer reads the last window positions
				if window > 0 {
					first = max(0, p-window+1)
				}
				for j := first; j < len(sc); j++ {
					for i := 0; i < r.hd; i++ {
						sc[j] += qs[p][hh*r.hd+i] * ks[j][kh+i]
					}
					sc[j] /= math.Sqrt(float64(r.hd))
					if r.attnCap > 0 {
						sc[j] = r.attnCap * math.Tanh(sc[j]/r.attnCap)
					}
					mx = max(mx, sc[j])
				}
				var sum float64
				for j := first; j < len(sc); j++ {
					sc[j] = math.Exp(sc[j] - mx)
					sum += sc[j]
				}
				for j := first; j < len(sc); j++ {
					for i := 0; i < r.hd; i++ {
						att[hh*r.hd+i] += sc[j] / sum * vs[j][kh+i]
					}
				}
			}
			o := mv64(wo, att)
			if pan != nil {
				o = rms64(o, pan, r.eps)
			}
			for i := range o {
				x[p][i] += o[i]
			}
			h := rms64(x[p], fn, r.eps)
			var d []float64
			if r.experts > 0 {
				d = r.moe64(l, h)
			} else {
				g, u := mv64(wg, h), mv64(wu, h)
				for i := range g {
					if r.gemma {
						g[i] = gelu64(g[i]) * u[i]
					} else {
						g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
					}
				}
				d = mv64(wd, g)
			}
			if pfn != nil {
				d = rms64(d, pfn, r.eps)
			}
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
		if r.cap64 > 0 {
			for i, v := range logits[p] {
				logits[p][i] = r.cap64 * math.Tanh(v/r.cap64)
			}
		}
	}
	return logits
}

// TestArchsAgainstFloat64 is the proof that each architecture is computed
// right: a random F32 model run token by token through model.NewStage (F32
// KV) gives every position's logits within 2e-5 relative error of a float64
// forward pass written from the file's tensors and keys alone.
//
// gemma2's and gemma3's bound is 8e-5: their GELU rounds the gate to half precision, and a
// gate within float32 rounding of a half-precision midpoint rounds one way
// here and the other in the float64 pass (up to 5.6e-5 seen over 20 seeds).
// A GELU without ggml's half-precision rounding lands 1.1e-4 to 1.6e-4 away
// and fails.
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
			bound := 2e-5
			if spec.Arch == "gemma3" || spec.Arch == "gemma2" {
				bound = 8e-5
			}
			if worst > bound {
				t.Fatalf("worst relative error of a position's logits %.3g against float64", worst)
			}
			t.Logf("worst relative error %.3g", worst)
		})
	}
}

// TestArchsLogitsBatchInvariant extends the numerics contract to every
// architecture: a sequence's logits are bit-identical run alone one token at
// a time, in prompt chunks inside batches of other sequences, and with 1 or
// 2 threads, and with the portable kernels. gemma2's and gemma3's
// 30-position prompts run past their sliding windows, so their sliding
// layers start attention at keys that move with each position.
func TestArchsLogitsBatchInvariant(t *testing.T) {
	for _, spec := range archSpecs {
		if spec.Arch != "qwen3" && spec.Arch != "phi3" && spec.Arch != "gemma2" && spec.Arch != "gemma3" && !moeSpec(spec) {
			continue
		}
		for _, typ := range []ggml.Type{ggml.F32, ggml.Q8_0} {
			t.Run(specName(spec)+"/"+typ.String(), func(t *testing.T) {
				spec.Type = typ
				m := randomModel(t, spec)
				rng := rand.New(rand.NewPCG(3, spec.Seed))
				prompt := randTokens(rng, 30, m.Vocab)
				ones := make([]int, len(prompt))
				for i := range ones {
					ones[i] = 1
				}
				ref := runInterleaved(t, newEngine(t, m, 1, 64, ggml.F16), &seqRun{seq: 1, tokens: prompt}, ones, nil, rng)
				defer cpu.SetPortable(false)
				for trial := 0; trial < 5; trial++ {
					threads := 1 + trial%2
					// The last trial runs the portable kernels: the same
					// bits as the SIMD ones (gemma2's soft-capped attention
					// included).
					cpu.SetPortable(trial == 4)
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
// gemma2 and gemma3 keep their seven layers, so that the cuts fall between
// sliding layers and on both sides of global ones (gemma3's layer 5,
// gemma2's odd layers), and their 20-position prompts cross the window.
func TestArchsPipelineSplitIdentical(t *testing.T) {
	for _, spec := range archSpecs {
		if spec.Arch != "qwen3" && spec.Arch != "phi3" && spec.Arch != "gemma2" && spec.Arch != "gemma3" && !moeSpec(spec) {
			continue
		}
		t.Run(specName(spec), func(t *testing.T) {
			spec.Type = ggml.Q8_0
			cutSets := [][]int{{5}, {6}, {2, 5}, {1, 3, 6}}
			if spec.Arch != "gemma3" && spec.Arch != "gemma2" {
				spec.Layers = 3
				cutSets = [][]int{{1}, {2}, {1, 2}}
			}
			m := randomModel(t, spec)
			prompt := randTokens(rand.New(rand.NewPCG(4, spec.Seed)), 20, m.Vocab)
			rows := []model.Row{{Seq: 1, First: true, Tokens: prompt, Blocks: []int32{0, 1}, Logits: true}}
			whole := newEngine(t, m, 2, 8, ggml.F16)
			want, err := whole.stage.Forward(rows, nil)
			if err != nil {
				t.Fatal(err)
			}
			want = slices.Clone(want)
			for _, cuts := range cutSets {
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
