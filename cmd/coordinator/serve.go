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
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/strata-llm/strata/coordinator"
	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/sched"
	"github.com/strata-llm/strata/shard"
	"golang.org/x/net/netutil"
)

// serveConfig is everything `coordinator serve` needs.
type serveConfig struct {
	Listen      string
	Model       string // "": the built-in demo model
	LocalShards int    // shards run in this process
	MinShards   int    // shards, local ones included, that form the pipeline
	Gossip      string // memberlist address shards join
	GRPC        string // service Coordinator address
	DataDir     string // bbolt: epoch, placement, shard registry; local shards' identities ("": a temporary directory)
	Private     bool   // the cluster's listeners are ephemeral loopback ports: only the local shards are in it
	Threads     int    // the local shards' one worker pool
	// Devices are the local shards' devices, shard i the i-th (the last
	// repeated): "cpu" or "cuda:N" (--device cpu,cuda:0 runs a CPU and a
	// GPU stage); CUDALibDir is searched first for NVRTC.
	Devices     []string
	CUDALibDir  string
	KVMemory    int64
	KVType      ggml.Type
	MaxModelLen int
	Engine      coordinator.EngineConfig
	Server      coordinator.ServerConfig
	Grace       time.Duration // drain time after SIGTERM

	// PlacementMix is the load placement balances stages for.
	PlacementMix coordinator.Mix

	// HTTP: TLS on the API when both are set; the most connections served
	// at once (0: no limit); how long a keep-alive connection may idle.
	TLSCert, TLSKey string
	MaxConns        int
	IdleTimeout     time.Duration
	LogEvery        time.Duration
	// Insecure runs the cluster plaintext (no TLS, no gossip key, no join
	// tokens); TokenTTL is the default join token's lifetime (0: none).
	Insecure bool
	TokenTTL time.Duration
	// TokenOut, when set, is a file the default join token is also written
	// to (0600): a volume shared with shards that read it (--token-file).
	TokenOut string
	Log      *slog.Logger
	Stderr   io.Writer // where the join line is printed (nil: os.Stderr)
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
	fs.IntVar(&cfg.LocalShards, "local-shards", -1, "shards run inside this process, reached over loopback gRPC like remote ones (default 1, or 0 with --min-shards alone)")
	fs.IntVar(&cfg.MinShards, "min-shards", 0, "shards, the local ones included, that must join before the pipeline forms; above --local-shards the rest are remote `shard join` shards (default --local-shards)")
	fs.StringVar(&cfg.Gossip, "gossip", ":7946", "gossip (memberlist) address shards join (with local shards only and neither --gossip nor --grpc: 127.0.0.1, ephemeral port)")
	fs.StringVar(&cfg.GRPC, "grpc", ":7070", "gRPC address of service Coordinator (see --gossip)")
	fs.StringVar(&cfg.DataDir, "data-dir", "strata-data", "where the coordinator keeps its epoch, placement and shard registry, and local shard N its identity (DIR/local-shard-N); with local shards only and no --data-dir, a temporary directory")
	fs.IntVar(&cfg.Threads, "threads", runtime.NumCPU(), "worker threads shared by the local shards")
	kvMem := fs.String("kv-memory", "512MiB", "KV cache memory per shard (e.g. 512MiB, 4GiB)")
	devices := fs.String("device", "cpu", "the local shards' compute devices, comma-separated, shard i the i-th and the last repeated: cpu or cuda:N (e.g. cuda:0, or cpu,cuda:0 for a CPU stage then a GPU stage)")
	fs.StringVar(&cfg.CUDALibDir, "cuda-lib-dir", "", "directory searched first for NVRTC (libnvrtc.so.13 or .12) with --device cuda:N, e.g. pip's site-packages/nvidia/cu13/lib")
	kvType := fs.String("kv-type", "f16", "KV cache storage: f16 or f32")
	placementMix := fs.String("placement-mix", "balanced", "load placement balances the stages for, from each shard's measured speed: decode, prefill or balanced (memory: by memory alone, ignoring speed)")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", 0, "longest prompt + output in tokens (default: the model's context)")
	fs.DurationVar(&cfg.Server.RequestTimeout, "request-timeout", 10*time.Minute, "deadline of a request from its arrival (0: none)")
	fs.DurationVar(&cfg.Engine.Sched.QueueTimeout, "queue-timeout", cfg.Engine.Sched.QueueTimeout, "longest wait for admission (0: none)")
	fs.IntVar(&cfg.Engine.Sched.MaxWaiting, "max-waiting", cfg.Engine.Sched.MaxWaiting, "requests that may wait for admission; more get 429")
	fs.StringVar(&cfg.Server.APIKey, "api-key", "", "require this Bearer key on the API (/healthz and /readyz stay open); visible to anyone who can list processes: prefer --api-key-file or $STRATA_API_KEY")
	keyFile := fs.String("api-key-file", "", "require one of the Bearer keys in this file (one per line; blank lines and # comments skipped)")
	maxBody := fs.String("max-body", "4MiB", "largest request body (larger ones get 413)")
	fs.IntVar(&cfg.MaxConns, "max-connections", 1024, "HTTP connections served at once; more wait to be accepted (0: no limit)")
	fs.DurationVar(&cfg.Server.BodyTimeout, "body-timeout", coordinator.DefaultBodyTimeout, "longest time a request body may take to arrive (408 after it)")
	fs.DurationVar(&cfg.Server.WriteTimeout, "write-timeout", coordinator.DefaultWriteTimeout, "longest time one write of a response may take; a client that stops reading is cut off after it")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", 2*time.Minute, "how long a keep-alive connection may wait for its next request")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "serve the API over TLS with this certificate (PEM; with --tls-key)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "the private key of --tls-cert (PEM)")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "run the cluster plaintext: gRPC without TLS, gossip unencrypted, any process that reaches the ports may join (a trusted network only; shards need --insecure too)")
	fs.DurationVar(&cfg.TokenTTL, "join-token-ttl", 24*time.Hour, "lifetime of the default join token printed at start (0: no expiry); `coordinator token create` makes more")
	fs.StringVar(&cfg.TokenOut, "join-token-out", "", "also write the default join token to this file (0600), for shards that share it (shard join --token-file)")
	fs.DurationVar(&cfg.Grace, "grace", cfg.Grace, "on SIGTERM, how long in-flight requests may run before they are failed")
	verbose := fs.Bool("v", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := apiKeys(&cfg.Server, *keyFile, os.Getenv("STRATA_API_KEY")); err != nil {
		return cfg, err
	}
	mb, err := shard.ParseSize(*maxBody)
	if err != nil || mb <= 0 {
		return cfg, fmt.Errorf("serve: --max-body must be a positive size such as 4MiB, got %q", *maxBody)
	}
	cfg.Server.MaxBodyBytes = mb
	switch {
	case cfg.MaxConns < 0:
		return cfg, fmt.Errorf("serve: --max-connections must be >= 0, got %d", cfg.MaxConns)
	case cfg.Server.BodyTimeout <= 0 || cfg.Server.WriteTimeout <= 0 || cfg.IdleTimeout <= 0:
		return cfg, errors.New("serve: --body-timeout, --write-timeout and --idle-timeout must be positive")
	case (cfg.TLSCert == "") != (cfg.TLSKey == ""):
		return cfg, errors.New("serve: --tls-cert and --tls-key go together")
	case cfg.TokenTTL < 0:
		return cfg, fmt.Errorf("serve: --join-token-ttl must be >= 0, got %v", cfg.TokenTTL)
	}
	n, err := shard.ParseSize(*kvMem)
	if err != nil {
		return cfg, fmt.Errorf("serve: --kv-memory: %w", err)
	}
	cfg.KVMemory = n
	for _, d := range strings.Split(*devices, ",") {
		d = strings.TrimSpace(d)
		if d != "cpu" && !strings.HasPrefix(d, "cuda:") {
			return cfg, fmt.Errorf("serve: --device must list cpu or cuda:N, got %q", d)
		}
		cfg.Devices = append(cfg.Devices, d)
	}
	if cfg.PlacementMix, err = coordinator.ParseMix(*placementMix); err != nil {
		return cfg, fmt.Errorf("serve: %w", err)
	}
	switch *kvType {
	case "f16":
		cfg.KVType = ggml.F16
	case "f32":
		cfg.KVType = ggml.F32
	default:
		return cfg, fmt.Errorf("serve: --kv-type must be f16 or f32, got %q", *kvType)
	}
	if err := resolveShards(&cfg, set); err != nil {
		return cfg, err
	}
	if cfg.MaxModelLen < 0 {
		return cfg, fmt.Errorf("serve: --max-model-len must be >= 0, got %d", cfg.MaxModelLen)
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	cfg.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg.Stderr = stderr
	if cfg.Insecure {
		cfg.Log.Warn("WARNING: --insecure: cluster traffic is plaintext and unauthenticated; anyone who reaches the gossip and gRPC ports can join, read the model and inject results")
	}
	if set["api-key"] {
		cfg.Log.Warn("--api-key is visible to anyone who can list this machine's processes; use --api-key-file or $STRATA_API_KEY")
	}
	cfg.Engine.Log = cfg.Log.With("component", "engine")
	cfg.Server.Log = cfg.Log.With("component", "http")
	return cfg, nil
}

// apiKeys adds the keys of keyFile (one per line; blank lines and lines
// starting with # skipped) and of env ($STRATA_API_KEY) to sc.
func apiKeys(sc *coordinator.ServerConfig, keyFile, env string) error {
	if env = strings.TrimSpace(env); env != "" {
		sc.APIKeys = append(sc.APIKeys, env)
	}
	if keyFile == "" {
		return nil
	}
	b, err := os.ReadFile(keyFile)
	if err != nil {
		return fmt.Errorf("serve: --api-key-file: %w", err)
	}
	n := 0
	for line := range strings.Lines(string(b)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			sc.APIKeys = append(sc.APIKeys, line)
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("serve: --api-key-file %s holds no key", keyFile)
	}
	return nil
}

// resolveShards checks --local-shards and --min-shards and fills in their
// defaults. --min-shards counts every shard of the pipeline, local ones
// included: it defaults to --local-shards, and above it the rest are remote.
// With local shards only, the cluster needs nothing outside this process:
// unless set, its gossip and gRPC listeners take ephemeral loopback ports
// and its data dir is temporary, so that one process opens nothing but
// --listen to others and leaves nothing behind.
func resolveShards(cfg *serveConfig, set map[string]bool) error {
	switch {
	case cfg.MinShards < 0:
		return fmt.Errorf("serve: --min-shards must be >= 0, got %d", cfg.MinShards)
	case cfg.LocalShards == -1 && cfg.MinShards > 0:
		cfg.LocalShards = 0
	case cfg.LocalShards == -1:
		cfg.LocalShards = 1
	case cfg.LocalShards < 0:
		return fmt.Errorf("serve: --local-shards must be >= 0, got %d", cfg.LocalShards)
	}
	if cfg.MinShards == 0 {
		cfg.MinShards = cfg.LocalShards
	}
	switch {
	case cfg.MinShards == 0:
		return errors.New("serve: --local-shards 0 needs --min-shards: the remote shards to wait for")
	case cfg.MinShards < cfg.LocalShards:
		return fmt.Errorf("serve: --min-shards %d is below --local-shards %d: it counts the local shards too", cfg.MinShards, cfg.LocalShards)
	case cfg.MinShards > cfg.LocalShards && cfg.Model == "":
		return errors.New("serve: --min-shards above --local-shards needs --model: remote shards load the same GGUF file")
	case cfg.MinShards > cfg.LocalShards:
		return nil
	}
	if !set["gossip"] && !set["grpc"] {
		cfg.Gossip, cfg.GRPC, cfg.Private = "127.0.0.1:0", "127.0.0.1:0", true
	}
	if !set["data-dir"] {
		cfg.DataDir = ""
	}
	return nil
}

// serve runs the coordinator and its local shards until ctx ends, then
// drains.
func serve(ctx context.Context, cfg serveConfig) error {
	log := cfg.Log
	cpu.ReserveIOProc(cfg.Threads)
	dataDir := cfg.DataDir
	if dataDir == "" {
		tmp, err := os.MkdirTemp("", "strata-serve-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dataDir = tmp
	}
	name, modelPath := "strata-demo", cfg.Model
	if modelPath != "" {
		name = strings.TrimSuffix(filepath.Base(modelPath), filepath.Ext(modelPath))
	} else {
		// Shards load the model from a file, as remote ones would.
		var err error
		if modelPath, err = writeDemoModel(dataDir); err != nil {
			return err
		}
	}
	f, m, tok, err := coordinator.OpenModel(modelPath)
	if err != nil {
		return err
	}
	defer f.Close()
	if cfg.LocalShards > m.Layers {
		return fmt.Errorf("serve: --local-shards must be in 0..%d (the model's layers), got %d", m.Layers, cfg.LocalShards)
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
	if g := m.KVGroups().Groups; g > 1 {
		// Sliding layers keep their own block tables, released as the
		// window moves (docs/sliding-window-kv.md).
		ec.Sched.KV.Groups, ec.Sched.KV.Window = g, m.SlidingWindow
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	defer ln.Close() // hs.Serve closes it too; this covers the returns before
	// The status page's history: the server samples into it, the
	// cluster's lifecycle log records land in it as events.
	hist := coordinator.NewHistory(0, 0)
	be, err := newBackend(cfg, dataDir, modelPath, f, m, ec.Sched.MaxBatchTokens, hist)
	if err != nil {
		return err
	}
	if err := printJoin(cfg, be.c, stderrOf(cfg)); err != nil {
		be.discard()
		return err
	}
	ec.Epoch = be.c.Epoch()
	ec.Sched.FirstSeq = sched.SeqID(be.c.FirstSeq())
	eng, err := coordinator.NewEngine(ec, be.c.Pipeline())
	if err != nil {
		be.discard()
		return err
	}
	ready := func() error {
		if eng.Draining() {
			return errors.New("draining: not admitting requests")
		}
		if err := be.c.Ready(); err != nil {
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
	sc.History = hist
	srv := coordinator.NewServer(sc, eng, info, ready)
	// No ReadTimeout or WriteTimeout: they would cut streams that last
	// longer. The server bounds each body read and each response write
	// itself (--body-timeout, --write-timeout).
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: cfg.IdleTimeout,
		ErrorLog: slog.NewLogLogger(log.With("component", "http").Handler(), slog.LevelDebug)}
	if cfg.MaxConns > 0 {
		ln = netutil.LimitListener(ln, cfg.MaxConns)
	}

	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := be.run(runCtx); err != nil {
			log.Error("pipeline", "err", err)
		}
	})
	wg.Go(func() { eng.Run(runCtx) })
	wg.Go(func() { srv.Run(runCtx) })
	wg.Go(func() { logThroughput(runCtx, log, eng, func() string { return kvBlocks(sc.View) }, cfg.LogEvery) })
	serveErr := make(chan error, 1)
	wg.Go(func() {
		if cfg.TLSCert != "" {
			serveErr <- hs.ServeTLS(ln, cfg.TLSCert, cfg.TLSKey)
		} else {
			serveErr <- hs.Serve(ln)
		}
	})
	log.Info("serving", "addr", ln.Addr().String(), "tls", cfg.TLSCert != "", "api_keys", len(sc.APIKeys)+min(len(sc.APIKey), 1), "model", name, "layers", m.Layers,
		"max_model_len", ec.Sched.MaxModelLen, "epoch", ec.Epoch, "local_shards", cfg.LocalShards, "min_shards", cfg.MinShards,
		"threads", cfg.Threads, "gossip", be.c.GossipAddr(), "grpc", be.c.GRPCAddr(), "data_dir", dataDir)
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
	hist.Record(coordinator.Event{T: time.Now().UnixMilli(), Kind: "drain", Message: "draining, grace " + cfg.Grace.String()})
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

// writeDemoModel writes the built-in demo model to dir/strata-demo.gguf (the
// same bytes every time) and returns its path.
func writeDemoModel(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "strata-demo.gguf")
	if err := model.WriteRandomFile(path, model.DemoSpec()); err != nil {
		return "", fmt.Errorf("write the demo model: %w", err)
	}
	return path, nil
}
