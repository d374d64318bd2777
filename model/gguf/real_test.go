package gguf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-llm/strata/model/ggml"
)

// sharedDir is the shared test data directory, relative to this package.
const sharedDir = "../../../shared"

// sharedFiles returns the GGUF files matching pattern under sharedDir, or
// skips the test when there are none.
func sharedFiles(t testing.TB, pattern string) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(sharedDir, pattern))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		sharedAbsent(t, filepath.Join(sharedDir, pattern), errors.New("no file matches"))
	}
	return paths
}

func TestOpenStories(t *testing.T) {
	paths := sharedFiles(t, "models/stories260K*.gguf")
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			checkStories(t, f)
			if testing.Verbose() && filepath.Base(path) == "stories260K.gguf" {
				for _, kv := range f.KV {
					t.Logf("kv %s = %s", kv.Key, fmtValue(kv.Value))
				}
				for _, tn := range f.Tensors {
					t.Logf("tensor %-24s %-5s %v offset %d", tn.Name, tn.Type, tn.Dims, tn.Offset)
				}
			}
		})
	}
}

func fmtValue(v any) string {
	switch x := v.(type) {
	case []string:
		return fmt.Sprintf("[]string(len %d)", len(x))
	case []float32:
		return fmt.Sprintf("[]float32(len %d)", len(x))
	case []int32:
		return fmt.Sprintf("[]int32(len %d)", len(x))
	case string:
		if len(x) > 40 {
			x = x[:40] + "..."
		}
		return "\"" + x + "\""
	}
	return fmt.Sprint(v)
}

func checkStories(t *testing.T, f *File) {
	t.Helper()
	if f.Version != 2 && f.Version != 3 {
		t.Errorf("Version = %d", f.Version)
	}
	arch, err := f.Architecture()
	if err != nil || arch != "llama" {
		t.Errorf("Architecture() = %q, %v; want llama", arch, err)
	}
	for key, want := range map[string]uint64{
		"llama.block_count":             5,
		"llama.embedding_length":        64,
		"llama.feed_forward_length":     172,
		"llama.attention.head_count":    8,
		"llama.attention.head_count_kv": 4,
	} {
		got, err := f.Uint(key)
		if err != nil || got != want {
			t.Errorf("Uint(%q) = %d, %v; want %d", key, got, err, want)
		}
		if gi, err := f.Int(key); err != nil || gi != int64(want) {
			t.Errorf("Int(%q) = %d, %v; want %d", key, gi, err, want)
		}
		if gf, err := f.Float(key); err != nil || gf != float64(want) {
			t.Errorf("Float(%q) = %v, %v; want %d", key, gf, err, want)
		}
	}
	toks, err := f.Strings("tokenizer.ggml.tokens")
	if err != nil || len(toks) != 512 {
		t.Errorf("Strings(tokenizer.ggml.tokens) = %d strings, %v; want 512", len(toks), err)
	}
	if eps, err := f.Float("llama.attention.layer_norm_rms_epsilon"); err != nil || eps <= 0 || eps > 1e-3 {
		t.Errorf("Float(rms eps) = %v, %v", eps, err)
	}
	if scores, err := f.Float32s("tokenizer.ggml.scores"); err != nil || len(scores) != 512 {
		t.Errorf("Float32s(scores) = %d, %v", len(scores), err)
	}
	if types, err := f.Int32s("tokenizer.ggml.token_type"); err != nil || len(types) != 512 {
		t.Errorf("Int32s(token_type) = %d, %v", len(types), err)
	}
	emb, err := f.Tensor("token_embd.weight")
	if err != nil {
		t.Fatal(err)
	}
	if emb.RowLen() != 64 || emb.Rows() != 512 || len(emb.Dims) != 2 {
		t.Errorf("token_embd.weight dims %v: RowLen %d Rows %d", emb.Dims, emb.RowLen(), emb.Rows())
	}
	if _, err := f.Tensor("no.such.tensor"); err == nil || !strings.Contains(err.Error(), `"no.such.tensor"`) {
		t.Errorf("Tensor(missing) error = %v, want one naming the tensor", err)
	}
	checkTensors(t, f)
}

// checkTensors checks the invariants every parsed tensor must meet.
func checkTensors(t testing.TB, f *File) {
	t.Helper()
	for _, tn := range f.Tensors {
		if !tn.Type.Known() {
			t.Errorf("%s: unknown type %v", tn.Name, tn.Type)
		}
		rb, err := tn.Type.RowBytes(tn.RowLen())
		if err != nil || rb != tn.RowBytes() {
			t.Errorf("%s: RowBytes %d, ggml says %d, %v", tn.Name, tn.RowBytes(), rb, err)
		}
		if len(tn.Data) != tn.Rows()*tn.RowBytes() {
			t.Errorf("%s: %d bytes, want %d rows of %d", tn.Name, len(tn.Data), tn.Rows(), tn.RowBytes())
		}
		if tn.Offset < f.DataOffset || tn.Offset%f.Alignment != 0 {
			t.Errorf("%s: offset %d (data section %d, alignment %d)", tn.Name, tn.Offset, f.DataOffset, f.Alignment)
		}
		if len(tn.Data) > 0 && &tn.Data[0] != &f.data[tn.Offset] {
			t.Errorf("%s: Data is not a view of the file at its offset", tn.Name)
		}
		if r := tn.Row(tn.Rows() - 1); len(r) != tn.RowBytes() || cap(r) != len(r) {
			t.Errorf("%s: last row len %d cap %d, want %d", tn.Name, len(r), cap(r), tn.RowBytes())
		}
		if tn.Elements() != uint64(tn.RowLen())*uint64(tn.Rows()) {
			t.Errorf("%s: Elements %d != RowLen %d * Rows %d", tn.Name, tn.Elements(), tn.RowLen(), tn.Rows())
		}
	}
}

func TestOpenStoriesTypes(t *testing.T) {
	sharedFiles(t, "models/stories260K.gguf")
	for name, want := range map[string]ggml.Type{
		"stories260K.gguf":      ggml.F32,
		"stories260K-F16.gguf":  ggml.F16,
		"stories260K-BF16.gguf": ggml.BF16,
		"stories260K-Q8_0.gguf": ggml.Q8_0,
		"stories260K-Q4_0.gguf": ggml.Q4_0,
	} {
		f, err := Open(filepath.Join(sharedDir, "models", name))
		if err != nil {
			t.Fatal(err)
		}
		tn, err := f.Tensor("blk.0.attn_q.weight")
		if err != nil {
			t.Fatal(err)
		}
		if tn.Type != want {
			t.Errorf("%s: blk.0.attn_q.weight type %v, want %v", name, tn.Type, want)
		}
		if err := f.Close(); err != nil {
			t.Error(err)
		}
		if tn.Data != nil {
			t.Errorf("%s: Data not nil after Close", name)
		}
		if err := f.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	}
}

func TestOpenVocab(t *testing.T) {
	for _, path := range sharedFiles(t, "tokenizers/ggml-vocab-*.gguf") {
		t.Run(filepath.Base(path), func(t *testing.T) {
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if len(f.Tensors) != 0 {
				t.Errorf("%d tensors, want 0", len(f.Tensors))
			}
			toks, err := f.Strings("tokenizer.ggml.tokens")
			if err != nil || len(toks) < 1000 {
				t.Errorf("tokens: %d, %v", len(toks), err)
			}
			model, err := f.String("tokenizer.ggml.model")
			if err != nil {
				t.Error(err)
			}
			t.Logf("v%d model %q, %d tokens, %d kvs", f.Version, model, len(toks), len(f.KV))
		})
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Open(filepath.Join(dir, "absent.gguf")); err == nil {
		t.Error("Open(absent) succeeded")
	}
	empty := filepath.Join(dir, "empty.gguf")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(empty); err == nil || !strings.Contains(err.Error(), empty) {
		t.Errorf("Open(empty) error = %v, want one naming the path", err)
	}
	if _, err := Open(dir); err == nil {
		t.Error("Open(dir) succeeded")
	}
}
