// Command shard runs a strata shard.
//
//	shard join --coordinator HOST:PORT --token T [--coordinator-grpc HOST:PORT]
//	           [--token-file F] [--insecure] [--model FILE.gguf] [--device cpu|cuda:N]
//	           [--gossip ADDR] [--grpc ADDR] [--advertise HOST] [--metrics ADDR]
//	           [--data-dir DIR] [--threads N] [--kv-memory SIZE] [--cuda-lib-dir DIR]
//
// joins the cluster whose coordinator gossips at HOST:PORT, serves the layer
// range the coordinator assigns, and leaves gracefully on SIGTERM. The
// first start presents the join token (--token, --token-file or
// $STRATA_TOKEN) and keeps the certificate it receives under --data-dir;
// later starts need no token.
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
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/shard"
)

const usage = `usage: shard join --coordinator HOST:PORT --token T [flags]

Run "shard join -h" for the flags.
`

func main() {
	if len(os.Args) < 2 || os.Args[1] != "join" {
		if len(os.Args) >= 2 && (os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help") {
			fmt.Fprint(os.Stdout, usage)
			return
		}
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cfg, err := parseJoin(os.Args[2:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "shard: %v\n", err)
		os.Exit(2)
	}
	slog.SetDefault(cfg.Logger)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cpu.ReserveIOProc(cfg.Threads)
	n, err := shard.New(cfg)
	if err == nil {
		err = n.Run(ctx)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "shard: %v\n", err)
		os.Exit(1)
	}
}

// parseJoin turns `shard join` flags into a Config.
func parseJoin(args []string, stderr io.Writer) (shard.Config, error) {
	cfg := shard.DefaultConfig()
	fs := flag.NewFlagSet("shard join", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Coordinator, "coordinator", "", "the coordinator's gossip address, HOST:PORT (required)")
	fs.StringVar(&cfg.Name, "name", "", "what people call this shard, shown on the coordinator's status page (default: the host name and a short ID)")
	fs.StringVar(&cfg.Model, "model", "", "local GGUF model file; without it the assigned layers are streamed from the coordinator and cached under --data-dir/weights")
	fs.StringVar(&cfg.Device, "device", cfg.Device, "compute device: cpu or cuda:N (NVIDIA GPU N: needs the driver and NVRTC)")
	fs.StringVar(&cfg.CUDALibDir, "cuda-lib-dir", "", "directory searched first for NVRTC (libnvrtc.so.13 or .12) with --device cuda:N, e.g. pip's site-packages/nvidia/cu13/lib")
	fs.StringVar(&cfg.Gossip, "gossip", cfg.Gossip, "gossip (memberlist) bind address")
	fs.StringVar(&cfg.GRPC, "grpc", cfg.GRPC, "stage endpoint (gRPC) bind address")
	fs.StringVar(&cfg.Advertise, "advertise", "", "host other nodes dial (default: the bound host, or the local address of the route to the coordinator)")
	fs.StringVar(&cfg.Metrics, "metrics", "", "serve /metrics on this address (default: off)")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the node identity and cached weights")
	fs.IntVar(&cfg.Threads, "threads", 0, "compute threads (0: all CPUs)")
	fs.StringVar(&cfg.Token, "token", "", "join token (strata-<CA fingerprint>.<secret>) printed by `coordinator serve`; needed at the first start only (visible in ps: prefer --token-file or $STRATA_TOKEN)")
	tokenFile := fs.String("token-file", "", "read the join token from this file")
	fs.StringVar(&cfg.JoinAddr, "coordinator-grpc", "", "the coordinator's gRPC address the token is presented to (default: the --coordinator host, port 7070)")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "plaintext: no TLS, no gossip key, no token (a trusted network only; the coordinator must run --insecure too)")
	kvMem := fs.String("kv-memory", "0", "KV cache memory budget, e.g. 512MiB or 4GiB (0: no budget of the shard's own)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("join: unexpected argument %q", fs.Arg(0))
	}
	if cfg.Token == "" && *tokenFile != "" && !joined(cfg.DataDir) {
		tok, err := readTokenFile(*tokenFile, tokenFileWait)
		if err != nil {
			return cfg, fmt.Errorf("--token-file: %w", err)
		}
		cfg.Token = tok
	}
	if cfg.Token == "" {
		cfg.Token = strings.TrimSpace(os.Getenv("STRATA_TOKEN"))
	}
	if cfg.Insecure {
		cfg.Token = ""
	}
	if *kvMem != "0" {
		v, err := shard.ParseSize(*kvMem)
		if err != nil {
			return cfg, fmt.Errorf("--kv-memory: %w", err)
		}
		cfg.KVMemory = v
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return cfg, fmt.Errorf("--log-level must be debug, info, warn or error, got %q", *logLevel)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if cfg.Insecure {
		cfg.Logger.Warn("WARNING: --insecure: cluster traffic is plaintext and unauthenticated (a trusted network only)")
	}
	return cfg, cfg.Validate()
}

// tokenFileWait is how long a --token-file that does not exist yet is
// waited for: a coordinator started beside the shard (compose) writes it
// once it has made its CA.
const tokenFileWait = time.Minute

// joined reports whether dataDir already holds the node's certificate: the
// token is then not needed (nor waited for).
func joined(dataDir string) bool {
	_, err := os.Stat(filepath.Join(dataDir, shard.TrustDir, "node.pem"))
	return err == nil
}

// readTokenFile reads a join token file, waiting up to wait for it to
// appear.
func readTokenFile(path string, wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	for {
		b, err := os.ReadFile(path)
		if err == nil {
			return strings.TrimSpace(string(b)), nil
		}
		if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			return "", err
		}
		time.Sleep(250 * time.Millisecond)
	}
}
