// Command coordinator runs strata's coordinator.
//
//	coordinator serve [--listen :8080] [--model FILE.gguf] [--local-shards N] …
//
// serves the OpenAI-compatible API over shards run in this process (on
// loopback gRPC, like remote `shard join` shards) and remote ones, and
//
//	coordinator generate [--model FILE.gguf] [--prompt TEXT] [-n N] [--temp T] …
//
// runs one prompt through the whole model and reports its speed. Without
// --model both use the built-in random-weight demo model.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/strata-llm/strata/coordinator"
	"github.com/strata-llm/strata/model/ggml"
)

const usage = `usage: coordinator <command> [flags]

commands:
  serve      run the OpenAI-compatible API over shards in this process and remote ones
  generate   run a prompt through the whole model in this process
  token      make, list and revoke join tokens (create [--ttl D], list, revoke ID)

Run "coordinator <command> -h" for a command's flags.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "serve":
		var cfg serveConfig
		if cfg, err = parseServe(os.Args[2:], os.Stderr); err == nil {
			err = serve(ctx, cfg)
		}
	case "generate":
		err = generate(ctx, os.Args[2:], os.Stdout, os.Stderr)
	case "token":
		err = token(os.Args[2:], os.Stdout, os.Stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(os.Stdout, usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "coordinator: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "coordinator: %v\n", err)
		os.Exit(1)
	}
}

func generate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := coordinator.DefaultGenerateConfig()
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Model, "model", "", "GGUF model file (default: the built-in demo model)")
	fs.StringVar(&cfg.Prompt, "prompt", cfg.Prompt, "prompt text")
	fs.IntVar(&cfg.MaxTokens, "n", cfg.MaxTokens, "tokens to generate (0: until the context is full)")
	fs.IntVar(&cfg.Threads, "threads", cfg.Threads, "worker threads")
	temp := fs.Float64("temp", 0, "temperature (0: greedy)")
	topK := fs.Int("top-k", 0, "keep the K most likely tokens (0: off)")
	topP := fs.Float64("top-p", 1, "nucleus sampling threshold (1: off)")
	minP := fs.Float64("min-p", 0, "drop tokens below this fraction of the top probability (0: off)")
	rep := fs.Float64("repeat-penalty", 1, "repetition penalty (1: off)")
	seed := fs.Uint64("seed", 0, "seed of the random draw")
	kvType := fs.String("kv-type", "f16", "KV cache storage: f16 or f32")
	verbose := fs.Bool("v", false, "log what the command does")
	benchMode := fs.Bool("bench", false, "measure CPU speed on generated models instead (pp128, tg64, batched decode, bandwidth)")
	benchSizes := fs.String("bench-sizes", "15M,110M", "with --bench: model sizes among 15M, 110M, 1B, moe1B (8 experts, 2 per token)")
	benchTypes := fs.String("bench-types", "F32,Q8_0,Q4_0", "with --bench: weight types (F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K, IQ4_XS) or mixtures (Q4_K_M, Q5_K_M)")
	benchThreads := fs.String("bench-threads", "1,2", "with --bench: thread counts")
	benchBatches := fs.String("bench-batches", "1,4,8,16", "with --bench: sequence counts of batched decode")
	benchReps := fs.Int("bench-reps", 3, "with --bench: repetitions (the median is reported)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *benchMode {
		bc, err := parseBenchConfig(*benchSizes, *benchTypes, *benchThreads, *benchBatches, *benchReps)
		if err != nil {
			return fmt.Errorf("generate: %w", err)
		}
		return runBench(ctx, bc, stdout)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("generate: unexpected argument %q", fs.Arg(0))
	}
	cfg.Sample.Temperature = float32(*temp)
	cfg.Sample.TopK = *topK
	cfg.Sample.TopP = float32(*topP)
	cfg.Sample.MinP = float32(*minP)
	cfg.Sample.RepetitionPenalty = float32(*rep)
	cfg.Sample.Seed = *seed
	switch *kvType {
	case "f16":
		cfg.KVType = ggml.F16
	case "f32":
		cfg.KVType = ggml.F32
	default:
		return fmt.Errorf("generate: --kv-type must be f16 or f32, got %q", *kvType)
	}
	cfg.Out = stdout
	if *verbose {
		cfg.Log = slog.New(slog.NewTextHandler(stderr, nil))
	}
	st, err := coordinator.Generate(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\n\nprompt: %d tokens, %.1f tok/s; generation: %d tokens, %.1f tok/s\n",
		st.PromptTokens, st.PromptTPS(), st.GeneratedTokens, st.GenerateTPS())
	return nil
}
