package model

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/strata-llm/strata/model/gguf"
)

func metaFile(t *testing.T, arch string, extra map[string]any, drop ...string) *gguf.File {
	t.Helper()
	kv := map[string]any{
		"general.architecture":                     arch,
		arch + ".block_count":                      uint32(4),
		arch + ".embedding_length":                 uint32(64),
		arch + ".feed_forward_length":              uint32(128),
		arch + ".attention.head_count":             uint32(8),
		arch + ".attention.head_count_kv":          uint32(2),
		arch + ".context_length":                   uint32(512),
		arch + ".attention.layer_norm_rms_epsilon": float32(1e-6),
	}
	for k, v := range extra {
		kv[k] = v
	}
	for _, k := range drop {
		delete(kv, k)
	}
	var kvs []gguf.KV
	for k, v := range kv {
		kvs = append(kvs, gguf.KV{Key: k, Value: v})
	}
	var buf bytes.Buffer
	if err := gguf.Write(&buf, kvs, nil); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestConfigFromGGUF(t *testing.T) {
	tests := []struct {
		name    string
		arch    string
		extra   map[string]any
		drop    []string
		check   func(Config) bool
		wantErr string // substring; "" means success
	}{
		{name: "llama defaults", arch: "llama", check: func(c Config) bool {
			return c.HeadDim == 8 && c.KVDim() == 16 && c.RopeBase == 10000 && c.RopeScale == 1 && c.Rope == RopeNormal && c.RopeDims == 8 && !c.QKVBias
		}},
		{name: "qwen2 is NeoX with biases", arch: "qwen2", extra: map[string]any{"qwen2.rope.freq_base": float32(1e6)}, check: func(c Config) bool {
			return c.Rope == RopeNeoX && c.QKVBias && c.RopeBase == 1e6
		}},
		{name: "mistral reads like llama", arch: "mistral", check: func(c Config) bool { return c.Rope == RopeNormal }},
		{name: "linear rope scaling", arch: "llama", extra: map[string]any{"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": float32(4)}, check: func(c Config) bool { return c.RopeScale == 4 }},
		{name: "smollm3 skips rope every 4th layer", arch: "smollm3", check: func(c Config) bool { return c.NoRopeEvery == 4 }},
		{name: "head_count_kv defaults to head_count", arch: "llama", drop: []string{"llama.attention.head_count_kv"}, check: func(c Config) bool { return c.HeadsKV == 8 }},
		{name: "unsupported architecture", arch: "gptneox", wantErr: `"gptneox" (general.architecture)`},
		{name: "missing block count names the key", arch: "llama", drop: []string{"llama.block_count"}, wantErr: "llama.block_count"},
		{name: "zero heads", arch: "llama", extra: map[string]any{"llama.attention.head_count": uint32(0)}, wantErr: "llama.attention.head_count = 0"},
		{name: "heads not dividing embedding", arch: "llama", extra: map[string]any{"llama.attention.head_count": uint32(6), "llama.attention.head_count_kv": uint32(6)}, wantErr: "not a multiple"},
		{name: "kv heads not dividing heads", arch: "llama", extra: map[string]any{"llama.attention.head_count_kv": uint32(3)}, wantErr: "head_count_kv"},
		{name: "huge layer count", arch: "llama", extra: map[string]any{"llama.block_count": uint64(1 << 40)}, wantErr: "want 1..1024"},
		{name: "negative epsilon", arch: "llama", extra: map[string]any{"llama.attention.layer_norm_rms_epsilon": float32(-1)}, wantErr: "layer_norm_rms_epsilon"},
		{name: "unknown rope scaling", arch: "llama", extra: map[string]any{"llama.rope.scaling.type": "yarn"}, wantErr: `"yarn" is not supported`},
		{name: "odd rope dims", arch: "llama", extra: map[string]any{"llama.rope.dimension_count": uint32(7)}, wantErr: "must be even"},
		{name: "wrong value type names the key", arch: "llama", extra: map[string]any{"llama.context_length": "long"}, wantErr: "llama.context_length"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ConfigFromGGUF(metaFile(t, tt.arch, tt.extra, tt.drop...))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Fatalf("config %+v", c)
			}
		})
	}
	if _, err := ConfigFromGGUF(metaFile(t, "falcon", nil)); !errors.Is(err, ErrUnsupportedArch) {
		t.Fatalf("unsupported arch error %v does not wrap ErrUnsupportedArch", err)
	}
}

// TestLoadChecksTensors: a file whose tensors are missing or misshapen is
// refused with an error naming the tensor.
func TestLoadChecksTensors(t *testing.T) {
	if _, err := Load(metaFile(t, "llama", nil)); err == nil || !strings.Contains(err.Error(), "token_embd.weight") {
		t.Fatalf("load without tensors: %v", err)
	}
}
