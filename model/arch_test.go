package model

import (
	"bytes"
	"math"
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
		{"gemma3 architecture", llama, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "general.architecture", "gemma3"), ts
		}, `unsupported architecture "gemma3" (general.architecture)`},
		{"qwen3moe architecture", llama, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "general.architecture", "qwen3moe"), ts
		}, `"qwen3moe"`},
		{"mixtral experts", llama, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "llama.expert_count", uint32(8)), ts
		}, "llama.expert_count = 8: mixture-of-experts"},
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
