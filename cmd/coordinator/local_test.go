package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/strata-llm/strata/coordinator"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/model/tokenizer"
	"github.com/strata-llm/strata/shard"
)

const stories = "../../../shared/models/stories260K.gguf"

type cluster struct {
	eng   *coordinator.Engine
	local *shard.Local
	tok   *tokenizer.Tokenizer
	stop  []int32
}

// startCluster runs an engine over n in-process shards until the test ends.
func startCluster(t *testing.T, path string, n int, kvMemory int64, tweak func(*coordinator.EngineConfig)) *cluster {
	t.Helper()
	if _, err := os.Stat(path); path != "" && err != nil {
		t.Skipf("model absent: %v", err)
	}
	f, m, tok, err := coordinator.OpenModel(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	pool := cpu.NewPool(2)
	t.Cleanup(pool.Close)
	local, err := newLocal(m, localConfig{Shards: n, Pool: pool, KVMemory: kvMemory, KVType: ggml.F16})
	if err != nil {
		t.Fatal(err)
	}
	cfg := coordinator.DefaultEngineConfig()
	cfg.Epoch = 1
	cfg.Sched.MaxModelLen = m.Context
	if tweak != nil {
		tweak(&cfg)
	}
	eng, err := coordinator.NewEngine(cfg, local)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { local.Run(ctx) })
	wg.Go(func() { eng.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	info, err := coordinator.NewModelInfo("test", f, m, tok)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{eng: eng, local: local, tok: tok, stop: info.Stop}
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
func (c *cluster) waitDrained(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := c.eng.Stats()
		ok := st.Running == 0 && st.Waiting == 0 && st.KV.Used == 0 && st.KV.Sequences == 0
		for _, s := range c.local.StageStats() {
			ok = ok && s.BlocksUsed == 0 && s.Sequences == 0
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained: engine %+v, stages %+v", st, c.local.StageStats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

const onceUponATime = ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said"

// TestGreedyThroughShards: greedy output through 1, 2 and 3 in-process
// shards equals llama.cpp's.
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
	for i, s := range c.local.StageStats() {
		t.Logf("stage %d: freed %v refused %v", i, s.Freed, s.Refused)
		if s.Freed["lease"]+s.Freed["reconcile"] != 0 {
			t.Errorf("stage %d needed repairs: %v", i, s.Freed)
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
