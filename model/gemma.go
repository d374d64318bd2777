package model

import (
	"fmt"
	"math"
	"sync"

	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

// Gemma 2 and Gemma 3, as llama.cpp's loader and graphs read a converted
// file. Both:
//
//   - token embeddings times sqrt(Embd), in float32;
//   - NeoX RoPE, then the queries times QueryScale, 1/sqrt(HeadDim) (the
//     27B models, Gemma 2's 46 layers and Gemma 3's 62: 1/sqrt(Embd/Heads),
//     their query_pre_attn_scalar, as llama.cpp decides it by the layer
//     count), and attention scores not scaled again;
//   - RMSNorms of the attention output (post_attention_norm) and of the FFN
//     output (post_ffw_norm) before each residual add; the converter folds
//     Gemma's 1+w into every stored norm weight, so they apply as stored;
//   - FFN gate GELU (tanh approximation) times up (GEGLU);
//   - sliding layers: with attention.sliding_window > 0, layer l slides
//     when l % P < P-1 for the period P of attention.sliding_window_pattern
//     (an array gives each layer's flag); a sliding layer at position p
//     attends to positions p-window+1..p;
//   - final_logit_softcapping > 0: logits = cap*tanh(logit/cap).
//
// Gemma 3 only: per-head RMSNorms of queries and keys (attn_q_norm,
// attn_k_norm) before RoPE; no sliding layers when attention.sliding_window
// is absent; period 6 when the pattern is absent; sliding layers rotate with
// rope.freq_base_swa (10000 when absent) and no linear scaling, the others
// with rope.freq_base and rope.scaling; no logit cap when the key is absent
// (llama.cpp's graph caps only files without sliding layers; strata caps
// whenever the file sets it, as the model's definition does, and no Gemma 3
// release sets it beside a sliding window); attn_logit_softcapping, which
// llama.cpp's Gemma 3 graph ignores, refused when non-zero.
//
// Gemma 2 only: attention logit soft-capping, attn_logit_softcapping (50
// when absent): each score s becomes cap*tanh(s*(1/cap)) before the
// softmax, as ggml's flash attention computes it (KV.AttendSoftCap); a
// window of 4096 when attention.sliding_window is absent and period 2 (every
// other layer, the first sliding) when the pattern is; sliding layers rotate
// with rope.freq_base_swa (rope.freq_base when absent) and the same linear
// scaling as the others; final_logit_softcapping 30 when absent. A cap of 0
// turns that capping off, as ggml's flash attention reads a zero cap
// (llama.cpp's graph would divide by it).

// gemmaConfig reads the Gemma 2 and Gemma 3 keys into c, whose common keys
// are read.
func gemmaConfig(f *gguf.File, c *Config) error {
	key := func(s string) string { return c.Arch + "." + s }
	gemma2 := c.Arch == "gemma2"
	c.EmbedScale = float32(math.Sqrt(float64(c.Embd)))
	c.PostNorms, c.GELU = true, true
	sq := c.HeadDim
	if (gemma2 && c.Layers == 46) || (!gemma2 && c.Layers == 62) { // llama.cpp's rule for the 27B models' query_pre_attn_scalar
		sq = c.Embd / c.Heads
	}
	c.QueryScale = 1 / float32(math.Sqrt(float64(float32(sq))))
	capKey := func(k string, def float32, dst *float32) error {
		*dst = def
		if !f.Has(key(k)) {
			return nil
		}
		v, err := f.Float(key(k))
		if err != nil {
			return err
		}
		if !(v >= 0 && v < math.MaxFloat32) {
			return fmt.Errorf("model: %s = %g, want a finite cap >= 0", key(k), v)
		}
		*dst = float32(v)
		return nil
	}
	if gemma2 {
		if err := capKey("attn_logit_softcapping", 50, &c.AttnSoftCap); err != nil {
			return err
		}
		if err := capKey("final_logit_softcapping", 30, &c.LogitSoftCap); err != nil {
			return err
		}
	} else {
		var attnCap float32
		if err := capKey("attn_logit_softcapping", 0, &attnCap); err != nil {
			return err
		}
		if attnCap != 0 {
			return fmt.Errorf("model: %s = %g: attention logit soft-capping is Gemma 2's; gemma3 files do not use it", key("attn_logit_softcapping"), attnCap)
		}
		if err := capKey("final_logit_softcapping", 0, &c.LogitSoftCap); err != nil {
			return err
		}
	}
	c.RopeBaseSWA, c.RopeScaleSWA = 10000, 1
	if gemma2 {
		c.RopeBaseSWA, c.RopeScaleSWA = c.RopeBase, c.RopeScale
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
	w, period := uint64(0), uint64(6)
	if gemma2 {
		w, period = 4096, 2
	}
	if f.Has(key("attention.sliding_window")) {
		var err error
		if w, err = f.Uint(key("attention.sliding_window")); err != nil {
			return err
		}
		if w > MaxContext {
			return fmt.Errorf("model: %s = %d, want 0..%d", key("attention.sliding_window"), w, MaxContext)
		}
	}
	if w == 0 {
		return nil
	}
	c.SlidingWindow = int(w)
	c.SlidingLayers = make([]bool, c.Layers)
	if v, ok := f.Get(key("attention.sliding_window_pattern")); ok {
		switch v := v.(type) {
		case []bool:
			if len(v) != c.Layers {
				return fmt.Errorf("model: %s has %d flags for %d layers", key("attention.sliding_window_pattern"), len(v), c.Layers)
			}
			copy(c.SlidingLayers, v)
			return nil
		default:
			var err error
			if period, err = f.Uint(key("attention.sliding_window_pattern")); err != nil {
				return err
			}
			if period > MaxLayers {
				return fmt.Errorf("model: %s = %d, want 0..%d", key("attention.sliding_window_pattern"), period, MaxLayers)
			}
		}
	}
	for l := range c.SlidingLayers {
		// as llama.cpp's set_swa_pattern: period 0, every layer slides
		c.SlidingLayers[l] = period == 0 || uint64(l)%period < period-1
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
