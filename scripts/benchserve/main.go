// Command benchserve reproduces the serving benchmark of issue 6: it writes
// the ~110M-parameter random Q8_0 model (n_embd 768, 12 layers, 12 heads,
// n_ff 2048, vocab 32000) with model.WriteRandom, starts a built
// `coordinator serve` binary on it with --local-shards 1 and then 2, and
// drives each with package loadgen: 34-token prompts, 64 output tokens, 1, 4
// and 8 concurrent streams, then the abort churn (8 streams, a quarter
// disconnecting after 16 tokens and replaced). It prints a Markdown table
// with the load average sampled around each case.
//
//	go build -o /tmp/coordinator ./cmd/coordinator
//	go run ./scripts/benchserve --coordinator /tmp/coordinator
//
// scripts/bench-serve.sh does both.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/strata-llm/strata/loadgen"
	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu/bench"
	"github.com/strata-llm/strata/model/ggml"
)

type config struct {
	coordinator string
	modelPath   string
	shards      []int
	streams     []int
	perStream   int // requests per stream in each case
	threads     int
	churn       bool
	serverLog   string
	serveFlags  []string // extra flags of coordinator serve (--insecure)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "benchserve:", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := config{}
	fs := flag.NewFlagSet("benchserve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.coordinator, "coordinator", "", "the built coordinator binary (required)")
	fs.StringVar(&cfg.modelPath, "model", filepath.Join(os.TempDir(), "strata-bench-110M-q8_0.gguf"), "the generated model file (written when absent)")
	shards := fs.String("shards", "1,2", "--local-shards values to run")
	streams := fs.String("streams", "1,4,8", "concurrent streams of the plain cases")
	fs.IntVar(&cfg.perStream, "requests-per-stream", 6, "requests each stream sends per case")
	fs.IntVar(&cfg.threads, "threads", 2, "--threads of the coordinator (llama.cpp's figures used 2)")
	fs.BoolVar(&cfg.churn, "churn", true, "also run the abort churn case (8 streams, 25% disconnect after 16 tokens)")
	fs.Func("serve-flag", "an extra flag for coordinator serve, repeatable (e.g. --serve-flag=--insecure)", func(v string) error {
		cfg.serveFlags = append(cfg.serveFlags, v)
		return nil
	})
	fs.StringVar(&cfg.serverLog, "server-log", "", "append the coordinator's output to this file (default: discard)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.coordinator == "" {
		return errors.New("--coordinator is required: go build -o /tmp/coordinator ./cmd/coordinator")
	}
	var err error
	if cfg.shards, err = ints(*shards); err != nil {
		return fmt.Errorf("--shards: %w", err)
	}
	if cfg.streams, err = ints(*streams); err != nil {
		return fmt.Errorf("--streams: %w", err)
	}
	if err := writeModel(cfg.modelPath, stderr); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "CPU: %s\nmodel %s, coordinator --threads %d, %d requests per stream per case\n\n",
		bench.CPU(), cfg.modelPath, cfg.threads, cfg.perStream)
	fmt.Fprintln(stdout, "| shards | case | streams | requests | output tok/s | TTFT p50 | ITL p50 | ITL p99 | ITL p99 kept | load avg (1m) before → after |")
	fmt.Fprintln(stdout, "|---|---|---|---|---|---|---|---|---|---|")
	for _, n := range cfg.shards {
		if err := benchShards(ctx, cfg, n, stdout, stderr); err != nil {
			return fmt.Errorf("--local-shards %d: %w", n, err)
		}
	}
	return nil
}

// writeModel writes the benchmark model to path unless it is there.
func writeModel(path string, stderr io.Writer) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	fmt.Fprintf(stderr, "writing %s …\n", path)
	spec := model.RandomSpec{Layers: 12, Embd: 768, Heads: 12, HeadsKV: 12, FF: 2048, Vocab: 32000, Context: 2048, Type: ggml.Q8_0, Seed: 1}
	return model.WriteRandomFile(path, spec)
}

func benchShards(ctx context.Context, cfg config, n int, stdout, stderr io.Writer) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	cmd := exec.Command(cfg.coordinator, append([]string{"serve", "--model", cfg.modelPath, "--listen", addr,
		"--local-shards", strconv.Itoa(n), "--threads", strconv.Itoa(cfg.threads), "--grace", "5s"}, cfg.serveFlags...)...)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if cfg.serverLog != "" {
		f, err := os.OpenFile(cfg.serverLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		cmd.Stdout, cmd.Stderr = f, f
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}()
	url := "http://" + addr
	if err := waitReady(ctx, url, exited); err != nil {
		return err
	}
	// Warm up: page in the weights and let the pools spin up.
	warm := loadgen.DefaultConfig()
	warm.URL, warm.Clients, warm.Requests, warm.Settle = url, 2, 4, 0
	if _, err := loadgen.Run(ctx, warm); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	var base8 time.Duration // ITL p99 of 8 plain streams, for the churn ratio
	for _, c := range cfg.streams {
		rep, l0, l1, err := one(ctx, url, c, cfg.perStream, 0)
		if err != nil {
			return err
		}
		if c == 8 {
			base8 = rep.ITL.P99
		}
		row(stdout, n, "plain", c, rep, l0, l1)
	}
	if cfg.churn {
		rep, l0, l1, err := one(ctx, url, 8, cfg.perStream, 0.25)
		if err != nil {
			return err
		}
		row(stdout, n, "churn 25%@16", 8, rep, l0, l1)
		if base8 > 0 {
			fmt.Fprintf(stderr, "shards %d: churn ITL p99 of kept streams %v vs %v without aborts: %.2f×\n",
				n, rep.ITLKept.P99.Round(100*time.Microsecond), base8.Round(100*time.Microsecond), float64(rep.ITLKept.P99)/float64(base8))
		}
	}
	return nil
}

// one runs one case and returns its report and the 1-minute load average
// before and after.
func one(ctx context.Context, url string, clients, perStream int, abortFrac float64) (*loadgen.Report, string, string, error) {
	lc := loadgen.DefaultConfig()
	lc.URL, lc.Clients, lc.Requests = url, clients, clients*perStream
	lc.AbortFrac = abortFrac
	if abortFrac > 0 {
		// Aborted requests are replaced: send more so that about as many
		// complete as in the plain case.
		lc.Requests = int(float64(lc.Requests) / (1 - abortFrac))
	}
	l0 := loadAvg()
	rep, err := loadgen.Run(ctx, lc)
	if err != nil {
		return nil, "", "", err
	}
	if n := rep.Requests - rep.Completed - rep.Aborted; n > 0 {
		return nil, "", "", fmt.Errorf("%d clients: %d requests failed: %v", clients, n, rep.Errors)
	}
	return rep, l0, loadAvg(), nil
}

func row(w io.Writer, shards int, name string, streams int, r *loadgen.Report, l0, l1 string) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	kept := "-"
	if r.Aborted > 0 {
		kept = ms(r.ITLKept.P99)
	}
	fmt.Fprintf(w, "| %d | %s | %d | %d (%d aborted) | %.1f | %s | %s | %s | %s | %s → %s |\n",
		shards, name, streams, r.Requests, r.Aborted, r.TokensPerSec, ms(r.TTFT.P50), ms(r.ITL.P50), ms(r.ITL.P99), kept, l0, l1)
}

func waitReady(ctx context.Context, url string, exited <-chan error) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("the coordinator exited before it was ready: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return errors.New("the coordinator was not ready within 2 minutes")
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// loadAvg returns the 1-minute load average ("?" where /proc is absent).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

func ints(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return nil, fmt.Errorf("want positive integers separated by commas, got %q", s)
		}
		out = append(out, v)
	}
	return out, nil
}
