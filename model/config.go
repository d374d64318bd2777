package model

import (
	"errors"
	"fmt"

	"github.com/strata-llm/strata/model/gguf"
)

// ErrUnsupportedArch is returned for a general.architecture strata cannot run.
var ErrUnsupportedArch = errors.New("model: unsupported architecture")

// RopeStyle says how RoPE pairs the dimensions of a head.
type RopeStyle int

const (
	// RopeNormal rotates adjacent pairs (x[2i], x[2i+1]), as Llama files use.
	RopeNormal RopeStyle = iota
	// RopeNeoX rotates x[i] with x[i+d/2], as Qwen2 files use.
	RopeNeoX
)

// Limits on what a file may claim, checked before anything is sized by them.
const (
	MaxLayers  = 1024
	MaxEmbd    = 1 << 16
	MaxHeads   = 1024
	MaxFF      = 1 << 18
	MaxVocab   = 1 << 22
	MaxContext = 1 << 24
	MaxHeadDim = 1024
)

// Config is a model's architecture as its GGUF metadata describes it.
type Config struct {
	Arch      string // general.architecture
	Layers    int    // transformer blocks
	Embd      int    // hidden size
	Heads     int    // query heads
	HeadsKV   int    // key/value heads (grouped-query attention when < Heads)
	HeadDim   int    // per-head width: attention.key_length, else Embd / Heads
	FF        int    // feed-forward hidden size
	Vocab     int    // rows of the embedding matrix
	Context   int    // training context length in tokens
	NormEps   float32
	RopeBase  float32   // rope_freq_base
	RopeScale float32   // linear scaling factor (1 = none); positions are divided by it
	RopeDims  int       // dimensions of a head that RoPE rotates
	Rope      RopeStyle // pairing layout
	// NoRopeEvery, when > 0, skips RoPE on every NoRopeEvery-th layer
	// (layer l with (l+1) % NoRopeEvery == 0), as SmolLM3 does.
	NoRopeEvery int
	QKVBias     bool // attention projections carry biases (Qwen2)
	TiedOutput  bool // no output.weight: the head reuses token_embd
	// QKNorm applies an RMSNorm of HeadDim weights (attn_q_norm,
	// attn_k_norm) to each head of the queries and keys before RoPE (Qwen3).
	QKNorm bool
	// FusedGateUp: ffn_up holds 2×FF rows, the gate's then the up
	// projection's, and there is no ffn_gate (Phi-3).
	FusedGateUp bool
	// RopeOrigContext is the context the model was trained with before its
	// RoPE was stretched (rope.scaling.original_context_length; Context when
	// absent). A file with rope_factors_long/short uses the long factors
	// when Context exceeds it, as llama.cpp does when run at the full
	// context.
	RopeOrigContext int
	// RopeAttnFactor scales RoPE's cosines and sines, and so every query and
	// key it rotates (rope.scaling.attn_factor; 1 when absent).
	RopeAttnFactor float32

	// Gemma 2 and Gemma 3 (see gemma.go for the keys and numerics).

	// EmbedScale, when > 0, multiplies every token embedding (sqrt(Embd)
	// in float32).
	EmbedScale float32
	// PostNorms: RMSNorms of the attention output (post_attention_norm) and
	// of the FFN output (post_ffw_norm) before each residual add.
	PostNorms bool
	// GELU: the FFN gate takes GELU (tanh approximation) instead of SiLU.
	GELU bool
	// QueryScale, when > 0, multiplies the queries after RoPE, and
	// attention then does not scale its scores; 0: scores are scaled by
	// 1/sqrt(HeadDim).
	QueryScale float32
	// SlidingWindow, when > 0, is the positions a sliding layer attends to,
	// its own included: position p reads keys max(0, p-SlidingWindow+1)..p.
	SlidingWindow int
	// SlidingLayers[l] says whether layer l slides (nil when no layer
	// does).
	SlidingLayers []bool
	// RopeBaseSWA and RopeScaleSWA are the RoPE base and linear scaling of
	// the sliding layers (Gemma 3's take none: 1).
	RopeBaseSWA, RopeScaleSWA float32
	// LogitSoftCap, when > 0, caps the logits: cap * tanh(logit / cap).
	LogitSoftCap float32
	// AttnSoftCap, when > 0, caps every attention score s before the
	// softmax: cap * tanh(s / cap) (Gemma 2).
	AttnSoftCap float32

	// Mixture of experts: qwen2moe, qwen3moe, and llama files with
	// expert_count (Mixtral); see moe.go for the keys and numerics.

	// Experts is the number of expert FFNs in each layer (expert_count);
	// 0: every layer has one dense FFN.
	Experts int
	// ExpertsUsed is the experts each token's FFN output sums
	// (expert_used_count).
	ExpertsUsed int
	// ExpertFF is each expert's hidden size: qwen2moe's and qwen3moe's
	// expert_feed_forward_length, else FF.
	ExpertFF int
	// ExpertWeightsNorm: the chosen experts' router probabilities are
	// divided by their sum (expert_weights_norm; when absent, false for
	// qwen2moe and true for the others, as llama.cpp's graphs do).
	ExpertWeightsNorm bool
	// SharedFF, when > 0, is the hidden size of the shared expert every
	// MoE layer adds to its routed experts' output, gated per token by a
	// sigmoid (qwen2moe: expert_shared_feed_forward_length, FF when
	// absent); 0: no shared expert.
	SharedFF int
}

// Window is the number of positions layer l attends to, its own included,
// or 0 when it attends to every earlier position.
func (c Config) Window(l int) int {
	if c.SlidingLayers == nil || !c.SlidingLayers[l] {
		return 0
	}
	return c.SlidingWindow
}

// KVDim is the width of one position's keys (and values) in one layer.
func (c Config) KVDim() int { return c.HeadsKV * c.HeadDim }

// QDim is the width of one position's queries (and of the attention output
// the O projection reads): Heads×HeadDim, which need not equal Embd.
func (c Config) QDim() int { return c.Heads * c.HeadDim }

// archInfo holds what differs between the supported architectures.
type archInfo struct {
	rope        RopeStyle
	qkvBias     bool
	qkNorm      bool
	fusedGateUp bool
	// ropeFactors: RoPE takes per-pair frequency divisors from the file's
	// rope_freqs or rope_factors_long/short tensors, as llama.cpp's graph
	// for the architecture does (the others ignore such tensors).
	ropeFactors bool
}

var archs = map[string]archInfo{
	"llama":   {rope: RopeNormal, ropeFactors: true},
	"mistral": {rope: RopeNormal},
	"qwen2":   {rope: RopeNeoX, qkvBias: true},
	"qwen3":   {rope: RopeNeoX, qkNorm: true},
	"phi3":    {rope: RopeNeoX, fusedGateUp: true, ropeFactors: true},
	"smollm3": {rope: RopeNormal},
	"gemma2":  {rope: RopeNeoX},
	"gemma3":  {rope: RopeNeoX, qkNorm: true},
	// qwen3moe is qwen3 with a mixture-of-experts FFN in every layer.
	"qwen3moe": {rope: RopeNeoX, qkNorm: true},
	// qwen2moe is qwen2 with a mixture-of-experts FFN and a shared expert
	// in every layer (Qwen1.5-MoE, Qwen2-MoE).
	"qwen2moe": {rope: RopeNeoX, qkvBias: true},
}

// supportedArchs lists archs' keys for error messages.
const supportedArchs = "gemma2, gemma3, llama, mistral, phi3, qwen2, qwen2moe, qwen3, qwen3moe, smollm3"

// ConfigFromGGUF reads the architecture keys of f. Errors name the key.
func ConfigFromGGUF(f *gguf.File) (Config, error) {
	arch, err := f.Architecture()
	if err != nil {
		return Config{}, err
	}
	info, ok := archs[arch]
	if !ok {
		return Config{}, fmt.Errorf("%w %q (general.architecture); supported: %s", ErrUnsupportedArch, arch, supportedArchs)
	}
	c := Config{Arch: arch, Rope: info.rope, QKVBias: info.qkvBias, QKNorm: info.qkNorm, FusedGateUp: info.fusedGateUp, RopeBase: 10000, RopeScale: 1, RopeAttnFactor: 1}
	key := func(s string) string { return arch + "." + s }
	geti := func(k string, limit int, dst *int) error {
		v, err := f.Uint(key(k))
		if err != nil {
			return err
		}
		if v == 0 || v > uint64(limit) {
			return fmt.Errorf("model: %s = %d, want 1..%d", key(k), v, limit)
		}
		*dst = int(v)
		return nil
	}
	for _, g := range []struct {
		k     string
		limit int
		dst   *int
	}{
		{"block_count", MaxLayers, &c.Layers},
		{"embedding_length", MaxEmbd, &c.Embd},
		{"feed_forward_length", MaxFF, &c.FF},
		{"attention.head_count", MaxHeads, &c.Heads},
		{"context_length", MaxContext, &c.Context},
	} {
		if err := geti(g.k, g.limit, g.dst); err != nil {
			return Config{}, err
		}
	}
	c.HeadsKV = c.Heads
	if f.Has(key("attention.head_count_kv")) {
		if err := geti("attention.head_count_kv", MaxHeads, &c.HeadsKV); err != nil {
			return Config{}, err
		}
	}
	if c.Heads%c.HeadsKV != 0 {
		return Config{}, fmt.Errorf("model: %s %d is not a multiple of %s %d", key("attention.head_count"), c.Heads, key("attention.head_count_kv"), c.HeadsKV)
	}
	if f.Has(key("attention.key_length")) {
		if err := geti("attention.key_length", MaxHeadDim, &c.HeadDim); err != nil {
			return Config{}, err
		}
	} else {
		if c.Embd%c.Heads != 0 {
			return Config{}, fmt.Errorf("model: %s %d is not a multiple of %s %d", key("embedding_length"), c.Embd, key("attention.head_count"), c.Heads)
		}
		c.HeadDim = c.Embd / c.Heads
	}
	if f.Has(key("attention.value_length")) {
		v, err := f.Uint(key("attention.value_length"))
		if err != nil {
			return Config{}, err
		}
		if v != uint64(c.HeadDim) {
			return Config{}, fmt.Errorf("model: %s = %d differs from the key width %d; unsupported", key("attention.value_length"), v, c.HeadDim)
		}
	}
	if err := moeConfig(f, &c); err != nil {
		return Config{}, err
	}
	c.RopeDims = c.HeadDim
	if f.Has(key("rope.dimension_count")) {
		if err := geti("rope.dimension_count", c.HeadDim, &c.RopeDims); err != nil {
			return Config{}, err
		}
		if c.RopeDims%2 != 0 {
			return Config{}, fmt.Errorf("model: %s = %d must be even", key("rope.dimension_count"), c.RopeDims)
		}
	}
	eps, err := f.Float(key("attention.layer_norm_rms_epsilon"))
	if err != nil {
		return Config{}, err
	}
	if !(eps > 0 && eps < 1) {
		return Config{}, fmt.Errorf("model: %s = %g, want 0 < eps < 1", key("attention.layer_norm_rms_epsilon"), eps)
	}
	c.NormEps = float32(eps)
	if f.Has(key("rope.freq_base")) {
		v, err := f.Float(key("rope.freq_base"))
		if err != nil {
			return Config{}, err
		}
		if !(v > 1) {
			return Config{}, fmt.Errorf("model: %s = %g, want > 1", key("rope.freq_base"), v)
		}
		c.RopeBase = float32(v)
	}
	if f.Has(key("rope.scaling.type")) {
		typ, err := f.String(key("rope.scaling.type"))
		if err != nil {
			return Config{}, err
		}
		switch typ {
		case "none":
		case "longrope": // the factors are tensors (rope_factors_long/short)
		case "linear":
			v, err := f.Float(key("rope.scaling.factor"))
			if err != nil {
				return Config{}, err
			}
			if !(v >= 1) {
				return Config{}, fmt.Errorf("model: %s = %g, want >= 1", key("rope.scaling.factor"), v)
			}
			c.RopeScale = float32(v)
		default:
			return Config{}, fmt.Errorf("model: %s %q is not supported (none, linear, longrope)", key("rope.scaling.type"), typ)
		}
	} else if f.Has(key("rope.scale_linear")) {
		v, err := f.Float(key("rope.scale_linear"))
		if err != nil {
			return Config{}, err
		}
		if !(v >= 1) {
			return Config{}, fmt.Errorf("model: %s = %g, want >= 1", key("rope.scale_linear"), v)
		}
		c.RopeScale = float32(v)
	}
	c.RopeOrigContext = c.Context
	if f.Has(key("rope.scaling.original_context_length")) {
		if err := geti("rope.scaling.original_context_length", MaxContext, &c.RopeOrigContext); err != nil {
			return Config{}, err
		}
	}
	if f.Has(key("rope.scaling.attn_factor")) {
		v, err := f.Float(key("rope.scaling.attn_factor"))
		if err != nil {
			return Config{}, err
		}
		if !(v > 0 && v < 16) {
			return Config{}, fmt.Errorf("model: %s = %g, want 0 < factor < 16", key("rope.scaling.attn_factor"), v)
		}
		c.RopeAttnFactor = float32(v)
	}
	if arch == "gemma2" || arch == "gemma3" {
		if err := gemmaConfig(f, &c); err != nil {
			return Config{}, err
		}
	}
	if arch == "smollm3" {
		c.NoRopeEvery = 4
		if f.Has(key("no_rope_layer_step")) {
			if err := geti("no_rope_layer_step", MaxLayers, &c.NoRopeEvery); err != nil {
				return Config{}, err
			}
		}
	}
	return c, nil
}
