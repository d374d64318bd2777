// Package bench measures the CPU backend the way llama-bench does, on
// generated models: prompt processing (one batch of Prompt tokens from an
// empty cache), token generation (Gen single-token steps from an empty
// cache), batched decode (several sequences, one token each per step), and
// the machine's memory bandwidth, so that generation can be judged against
// the bytes of weights it must stream per token.
//
// Run and Bandwidth take the whole machine for their duration; call them
// from one goroutine.
package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

// Spec15M, Spec110M and Spec1B are llama-shaped models of about 15 M, 110 M
// (issue 7's reference shape) and 1 B parameters with matrices of type t.
func Spec15M(t ggml.Type) model.RandomSpec {
	return model.RandomSpec{Layers: 6, Embd: 288, Heads: 6, HeadsKV: 6, FF: 768, Vocab: 32000, Context: 2048, Type: t, Seed: 1}
}

// Spec110M is the shape of issue 7's reference table (109.5 M parameters).
func Spec110M(t ggml.Type) model.RandomSpec {
	return model.RandomSpec{Layers: 12, Embd: 768, Heads: 12, HeadsKV: 12, FF: 2048, Vocab: 32000, Context: 2048, Type: t, Seed: 1}
}

// Spec1B is a TinyLlama-like model of about 1.1 B parameters.
func Spec1B(t ggml.Type) model.RandomSpec {
	return model.RandomSpec{Layers: 22, Embd: 2048, Heads: 32, HeadsKV: 4, FF: 5632, Vocab: 32000, Context: 2048, Type: t, Seed: 1}
}

// SpecMoE1B is a Qwen3-MoE-like model of about 1.1 B parameters of which
// about 0.35 B are used per token: 16 layers of 8 experts of 2560, 2 per
// token.
func SpecMoE1B(t ggml.Type) model.RandomSpec {
	return model.RandomSpec{Arch: "qwen3moe", Layers: 16, Embd: 1024, Heads: 16, HeadsKV: 4, HeadDim: 64, FF: 2560, Experts: 8, ExpertsUsed: 2, ExpertFF: 2560, Vocab: 32000, Context: 2048, Type: t, Seed: 1}
}

// Config is one measurement.
type Config struct {
	Spec model.RandomSpec
	// Path is a file holding the model of Spec, written by
	// model.WriteRandomFile; empty generates it into a temporary file.
	Path    string
	Threads int // workers (runtime.NumCPU() when <= 0)
	Prompt  int // pp tokens; 128 when 0
	Gen     int // tg steps; 64 when 0
	// Depth is the context already cached when pp and tg start
	// (llama-bench's -d): that many tokens are prefilled first, untimed, in
	// chunks of Prompt, and both attend to them; 0 starts at position 0.
	Depth   int
	Batches []int // sequence counts of batched decode; none when empty
	// BatchPrompt is the prompt each sequence of a batched decode is
	// prefilled with (not timed) before Gen steps are timed; 0 means Prompt.
	BatchPrompt int
	Reps        int       // repetitions, the median is reported; 3 when 0
	KVType      ggml.Type // ggml.F16 (the default, 0 is F32's value so set it)
}

// Result is the medians of one Config.
type Result struct {
	Spec        model.RandomSpec
	Threads     int
	ISA         string  // kernels the matrices use, one name per type ("+" between)
	Params      int64   // parameters of the model
	WeightBytes int64   // bytes of matrices streamed per generated token
	PP          float64 // prompt tokens per second
	TG          float64 // generated tokens per second
	TGGBps      float64 // WeightBytes*TG: GB/s of weights streamed while generating
	Batched     []Batched
	// FileBytes is the model file's size (0 when Run generated it); LoadRSS
	// is how much the process's resident set (VmRSS) grew from the opened
	// file to the ready stage (model.Load, the repacking), RSSKnown whether
	// it was measured (/proc/self/status readable); it can be 0 or below
	// where the load touched none of the file (weights used in place
	// through the mapping, as Q8_0's on a CPU without AVX-512 VNNI) and the
	// runtime returned memory meanwhile. LoadTime is how long those took.
	FileBytes int64
	LoadRSS   int64
	RSSKnown  bool
	LoadTime  time.Duration
}

// Batched is the batched-decode figure for one sequence count.
type Batched struct {
	Seqs      int
	TokPerSec float64 // tokens of all sequences per second
	StepMs    float64 // milliseconds per step (one token of each sequence)
}

// Run generates the model of cfg.Spec, loads it, and measures it.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Prompt <= 0 {
		cfg.Prompt = 128
	}
	if cfg.Gen <= 0 {
		cfg.Gen = 64
	}
	if cfg.Reps <= 0 {
		cfg.Reps = 3
	}
	if cfg.BatchPrompt <= 0 {
		cfg.BatchPrompt = cfg.Prompt
	}
	if cfg.Depth < 0 {
		return Result{}, fmt.Errorf("bench: depth %d: want 0 or more tokens of context", cfg.Depth)
	}
	var f *gguf.File
	var err error
	if cfg.Path != "" {
		f, err = gguf.Open(cfg.Path)
	} else {
		f, err = openRandom(cfg.Spec)
	}
	if err != nil {
		return Result{}, fmt.Errorf("bench: generate model: %w", err)
	}
	defer f.Close()
	pool := cpu.NewPool(cfg.Threads)
	defer pool.Close()
	runtime.GC()
	debug.FreeOSMemory() // the generator's garbage out of the baseline
	rss0 := VmRSS()
	start := time.Now()
	m, err := model.Load(f)
	if err != nil {
		return Result{}, fmt.Errorf("bench: load model: %w", err)
	}
	res := Result{Spec: cfg.Spec, Threads: pool.Workers(), ISA: isas(m)}
	if cfg.Path != "" {
		if st, err := os.Stat(cfg.Path); err == nil {
			res.FileBytes = st.Size()
		}
	}
	res.Params, res.WeightBytes = sizes(m)

	maxSeqs := 1
	for _, s := range cfg.Batches {
		maxSeqs = max(maxSeqs, s)
	}
	const bs = cpu.DefaultBlockSize
	perSeq := (max(cfg.Depth+cfg.Prompt, cfg.BatchPrompt+cfg.Gen, cfg.Depth+cfg.Gen) + bs) / bs
	kv, err := cpu.NewKV(cpu.KVConfig{Layers: m.Layers, Blocks: perSeq * maxSeqs, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: cfg.KVType})
	if err != nil {
		return Result{}, fmt.Errorf("bench: %w", err)
	}
	st, err := model.NewStage(m, 0, m.Layers, cpu.NewBackend(pool), kv)
	if err != nil {
		return Result{}, fmt.Errorf("bench: %w", err)
	}
	res.LoadTime = time.Since(start)
	if rss1 := VmRSS(); rss0 > 0 && rss1 > 0 {
		res.LoadRSS, res.RSSKnown = rss1-rss0, true
	}
	tables := make([][]int32, maxSeqs)
	for s := range tables {
		for b := range perSeq {
			tables[s] = append(tables[s], int32(s*perSeq+b))
		}
	}
	tokens := func(n, seed int) []int32 {
		t := make([]int32, n)
		for i := range t {
			t[i] = int32(3 + (seed*7919+i*31)%(m.Vocab-3))
		}
		return t
	}

	// Depth tokens of context, untimed, for pp and tg to attend to.
	depth := tokens(cfg.Depth, 3)
	for p := 0; p < cfg.Depth; p += cfg.Prompt {
		chunk := depth[p:min(p+cfg.Prompt, cfg.Depth)]
		if _, err := st.Forward([]model.Row{{Seq: 1, Pos: p, First: p == 0, Tokens: chunk, Blocks: tables[0]}}, nil); err != nil {
			return res, err
		}
	}

	// pp: one batch of Prompt tokens at position Depth.
	prompt := tokens(cfg.Prompt, 0)
	pp, err := median(ctx, cfg.Reps, func() error {
		_, err := st.Forward([]model.Row{{Seq: 1, Pos: cfg.Depth, First: cfg.Depth == 0, Tokens: prompt, Blocks: tables[0], Logits: true}}, nil)
		return err
	})
	if err != nil {
		return res, err
	}
	res.PP = float64(cfg.Prompt) / pp.Seconds()

	// tg: Gen steps of one token from position Depth (each rep rewrites
	// the same positions).
	gen := tokens(cfg.Gen, 1)
	rows := make([]model.Row, maxSeqs)
	tg, err := median(ctx, cfg.Reps, func() error {
		for i := range gen {
			pos := cfg.Depth + i
			rows[0] = model.Row{Seq: 1, Pos: pos, First: pos == 0, Tokens: gen[i : i+1 : i+1], Blocks: tables[0], Logits: true}
			if _, err := st.Forward(rows[:1], nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	res.TG = float64(cfg.Gen) / tg.Seconds()
	res.TGGBps = float64(res.WeightBytes) * res.TG / 1e9

	// Batched decode: S sequences prefilled with BatchPrompt tokens, then
	// Gen steps of one token each.
	bp := tokens(cfg.BatchPrompt, 2)
	for _, S := range cfg.Batches {
		for s := range S {
			if _, err := st.Forward([]model.Row{{Seq: uint64(s + 1), First: true, Tokens: bp, Blocks: tables[s]}}, nil); err != nil {
				return res, err
			}
		}
		step, err := median(ctx, cfg.Reps, func() error {
			for i := range cfg.Gen {
				for s := range S {
					rows[s] = model.Row{Seq: uint64(s + 1), Pos: cfg.BatchPrompt + i, Tokens: gen[i : i+1 : i+1], Blocks: tables[s], Logits: true}
				}
				if _, err := st.Forward(rows[:S], nil); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return res, err
		}
		res.Batched = append(res.Batched, Batched{Seqs: S, TokPerSec: float64(S*cfg.Gen) / step.Seconds(), StepMs: step.Seconds() * 1e3 / float64(cfg.Gen)})
	}
	return res, nil
}

// median runs f reps times after one warm-up run and returns the median
// duration.
func median(ctx context.Context, reps int, f func() error) (time.Duration, error) {
	if err := f(); err != nil {
		return 0, err
	}
	var ds []time.Duration
	for range reps {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		start := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

// sizes returns the parameters of m and the bytes of the matrices one
// generated token streams (every layer matrix and the output head; one row
// of the embedding). Of a mixture-of-experts layer's experts a token streams
// only the ExpertsUsed it is routed to: ExpertsUsed/Experts of their bytes.
func sizes(m *model.Model) (params, streamed int64) {
	add := func(w *model.Weight) {
		params += int64(w.Rows) * int64(w.Cols)
		streamed += int64(len(w.Data))
	}
	for i := range m.LayerWeights {
		L := &m.LayerWeights[i]
		var experts int64
		for _, e := range L.Experts {
			for _, w := range []*model.Weight{e.Gate, e.Up, e.Down} {
				experts += int64(len(w.Data))
			}
		}
		for _, w := range L.Matrices() {
			add(w)
		}
		if experts > 0 {
			streamed -= experts - experts*int64(m.ExpertsUsed)/int64(m.Experts)
		}
	}
	add(m.Output)
	if !m.TiedOutput {
		params += int64(m.Embed.Rows) * int64(m.Embed.Cols)
	}
	return params, streamed
}

// isas names the kernels of m's matrices, one per type in the order of
// model.MatrixTypes ("Q6_K portable" for a type without SIMD kernels).
func isas(m *model.Model) string {
	seen := map[ggml.Type]bool{m.Output.Type: true}
	for i := range m.LayerWeights {
		for _, w := range m.LayerWeights[i].Matrices() {
			seen[w.Type] = true
		}
	}
	var names []string
	for _, t := range model.MatrixTypes {
		if !seen[t] {
			continue
		}
		name := cpu.ISA(t)
		if name == "portable" {
			name = t.String() + " portable"
		}
		names = append(names, name)
	}
	if cpu.MatVecAhead() {
		return strings.Join(names, "+") + " (ahead)"
	}
	return strings.Join(names, "+")
}

// Bandwidth measures the STREAM triad a[i] = b[i] + s*c[i] over three
// arrays of 16 Mi float32 (192 MiB) on threads workers and returns the best
// of reps runs in GB/s, counting 12 bytes per element as STREAM does.
func Bandwidth(ctx context.Context, threads, reps int) (float64, error) {
	const n = 16 << 20
	a, b, c := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range b {
		b[i], c[i] = 1, 2
	}
	pool := cpu.NewPool(threads)
	defer pool.Close()
	const chunk = 1 << 16
	triad := func(_, i int) {
		lo, hi := i*chunk, min((i+1)*chunk, n)
		aa, bb, cc := a[lo:hi], b[lo:hi], c[lo:hi]
		for j := range aa {
			aa[j] = bb[j] + 3*cc[j]
		}
	}
	best := 0.0
	for range max(reps, 1) + 1 {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		start := time.Now()
		pool.Parallel(n/chunk, triad)
		best = max(best, 12*n/time.Since(start).Seconds()/1e9)
	}
	return best, nil
}

// openRandom writes the model of spec to a temporary file and maps it, as a
// served model file is: a 1B F32 model (4.4 GB) built in a growing buffer
// would need three times that in memory.
func openRandom(spec model.RandomSpec) (*gguf.File, error) {
	dir, err := os.MkdirTemp("", "strata-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir) // the mapping outlives the name
	path := filepath.Join(dir, "model.gguf")
	if err := model.WriteRandomFile(path, spec); err != nil {
		return nil, err
	}
	return gguf.Open(path)
}
