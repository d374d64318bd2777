package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/strata-llm/strata/coordinator"
	"github.com/strata-llm/strata/model/cuda"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/model/tokenizer"
	"github.com/strata-llm/strata/sched"
	"github.com/strata-llm/strata/shard"
)

const stories = "../../../shared/models/stories260K.gguf"

type cluster struct {
	eng  *coordinator.Engine
	be   *backend
	tok  *tokenizer.Tokenizer
	stop []int32
}

// startCluster runs an engine over serve's backend with n local shards (on
// loopback gRPC, sharing a pool of 2 workers) until the test ends, and
// returns once they form an n-stage pipeline.
func startCluster(t *testing.T, path string, n int, kvMemory int64, tweak func(*coordinator.EngineConfig)) *cluster {
	t.Helper()
	if _, err := os.Stat(path); path != "" && err != nil {
		sharedAbsent(t, path, err)
	}
	f, m, tok, err := coordinator.OpenModel(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	cfg := coordinator.DefaultEngineConfig()
	cfg.Sched.MaxModelLen = m.Context
	if tweak != nil {
		tweak(&cfg)
	}
	sc := serveConfig{LocalShards: n, MinShards: n, Gossip: "127.0.0.1:0", GRPC: "127.0.0.1:0", Private: true, Threads: 2,
		KVMemory: kvMemory, KVType: ggml.F16, Log: slog.New(slog.DiscardHandler)}
	be, err := newBackend(sc, t.TempDir(), path, f, m, cfg.Sched.MaxBatchTokens, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Epoch = be.c.Epoch()
	cfg.Sched.FirstSeq = sched.SeqID(be.c.FirstSeq())
	eng, err := coordinator.NewEngine(cfg, be.c.Pipeline())
	if err != nil {
		be.discard()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := be.run(ctx); err != nil {
			t.Errorf("backend: %v", err)
		}
	})
	wg.Go(func() { eng.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	wctx, wcancel := context.WithTimeout(context.Background(), guard(30*time.Second))
	defer wcancel()
	if err := be.c.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	stages := 0
	for _, s := range be.c.View().Shards {
		if s.Stage >= 0 {
			stages++
		}
	}
	if stages != n {
		t.Fatalf("pipeline of %d stages over %d local shards: %+v", stages, n, be.c.View())
	}
	info, err := coordinator.NewModelInfo("test", f, m, tok)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{eng: eng, be: be, tok: tok, stop: info.Stop}
}

// shardStats snapshots every local shard.
func (c *cluster) shardStats() []shard.Stats {
	var out []shard.Stats
	for _, n := range c.be.local.nodes {
		out = append(out, n.Stats())
	}
	return out
}

// generate runs one request to its end and returns its tokens.
func (c *cluster) generate(ctx context.Context, prompt []int32, n int, p sample.Params) ([]int32, coordinator.FinishReason, error) {
	st, err := c.eng.Submit(ctx, coordinator.GenParams{Prompt: prompt, MaxTokens: n, Sample: p, Stop: c.stop})
	if err != nil {
		return nil, "", err
	}
	var out []int32
	for {
		toks, done, reason, err := st.Next(ctx)
		for _, t := range toks {
			out = append(out, t.ID)
		}
		if err != nil || done {
			return out, reason, err
		}
	}
}

// waitDrained waits until every stage and the allocator hold nothing.
func (c *cluster) waitDrained(t *testing.T, extra ...*shard.Node) {
	t.Helper()
	deadline := time.Now().Add(guard(5 * time.Second))
	stats := func() []shard.Stats {
		out := c.shardStats()
		for _, n := range extra {
			out = append(out, n.Stats())
		}
		return out
	}
	for {
		st := c.eng.Stats()
		ok := st.Running == 0 && st.Waiting == 0 && st.KV.Used == 0 && st.KV.Sequences == 0
		for _, s := range stats() {
			ok = ok && s.BlocksUsed == 0 && s.Sequences == 0
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained: engine %+v, shards %+v", st, stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

const onceUponATime = ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said"

// TestGreedyThroughShards: greedy output through 1, 2 and 3 local shards
// (serve's path: loopback gRPC, one shared pool) equals llama.cpp's.
func TestGreedyThroughShards(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("shards=%d", n), func(t *testing.T) {
			c := startCluster(t, stories, n, 1<<20, nil)
			prompt := c.tok.Encode("Once upon a time", tokenizer.EncodeOptions{AddSpecial: true})
			got, reason, err := c.generate(context.Background(), prompt, 64, sample.DefaultParams())
			if err != nil {
				t.Fatal(err)
			}
			if text := c.tok.Decode(got); text != onceUponATime || reason != coordinator.FinishLength {
				t.Errorf("got %q (%s), want %q (length)", text, reason, onceUponATime)
			}
			c.waitDrained(t)
		})
	}
}

// TestAbortStorm: many concurrent requests, about half cancelled at random
// moments and some running into short deadlines; afterwards no stage holds
// a block or a sequence, and a greedy request still gives llama.cpp's text.
func TestAbortStorm(t *testing.T) {
	c := startCluster(t, stories, 2, 256<<10, func(cfg *coordinator.EngineConfig) {
		cfg.Sched.MaxBatchTokens = 64 // many small batches: more interleaving
	})
	prompt := c.tok.Encode("Once upon a time", tokenizer.EncodeOptions{AddSpecial: true})
	const clients, perClient = 24, 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	reasons := map[coordinator.FinishReason]int{}
	for i := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for range perClient {
				ctx, cancel := context.WithCancel(context.Background())
				p := sample.DefaultParams()
				p.Temperature = 0.8
				p.Seed = rng.Uint64()
				params := coordinator.GenParams{Prompt: prompt, MaxTokens: 8 + rng.IntN(120), Sample: p, Stop: c.stop}
				if rng.IntN(6) == 0 {
					params.Deadline = time.Now().Add(time.Duration(rng.IntN(30)) * time.Millisecond)
				}
				st, err := c.eng.Submit(ctx, params)
				if err != nil {
					cancel()
					if !errors.Is(err, coordinator.ErrQueueFull) {
						t.Error(err)
					}
					continue
				}
				abortAfter := -1
				if rng.IntN(2) == 0 {
					abortAfter = rng.IntN(40)
				}
				got := 0
				for {
					toks, done, reason, err := st.Next(ctx)
					got += len(toks)
					if done || err != nil {
						mu.Lock()
						if err != nil && done {
							reasons[reason]++
						} else if err != nil {
							reasons["client-cancel"]++
						} else {
							reasons[reason]++
						}
						mu.Unlock()
						break
					}
					if abortAfter >= 0 && got >= abortAfter {
						cancel()
					}
				}
				cancel()
			}
		})
	}
	wg.Wait()
	t.Logf("endings: %v", reasons)
	c.waitDrained(t)
	got, _, err := c.generate(context.Background(), prompt, 64, sample.DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	if text := c.tok.Decode(got); text != onceUponATime {
		t.Errorf("after the storm: %q", text)
	}
	for i, s := range c.shardStats() {
		t.Logf("shard %d: freed %v", i, s.Freed)
		if s.Freed["lease"]+s.Freed["reconcile"] != 0 {
			t.Errorf("shard %d needed repairs: %v", i, s.Freed)
		}
	}
}

// TestCancelDoesNotChangeNeighbour: a request cancelled while another
// decodes beside it in the same batches leaves the other's tokens unchanged.
func TestCancelDoesNotChangeNeighbour(t *testing.T) {
	c := startCluster(t, stories, 2, 1<<20, nil)
	prompt := c.tok.Encode("Once upon a time", tokenizer.EncodeOptions{AddSpecial: true})
	other := c.tok.Encode("The little dog", tokenizer.EncodeOptions{AddSpecial: true})
	alone, _, err := c.generate(context.Background(), prompt, 48, sample.DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := c.eng.Submit(ctx, coordinator.GenParams{Prompt: other, MaxTokens: 200, Sample: sample.DefaultParams()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		n := 0
		for {
			toks, fin, _, err := st.Next(ctx)
			n += len(toks)
			if n >= 10 {
				cancel()
			}
			if fin || err != nil {
				return
			}
		}
	}()
	got, _, err := c.generate(context.Background(), prompt, 48, sample.DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	<-done
	cancel()
	if !slices.Equal(got, alone) {
		t.Errorf("with a cancelled neighbour: %q\nalone: %q", c.tok.Decode(got), c.tok.Decode(alone))
	}
	c.waitDrained(t)
}

// TestServeDevices: --device lists the local shards' devices; anything but
// cpu and cuda:N is refused.
func TestServeDevices(t *testing.T) {
	cfg, err := parseServe([]string{"--local-shards", "2", "--device", "cpu, cuda:0", "--cuda-lib-dir", "/x"}, io.Discard)
	if err != nil || len(cfg.Devices) != 2 || cfg.Devices[0] != "cpu" || cfg.Devices[1] != "cuda:0" || cfg.CUDALibDir != "/x" {
		t.Fatalf("got %q %q, %v", cfg.Devices, cfg.CUDALibDir, err)
	}
	if _, err := parseServe([]string{"--device", "gpu0"}, io.Discard); err == nil || !strings.Contains(err.Error(), "cpu or cuda:N") {
		t.Fatalf("--device gpu0: %v", err)
	}
}

// TestServeCUDAWithoutDriver: `serve --local-shards 1 --device cuda:0` on a
// machine without the NVIDIA driver fails at start, the reason in one line.
func TestServeCUDAWithoutDriver(t *testing.T) {
	if _, err := cuda.LoadDriver(); err == nil {
		t.Skip("this machine has an NVIDIA driver")
	}
	cfg, err := parseServe([]string{"--listen", "127.0.0.1:0", "--grace", "1s", "--local-shards", "1", "--device", "cuda:0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), guard(30*time.Second))
	defer cancel()
	err = serve(ctx, cfg)
	if !errors.Is(err, cuda.ErrNoDriver) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("serve: %q, want one line wrapping cuda.ErrNoDriver", err)
	}
}
