package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/strata-llm/strata/coordinator"
	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// archE2ESpecs are generated models of the architectures beyond llama, with
// heads of another width than Embd/Heads where the architecture has them.
var archE2ESpecs = []model.RandomSpec{
	{Arch: "qwen3", Layers: 4, Embd: 128, Heads: 4, HeadsKV: 2, HeadDim: 64, FF: 256, Vocab: 600, Context: 512, Type: ggml.Q8_0, Seed: 42},
	{Arch: "phi3", Layers: 4, Embd: 128, Heads: 4, HeadsKV: 4, FF: 256, Vocab: 600, Context: 512, Type: ggml.Q8_0, Seed: 42},
	// Sliding layers 0-4 and 6 over 8 positions, layer 5 global.
	{Arch: "gemma3", Layers: 7, Embd: 128, Heads: 4, HeadsKV: 2, HeadDim: 64, FF: 256, Vocab: 600, Context: 512, Type: ggml.Q8_0, Seed: 42},
	// Mixtures of experts: 8 experts of 64, 2 per token; Mixtral's layout
	// with 4 experts of FF.
	{Arch: "qwen3moe", Layers: 4, Embd: 128, Heads: 4, HeadsKV: 2, HeadDim: 64, FF: 256, Experts: 8, ExpertsUsed: 2, ExpertFF: 64, Vocab: 600, Context: 512, Type: ggml.Q8_0, Seed: 42},
	{Arch: "mixtral", Layers: 4, Embd: 128, Heads: 4, HeadsKV: 2, FF: 128, Experts: 4, ExpertsUsed: 2, Vocab: 600, Context: 512, Type: ggml.Q8_0, Seed: 42},
}

func writeSpec(t *testing.T, spec model.RandomSpec) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), spec.Arch+".gguf")
	if err := model.WriteRandomFile(path, spec); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestGenerateArchs: `coordinator generate` runs a generated file of each
// architecture to the token budget.
func TestGenerateArchs(t *testing.T) {
	for _, spec := range archE2ESpecs {
		t.Run(spec.Arch, func(t *testing.T) {
			gc := coordinator.DefaultGenerateConfig()
			gc.Model, gc.MaxTokens, gc.Threads, gc.IgnoreEOS = writeSpec(t, spec), 24, 1, true
			st, err := coordinator.Generate(context.Background(), gc)
			if err != nil {
				t.Fatal(err)
			}
			if st.PromptTokens == 0 || len(st.Tokens) != 24 {
				t.Fatalf("%d prompt tokens, %d generated, want 24", st.PromptTokens, len(st.Tokens))
			}
		})
	}
}

// TestE2EArchsThreeShards: greedy output of generated qwen3, phi3,
// gemma3, qwen3moe and Mixtral-style models through three `shard join` processes (for the 4-layer
// models the split falls between every pair of layers but one) equals the
// single-process output of `coordinator generate`.
func TestE2EArchsThreeShards(t *testing.T) {
	binaries(t) // skips with -short or without the shared files
	for _, spec := range archE2ESpecs {
		t.Run(spec.Arch, func(t *testing.T) {
			path := writeSpec(t, spec)
			gc := coordinator.DefaultGenerateConfig()
			gc.Model, gc.Prompt, gc.MaxTokens, gc.Threads = path, "Once upon a time", 32, 1
			want, err := coordinator.Generate(context.Background(), gc)
			if err != nil {
				t.Fatal(err)
			}
			if len(want.Tokens) < 16 || want.Text == "" {
				t.Fatalf("the generated model ended after %d tokens (%q): too short to compare", len(want.Tokens), want.Text)
			}
			t.Logf("one process: %d tokens, %q", len(want.Tokens), want.Text)
			c := startE2EModel(t, path, 3)
			ctx, cancel := context.WithTimeout(context.Background(), guard(time.Minute))
			defer cancel()
			got, _, err := c.complete(ctx, "Once upon a time", 32, false)
			if err != nil {
				t.Fatal(err)
			}
			if got != want.Text {
				t.Fatalf("three shard processes: %q\none process (%d tokens): %q", got, len(want.Tokens), want.Text)
			}
		})
	}
}
