package coordinator

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/sched"
)

// TestEngineRunsTheClusterLoop: an engine over a cluster runs the
// cluster's loop in its own goroutine, so that one goroutine owns the
// scheduler and the control core. While it does, the cluster's events are
// handled there (a request runs through the pipeline; a shard registers
// and opens its control stream); when the engine stops, Run's goroutine
// takes the loop back and handles them again; and a cluster stopping
// while an engine runs its loop ends Run at once.
func TestEngineRunsTheClusterLoop(t *testing.T) {
	c := startCluster(t, t.TempDir(), 1, nil)
	newFakeShard(t, c.GRPCAddr(), "node-a", 1, 1<<20).join()
	waitReady(t, c.Cluster)
	engine := func() (*Engine, func()) {
		ec := DefaultEngineConfig()
		ec.Epoch, ec.Sched.FirstSeq = c.Epoch(), sched.SeqID(c.FirstSeq())
		eng, err := NewEngine(ec, c.Pipeline())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			eng.Run(ctx)
		}()
		stop := func() {
			cancel()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Engine.Run did not return within 10s")
			}
		}
		t.Cleanup(stop)
		waitUntil(t, "the engine to run the cluster's loop", c.lent.Load)
		return eng, stop
	}
	shards := func(n int) func() bool {
		return func() bool {
			v := c.View()
			return len(v.Shards) == n && !slices.ContainsFunc(v.Shards, func(s ShardView) bool { return !s.Connected })
		}
	}

	eng, stop := engine()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := eng.Submit(ctx, GenParams{Prompt: []int32{1, 2, 3}, MaxTokens: 4, Sample: sample.DefaultParams()})
	if err != nil {
		t.Fatal(err)
	}
	var got []int32
	for {
		toks, done, _, err := st.Next(ctx)
		for _, tk := range toks {
			got = append(got, tk.ID)
		}
		if err != nil {
			t.Fatalf("%v: engine %+v, cluster %+v, got %v", err, eng.Stats(), c.View(), got)
		}
		if done {
			break
		}
	}
	if want := []int32{4, 5, 6, 7}; !slices.Equal(got, want) { // the fake's sample: the last token + 1
		t.Fatalf("tokens %v, want %v", got, want)
	}
	newFakeShard(t, c.GRPCAddr(), "node-b", 1, 1<<20).join()
	waitUntil(t, "node-b registered and connected while the engine runs the loop", shards(2))

	stop()
	waitUntil(t, "Run to take the loop back", func() bool { return !c.lent.Load() })
	newFakeShard(t, c.GRPCAddr(), "node-c", 1, 1<<20).join()
	waitUntil(t, "node-c registered and connected on Run's loop", shards(3))

	_, stop = engine()
	c.stop() // fails the test unless Run returns within 10 s
	stop()
}
