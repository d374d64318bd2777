package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu/bench"
	"github.com/strata-llm/strata/model/ggml"
)

// benchConfig is `coordinator generate --bench`: the CPU speed table of
// issue 7 on generated models.
type benchConfig struct {
	Sizes   []string    // 15M, 110M, 1B
	Types   []ggml.Type // F32, Q8_0, Q4_0
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
		case "15M", "110M", "1B":
			return s, nil
		}
		return "", fmt.Errorf("--bench-sizes: want 15M, 110M or 1B, got %q", s)
	}); err != nil {
		return cfg, err
	}
	if cfg.Types, err = parseList(types, func(s string) (ggml.Type, error) {
		switch strings.ToUpper(s) {
		case "F32":
			return ggml.F32, nil
		case "F16":
			return ggml.F16, nil
		case "BF16":
			return ggml.BF16, nil
		case "Q8_0":
			return ggml.Q8_0, nil
		case "Q4_0":
			return ggml.Q4_0, nil
		}
		return 0, fmt.Errorf("--bench-types: want F32, F16, BF16, Q8_0 or Q4_0, got %q", s)
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
// table with prompt processing (pp128), generation (tg64), batched decode
// and the weight bandwidth of generation beside the machine's triad
// bandwidth measured in the same run.
func runBench(ctx context.Context, cfg benchConfig, out io.Writer) error {
	specs := map[string]func(ggml.Type) model.RandomSpec{"15M": bench.Spec15M, "110M": bench.Spec110M, "1B": bench.Spec1B}
	bw := map[int]float64{}
	for _, th := range cfg.Threads {
		v, err := bench.Bandwidth(ctx, th, 3)
		if err != nil {
			return err
		}
		bw[th] = v
	}
	head := "| model | type | threads | kernels | pp128 tok/s | tg64 tok/s | weights GB/s (triad) |"
	sep := "|---|---|---|---|---|---|---|"
	for _, n := range cfg.Batches {
		head += fmt.Sprintf(" %d seqs ms/step |", n)
		sep += "---|"
	}
	fmt.Fprintln(out, head)
	fmt.Fprintln(out, sep)
	for _, size := range cfg.Sizes {
		for _, typ := range cfg.Types {
			for _, th := range cfg.Threads {
				r, err := bench.Run(ctx, bench.Config{Spec: specs[size](typ), Threads: th, Batches: cfg.Batches, Reps: cfg.Reps, KVType: ggml.F16})
				if err != nil {
					return fmt.Errorf("bench %s %v %d threads: %w", size, typ, th, err)
				}
				line := fmt.Sprintf("| %s | %v | %d | %s | %.1f | %.1f | %.1f (%.1f) |", size, typ, th, r.ISA, r.PP, r.TG, r.TGGBps, bw[th])
				for _, b := range r.Batched {
					line += fmt.Sprintf(" %.1f |", b.StepMs)
				}
				fmt.Fprintln(out, line)
			}
		}
	}
	return nil
}
