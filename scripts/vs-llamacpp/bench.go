package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"

	"github.com/strata-llm/strata/coordinator"
	"github.com/strata-llm/strata/model/cpu/bench"
	"github.com/strata-llm/strata/model/ggml"
)

// benchFile measures strata on one file the way `coordinator generate
// --bench` measures its generated ones: pp128 and tg64 from an empty cache
// (medians of --reps after a warm-up), and the end-to-end row, tg64 through
// `generate`'s whole path (sampler, detokenizer). It prints one JSON line.
func benchFile(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	path := fs.String("model", "", "GGUF file")
	threads := fs.Int("threads", 2, "worker threads")
	reps := fs.Int("reps", 3, "repetitions (the median is reported)")
	depth := fs.Int("depth", 0, "tokens of context cached before pp128 and tg64 (llama-bench's -d); the e2e row is measured only at 0")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" {
		return errors.New("bench: --model is required")
	}
	r, err := bench.Run(ctx, bench.Config{Path: *path, Threads: *threads, Reps: *reps, KVType: ggml.F16, Depth: *depth})
	if err != nil {
		return err
	}
	out := map[string]any{
		"model": *path, "threads": r.Threads, "kernels": r.ISA, "pp128": r.PP, "tg64": r.TG,
		"cpu": bench.CPU(), "load_s": r.LoadTime.Seconds(), "load_rss_mb": loadRSS(r), "file_mb": float64(r.FileBytes) / 1e6,
	}
	if *depth > 0 {
		out["depth"] = *depth
		return json.NewEncoder(os.Stdout).Encode(out)
	}
	gc := coordinator.DefaultGenerateConfig()
	gc.Model, gc.Threads, gc.MaxTokens, gc.IgnoreEOS = *path, *threads, 65, true // the first token comes from prefill
	var tps []float64
	for i := range max(*reps, 1) + 1 {
		st, err := coordinator.Generate(ctx, gc)
		if err != nil {
			return err
		}
		if st.GeneratedTokens != 65 {
			return fmt.Errorf("bench: generated %d tokens, want 65", st.GeneratedTokens)
		}
		if i > 0 { // the first is a warm-up
			tps = append(tps, st.GenerateTPS())
		}
	}
	slices.Sort(tps)
	out["e2e"] = tps[len(tps)/2]
	return json.NewEncoder(os.Stdout).Encode(out)
}

// loadRSS is how many MB the resident set grew over the load (bench.Result's
// LoadRSS), or nil where it was not measured.
func loadRSS(r bench.Result) any {
	if !r.RSSKnown {
		return nil
	}
	return float64(r.LoadRSS) / 1e6
}
