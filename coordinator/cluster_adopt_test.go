package coordinator

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/sched"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
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
	shards := func(n int) func() bool {
		return func() bool {
			v := c.View()
			return len(v.Shards) == n && !slices.ContainsFunc(v.Shards, func(s ShardView) bool { return !s.Connected })
		}
	}

	eng, stop := runEngine(t, c.Cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := eng.Submit(ctx, GenParams{Prompt: []int32{1, 2, 3}, MaxTokens: 4, Sample: sample.DefaultParams()})
	if err != nil {
		t.Fatal(err)
	}
	got, err := streamTokens(ctx, st)
	if err != nil {
		t.Fatalf("%v: engine %+v, cluster %+v, got %v", err, eng.Stats(), c.View(), got)
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

	_, stop = runEngine(t, c.Cluster)
	c.stop() // fails the test unless Run returns within 10 s
	stop()
}

// TestEngineTurnFollows: a turn of the cluster's loop that the engine runs
// is followed before the engine's next step: a placement or a pause the
// turn made is the scheduler's at once. Otherwise the step right after a
// pause dispatches into the paused pipeline, failing the batch and costing
// its requests a retry though nothing of theirs was lost.
func TestEngineTurnFollows(t *testing.T) {
	h := newHandCluster(t, 2)
	h.join("node-a", 1, 1<<20)
	ec := DefaultEngineConfig()
	ec.Epoch = h.Epoch()
	eng, err := NewEngine(ec, h.Pipeline())
	if err != nil {
		t.Fatal(err)
	}
	eng.follow() // as Run starts: no placement yet
	select {
	case <-h.pipe.changed:
	default:
	}
	cl := &clusterLoop{c: h.Cluster, ctx: context.Background()}
	reply := make(chan registerReply, 1)
	eng.turn(cl, evRegister{req: &pb.RegisterRequest{NodeId: "node-b", Incarnation: 2, GrpcAddr: "127.0.0.1:1",
		ProtocolVersion: transport.ProtocolVersion, Devices: &pb.Devices{CpuCores: 2, MemoryBytes: 1 << 20, Device: "cpu"}}, reply: reply})
	r := <-reply
	if r.err != nil {
		t.Fatal(r.err)
	}
	if eng.version != 0 {
		t.Fatalf("engine on placement %d with one of --min-shards 2", eng.version)
	}
	errc := make(chan error, 1)
	eng.turn(cl, evCtlOpen{hello: &pb.StreamHello{ShardId: r.rep.GetShardId(), Incarnation: 2, Epoch: h.Epoch()}, out: newOutbox(), reply: errc})
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if h.active == nil || h.active.Version != 1 {
		t.Fatalf("placement %+v after the second shard's stream opened, want version 1", h.active)
	}
	if eng.version != 1 {
		t.Fatalf("right after the turn that made placement 1 the engine is on placement %d: the turn was not followed", eng.version)
	}
}

// TestEngineLedger: over a cluster, the scheduler's record is the one
// answers and reconcile go by. A heartbeat reply names unknown only what
// the scheduler does not run; /v1/cluster counts what it runs; a pause
// fails the batch in flight at once, so its request is served again as
// soon as the link is back, not after the 30 s reclaim deadline; and the
// last stage's results complete it.
func TestEngineLedger(t *testing.T) {
	c, sh := holdingCluster(t)
	eng, _ := runEngine(t, c.Cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	st, err := eng.Submit(ctx, GenParams{Prompt: []int32{1, 2, 3}, MaxTokens: 3, Sample: sample.DefaultParams()})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the shard to hold the prompt's batch", func() bool { _, _, _, b := sh.snapshot(); return len(b) == 1 })
	_, _, _, held := sh.snapshot()
	seq := held[0].GetRows()[0].GetSeq()
	sh.heartbeat(seq, 99)
	waitUntil(t, "a heartbeat reply", func() bool { _, _, rep, _ := sh.snapshot(); return len(rep) > 0 })
	if _, _, rep, _ := sh.snapshot(); !slices.Equal(rep[0].GetUnknownSeqs(), []uint64{99}) {
		t.Fatalf("heartbeat reply names %v unknown with sequence %d running, want [99]", rep[0].GetUnknownSeqs(), seq)
	}
	if v := c.View(); v.LiveSequences != 1 {
		t.Fatalf("/v1/cluster live sequences %d, want 1", v.LiveSequences)
	}

	sh.breakStage() // the link drops: the pause fails the held batch
	sh.mu.Lock()
	sh.hold = false
	sh.mu.Unlock()
	got, err := streamTokens(ctx, st)
	if err != nil {
		t.Fatalf("%v: engine %+v, cluster %+v, got %v", err, eng.Stats(), c.View(), got)
	}
	if want := []int32{4, 5, 6}; !slices.Equal(got, want) {
		t.Fatalf("tokens %v, want %v", got, want)
	}
	if n := c.BatchFailedByReason()["pipeline_lost"]; n != 1 {
		t.Fatalf("pipeline_lost %d, want the one held batch", n)
	}
}

// runEngine starts an engine over c's pipeline and waits until it runs the
// cluster's loop; stop (also a cleanup) ends it.
func runEngine(t *testing.T, c *Cluster) (eng *Engine, stop func()) {
	t.Helper()
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
	stop = func() {
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

// streamTokens reads st to its end and returns its tokens.
func streamTokens(ctx context.Context, st *Stream) ([]int32, error) {
	var got []int32
	for {
		toks, done, _, err := st.Next(ctx)
		for _, tk := range toks {
			got = append(got, tk.ID)
		}
		if err != nil || done {
			return got, err
		}
	}
}
