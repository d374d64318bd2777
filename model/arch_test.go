package model

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

// TestRandomArchConfig loads each architecture's random file and checks what
// Load made of its keys and tensors.
func TestRandomArchConfig(t *testing.T) {
	base := RandomSpec{Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Type: ggml.F32, Seed: 1}
	tests := []struct {
		arch    string
		headDim int
		check   func(t *testing.T, m *Model)
	}{
		{arch: "qwen3", headDim: 32, check: func(t *testing.T, m *Model) {
			c := m.Config
			if c.Rope != RopeNeoX || !c.QKNorm || c.QKVBias || c.FusedGateUp || c.HeadDim != 32 || c.QDim() != 128 || c.KVDim() != 64 || c.RopeDims != 32 || c.RopeBase != 1e6 {
				t.Fatalf("config %+v", c)
			}
			L := m.LayerWeights[1]
			if len(L.QNorm) != 32 || len(L.KNorm) != 32 || L.Q.Rows != 128 || L.O.Cols != 128 || L.QKV != nil || L.GateUp != nil {
				t.Fatalf("layer: q norm %d, k norm %d, Q rows %d, O cols %d", len(L.QNorm), len(L.KNorm), L.Q.Rows, L.O.Cols)
			}
			if m.RopeFactors != nil {
				t.Fatal("qwen3 has RoPE factors")
			}
		}},
		{arch: "qwen3", check: func(t *testing.T, m *Model) { // key_length equal to Embd/Heads
			if m.HeadDim != 16 || m.QDim() != m.Embd {
				t.Fatalf("config %+v", m.Config)
			}
		}},
		{arch: "phi3", check: func(t *testing.T, m *Model) {
			c := m.Config
			if c.Rope != RopeNeoX || c.QKNorm || !c.FusedGateUp || c.HeadDim != 16 || c.RopeDims != 12 || c.RopeOrigContext != 128 {
				t.Fatalf("config %+v", c)
			}
			if want := float32(math.Sqrt(1 + math.Log(2)/math.Log(128))); c.RopeAttnFactor != want {
				t.Fatalf("attn factor %g, want %g", c.RopeAttnFactor, want)
			}
			L := m.LayerWeights[0]
			if L.QKV == nil || L.QKV.Rows != 64+2*32 || L.Q != nil || L.GateUp == nil || L.GateUp.Rows != 2*96 || L.Gate != nil || L.Up != nil {
				t.Fatalf("layer %+v", L)
			}
			if len(L.Matrices()) != 4 {
				t.Fatalf("%d matrices, want QKV, O, GateUp, Down", len(L.Matrices()))
			}
			if len(m.RopeFactors) != 6 {
				t.Fatalf("%d rope factors, want 6", len(m.RopeFactors))
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.arch, func(t *testing.T) {
			spec := base
			spec.Arch, spec.HeadDim = tt.arch, tt.headDim
			f, err := RandomFile(spec)
			if err != nil {
				t.Fatal(err)
			}
			m, err := Load(f)
			if err != nil {
				t.Fatal(err)
			}
			if m.Arch != tt.arch {
				t.Fatalf("arch %q", m.Arch)
			}
			tt.check(t, m)
		})
	}
}

// TestGemma3Config checks what Load makes of a gemma3 file's keys: the
// sliding layers (from the window and the pattern, a period or per-layer
// flags, as llama.cpp reads them), their RoPE base, the query scale, the
// embedding scale and the logit cap.
func TestGemma3Config(t *testing.T) {
	spec := RandomSpec{Arch: "gemma3", Layers: 7, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Type: ggml.F32, Seed: 4}
	kvs, ts := parseRandom(t, spec)
	load := func(t *testing.T, kvs []gguf.KV) *Model {
		t.Helper()
		m, err := Load(writeParse(t, kvs, ts))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	T, F := true, false
	t.Run("random file", func(t *testing.T) {
		m := load(t, kvs)
		c := m.Config
		if c.Rope != RopeNeoX || !c.QKNorm || !c.PostNorms || !c.GELU || c.QKVBias || c.FusedGateUp || c.HeadDim != 16 {
			t.Fatalf("config %+v", c)
		}
		if c.EmbedScale != 8 || c.QueryScale != 0.25 || c.LogitSoftCap != 30 || c.NormEps != 1e-6 {
			t.Fatalf("embed scale %g, query scale %g, logit cap %g, eps %g", c.EmbedScale, c.QueryScale, c.LogitSoftCap, c.NormEps)
		}
		if c.RopeBase != 1e6 || c.RopeScale != 8 || c.RopeBaseSWA != 10000 || c.SlidingWindow != 8 {
			t.Fatalf("rope base %g scale %g, sliding base %g, window %d", c.RopeBase, c.RopeScale, c.RopeBaseSWA, c.SlidingWindow)
		}
		if want := []bool{T, T, T, T, T, F, T}; !slices.Equal(c.SlidingLayers, want) {
			t.Fatalf("sliding layers %v, want %v", c.SlidingLayers, want)
		}
		if c.Window(0) != 8 || c.Window(5) != 0 || c.Window(6) != 8 {
			t.Fatalf("windows %d %d %d", c.Window(0), c.Window(5), c.Window(6))
		}
		L := m.LayerWeights[3]
		if len(L.PostAttnNorm) != 64 || len(L.PostFFNNorm) != 64 || len(L.QNorm) != 16 || L.Gate == nil || L.GateUp != nil {
			t.Fatalf("layer %+v", L)
		}
	})
	for _, tc := range []struct {
		name    string
		kvs     []gguf.KV
		sliding []bool // nil: no sliding layer
	}{
		{"period 2", setKV(kvs, "gemma3.attention.sliding_window_pattern", uint32(2)), []bool{T, F, T, F, T, F, T}},
		{"period 1: none slide", setKV(kvs, "gemma3.attention.sliding_window_pattern", uint32(1)), []bool{F, F, F, F, F, F, F}},
		{"period 0: all slide", setKV(kvs, "gemma3.attention.sliding_window_pattern", uint32(0)), []bool{T, T, T, T, T, T, T}},
		{"flags", setKV(kvs, "gemma3.attention.sliding_window_pattern", []bool{F, T, T, F, F, T, F}), []bool{F, T, T, F, F, T, F}},
		{"window 0", setKV(kvs, "gemma3.attention.sliding_window", uint32(0)), nil},
		{"no window", dropKV(kvs, "gemma3.attention.sliding_window"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := load(t, tc.kvs).Config
			if !slices.Equal(c.SlidingLayers, tc.sliding) {
				t.Fatalf("sliding layers %v, want %v", c.SlidingLayers, tc.sliding)
			}
			for l, s := range tc.sliding {
				if w := c.Window(l); (w == 8) != s || (w != 0 && w != 8) {
					t.Fatalf("layer %d window %d", l, w)
				}
			}
		})
	}
	t.Run("sliding rope base and no cap", func(t *testing.T) {
		c := load(t, setKV(dropKV(kvs, "gemma3.final_logit_softcapping"), "gemma3.rope.freq_base_swa", float32(5e4))).Config
		if c.RopeBaseSWA != 5e4 || c.LogitSoftCap != 0 {
			t.Fatalf("sliding base %g, cap %g", c.RopeBaseSWA, c.LogitSoftCap)
		}
	})
	t.Run("27B query scale", func(t *testing.T) {
		// llama.cpp scales the 62-layer model's queries by 1/sqrt(Embd/Heads)
		// (its query_pre_attn_scalar), every other one's by 1/sqrt(HeadDim).
		s := spec
		s.Layers, s.HeadDim, s.FF, s.Vocab = 62, 32, 8, 263
		f, err := RandomFile(s)
		if err != nil {
			t.Fatal(err)
		}
		m, err := Load(f)
		if err != nil {
			t.Fatal(err)
		}
		if m.QueryScale != 0.25 || m.HeadDim != 32 {
			t.Fatalf("query scale %g with head dim %d, want 1/sqrt(64/4)", m.QueryScale, m.HeadDim)
		}
		s.Layers = 61
		if f, err = RandomFile(s); err != nil {
			t.Fatal(err)
		}
		if m, err = Load(f); err != nil {
			t.Fatal(err)
		}
		if want := 1 / float32(math.Sqrt(32)); m.QueryScale != want {
			t.Fatalf("query scale %g, want 1/sqrt(32) = %g", m.QueryScale, want)
		}
	})
}

// TestGemma2Config checks what Load makes of a gemma2 file's keys: every
// other layer sliding (the first included) when the pattern is absent, the
// window and caps from the file or llama.cpp's defaults (4096, 50, 30), the
// sliding layers' RoPE as the others', no Q/K norms.
func TestGemma2Config(t *testing.T) {
	spec := RandomSpec{Arch: "gemma2", Layers: 5, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Type: ggml.F32, Seed: 5, AttnSoftCap: 20}
	kvs, ts := parseRandom(t, spec)
	load := func(t *testing.T, kvs []gguf.KV) *Model {
		t.Helper()
		m, err := Load(writeParse(t, kvs, ts))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	T, F := true, false
	t.Run("random file", func(t *testing.T) {
		m := load(t, kvs)
		c := m.Config
		if c.Rope != RopeNeoX || c.QKNorm || !c.PostNorms || !c.GELU || c.QKVBias || c.FusedGateUp || c.HeadDim != 16 {
			t.Fatalf("config %+v", c)
		}
		if c.EmbedScale != 8 || c.QueryScale != 0.25 || c.LogitSoftCap != 30 || c.AttnSoftCap != 20 || c.NormEps != 1e-6 {
			t.Fatalf("embed scale %g, query scale %g, logit cap %g, attention cap %g, eps %g", c.EmbedScale, c.QueryScale, c.LogitSoftCap, c.AttnSoftCap, c.NormEps)
		}
		if c.RopeBase != 10000 || c.RopeScale != 2 || c.RopeBaseSWA != 10000 || c.RopeScaleSWA != 2 || c.SlidingWindow != 8 {
			t.Fatalf("rope base %g scale %g, sliding base %g scale %g, window %d", c.RopeBase, c.RopeScale, c.RopeBaseSWA, c.RopeScaleSWA, c.SlidingWindow)
		}
		if want := []bool{T, F, T, F, T}; !slices.Equal(c.SlidingLayers, want) {
			t.Fatalf("sliding layers %v, want %v", c.SlidingLayers, want)
		}
		L := m.LayerWeights[1]
		if len(L.PostAttnNorm) != 64 || len(L.PostFFNNorm) != 64 || L.QNorm != nil || L.KNorm != nil || L.Gate == nil {
			t.Fatalf("layer %+v", L)
		}
	})
	t.Run("defaults", func(t *testing.T) {
		kv := kvs
		for _, k := range []string{"attn_logit_softcapping", "final_logit_softcapping", "attention.sliding_window"} {
			kv = dropKV(kv, "gemma2."+k)
		}
		c := load(t, setKV(kv, "gemma2.rope.freq_base_swa", float32(5e4))).Config
		if c.AttnSoftCap != 50 || c.LogitSoftCap != 30 || c.SlidingWindow != 4096 || c.RopeBaseSWA != 5e4 {
			t.Fatalf("attention cap %g, logit cap %g, window %d, sliding base %g", c.AttnSoftCap, c.LogitSoftCap, c.SlidingWindow, c.RopeBaseSWA)
		}
	})
	t.Run("caps off, period 3", func(t *testing.T) {
		kv := setKV(setKV(kvs, "gemma2.attn_logit_softcapping", float32(0)), "gemma2.final_logit_softcapping", float32(0))
		c := load(t, setKV(kv, "gemma2.attention.sliding_window_pattern", uint32(3))).Config
		if c.AttnSoftCap != 0 || c.LogitSoftCap != 0 || !slices.Equal(c.SlidingLayers, []bool{T, T, F, T, T}) {
			t.Fatalf("attention cap %g, logit cap %g, sliding %v", c.AttnSoftCap, c.LogitSoftCap, c.SlidingLayers)
		}
	})
	t.Run("27B query scale", func(t *testing.T) {
		// llama.cpp scales the 46-layer model's queries by 1/sqrt(Embd/Heads),
		// every other one's by 1/sqrt(HeadDim); the keys alone decide it.
		kv := setKV(kvs, "gemma2.attention.key_length", uint32(32))
		kv = setKV(kv, "gemma2.attention.value_length", uint32(32))
		for layers, want := range map[uint32]float32{46: 0.25, 45: 1 / float32(math.Sqrt(32))} {
			c, err := ConfigFromGGUF(writeParse(t, setKV(kv, "gemma2.block_count", layers), ts))
			if err != nil {
				t.Fatal(err)
			}
			if c.QueryScale != want || c.HeadDim != 32 {
				t.Fatalf("%d layers: query scale %g with head dim %d, want %g", layers, c.QueryScale, c.HeadDim, want)
			}
		}
	})
}

// dropKV returns kvs without key.
func dropKV(kvs []gguf.KV, key string) []gguf.KV {
	var out []gguf.KV
	for _, kv := range kvs {
		if kv.Key != key {
			out = append(out, kv)
		}
	}
	return out
}

// TestPhi3RopeFactorsChoice: the long factors apply when the context served
// exceeds rope.scaling.original_context_length, the short ones otherwise.
func TestPhi3RopeFactorsChoice(t *testing.T) {
	spec := RandomSpec{Arch: "phi3", Layers: 1, Embd: 64, Heads: 4, HeadsKV: 4, FF: 64, Vocab: 300, Context: 256, Type: ggml.F32, Seed: 2}
	kvs, ts := parseRandom(t, spec)
	want := func(name string) []float32 {
		for _, tt := range ts {
			if tt.Name == name {
				out := make([]float32, tt.Dims[0])
				if err := ggml.DequantizeRow(ggml.F32, tt.Data, out); err != nil {
					t.Fatal(err)
				}
				return out
			}
		}
		t.Fatalf("no tensor %s", name)
		return nil
	}
	for _, tc := range []struct {
		orig uint32
		name string
	}{{128, "rope_factors_long.weight"}, {255, "rope_factors_long.weight"}, {256, "rope_factors_short.weight"}, {4096, "rope_factors_short.weight"}} {
		m, err := Load(writeParse(t, setKV(kvs, "phi3.rope.scaling.original_context_length", tc.orig), ts))
		if err != nil {
			t.Fatal(err)
		}
		w := want(tc.name)
		for i := range w {
			if m.RopeFactors[i] != w[i] {
				t.Fatalf("original context %d: factors %v, want %s %v", tc.orig, m.RopeFactors, tc.name, w)
			}
		}
	}
}

// TestArchRefusals: what strata cannot run is refused at load with one line
// naming the architecture, the key or the tensor.
func TestArchRefusals(t *testing.T) {
	phi3 := RandomSpec{Arch: "phi3", Layers: 1, Embd: 64, Heads: 4, HeadsKV: 2, FF: 64, Vocab: 300, Context: 256, Type: ggml.F32, Seed: 3}
	qwen3 := phi3
	qwen3.Arch = "qwen3"
	gemma3 := phi3
	gemma3.Arch = "gemma3"
	gemma2 := phi3
	gemma2.Arch = "gemma2"
	llama := phi3
	llama.Arch = "llama"
	drop := func(ts []gguf.WriteTensor, name string) []gguf.WriteTensor {
		var out []gguf.WriteTensor
		for _, t := range ts {
			if t.Name != name {
				out = append(out, t)
			}
		}
		return out
	}
	tests := []struct {
		name string
		spec RandomSpec
		edit func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor)
		want string
	}{
		{"deepseek2 architecture", llama, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "general.architecture", "deepseek2"), ts
		}, `unsupported architecture "deepseek2" (general.architecture)`},
		{"qwen3 with experts", qwen3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "qwen3.expert_count", uint32(8)), ts
		}, "qwen3.expert_count = 8: mixture-of-experts qwen3 files are not supported"},
		{"value width differs from key width", qwen3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "qwen3.attention.value_length", uint32(8)), ts
		}, "qwen3.attention.value_length = 8 differs from the key width 16"},
		{"huge key length", qwen3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "qwen3.attention.key_length", uint32(4096)), ts
		}, "qwen3.attention.key_length = 4096, want 1..1024"},
		{"yarn scaling", qwen3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "qwen3.rope.scaling.type", "yarn"), ts
		}, `qwen3.rope.scaling.type "yarn" is not supported`},
		{"qwen3 without k norm", qwen3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return kvs, drop(ts, "blk.0.attn_k_norm.weight")
		}, "blk.0.attn_k_norm.weight"},
		{"phi3 short factors without long", phi3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return kvs, drop(ts, "rope_factors_long.weight")
		}, "rope_factors_long.weight and rope_factors_short.weight must come together"},
		{"phi3 bad attn factor", phi3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "phi3.rope.scaling.attn_factor", float32(-1)), ts
		}, "phi3.rope.scaling.attn_factor = -1"},
		{"phi3 zero factor", phi3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			for i := range ts {
				if ts[i].Name == "rope_factors_long.weight" {
					ts[i].Data = bytes.Clone(ts[i].Data)
					clear(ts[i].Data[4:8])
				}
			}
			return kvs, ts
		}, `"rope_factors_long.weight" element 1 is 0`},
		{"gemma3 attention soft-capping", gemma3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "gemma3.attn_logit_softcapping", float32(50)), ts
		}, "gemma3.attn_logit_softcapping = 50: attention logit soft-capping is Gemma 2's; gemma3 files do not use it"},
		{"gemma2 negative attention cap", gemma2, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "gemma2.attn_logit_softcapping", float32(-50)), ts
		}, "gemma2.attn_logit_softcapping = -50, want a finite cap >= 0"},
		{"gemma2 infinite logit cap", gemma2, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "gemma2.final_logit_softcapping", float32(math.Inf(1))), ts
		}, "gemma2.final_logit_softcapping = +Inf, want a finite cap >= 0"},
		{"gemma2 without post-attention norm", gemma2, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return kvs, drop(ts, "blk.0.post_attention_norm.weight")
		}, "blk.0.post_attention_norm.weight"},
		{"gemma3 negative logit cap", gemma3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "gemma3.final_logit_softcapping", float32(-30)), ts
		}, "gemma3.final_logit_softcapping = -30, want a finite cap >= 0"},
		{"gemma3 pattern of the wrong length", gemma3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "gemma3.attention.sliding_window_pattern", []bool{true, false}), ts
		}, "gemma3.attention.sliding_window_pattern has 2 flags for 1 layers"},
		{"gemma3 pattern of strings", gemma3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "gemma3.attention.sliding_window_pattern", "6"), ts
		}, "gemma3.attention.sliding_window_pattern"},
		{"gemma3 huge window", gemma3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "gemma3.attention.sliding_window", uint64(1)<<40), ts
		}, "gemma3.attention.sliding_window = 1099511627776, want 0..16777216"},
		{"gemma3 bad sliding rope base", gemma3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "gemma3.rope.freq_base_swa", float32(0)), ts
		}, "gemma3.rope.freq_base_swa = 0, want > 1"},
		{"gemma3 without post-FFN norm", gemma3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return kvs, drop(ts, "blk.0.post_ffw_norm.weight")
		}, "blk.0.post_ffw_norm.weight"},
		{"gemma3 without post-attention norm", gemma3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return kvs, drop(ts, "blk.0.post_attention_norm.weight")
		}, "blk.0.post_attention_norm.weight"},
		{"phi3 up without the gate's rows", phi3, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			for i := range ts {
				if ts[i].Name == "blk.0.ffn_up.weight" {
					ts[i].Dims = []uint64{64, 64}
					ts[i].Data = ts[i].Data[:len(ts[i].Data)/2]
				}
			}
			return kvs, ts
		}, `"blk.0.ffn_up.weight" has shape [64 64], want [64 128]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kvs, ts := parseRandom(t, tt.spec)
			kvs, ts = tt.edit(kvs, ts)
			_, err := Load(writeParse(t, kvs, ts))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
		})
	}
}

// parseRandom returns the keys and tensors of spec's random file.
func parseRandom(t *testing.T, spec RandomSpec) ([]gguf.KV, []gguf.WriteTensor) {
	t.Helper()
	f, err := RandomFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	kvs := append([]gguf.KV(nil), f.KV...)
	var ts []gguf.WriteTensor
	for _, ti := range f.Tensors {
		ts = append(ts, gguf.WriteTensor{Name: ti.Name, Type: ti.Type, Dims: ti.Dims, Data: ti.Data})
	}
	return kvs, ts
}

// setKV returns kvs with key set to v (replaced or appended).
func setKV(kvs []gguf.KV, key string, v any) []gguf.KV {
	out := make([]gguf.KV, 0, len(kvs)+1)
	for _, kv := range kvs {
		if kv.Key != key {
			out = append(out, kv)
		}
	}
	return append(out, gguf.KV{Key: key, Value: v})
}

func writeParse(t *testing.T, kvs []gguf.KV, ts []gguf.WriteTensor) *gguf.File {
	t.Helper()
	var buf bytes.Buffer
	if err := gguf.Write(&buf, kvs, ts); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}
