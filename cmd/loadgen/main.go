// Command loadgen drives a strata coordinator (or any OpenAI-compatible
// server) with concurrent clients and prints throughput, TTFT, inter-token
// latency, errors by kind and the KV blocks each shard still holds after the
// run. See package loadgen.
//
//	loadgen --url http://127.0.0.1:8080 --clients 8 --requests 200 \
//	    --prompt-len 34 --output-len 64 --abort-frac 0.25 --abort-after 16
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/strata-llm/strata/loadgen"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
		}
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, asJSON, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	rep, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	rep.Write(stdout)
	return nil
}

func parseFlags(args []string, stderr io.Writer) (loadgen.Config, bool, error) {
	cfg := loadgen.DefaultConfig()
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.URL, "url", "http://127.0.0.1:8080", "base URL of the server (the only address loadgen talks to)")
	fs.StringVar(&cfg.APIKey, "api-key", os.Getenv("STRATA_API_KEY"), "Bearer key (default $STRATA_API_KEY)")
	fs.StringVar(&cfg.Model, "model", "", "model name (default: the first of /v1/models)")
	fs.BoolVar(&cfg.Chat, "chat", false, "use /v1/chat/completions instead of /v1/completions")
	fs.BoolVar(&cfg.Stream, "stream", cfg.Stream, "stream the answers (SSE)")
	fs.IntVar(&cfg.Clients, "clients", cfg.Clients, "concurrent clients")
	fs.IntVar(&cfg.Requests, "requests", cfg.Requests, "requests to send in all (0: until --duration)")
	fs.DurationVar(&cfg.Duration, "duration", 0, "stop starting requests after this long (0: until --requests)")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "client-side deadline of each request")
	fs.Float64Var(&cfg.AbortFrac, "abort-frac", 0, "fraction of streams that disconnect mid-stream (their client starts a new request)")
	fs.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the prompts, lengths and aborts")
	fs.DurationVar(&cfg.Settle, "settle", cfg.Settle, "at the end, how long to wait for the shards to free their KV before reporting")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	ranges := []struct {
		name, help string
		r          *loadgen.Range
	}{
		{"prompt-len", "prompt tokens: N or A-B (uniform); words for --chat", &cfg.PromptLen},
		{"output-len", "max_tokens: N or A-B (uniform)", &cfg.OutputLen},
		{"abort-after", "tokens an aborting stream reads before it disconnects: N or A-B", &cfg.AbortAfter},
	}
	for _, r := range ranges {
		fs.Func(r.name, r.help+" (default "+r.r.String()+")", func(s string) error {
			v, err := loadgen.ParseRange(s)
			if err == nil {
				*r.r = v
			}
			return err
		})
	}
	if err := fs.Parse(args); err != nil {
		return cfg, false, err
	}
	if fs.NArg() > 0 {
		return cfg, false, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return cfg, *asJSON, cfg.Validate()
}
