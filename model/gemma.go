package model

import (
	"fmt"
	"math"
	"sync"

	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

// Gemma 3, as llama.cpp's loader and graph read a converted file:
//
//   - token embeddings times sqrt(Embd), in float32;
//   - per-head RMSNorms of queries and keys (attn_q_norm, attn_k_norm)
//     before NeoX RoPE, then the queries times 1/sqrt(HeadDim) (Gemma 3
//     27B, the 62-layer model: 1/sqrt(Embd/Heads), its
//     query_pre_attn_scalar), and attention scores not scaled again;
//   - RMSNorms of the attention output (post_attention_norm) and of the FFN
//     output (post_ffw_norm) before each residual add; the converter folds
//     Gemma's 1+w into every stored norm weight, so they apply as stored;
//   - FFN gate GELU (tanh approximation) times up (GEGLU);
//   - sliding layers: with attention.sliding_window set and > 0, layer l
//     slides when l % P < P-1 for the period P of
//     attention.sliding_window_pattern (6 when absent; an array gives each
//     layer's flag); a sliding layer at position p attends to positions
//     p-window+1..p, with RoPE base rope.freq_base_swa (10000 when absent)
//     and no linear scaling; the other layers attend to every earlier
//     position with rope.freq_base and rope.scaling;
//   - final_logit_softcapping, when set and > 0: logits = cap*tanh(logit/cap).
//     llama.cpp's graph caps only files without sliding layers; strata caps
//     whenever the file sets it, as the model's definition does (no Gemma 3
//     release sets it beside a sliding window).

// gemma3Config reads the Gemma 3 keys into c, whose common keys are read.
func gemma3Config(f *gguf.File, c *Config) error {
	key := func(s string) string { return c.Arch + "." + s }
	c.EmbedScale = float32(math.Sqrt(float64(c.Embd)))
	c.PostNorms, c.GELU = true, true
	sq := c.HeadDim
	if c.Layers == 62 { // llama.cpp's rule for the 27B model's query_pre_attn_scalar
		sq = c.Embd / c.Heads
	}
	c.QueryScale = 1 / float32(math.Sqrt(float64(float32(sq))))
	c.RopeBaseSWA = 10000
	if f.Has(key("attn_logit_softcapping")) {
		v, err := f.Float(key("attn_logit_softcapping"))
		if err != nil {
			return err
		}
		if v != 0 {
			return fmt.Errorf("model: %s = %g: attention logit soft-capping (Gemma 2) is not supported", key("attn_logit_softcapping"), v)
		}
	}
	if f.Has(key("final_logit_softcapping")) {
		v, err := f.Float(key("final_logit_softcapping"))
		if err != nil {
			return err
		}
		if !(v >= 0 && v < math.MaxFloat32) {
			return fmt.Errorf("model: %s = %g, want a finite cap >= 0", key("final_logit_softcapping"), v)
		}
		c.LogitSoftCap = float32(v)
	}
	if !f.Has(key("attention.sliding_window")) {
		return nil
	}
	w, err := f.Uint(key("attention.sliding_window"))
	if err != nil {
		return err
	}
	if w > MaxContext {
		return fmt.Errorf("model: %s = %d, want 0..%d", key("attention.sliding_window"), w, MaxContext)
	}
	if w == 0 {
		return nil
	}
	c.SlidingWindow = int(w)
	c.SlidingLayers = make([]bool, c.Layers)
	period := uint64(6)
	if v, ok := f.Get(key("attention.sliding_window_pattern")); ok {
		switch v := v.(type) {
		case []bool:
			if len(v) != c.Layers {
				return fmt.Errorf("model: %s has %d flags for %d layers", key("attention.sliding_window_pattern"), len(v), c.Layers)
			}
			copy(c.SlidingLayers, v)
			period = 0
		default:
			if period, err = f.Uint(key("attention.sliding_window_pattern")); err != nil {
				return err
			}
			if period > MaxLayers {
				return fmt.Errorf("model: %s = %d, want 0..%d", key("attention.sliding_window_pattern"), period, MaxLayers)
			}
			if period == 0 { // as llama.cpp's set_swa_pattern: every layer slides
				for l := range c.SlidingLayers {
					c.SlidingLayers[l] = true
				}
			}
		}
	}
	if period > 0 {
		for l := range c.SlidingLayers {
			c.SlidingLayers[l] = uint64(l)%period < period-1
		}
	}
	if f.Has(key("rope.freq_base_swa")) {
		v, err := f.Float(key("rope.freq_base_swa"))
		if err != nil {
			return err
		}
		if !(v > 1) {
			return fmt.Errorf("model: %s = %g, want > 1", key("rope.freq_base_swa"), v)
		}
		c.RopeBaseSWA = float32(v)
	}
	return nil
}

// geluTable maps every half-precision input to GELU's output rounded to
// half precision: ggml's CPU GELU, which computes
// 0.5x(1+tanh(sqrt(2/pi)·x·(1+0.044715x²))) in float32 once per f16 value.
var geluTable = sync.OnceValue(func() *[1 << 16]float32 {
	const a, c = float32(0.044715), float32(0.79788456080286535587989211986876)
	var t [1 << 16]float32
	for i := range t {
		x := ggml.F16ToF32(uint16(i))
		// Each product rounded on its own (no fused multiply-add), as
		// ggml's C computes it without contraction.
		inner := float32(float32(c*x) * float32(1+float32(float32(a*x)*x)))
		y := float32(float32(0.5*x) * float32(1+float32(math.Tanh(float64(inner)))))
		t[i] = ggml.F16ToF32(ggml.F32ToF16(y))
	}
	return &t
})

// geglu sets gate[i] = gelu(gate[i]) * up[i] for i < len(gate) with ggml's
// CPU numerics: the input rounded to half precision and looked up in
// geluTable; inputs at or below -10 give 0, at or above 10 pass unchanged.
// The result depends only on gate[i] and up[i].
func geglu(gate, up []float32) {
	t := geluTable()
	up = up[:len(gate)]
	for i, x := range gate {
		switch {
		case x <= -10:
			gate[i] = 0
		case x >= 10:
			gate[i] = x * up[i]
		default:
			gate[i] = t[ggml.F32ToF16(x)] * up[i]
		}
	}
}

// softCap sets x[i] = c * tanh(x[i] * (1/c)), each step rounded to float32
// as ggml's scale, tanh and scale compute it.
func softCap(x []float32, c float32) {
	inv := 1 / c
	for i, v := range x {
		x[i] = float32(math.Tanh(float64(v*inv))) * c
	}
}
