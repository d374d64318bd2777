package model

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

// RandomSpec describes a random-weight model. Weights' values do not
// change speed, so such files stand in for real models in benchmarks.
type RandomSpec struct {
	// Arch is the architecture written: "llama" (the default when empty),
	// "qwen2" (NeoX RoPE, biases on the Q/K/V projections), "qwen3" (NeoX
	// RoPE, per-head Q and K norms, attention.key_length written) or "phi3"
	// (fused attn_qkv and gate-up ffn_up, NeoX RoPE over three quarters of
	// each head, longrope factors with original_context_length Context/2,
	// so that the long factors apply) or "gemma3" (per-head Q and K norms,
	// post-attention and post-FFN norms, GELU gate, every sixth layer global
	// and the others sliding over SlidingWindow positions, linear RoPE
	// scaling 8 on the global layers, final logit soft-capping) or "gemma2"
	// (gemma3 without the Q and K norms, every other layer sliding, the
	// first included, linear RoPE scaling 2 on every layer, attention and
	// final logit soft-capping, always Tied as Gemma 2's files are) or
	// "qwen3moe" (qwen3 with a mixture-of-experts FFN in every layer) or
	// "qwen2moe" (qwen2 with a mixture-of-experts FFN and a shared expert
	// of SharedFF in every layer, expert weights not renormalised) or
	// "mixtral" (a llama file with expert_count: Mixtral's layout). The
	// MoE architectures write Experts experts of ExpertFF, ExpertsUsed of
	// them chosen per token, and an F32 router (llama-quantize leaves
	// ffn_gate_inp unquantized; the same for qwen2moe's 1-D
	// ffn_gate_inp_shexp).
	Arch                                             string
	Layers, Embd, Heads, HeadsKV, FF, Vocab, Context int
	Type                                             ggml.Type // matrices; norms stay F32
	Tied                                             bool      // no output.weight
	Seed                                             uint64

	// Types overrides Type for single tensors, as llama-quantize's mixtures
	// do (Q4_K_M puts Q6_K on attn_v, ffn_down and output): a key is a
	// tensor's name ("output.weight", "blk.0.attn_v.weight") or a layer
	// tensor's name without its "blk.N." prefix ("ffn_down.weight": every
	// layer's), the full name first. A type whose blocks do not divide a
	// tensor's rows falls back as llama-quantize's does (ggml.Type.Fallback).
	Types map[string]ggml.Type

	// HeadDim is each head's width; 0 means Embd/Heads. A non-zero value is
	// written as attention.key_length and value_length.
	HeadDim int

	// SlidingWindow is gemma2's and gemma3's attention.sliding_window in
	// positions; 0 means 8, so that short tests cross it.
	SlidingWindow int
	// LogitSoftCap is gemma2's and gemma3's final_logit_softcapping; 0
	// means 30 (Gemma 2's cap), a negative value writes none.
	LogitSoftCap float32
	// AttnSoftCap is gemma2's attn_logit_softcapping; 0 means 50 (Gemma
	// 2's), a negative value writes none (and so 50 applies).
	AttnSoftCap float32

	// Experts, ExpertsUsed and ExpertFF shape the MoE architectures' FFNs;
	// 0 means 4 experts, 2 used, and FF (mixtral's experts are always FF
	// wide, as llama files have no expert_feed_forward_length).
	Experts, ExpertsUsed, ExpertFF int
	// RawExpertWeights writes expert_weights_norm = false: the chosen
	// experts' probabilities are not renormalised (qwen2moe's default).
	RawExpertWeights bool
	// SharedFF is qwen2moe's shared expert width; 0 means FF.
	SharedFF int

	// ChatTemplate, when set, is written as tokenizer.chat_template (tests
	// of templates' tool calls use it).
	ChatTemplate string
}

// moe returns the expert count, the experts used per token and each
// expert's width that s writes; 0s for a dense architecture.
func (s RandomSpec) moe() (n, used, ff int) {
	if s.Arch != "qwen3moe" && s.Arch != "qwen2moe" && s.Arch != "mixtral" {
		return 0, 0, 0
	}
	n, used, ff = cmp.Or(s.Experts, 4), cmp.Or(s.ExpertsUsed, 2), cmp.Or(s.ExpertFF, s.FF)
	if s.Arch == "mixtral" {
		ff = s.FF
	}
	return n, used, ff
}

// DemoSpec is the built-in demo model: small enough to generate in memory in
// well under a second and to run fast on one core, big enough to exercise
// grouped-query attention, several layers and multi-block KV.
func DemoSpec() RandomSpec {
	return RandomSpec{Layers: 4, Embd: 128, Heads: 8, HeadsKV: 4, FF: 384, Vocab: 1024, Context: 2048, Type: ggml.F32, Seed: 1}
}

// Validate names the first field out of range.
func (s RandomSpec) Validate() error {
	switch {
	case s.Layers <= 0 || s.Layers > MaxLayers:
		return fmt.Errorf("model: random spec Layers must be 1..%d, got %d", MaxLayers, s.Layers)
	case s.Heads <= 0 || s.HeadsKV <= 0 || s.Heads%s.HeadsKV != 0:
		return fmt.Errorf("model: random spec Heads %d must be a positive multiple of HeadsKV %d", s.Heads, s.HeadsKV)
	case s.HeadDim == 0 && (s.Embd <= 0 || s.Embd%s.Heads != 0 || (s.Embd/s.Heads)%2 != 0):
		return fmt.Errorf("model: random spec Embd %d must be a positive multiple of 2×Heads (%d)", s.Embd, 2*s.Heads)
	case s.HeadDim != 0 && (s.HeadDim < 0 || s.HeadDim%2 != 0 || s.HeadDim > MaxHeadDim || s.Embd <= 0):
		return fmt.Errorf("model: random spec HeadDim must be even and 2..%d with Embd > 0, got %d (Embd %d)", MaxHeadDim, s.HeadDim, s.Embd)
	case s.FF <= 0:
		return fmt.Errorf("model: random spec FF must be > 0, got %d", s.FF)
	case s.Vocab < 259+4 || s.Vocab > MaxVocab:
		return fmt.Errorf("model: random spec Vocab must be %d..%d, got %d", 263, MaxVocab, s.Vocab)
	case s.Context <= 0:
		return fmt.Errorf("model: random spec Context must be > 0, got %d", s.Context)
	}
	switch s.Arch {
	case "", "llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "qwen2moe", "qwen3moe", "mixtral":
	default:
		return fmt.Errorf("model: random spec Arch must be llama, qwen2, qwen3, phi3, gemma2, gemma3, qwen2moe, qwen3moe or mixtral, got %q", s.Arch)
	}
	if s.Experts < 0 || s.Experts > MaxExperts || s.ExpertsUsed < 0 || s.ExpertFF < 0 || s.ExpertFF > MaxExpertFF || s.SharedFF < 0 || s.SharedFF > MaxFF {
		return fmt.Errorf("model: random spec Experts %d, ExpertsUsed %d, ExpertFF %d, SharedFF %d out of range", s.Experts, s.ExpertsUsed, s.ExpertFF, s.SharedFF)
	}
	if n, used, _ := s.moe(); used > n {
		return fmt.Errorf("model: random spec ExpertsUsed %d exceeds Experts %d", used, n)
	}
	if s.SlidingWindow < 0 || s.SlidingWindow > MaxContext {
		return fmt.Errorf("model: random spec SlidingWindow must be 0..%d, got %d", MaxContext, s.SlidingWindow)
	}
	if !slices.Contains(MatrixTypes, s.Type) {
		return fmt.Errorf("model: random spec Type must be one of %s, got %v", matrixTypeNames(), s.Type)
	}
	for _, name := range slices.Sorted(maps.Keys(s.Types)) {
		if t := s.Types[name]; !slices.Contains(MatrixTypes, t) {
			return fmt.Errorf("model: random spec Types[%q] must be one of %s, got %v", name, matrixTypeNames(), t)
		}
	}
	return nil
}

// typeOf returns the type tensor name is written in: its entry in s.Types
// (by full name, then without the "blk.N." prefix), else t.
func (s RandomSpec) typeOf(name string, t ggml.Type) ggml.Type {
	if o, ok := s.Types[name]; ok {
		return o
	}
	if rest, ok := strings.CutPrefix(name, "blk."); ok {
		if _, suffix, ok := strings.Cut(rest, "."); ok {
			if o, ok := s.Types[suffix]; ok {
				return o
			}
		}
	}
	return t
}

// WriteRandom writes a GGUF file of a model of s.Arch with random weights and a
// synthetic SentencePiece vocabulary (control tokens, 256 byte tokens, then
// characters and character pairs). The same spec always gives the same bytes.
func WriteRandom(w io.Writer, s RandomSpec) error {
	if err := s.Validate(); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(s.Seed, 0x5eed))
	toks, scores, types := syntheticVocab(s.Vocab)
	arch := s.Arch
	if arch == "" || arch == "mixtral" {
		arch = "llama"
	}
	nExp, nUsed, expFF := s.moe()
	sharedFF := cmp.Or(s.SharedFF, s.FF)
	base := float32(10000)
	if arch == "qwen2" || arch == "qwen3" || arch == "gemma3" || arch == "qwen2moe" || arch == "qwen3moe" {
		base = 1e6
	}
	hd := s.Embd / s.Heads
	if s.HeadDim != 0 {
		hd = s.HeadDim
	}
	ropeDims := hd
	if arch == "phi3" { // partial rotary, as Phi-4-mini's 0.75
		if rd := hd * 3 / 4 &^ 1; rd >= 2 {
			ropeDims = rd
		}
	}
	kvs := []gguf.KV{
		{Key: "general.architecture", Value: arch},
		{Key: "general.name", Value: randomName(arch, s)},
		{Key: arch + ".context_length", Value: uint32(s.Context)},
		{Key: arch + ".embedding_length", Value: uint32(s.Embd)},
		{Key: arch + ".feed_forward_length", Value: uint32(s.FF)},
		{Key: arch + ".block_count", Value: uint32(s.Layers)},
		{Key: arch + ".attention.head_count", Value: uint32(s.Heads)},
		{Key: arch + ".attention.head_count_kv", Value: uint32(s.HeadsKV)},
		{Key: arch + ".rope.dimension_count", Value: uint32(ropeDims)},
		{Key: arch + ".attention.layer_norm_rms_epsilon", Value: float32(1e-5)},
		{Key: arch + ".rope.freq_base", Value: base},
		{Key: "tokenizer.ggml.model", Value: "llama"},
		{Key: "tokenizer.ggml.tokens", Value: toks},
		{Key: "tokenizer.ggml.scores", Value: scores},
		{Key: "tokenizer.ggml.token_type", Value: types},
		{Key: "tokenizer.ggml.unknown_token_id", Value: uint32(0)},
		{Key: "tokenizer.ggml.bos_token_id", Value: uint32(1)},
		{Key: "tokenizer.ggml.eos_token_id", Value: uint32(2)},
	}
	if s.ChatTemplate != "" {
		kvs = append(kvs, gguf.KV{Key: "tokenizer.chat_template", Value: s.ChatTemplate})
	}
	if nExp > 0 {
		kvs = append(kvs,
			gguf.KV{Key: arch + ".expert_count", Value: uint32(nExp)},
			gguf.KV{Key: arch + ".expert_used_count", Value: uint32(nUsed)})
		if arch == "qwen3moe" || arch == "qwen2moe" {
			kvs = append(kvs, gguf.KV{Key: arch + ".expert_feed_forward_length", Value: uint32(expFF)})
		}
		if arch == "qwen2moe" {
			kvs = append(kvs, gguf.KV{Key: arch + ".expert_shared_feed_forward_length", Value: uint32(sharedFF)})
		}
		if s.RawExpertWeights && arch != "qwen2moe" {
			kvs = append(kvs, gguf.KV{Key: arch + ".expert_weights_norm", Value: false})
		}
	}
	if s.HeadDim != 0 || arch == "qwen3" || arch == "gemma2" || arch == "gemma3" || arch == "qwen3moe" {
		kvs = append(kvs,
			gguf.KV{Key: arch + ".attention.key_length", Value: uint32(hd)},
			gguf.KV{Key: arch + ".attention.value_length", Value: uint32(hd)})
	}
	origCtx := max(s.Context/2, 1)
	if arch == "phi3" {
		kvs = append(kvs, gguf.KV{Key: arch + ".rope.scaling.original_context_length", Value: uint32(origCtx)})
		if scale := float64(s.Context) / float64(origCtx); scale > 1 {
			// as llama.cpp's converter computes it for longrope
			kvs = append(kvs, gguf.KV{Key: arch + ".rope.scaling.attn_factor", Value: float32(math.Sqrt(1 + math.Log(scale)/math.Log(float64(origCtx))))})
		}
	}
	gemma := arch == "gemma2" || arch == "gemma3"
	if gemma {
		window, softCap, attnCap := cmp.Or(s.SlidingWindow, 8), cmp.Or(s.LogitSoftCap, 30), cmp.Or(s.AttnSoftCap, 50)
		ropeScale := float32(8)
		if arch == "gemma2" {
			ropeScale = 2
		}
		kvs = setRandomKV(kvs, arch+".attention.layer_norm_rms_epsilon", float32(1e-6))
		kvs = append(kvs,
			gguf.KV{Key: arch + ".attention.sliding_window", Value: uint32(window)},
			gguf.KV{Key: arch + ".rope.scaling.type", Value: "linear"},
			gguf.KV{Key: arch + ".rope.scaling.factor", Value: ropeScale})
		if softCap > 0 {
			kvs = append(kvs, gguf.KV{Key: arch + ".final_logit_softcapping", Value: softCap})
		}
		if arch == "gemma2" && attnCap > 0 {
			kvs = append(kvs, gguf.KV{Key: arch + ".attn_logit_softcapping", Value: attnCap})
		}
	}
	var ts []gguf.WriteTensor
	add := func(name string, t ggml.Type, rows, cols int, scale float32) error {
		t = s.typeOf(name, t).Fallback(cols) // as llama-quantize does for rows that are not whole blocks
		vals := make([]float32, cols)
		rb, err := t.RowBytes(cols)
		if err != nil {
			return err
		}
		data := make([]byte, rows*rb)
		for r := 0; r < rows; r++ {
			for i := range vals {
				vals[i] = float32(rng.NormFloat64()) * scale
			}
			if err := ggml.QuantizeRow(t, vals, data[r*rb:(r+1)*rb]); err != nil {
				return err
			}
		}
		dims := []uint64{uint64(cols), uint64(rows)}
		if rows == 1 {
			dims = dims[:1]
		}
		ts = append(ts, gguf.WriteTensor{Name: name, Type: t, Dims: dims, Data: data})
		return nil
	}
	// add3 writes n matrices of rows×cols as one 3-D tensor, llama.cpp's
	// layout of the experts' FFNs.
	add3 := func(name string, t ggml.Type, n, rows, cols int, scale float32) error {
		if err := add(name, t, n*rows, cols, scale); err != nil {
			return err
		}
		ts[len(ts)-1].Dims = []uint64{uint64(cols), uint64(rows), uint64(n)}
		return nil
	}
	vec := func(name string, n int, mean, scale float32) error {
		data := make([]byte, 4*n)
		vals := make([]float32, n)
		for i := range vals {
			vals[i] = mean + scale*float32(rng.NormFloat64())
		}
		if err := ggml.QuantizeRow(ggml.F32, vals, data); err != nil {
			return err
		}
		ts = append(ts, gguf.WriteTensor{Name: name, Type: ggml.F32, Dims: []uint64{uint64(n)}, Data: data})
		return nil
	}
	norm := func(name string) error { return vec(name, s.Embd, 1, 0.1) }
	kvDim, qDim := s.HeadsKV*hd, s.Heads*hd
	in := 1 / float32(math.Sqrt(float64(s.Embd)))
	steps := []func() error{
		func() error { return add("token_embd.weight", s.Type, s.Vocab, s.Embd, 1) },
		func() error { return norm("output_norm.weight") },
	}
	if !s.Tied && arch != "gemma2" { // llama.cpp's gemma2 loader takes no output.weight
		steps = append(steps, func() error { return add("output.weight", s.Type, s.Vocab, s.Embd, in) })
	}
	if arch == "phi3" {
		factors := func(name string, spread float32) error {
			data := make([]byte, 4*ropeDims/2)
			vals := make([]float32, ropeDims/2)
			for i := range vals {
				vals[i] = 1 + spread*float32(rng.Float64())
			}
			if err := ggml.QuantizeRow(ggml.F32, vals, data); err != nil {
				return err
			}
			ts = append(ts, gguf.WriteTensor{Name: name, Type: ggml.F32, Dims: []uint64{uint64(len(vals))}, Data: data})
			return nil
		}
		steps = append(steps,
			func() error { return factors("rope_factors_long.weight", 8) },
			func() error { return factors("rope_factors_short.weight", 0.5) })
	}
	for l := 0; l < s.Layers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		attn := []func() error{
			func() error { return add(p+"attn_q.weight", s.Type, qDim, s.Embd, in) },
			func() error { return add(p+"attn_k.weight", s.Type, kvDim, s.Embd, in) },
			func() error { return add(p+"attn_v.weight", s.Type, kvDim, s.Embd, in) },
		}
		if arch == "phi3" {
			attn = []func() error{func() error { return add(p+"attn_qkv.weight", s.Type, qDim+2*kvDim, s.Embd, in) }}
		}
		ffn := []func() error{
			func() error { return add(p+"ffn_gate.weight", s.Type, s.FF, s.Embd, in) },
			func() error { return add(p+"ffn_up.weight", s.Type, s.FF, s.Embd, in) },
		}
		if arch == "phi3" {
			ffn = []func() error{func() error { return add(p+"ffn_up.weight", s.Type, 2*s.FF, s.Embd, in) }}
		}
		steps = append(steps, func() error { return norm(p + "attn_norm.weight") })
		steps = append(steps, attn...)
		steps = append(steps,
			func() error {
				return add(p+"attn_output.weight", s.Type, s.Embd, qDim, 1/float32(math.Sqrt(float64(qDim))))
			},
			func() error {
				switch arch {
				case "qwen2", "qwen2moe":
					if err := vec(p+"attn_q.bias", qDim, 0, 0.5); err != nil {
						return err
					}
					if err := vec(p+"attn_k.bias", kvDim, 0, 0.5); err != nil {
						return err
					}
					return vec(p+"attn_v.bias", kvDim, 0, 0.5)
				case "qwen3", "gemma3", "qwen3moe":
					if err := vec(p+"attn_q_norm.weight", hd, 1, 0.1); err != nil {
						return err
					}
					if err := vec(p+"attn_k_norm.weight", hd, 1, 0.1); err != nil {
						return err
					}
				}
				if gemma {
					return norm(p + "post_attention_norm.weight")
				}
				return nil
			},
			func() error { return norm(p + "ffn_norm.weight") },
		)
		if nExp > 0 {
			steps = append(steps,
				func() error { return add(p+"ffn_gate_inp.weight", ggml.F32, nExp, s.Embd, in) },
				func() error { return add3(p+"ffn_gate_exps.weight", s.Type, nExp, expFF, s.Embd, in) },
				func() error { return add3(p+"ffn_up_exps.weight", s.Type, nExp, expFF, s.Embd, in) },
				func() error {
					return add3(p+"ffn_down_exps.weight", s.Type, nExp, s.Embd, expFF, 1/float32(math.Sqrt(float64(expFF))))
				})
			if arch == "qwen2moe" {
				steps = append(steps,
					func() error { return vec(p+"ffn_gate_inp_shexp.weight", s.Embd, 0, in) },
					func() error { return add(p+"ffn_gate_shexp.weight", s.Type, sharedFF, s.Embd, in) },
					func() error { return add(p+"ffn_up_shexp.weight", s.Type, sharedFF, s.Embd, in) },
					func() error {
						return add(p+"ffn_down_shexp.weight", s.Type, s.Embd, sharedFF, 1/float32(math.Sqrt(float64(sharedFF))))
					})
			}
			continue
		}
		steps = append(steps, ffn...)
		steps = append(steps, func() error {
			return add(p+"ffn_down.weight", s.Type, s.Embd, s.FF, 1/float32(math.Sqrt(float64(s.FF))))
		})
		if gemma {
			steps = append(steps, func() error { return norm(p + "post_ffw_norm.weight") })
		}
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return gguf.Write(w, kvs, ts)
}

// randomName is a random file's general.name. A phi3 file's leaves the
// architecture out: llama.cpp takes a name containing "phi3" for Phi-3's
// own vocabulary and looks up its <|endoftext|>, which the synthetic one
// lacks.
func randomName(arch string, s RandomSpec) string {
	if arch == "phi3" {
		arch = "fused"
	}
	return fmt.Sprintf("strata-random-%s-%dL-%d", arch, s.Layers, s.Embd)
}

// setRandomKV returns kvs with key's value replaced by v.
func setRandomKV(kvs []gguf.KV, key string, v any) []gguf.KV {
	for i := range kvs {
		if kvs[i].Key == key {
			kvs[i].Value = v
		}
	}
	return kvs
}

// WriteRandomFile writes a random model to path: to a temporary file beside
// it first, renamed into place once complete, so that path never holds a
// partial model.
func WriteRandomFile(path string, s RandomSpec) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	w := bufio.NewWriterSize(tmp, 1<<20)
	if err := WriteRandom(w, s); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := w.Flush(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// RandomFile writes a random model to memory and parses it.
func RandomFile(s RandomSpec) (*gguf.File, error) {
	var buf bytes.Buffer
	if err := WriteRandom(&buf, s); err != nil {
		return nil, err
	}
	return gguf.Parse(buf.Bytes())
}

// syntheticVocab builds a SentencePiece vocabulary of n tokens: <unk>, <s>,
// </s>, the 256 byte tokens, then single characters with and without the
// word-start mark, then pairs, with scores falling so earlier pieces merge
// first.
func syntheticVocab(n int) ([]string, []float32, []int32) {
	const (
		normal  = 1
		unknown = 2
		control = 3
		byteTok = 6
	)
	toks := []string{"<unk>", "<s>", "</s>"}
	types := []int32{unknown, control, control}
	for b := 0; b < 256; b++ {
		toks = append(toks, fmt.Sprintf("<0x%02X>", b))
		types = append(types, byteTok)
	}
	seen := map[string]bool{}
	push := func(s string) {
		if len(toks) < n && !seen[s] {
			seen[s] = true
			toks = append(toks, s)
			types = append(types, normal)
		}
	}
	chars := []string{"▁"}
	for _, r := range "etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZ0123456789.,!?'\"-:;()" {
		chars = append(chars, string(r))
	}
	for _, c := range chars {
		push(c)
	}
	for _, c := range chars[1:] {
		push("▁" + c)
	}
	for _, a := range chars[1:] {
		for _, b := range chars[1:] {
			push(a + b)
			push("▁" + a + b)
		}
	}
	for i := 0; len(toks) < n; i++ {
		push(fmt.Sprintf("▁w%d", i))
	}
	scores := make([]float32, len(toks))
	for i := 259; i < len(toks); i++ {
		scores[i] = -float32(i - 259)
	}
	return toks, scores, types
}
