package tokenizer

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/strata-llm/strata/model/gguf"
)

// ggufOf writes kvs as a GGUF file in memory and parses it back.
func ggufOf(t *testing.T, kvs []gguf.KV) *gguf.File {
	t.Helper()
	var buf bytes.Buffer
	if err := gguf.Write(&buf, kvs, nil); err != nil {
		t.Fatalf("gguf.Write: %v", err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatalf("gguf.Parse: %v", err)
	}
	return f
}

func spmKVs() []gguf.KV {
	v := tinySPM()
	return []gguf.KV{
		{Key: KeyModel, Value: ModelSPM},
		{Key: KeyTokens, Value: v.Tokens},
		{Key: KeyScores, Value: v.Scores},
		{Key: KeyTokenType, Value: v.Types},
	}
}

func bpeKVs() []gguf.KV {
	v := tinyBPE()
	return []gguf.KV{
		{Key: KeyModel, Value: ModelBPE},
		{Key: KeyPre, Value: "gpt-2"},
		{Key: KeyTokens, Value: v.Tokens},
		{Key: KeyTokenType, Value: v.Types},
		{Key: KeyMerges, Value: v.Merges},
	}
}

func set(kvs []gguf.KV, key string, val any) []gguf.KV {
	out := make([]gguf.KV, 0, len(kvs)+1)
	found := false
	for _, kv := range kvs {
		if kv.Key == key {
			found = true
			if val == nil {
				continue // delete
			}
			kv.Value = val
		}
		out = append(out, kv)
	}
	if !found && val != nil {
		out = append(out, gguf.KV{Key: key, Value: val})
	}
	return out
}

func TestFromGGUFDefaults(t *testing.T) {
	tok, err := FromGGUF(ggufOf(t, spmKVs()))
	if err != nil {
		t.Fatal(err)
	}
	// llama.cpp's SPM defaults: BOS 1, EOS 2, UNK 0, add BOS, space prefix.
	if tok.BOS() != 1 || tok.EOS() != 2 || tok.UNK() != 0 || tok.PAD() != -1 || !tok.AddBOS() || tok.AddEOS() {
		t.Errorf("SPM defaults: BOS %d EOS %d UNK %d PAD %d AddBOS %v AddEOS %v", tok.BOS(), tok.EOS(), tok.UNK(), tok.PAD(), tok.AddBOS(), tok.AddEOS())
	}
	if got := tok.Encode("ab", EncodeOptions{AddSpecial: true}); len(got) != 2 || got[1] != 264 {
		t.Errorf("Encode = %v, want [1 264]", got)
	}

	// Keys override; an ID out of range keeps the default; int32 scores
	// are accepted.
	kvs := set(spmKVs(), KeyAddPrefix, false)
	kvs = set(kvs, KeyAddBOS, false)
	kvs = set(kvs, KeyAddEOS, true)
	kvs = set(kvs, KeyEOS, uint32(1<<31))
	kvs = set(kvs, KeyPAD, uint32(2))
	kvs = set(kvs, KeyScores, make([]int32, len(tinySPM().Tokens)))
	tok, err = FromGGUF(ggufOf(t, kvs))
	if err != nil {
		t.Fatal(err)
	}
	if tok.EOS() != 2 || tok.PAD() != 2 || tok.AddBOS() || !tok.AddEOS() {
		t.Errorf("overrides: EOS %d PAD %d AddBOS %v AddEOS %v", tok.EOS(), tok.PAD(), tok.AddBOS(), tok.AddEOS())
	}
	if got := tok.Encode("a", EncodeOptions{AddSpecial: true}); len(got) != 2 || got[0] != 260 || got[1] != 2 {
		t.Errorf("Encode without prefix = %v, want [260 2]", got)
	}

	tok, err = FromGGUF(ggufOf(t, bpeKVs()))
	if err != nil {
		t.Fatal(err)
	}
	// GPT-2: BOS and EOS default to 11 and no BOS is added.
	if tok.BOS() != 11 || tok.AddBOS() {
		t.Errorf("BPE defaults: BOS %d AddBOS %v", tok.BOS(), tok.AddBOS())
	}
	tok, err = FromGGUF(ggufOf(t, set(bpeKVs(), KeyPre, "llama-bpe")))
	if err != nil {
		t.Fatal(err)
	}
	if !tok.AddBOS() {
		t.Errorf("llama-bpe: AddBOS false, want llama.cpp's default true")
	}
}

func TestFromGGUFErrors(t *testing.T) {
	tests := []struct {
		name string
		kvs  []gguf.KV
		is   error
		key  string
	}{
		{"no model", set(spmKVs(), KeyModel, nil), gguf.ErrNotFound, KeyModel},
		{"model type", set(spmKVs(), KeyModel, uint32(1)), gguf.ErrWrongType, KeyModel},
		{"unknown model", set(spmKVs(), KeyModel, "bert"), ErrUnsupported, KeyModel},
		{"no tokens", set(spmKVs(), KeyTokens, nil), gguf.ErrNotFound, KeyTokens},
		{"short scores", set(spmKVs(), KeyScores, []float32{1}), ErrInvalid, KeyScores},
		{"types type", set(spmKVs(), KeyTokenType, []string{"x"}), gguf.ErrWrongType, KeyTokenType},
		{"bos type", set(spmKVs(), KeyBOS, "one"), gguf.ErrWrongType, KeyBOS},
		{"add bos type", set(spmKVs(), KeyAddBOS, uint8(1)), gguf.ErrWrongType, KeyAddBOS},
		// chatglm-bpe has no default BOS.
		{"add bos no bos", set(set(bpeKVs(), KeyPre, "chatglm-bpe"), KeyAddBOS, true), ErrInvalid, KeyAddBOS},
		{"no merges", set(bpeKVs(), KeyMerges, nil), gguf.ErrNotFound, KeyMerges},
		{"unknown pre", set(bpeKVs(), KeyPre, "tekken"), ErrUnsupported, KeyPre},
	}
	for _, tc := range tests {
		_, err := FromGGUF(ggufOf(t, tc.kvs))
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.is)
		}
		if !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: err = %v, want it to name %s", tc.name, err, tc.key)
		}
	}
}
