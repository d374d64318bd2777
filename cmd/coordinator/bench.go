package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/strata-llm/strata/coordinator"
	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu/bench"
	"github.com/strata-llm/strata/model/ggml"
)

// benchConfig is `coordinator generate --bench`: the CPU speed table of
// issue 7 on generated models.
type benchConfig struct {
	Sizes   []string     // 15M, 110M, 1B, moe1B
	Types   []bench.Kind // F32, Q8_0, Q4_K_M, ...
	Threads []int
	Batches []int // batched decode sequence counts
	Reps    int
}

func parseList[T any](s string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := parse(f)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func parseBenchConfig(sizes, types, threads, batches string, reps int) (benchConfig, error) {
	cfg := benchConfig{Reps: reps}
	var err error
	if cfg.Sizes, err = parseList(sizes, func(s string) (string, error) {
		switch s {
		case "15M", "110M", "1B", "moe1B":
			return s, nil
		}
		return "", fmt.Errorf("--bench-sizes: want 15M, 110M, 1B or moe1B, got %q", s)
	}); err != nil {
		return cfg, err
	}
	if cfg.Types, err = parseList(types, func(s string) (bench.Kind, error) {
		k, err := bench.ParseKind(s)
		if err != nil {
			return k, fmt.Errorf("--bench-types: %w", err)
		}
		return k, nil
	}); err != nil {
		return cfg, err
	}
	positive := func(flag string) func(string) (int, error) {
		return func(s string) (int, error) {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return 0, fmt.Errorf("%s: want positive integers, got %q", flag, s)
			}
			return n, nil
		}
	}
	if cfg.Threads, err = parseList(threads, positive("--bench-threads")); err != nil {
		return cfg, err
	}
	if cfg.Batches, err = parseList(batches, positive("--bench-batches")); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// runBench measures every size × type × thread count and prints a Markdown
// table with prompt processing (pp128), generation (tg64), the same
// generation through the whole one-process path a user runs (`generate`:
// forward, sampler, detokenizer; "e2e"), batched decode, the bytes of
// weights one generated token streams (a mixture-of-experts layer counts
// only its chosen experts' matrices, ExpertsUsed of Experts) and the weight
// bandwidth of generation beside the machine's triad bandwidth measured in
// the same run. The first line names the CPU: SIMD costs differ by vendor.
// An e2e figure more than 15 % below tg64 means the path around the kernels
// costs what it should not (issue 11: a dirty AVX state made the sampler's
// scalar code 10× slower on Intel) and is flagged in the table.
func runBench(ctx context.Context, cfg benchConfig, out io.Writer) error {
	specs := map[string]func(ggml.Type) model.RandomSpec{"15M": bench.Spec15M, "110M": bench.Spec110M, "1B": bench.Spec1B, "moe1B": bench.SpecMoE1B}
	fmt.Fprintf(out, "CPU: %s\n\n", bench.CPU())
	bw := map[int]float64{}
	for _, th := range cfg.Threads {
		v, err := bench.Bandwidth(ctx, th, 3)
		if err != nil {
			return err
		}
		bw[th] = v
	}
	head := "| model | type | threads | kernels | pp128 tok/s | tg64 tok/s | e2e tok/s | e2e/tg64 | weights MB/token | weights GB/s (triad) | load RSS / file MB (s) |"
	sep := "|---|---|---|---|---|---|---|---|---|---|---|"
	for _, n := range cfg.Batches {
		head += fmt.Sprintf(" %d seqs ms/step |", n)
		sep += "---|"
	}
	fmt.Fprintln(out, head)
	fmt.Fprintln(out, sep)
	dir, err := os.MkdirTemp("", "strata-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, size := range cfg.Sizes {
		for _, typ := range cfg.Types {
			spec := typ.Mix(specs[size](ggml.F32))
			path := filepath.Join(dir, fmt.Sprintf("%s-%s.gguf", size, typ.Name))
			if err := model.WriteRandomFile(path, spec); err != nil {
				return fmt.Errorf("bench %s %s: %w", size, typ.Name, err)
			}
			for _, th := range cfg.Threads {
				r, err := bench.Run(ctx, bench.Config{Spec: spec, Path: path, Threads: th, Batches: cfg.Batches, Reps: cfg.Reps, KVType: ggml.F16})
				if err != nil {
					return fmt.Errorf("bench %s %s %d threads: %w", size, typ.Name, th, err)
				}
				e2e, err := benchGenerate(ctx, path, th, 64, cfg.Reps)
				if err != nil {
					return fmt.Errorf("bench %s %s %d threads, generate: %w", size, typ.Name, th, err)
				}
				ratio := fmt.Sprintf("%.2f", e2e/r.TG)
				if e2e < 0.85*r.TG {
					ratio += " (gap > 15 %)"
				}
				line := fmt.Sprintf("| %s | %s | %d | %s | %.1f | %.1f | %.1f | %s | %.1f | %.1f (%.1f) | %s |", size, typ.Name, th, r.ISA, r.PP, r.TG, e2e, ratio, float64(r.WeightBytes)/1e6, r.TGGBps, bw[th], loadCell(r))
				for _, b := range r.Batched {
					line += fmt.Sprintf(" %.1f |", b.StepMs)
				}
				fmt.Fprintln(out, line)
			}
		}
	}
	return nil
}

// loadCell is the load column: the resident memory the load added beside
// the file's size, their ratio (issue 12's goal is at most 1.1), and the
// load time.
func loadCell(r bench.Result) string {
	if !r.RSSKnown || r.FileBytes <= 0 {
		return fmt.Sprintf("? (%.1f)", r.LoadTime.Seconds())
	}
	return fmt.Sprintf("%.0f / %.0f = %.2f× (%.1f)", float64(r.LoadRSS)/1e6, float64(r.FileBytes)/1e6, float64(r.LoadRSS)/float64(r.FileBytes), r.LoadTime.Seconds())
}

// benchGenerate runs `generate` on the model file with a short prompt,
// greedy, past any end-of-generation token, and returns the median of reps
// runs (after one warm-up) of its decode tokens per second over n steps:
// tg64's figure, but through the sampler and detokenizer as well.
func benchGenerate(ctx context.Context, path string, threads, n, reps int) (float64, error) {
	gc := coordinator.DefaultGenerateConfig()
	gc.Model, gc.Threads, gc.MaxTokens, gc.IgnoreEOS = path, threads, n+1, true // the first token comes from prefill
	var tps []float64
	for i := range max(reps, 1) + 1 {
		st, err := coordinator.Generate(ctx, gc)
		if err != nil {
			return 0, err
		}
		if st.GeneratedTokens != n+1 {
			return 0, fmt.Errorf("generated %d tokens, want %d", st.GeneratedTokens, n+1)
		}
		if i > 0 {
			tps = append(tps, st.GenerateTPS())
		}
	}
	slices.Sort(tps)
	return tps[len(tps)/2], nil
}
