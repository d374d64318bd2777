package model

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

// retype rewrites the file of spec with tensor name in type typ (random
// block bytes of the right size), as a file llama-quantize made in a type
// strata cannot compute would hold it.
func retype(t *testing.T, spec RandomSpec, name string, typ ggml.Type) *gguf.File {
	t.Helper()
	f, err := RandomFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	var ts []gguf.WriteTensor
	found := false
	for _, tn := range f.Tensors {
		wt := gguf.WriteTensor{Name: tn.Name, Type: tn.Type, Dims: tn.Dims, Data: tn.Data}
		if tn.Name == name {
			found = true
			rb, err := typ.RowBytes(tn.RowLen())
			if err != nil {
				t.Fatal(err)
			}
			wt.Type, wt.Data = typ, make([]byte, rb*tn.Rows())
			for i := range wt.Data {
				wt.Data[i] = byte(r.Uint32())
			}
		}
		ts = append(ts, wt)
	}
	if !found {
		t.Fatalf("no tensor %s", name)
	}
	var buf bytes.Buffer
	if err := gguf.Write(&buf, f.KV, ts); err != nil {
		t.Fatal(err)
	}
	g, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestLoadRefusesUnsupportedType: a file holding a matrix of a type strata
// cannot compute parses, and Load refuses it with one line naming the
// tensor, its type and the types strata computes.
func TestLoadRefusesUnsupportedType(t *testing.T) {
	spec := RandomSpec{Layers: 2, Embd: 256, Heads: 4, HeadsKV: 2, FF: 256, Vocab: 300, Context: 64, Type: ggml.Q4_K, Seed: 5}
	const supported = "F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS"
	for _, c := range []struct {
		tensor string
		typ    ggml.Type
	}{
		{"blk.1.ffn_down.weight", ggml.IQ2_XXS},
		{"blk.0.attn_q.weight", ggml.IQ3_S},
		{"output.weight", ggml.TQ2_0},
		{"token_embd.weight", ggml.IQ1_M},
		{"blk.0.ffn_up.weight", ggml.Q4_1},
	} {
		_, err := Load(retype(t, spec, c.tensor, c.typ))
		want := "model: tensor " + c.tensor + " has type " + c.typ.String() + ", which strata cannot compute; supported: " + supported
		if err == nil || err.Error() != want {
			t.Errorf("Load: %v\nwant: %s", err, want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("the refusal is not one line: %q", err)
		}
	}
}

// TestRandomSpecTypes: per-tensor overrides and llama-quantize's fallbacks
// shape a Q4_K_M-like file (Q6_K on attn_v, the first layer's ffn_down and
// the output; rows of 288 cannot hold super-blocks, so ffn_down falls back
// to Q8_0 or Q5_0), and an override strata cannot write is refused.
func TestRandomSpecTypes(t *testing.T) {
	spec := RandomSpec{Layers: 2, Embd: 256, Heads: 4, HeadsKV: 2, FF: 288, Vocab: 300, Context: 64, Type: ggml.Q4_K, Seed: 6,
		Types: map[string]ggml.Type{"attn_v.weight": ggml.Q6_K, "blk.0.ffn_down.weight": ggml.Q6_K, "output.weight": ggml.Q6_K, "token_embd.weight": ggml.Q5_K}}
	f, err := RandomFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]ggml.Type{
		"token_embd.weight":     ggml.Q5_K,
		"output.weight":         ggml.Q6_K,
		"output_norm.weight":    ggml.F32,
		"blk.0.attn_q.weight":   ggml.Q4_K,
		"blk.0.attn_v.weight":   ggml.Q6_K,
		"blk.1.attn_v.weight":   ggml.Q6_K,
		"blk.0.ffn_up.weight":   ggml.Q4_K,
		"blk.0.ffn_down.weight": ggml.Q8_0, // Q6_K's fallback
		"blk.1.ffn_down.weight": ggml.Q5_0, // Q4_K's
		"blk.1.ffn_norm.weight": ggml.F32,
	}
	for name, typ := range want {
		tn, err := f.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		if tn.Type != typ {
			t.Errorf("%s: %s, want %s", name, tn.Type, typ)
		}
	}
	if _, err := Load(f); err != nil {
		t.Fatal(err)
	}
	spec.Types = map[string]ggml.Type{"ffn_up.weight": ggml.IQ2_XXS}
	if err := spec.Validate(); err == nil || !strings.Contains(err.Error(), `Types["ffn_up.weight"]`) {
		t.Errorf("Validate: %v, want a refusal naming Types[\"ffn_up.weight\"]", err)
	}
}
