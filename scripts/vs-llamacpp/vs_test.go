package main

import (
	"bytes"
	"encoding/binary"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

func TestTop2SkipsEOGAndBreaksTiesLow(t *testing.T) {
	logits := []float32{0.5, 3, 9, 3, 1} // token 2 is the end-of-generation token
	best, second := top2(logits, func(id int32) bool { return id == 2 })
	if best != 1 || second != 3 {
		t.Fatalf("top2 = %d, %d; want 1, 3 (2 skipped, the tie to the lower ID)", best, second)
	}
}

func TestAlignLeavesTokensWithoutListNil(t *testing.T) {
	var c completion
	c.Tokens = []int32{7, 8, 9}
	for _, id := range []int32{7, 8} { // the last token ends inside a UTF-8 sequence: no list
		c.Probs = append(c.Probs, struct {
			ID  int32     `json:"id"`
			Top []tokenLP `json:"top_logprobs"`
		}{ID: id, Top: []tokenLP{{ID: id, Logprob: -0.5}}})
	}
	top := align(c)
	if len(top) != 3 || top[0][0].ID != 7 || top[1][0].ID != 8 || top[2] != nil {
		t.Fatalf("align = %v", top)
	}
}

func TestLogSoftmax(t *testing.T) {
	lp := logSoftmax([]float32{1, 2, 3, 1000})
	var sum float64
	for _, v := range lp {
		sum += math.Exp(v)
	}
	if math.Abs(sum-1) > 1e-12 || math.Abs(lp[3]) > 1e-12 {
		t.Fatalf("logSoftmax = %v (sum of exp %v)", lp, sum)
	}
}

// TestScaleHead: the head is multiplied by k, everything else is kept.
func TestScaleHead(t *testing.T) {
	dir := t.TempDir()
	spec := model.RandomSpec{Layers: 1, Embd: 64, Heads: 2, HeadsKV: 1, FF: 64, Vocab: 300, Context: 64, Type: ggml.F32, Seed: 3}
	a, b := filepath.Join(dir, "a.gguf"), filepath.Join(dir, "b.gguf")
	for _, p := range []string{a, b} {
		if err := model.WriteRandomFile(p, spec); err != nil {
			t.Fatal(err)
		}
	}
	if err := scaleHead(b, 4); err != nil {
		t.Fatal(err)
	}
	fa, err := gguf.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := gguf.Open(b)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	if len(fa.KV) != len(fb.KV) || len(fa.Tensors) != len(fb.Tensors) {
		t.Fatalf("%d KVs, %d tensors after scaling; want %d, %d", len(fb.KV), len(fb.Tensors), len(fa.KV), len(fa.Tensors))
	}
	for i, ta := range fa.Tensors {
		tb := fb.Tensors[i]
		if ta.Name != tb.Name || ta.Type != tb.Type || !slices.Equal(ta.Dims, tb.Dims) {
			t.Fatalf("tensor %d: %s %v %v, want %s %v %v", i, tb.Name, tb.Type, tb.Dims, ta.Name, ta.Type, ta.Dims)
		}
		if ta.Name != "output.weight" {
			if !bytes.Equal(ta.Data, tb.Data) {
				t.Errorf("%s changed", ta.Name)
			}
			continue
		}
		for j := 0; j < len(ta.Data); j += 4 {
			x := math.Float32frombits(binary.LittleEndian.Uint32(ta.Data[j:]))
			y := math.Float32frombits(binary.LittleEndian.Uint32(tb.Data[j:]))
			if y != 4*x {
				t.Fatalf("output.weight[%d] = %v, want 4×%v", j/4, y, x)
			}
		}
	}
}

// TestSizedSpec: the speed sizes fit their architectures, the MoE shape
// has 8 experts of 2048, 2 per token, at about half a billion parameters,
// and the mismatches are refused.
func TestSizedSpec(t *testing.T) {
	for _, arch := range []string{"qwen2moe", "qwen3moe", "mixtral"} {
		s, err := sizedSpec(arch, "moe", 1)
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		ff := s.ExpertFF
		if arch == "mixtral" {
			ff = s.FF
		}
		kv := s.HeadsKV * s.Embd / s.Heads
		layer := 3*s.Experts*s.Embd*ff + s.Experts*s.Embd + 2*s.Embd*s.Embd + 2*s.Embd*kv + 3*s.Embd*s.SharedFF
		if p := s.Layers*layer + 2*s.Vocab*s.Embd; s.Experts != 8 || s.ExpertsUsed != 2 || ff != 2048 || p < 0.5e9 || p > 0.6e9 {
			t.Errorf("%s: %d experts, %d used, %d wide, %d parameters", arch, s.Experts, s.ExpertsUsed, ff, p)
		}
		if _, err := sizedSpec(arch, "110M", 1); err == nil {
			t.Errorf("%s --size 110M: no error", arch)
		}
	}
	for _, arch := range []string{"llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"} {
		s, err := sizedSpec(arch, "110M", 1)
		if err != nil || s.Layers != 12 || s.Embd != 768 || s.SlidingWindow != 1024 {
			t.Errorf("%s --size 110M: %+v, %v", arch, s, err)
		}
		if _, err := sizedSpec(arch, "moe", 1); err == nil {
			t.Errorf("%s --size moe: no error", arch)
		}
	}
	if _, err := sizedSpec("llama", "7B", 1); err == nil {
		t.Error("--size 7B: no error")
	}
}
