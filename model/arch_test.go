package model

import (
	"bytes"
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
			if c.Rope != RopeNeoX || !c.QKNorm || c.QKVBias || c.HeadDim != 32 || c.QDim() != 128 || c.KVDim() != 64 || c.RopeDims != 32 || c.RopeBase != 1e6 {
				t.Fatalf("config %+v", c)
			}
			L := m.LayerWeights[1]
			if len(L.QNorm) != 32 || len(L.KNorm) != 32 || L.Q.Rows != 128 || L.O.Cols != 128 {
				t.Fatalf("layer: q norm %d, k norm %d, Q rows %d, O cols %d", len(L.QNorm), len(L.KNorm), L.Q.Rows, L.O.Cols)
			}
		}},
		{arch: "qwen3", check: func(t *testing.T, m *Model) { // key_length equal to Embd/Heads
			if m.HeadDim != 16 || m.QDim() != m.Embd {
				t.Fatalf("config %+v", m.Config)
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

// TestArchRefusals: what strata cannot run is refused at load with one line
// naming the architecture, the key or the tensor.
func TestArchRefusals(t *testing.T) {
	qwen3 := RandomSpec{Arch: "qwen3", Layers: 1, Embd: 64, Heads: 4, HeadsKV: 2, FF: 64, Vocab: 300, Context: 256, Type: ggml.F32, Seed: 3}
	llama := qwen3
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
