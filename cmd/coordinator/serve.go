package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/strata-llm/strata/coordinator"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/sched"
	"github.com/strata-llm/strata/shard"
)

// serveConfig is everything `coordinator serve` needs.
type serveConfig struct {
	Listen      string
	Model       string
	LocalShards int
	MinShards   int    // > 0: wait for this many remote `shard join` shards
	Gossip      string // memberlist address (cluster mode)
	GRPC        string // service Coordinator address (cluster mode)
	DataDir     string // bbolt: epoch, placement, shard registry (cluster mode)
	Threads     int
	KVMemory    int64
	KVType      ggml.Type
	MaxModelLen int
	Engine      coordinator.EngineConfig
	Server      coordinator.ServerConfig
	Grace       time.Duration // drain time after SIGTERM
	LogEvery    time.Duration
	Log         *slog.Logger
	// Ready, when set, receives the listening address once serving.
	Ready func(addr string)
}

func parseServe(args []string, stderr io.Writer) (serveConfig, error) {
	cfg := serveConfig{
		Engine:   coordinator.DefaultEngineConfig(),
		KVType:   ggml.F16,
		Grace:    30 * time.Second,
		LogEvery: 10 * time.Second,
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Listen, "listen", ":8080", "HTTP address of the OpenAI-compatible API")
	fs.StringVar(&cfg.Model, "model", "", "GGUF model file (default: the built-in demo model)")
	fs.IntVar(&cfg.LocalShards, "local-shards", -1, "shards run inside this process, layers split evenly (default 1, or 0 with --min-shards)")
	fs.IntVar(&cfg.MinShards, "min-shards", 0, "serve through remote `shard join` shards: hold readiness until this many form the pipeline")
	fs.StringVar(&cfg.Gossip, "gossip", ":7946", "gossip (memberlist) address shards join, with --min-shards")
	fs.StringVar(&cfg.GRPC, "grpc", ":7070", "gRPC address of service Coordinator, with --min-shards")
	fs.StringVar(&cfg.DataDir, "data-dir", "strata-data", "where the coordinator keeps its epoch, placement and shard registry, with --min-shards")
	fs.IntVar(&cfg.Threads, "threads", runtime.NumCPU(), "worker threads shared by the local shards")
	kvMem := fs.String("kv-memory", "512MiB", "KV cache memory per shard (e.g. 512MiB, 4GiB)")
	kvType := fs.String("kv-type", "f16", "KV cache storage: f16 or f32")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", 0, "longest prompt + output in tokens (default: the model's context)")
	fs.DurationVar(&cfg.Server.RequestTimeout, "request-timeout", 10*time.Minute, "deadline of a request from its arrival (0: none)")
	fs.DurationVar(&cfg.Engine.Sched.QueueTimeout, "queue-timeout", cfg.Engine.Sched.QueueTimeout, "longest wait for admission (0: none)")
	fs.IntVar(&cfg.Engine.Sched.MaxWaiting, "max-waiting", cfg.Engine.Sched.MaxWaiting, "requests that may wait for admission; more get 429")
	fs.StringVar(&cfg.Server.APIKey, "api-key", "", "require this Bearer key on the API (/healthz and /readyz stay open)")
	fs.DurationVar(&cfg.Grace, "grace", cfg.Grace, "on SIGTERM, how long in-flight requests may run before they are failed")
	verbose := fs.Bool("v", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	n, err := shard.ParseSize(*kvMem)
	if err != nil {
		return cfg, fmt.Errorf("serve: --kv-memory: %w", err)
	}
	cfg.KVMemory = n
	switch *kvType {
	case "f16":
		cfg.KVType = ggml.F16
	case "f32":
		cfg.KVType = ggml.F32
	default:
		return cfg, fmt.Errorf("serve: --kv-type must be f16 or f32, got %q", *kvType)
	}
	if cfg.MinShards < 0 {
		return cfg, fmt.Errorf("serve: --min-shards must be >= 0, got %d", cfg.MinShards)
	}
	switch {
	case cfg.LocalShards == -1 && cfg.MinShards > 0:
		cfg.LocalShards = 0
	case cfg.LocalShards == -1:
		cfg.LocalShards = 1
	case cfg.LocalShards > 0 && cfg.MinShards > 0:
		return cfg, errors.New("serve: --local-shards with --min-shards: mixing in-process and remote shards is not supported yet")
	case cfg.LocalShards < 1 && cfg.MinShards == 0:
		return cfg, fmt.Errorf("serve: --local-shards must be >= 1 without --min-shards, got %d", cfg.LocalShards)
	}
	if cfg.MinShards > 0 && cfg.Model == "" {
		return cfg, errors.New("serve: --min-shards needs --model: remote shards load the same GGUF file")
	}
	if cfg.MaxModelLen < 0 {
		return cfg, fmt.Errorf("serve: --max-model-len must be >= 0, got %d", cfg.MaxModelLen)
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	cfg.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg.Engine.Log = cfg.Log.With("component", "engine")
	cfg.Server.Log = cfg.Log.With("component", "http")
	return cfg, nil
}

// serve runs the coordinator with local shards until ctx ends, then drains.
func serve(ctx context.Context, cfg serveConfig) error {
	log := cfg.Log
	f, m, tok, err := coordinator.OpenModel(cfg.Model)
	if err != nil {
		return err
	}
	defer f.Close()
	name := "strata-demo"
	if cfg.Model != "" {
		name = strings.TrimSuffix(filepath.Base(cfg.Model), filepath.Ext(cfg.Model))
	}
	info, err := coordinator.NewModelInfo(name, f, m, tok)
	if err != nil {
		return err
	}
	ec := cfg.Engine
	ec.Sched.MaxModelLen = m.Context
	if cfg.MaxModelLen > 0 {
		ec.Sched.MaxModelLen = min(cfg.MaxModelLen, m.Context)
	}
	info.Context = ec.Sched.MaxModelLen
	var be *backend
	if cfg.MinShards > 0 {
		be, err = clusterBackend(cfg, f, m, ec.Sched.MaxBatchTokens)
	} else {
		be, err = localBackend(cfg, m)
	}
	if err != nil {
		return err
	}
	defer be.close()
	ec.Epoch = be.epoch
	if be.firstSeq > 0 {
		ec.Sched.FirstSeq = sched.SeqID(be.firstSeq)
	}
	eng, err := coordinator.NewEngine(ec, be.pipe)
	if err != nil {
		return err
	}
	ready := func() error {
		if eng.Draining() {
			return errors.New("draining: not admitting requests")
		}
		if err := be.ready(); err != nil {
			return err
		}
		st := eng.Stats()
		if st.Waiting > 0 && st.Running == 0 && time.Since(st.LastStep) > 30*time.Second {
			return fmt.Errorf("%d requests waiting and no step completed for %v", st.Waiting, time.Since(st.LastStep).Round(time.Second))
		}
		return nil
	}
	sc := cfg.Server
	sc.View, sc.StageTimings = be.views(eng)
	srv := coordinator.NewServer(sc, eng, info, ready)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}

	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := be.run(runCtx); err != nil {
			log.Error("pipeline", "err", err)
		}
	})
	wg.Go(func() { eng.Run(runCtx) })
	wg.Go(func() { logThroughput(runCtx, log, eng, be.kvBlocks, cfg.LogEvery) })
	serveErr := make(chan error, 1)
	wg.Go(func() { serveErr <- hs.Serve(ln) })
	log.Info("serving", append([]any{"addr", ln.Addr().String(), "model", name, "layers", m.Layers,
		"max_model_len", ec.Sched.MaxModelLen, "epoch", ec.Epoch}, be.attrs...)...)
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr().String())
	}

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		runErr = err
	}
	// Drain: stop admitting, let admitted requests finish within the grace
	// period, then fail the rest and stop.
	eng.Drain()
	log.Info("draining", "grace", cfg.Grace)
	deadline := time.Now().Add(cfg.Grace)
	for time.Now().Before(deadline) {
		st := eng.Stats()
		if st.Running == 0 && st.Waiting == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopRun() // fails what is left; streams end with an error event
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(shutCtx); err != nil {
		log.Warn("http shutdown", "err", err)
	}
	wg.Wait()
	if errors.Is(runErr, http.ErrServerClosed) {
		runErr = nil
	}
	log.Info("stopped")
	return runErr
}

// logThroughput writes the periodic line users of the seed project know.
func logThroughput(ctx context.Context, log *slog.Logger, eng *coordinator.Engine, kvBlocks func() string, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	last, lastAt := eng.Stats().GeneratedTokens, time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			st := eng.Stats()
			if st.GeneratedTokens == last && st.Running == 0 && st.Waiting == 0 {
				lastAt = now
				continue
			}
			tps := float64(st.GeneratedTokens-last) / now.Sub(lastAt).Seconds()
			last, lastAt = st.GeneratedTokens, now
			log.Info(fmt.Sprintf("Throughput (T/s) %.2f, Prefix cache hitrate %.2f%%, %d running, %d waiting",
				tps, 100*st.KV.HitRate(), st.Running, st.Waiting), "kv_blocks", kvBlocks())
		}
	}
}

// localStages converts the in-process stages' snapshots for the
// coordinator's view and metrics.
func localStages(local *shard.Local) []coordinator.LocalStage {
	st := local.StageStats()
	out := make([]coordinator.LocalStage, len(st))
	for i, s := range st {
		out[i] = coordinator.LocalStage{First: s.FirstLayer, End: s.LastLayer, BlocksUsed: s.BlocksUsed, BlocksTotal: s.BlocksTotal,
			Sequences: s.Sequences, Batches: s.Batches, Busy: s.Busy}
	}
	return out
}
