package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/strata-llm/strata/coordinator"
	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// TestE2EThreeShardsGeneratedModel: greedy output of a generated 8-layer
// model in F32 and Q8_0 through three `shard join` processes equals the
// single-process output of `coordinator generate`.
func TestE2EThreeShardsGeneratedModel(t *testing.T) {
	binaries(t) // skips with -short or without the shared files
	for _, typ := range []ggml.Type{ggml.F32, ggml.Q8_0} {
		t.Run(typ.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "gen.gguf")
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			spec := model.RandomSpec{Layers: 8, Embd: 128, Heads: 8, HeadsKV: 4, FF: 256, Vocab: 600, Context: 512, Type: typ, Seed: 42}
			if err := model.WriteRandom(f, spec); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			gc := coordinator.DefaultGenerateConfig()
			gc.Model, gc.Prompt, gc.MaxTokens, gc.Threads = path, "Once upon a time", 40, 1
			want, err := coordinator.Generate(context.Background(), gc)
			if err != nil {
				t.Fatal(err)
			}
			if len(want.Tokens) < 20 || want.Text == "" {
				t.Fatalf("the generated model ended after %d tokens (%q): too short to compare", len(want.Tokens), want.Text)
			}
			t.Logf("one process: %d tokens, %q", len(want.Tokens), want.Text)
			c := startE2EModel(t, path, 3)
			ctx, cancel := context.WithTimeout(context.Background(), guard(time.Minute))
			defer cancel()
			body := fmt.Sprintf("%d generated tokens", len(want.Tokens))
			got, _, err := c.complete(ctx, "Once upon a time", 40, false)
			if err != nil {
				t.Fatal(err)
			}
			if got != want.Text {
				t.Fatalf("three shard processes: %q\none process (%s): %q", got, body, want.Text)
			}
		})
	}
}
