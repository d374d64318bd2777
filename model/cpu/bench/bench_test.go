package bench

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

func TestRunSmall(t *testing.T) {
	spec := model.RandomSpec{Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Type: ggml.Q8_0, Seed: 1}
	res, err := Run(context.Background(), Config{Spec: spec, Threads: 2, Prompt: 16, Gen: 4, Batches: []int{1, 3}, Reps: 1, KVType: ggml.F16})
	if err != nil {
		t.Fatal(err)
	}
	if res.PP <= 0 || res.TG <= 0 || len(res.Batched) != 2 || res.Batched[1].TokPerSec <= 0 || res.WeightBytes <= 0 {
		t.Fatalf("result %+v", res)
	}
}

// TestRunDepth: with Depth, pp and tg run after that much context, in a
// table Run sizes for it (a short one is a bad batch), prefilled in chunks
// of Prompt (40 = 16 + 16 + 8).
func TestRunDepth(t *testing.T) {
	spec := model.RandomSpec{Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Type: ggml.Q8_0, Seed: 1}
	res, err := Run(context.Background(), Config{Spec: spec, Threads: 2, Prompt: 16, Gen: 4, Depth: 40, Reps: 1, KVType: ggml.F16})
	if err != nil {
		t.Fatal(err)
	}
	if res.PP <= 0 || res.TG <= 0 {
		t.Fatalf("result %+v", res)
	}
	if _, err := Run(context.Background(), Config{Spec: spec, Threads: 1, Depth: -1, KVType: ggml.F16}); err == nil || !strings.Contains(err.Error(), "depth -1") {
		t.Fatalf("a negative depth: %v", err)
	}
}

// BenchmarkReference prints issue 7's table for the 110 M shape: go test
// -run XXX -bench Reference ./model/cpu/bench/ -benchtime 1x.
func BenchmarkReference(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		for _, threads := range []int{1, 2} {
			bw, err := Bandwidth(ctx, threads, 3)
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("triad bandwidth, %d threads: %.1f GB/s", threads, bw)
		}
		for _, typ := range []ggml.Type{ggml.F32, ggml.Q8_0, ggml.Q4_0} {
			for _, threads := range []int{1, 2} {
				cfg := Config{Spec: Spec110M(typ), Threads: threads, KVType: ggml.F16}
				if threads == 2 {
					cfg.Batches = []int{1, 4, 8, 16}
				}
				res, err := Run(ctx, cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.Logf("%v %d threads (%s): pp128 %.1f tok/s, tg64 %.1f tok/s (%.1f GB/s of %d MB weights)", typ, threads, res.ISA, res.PP, res.TG, res.TGGBps, res.WeightBytes>>20)
				for _, bd := range res.Batched {
					b.Logf("  batched decode %2d seqs: %.1f tok/s, %.2f ms/step", bd.Seqs, bd.TokPerSec, bd.StepMs)
				}
			}
		}
	}
}

// BenchmarkBatchedDecode logs batched decode of the 110 M Q8_0 model at 1,
// 4, 8 and 16 sequences on 2 threads.
func BenchmarkBatchedDecode(b *testing.B) {
	for b.Loop() {
		res, err := Run(context.Background(), Config{Spec: Spec110M(ggml.Q8_0), Threads: 2, Gen: 32, Batches: []int{1, 4, 8, 16}, Reps: 3, KVType: ggml.F16})
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("Q8_0 2 threads (%s): pp128 %.1f tok/s, tg %.1f tok/s (%.1f GB/s)", res.ISA, res.PP, res.TG, res.TGGBps)
		for _, bd := range res.Batched {
			b.Logf("batched decode %2d seqs: %.1f tok/s, %.2f ms/step", bd.Seqs, bd.TokPerSec, bd.StepMs)
		}
	}
}

func TestCPUInfo(t *testing.T) {
	p := filepath.Join(t.TempDir(), "cpuinfo")
	text := "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\n"
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	name, vendor := cpuinfo(p)
	if name != "Intel(R) Xeon(R) Platinum 8488C" || vendor != "GenuineIntel" {
		t.Errorf("cpuinfo = %q, %q", name, vendor)
	}
	if name, vendor := cpuinfo(filepath.Join(t.TempDir(), "absent")); name != "" || vendor != "" {
		t.Errorf("absent file: %q, %q", name, vendor)
	}
	if got := CPU(); !strings.Contains(got, "CPUs") {
		t.Errorf("CPU() = %q", got)
	}
}

// TestKMix pins Q4_K_M's rules on the 110M shape: Q6_K for the output head
// and for attn_v and ffn_down in layers 0, 3, 6, 9, 10 and 11 (what
// llama-quantize's use_more_bits picks of 12 layers), Q4_K elsewhere.
func TestKMix(t *testing.T) {
	k, err := ParseKind("q4_k_m")
	if err != nil {
		t.Fatal(err)
	}
	spec := k.Mix(Spec110M(ggml.F32))
	if spec.Type != ggml.Q4_K || spec.Types["output.weight"] != ggml.Q6_K {
		t.Fatalf("%v %v", spec.Type, spec.Types)
	}
	var more []int
	for i := range spec.Layers {
		v, vok := spec.Types["blk."+strconv.Itoa(i)+".attn_v.weight"]
		d, dok := spec.Types["blk."+strconv.Itoa(i)+".ffn_down.weight"]
		if vok != dok || (vok && (v != ggml.Q6_K || d != ggml.Q6_K)) {
			t.Fatalf("layer %d: attn_v %v %v, ffn_down %v %v", i, v, vok, d, dok)
		}
		if vok {
			more = append(more, i)
		}
	}
	if want := []int{0, 3, 6, 9, 10, 11}; !slices.Equal(more, want) {
		t.Errorf("Q6_K layers %v, want %v", more, want)
	}
	if len(spec.Types) != 13 {
		t.Errorf("%d overrides, want 13", len(spec.Types))
	}
	for _, bad := range []string{"Q8_K", "Q4_K_S", "IQ4_XS_S", ""} {
		if _, err := ParseKind(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestOtherMixes pins Q3_K_M's and IQ4_XS's rules on the 110M shape (12
// layers: no layer in the first sixteenth, one in the first eighth).
func TestOtherMixes(t *testing.T) {
	for _, c := range []struct {
		name      string
		base      ggml.Type
		overrides map[string]ggml.Type
	}{
		{"Q3_K_M", ggml.Q3_K, map[string]ggml.Type{
			"output.weight": ggml.Q6_K, "attn_output.weight": ggml.Q4_K,
			"blk.0.attn_v.weight": ggml.Q5_K, "blk.1.attn_v.weight": ggml.Q5_K, "blk.2.attn_v.weight": ggml.Q4_K,
			"blk.11.attn_v.weight": ggml.Q4_K, "blk.0.ffn_down.weight": ggml.Q4_K, "blk.11.ffn_down.weight": ggml.Q4_K,
		}},
		{"IQ4_XS_M", ggml.IQ4_XS, map[string]ggml.Type{
			"output.weight": ggml.Q6_K, "blk.0.ffn_down.weight": ggml.Q5_K,
		}},
	} {
		k, err := ParseKind(c.name)
		if err != nil {
			t.Fatal(err)
		}
		spec := k.Mix(Spec110M(ggml.F32))
		if spec.Type != c.base {
			t.Errorf("%s: base %v, want %v", c.name, spec.Type, c.base)
		}
		for name, want := range c.overrides {
			if got := spec.Types[name]; got != want {
				t.Errorf("%s: %s is %v, want %v", c.name, name, got, want)
			}
		}
		if c.name == "IQ4_XS_M" && len(spec.Types) != 2 {
			t.Errorf("IQ4_XS_M: %d overrides, want 2: %v", len(spec.Types), spec.Types)
		}
	}
}
