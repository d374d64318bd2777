package coordinator

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/strata-llm/strata/control"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func testShape() ModelShape {
	return ModelShape{Shape: control.Shape{Model: "feedface", Layers: 4, LayerBytes: []int64{1000, 1000, 1000, 1000},
		EmbedBytes: 500, HeadBytes: 500, KVBytesPerBlockLayer: 100, BlockSize: 16}, HiddenDim: 8, MaxBatchTokens: 64}
}

type testCluster struct {
	*Cluster
	stop func()
}

func startCluster(t *testing.T, dir string, minShards int, mod func(*ClusterConfig)) *testCluster {
	t.Helper()
	cfg := DefaultClusterConfig()
	cfg.GossipAddr = ""
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.DataDir = dir
	cfg.MinShards = minShards
	cfg.Shape = testShape()
	cfg.LossConfirm = 300 * time.Millisecond
	if mod != nil {
		mod(&cfg)
	}
	c, err := NewCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return within 10s")
			}
		})
	}
	t.Cleanup(stop)
	return &testCluster{c, stop}
}

// waitUntil polls cond for up to 5 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitReady(t *testing.T, c *Cluster) {
	t.Helper()
	waitUntil(t, "a ready pipeline", func() bool { return c.Ready() == nil })
}

func nextResult(t *testing.T, p Pipeline) *transport.BatchResult {
	t.Helper()
	select {
	case r := <-p.Results():
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no batch result within 5s")
		return nil
	}
}

func TestClusterEndToEnd(t *testing.T) {
	c := startCluster(t, t.TempDir(), 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err == nil {
		t.Fatal("WaitReady succeeded with no shard")
	}
	sh := newFakeShard(t, c.GRPCAddr(), "node-a", 7, 1<<20)
	sh.join()
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	assigns, _, _, _ := sh.snapshot()
	if len(assigns) != 1 {
		t.Fatalf("got %d assigns, want 1", len(assigns))
	}
	a := assigns[0]
	if a.GetFirstLayer() != 0 || a.GetEndLayer() != 4 || !a.GetEmbed() || !a.GetHead() || a.GetNextAddr() != "" || a.GetKvBlocks() == 0 || a.GetModelSha256() != "feedface" {
		t.Fatalf("assign = %v", a)
	}
	p := direct(t, c.Cluster)
	if p.Stages() != 1 || p.Blocks() != int(a.GetKvBlocks()) || p.BlockSize() != 16 {
		t.Fatalf("pipeline shape %d stages %d blocks %d bs, assign %v", p.Stages(), p.Blocks(), p.BlockSize(), a)
	}

	b := &transport.MicroBatch{Epoch: c.Epoch(), ID: 1, Rows: []transport.Row{
		{Seq: 10, Pos: 0, First: true, Tokens: []int32{5, 6, 7}, Blocks: []int32{0}, Sample: true},
	}}
	if err := p.Dispatch(b); err != nil {
		t.Fatal(err)
	}
	r := nextResult(t, p)
	if r.ID != 1 || r.Lost || len(r.Samples) != 1 || r.Samples[0].Seq != 10 || r.Samples[0].Token != 8 {
		t.Fatalf("result = %+v", r)
	}
	// A later row carries the full block table.
	b = &transport.MicroBatch{Epoch: c.Epoch(), ID: 2, Rows: []transport.Row{
		{Seq: 10, Pos: 16, Tokens: []int32{8}, Blocks: []int32{0, 1}, Sample: true},
	}}
	if err := p.Dispatch(b); err != nil {
		t.Fatal(err)
	}
	if r := nextResult(t, p); r.ID != 2 || r.Samples[0].Token != 9 {
		t.Fatalf("result = %+v", r)
	}
	_, _, _, batches := sh.snapshot()
	if got := batches[1].GetRows()[0].GetBlocks(); !slices.Equal(got, []int32{0, 1}) {
		t.Fatalf("second row blocks = %v, want the full table [0 1]", got)
	}
	if batches[0].GetPlacementVersion() != a.GetPlacementVersion() || batches[0].GetEpoch() != c.Epoch() {
		t.Fatalf("batch stamped epoch %d placement %d", batches[0].GetEpoch(), batches[0].GetPlacementVersion())
	}

	// Anti-entropy: the heartbeat reply names live sequences the
	// coordinator does not know.
	sh.heartbeat(10, 999)
	waitUntil(t, "a heartbeat reply", func() bool { _, _, rep, _ := sh.snapshot(); return len(rep) > 0 })
	_, _, replies, _ := sh.snapshot()
	if rep := replies[0]; !slices.Equal(rep.GetUnknownSeqs(), []uint64{999}) || rep.GetLeaseMs() <= 0 || rep.GetEpoch() != c.Epoch() {
		t.Fatalf("heartbeat reply = %v", rep)
	}
	waitUntil(t, "the view to show the heartbeat", func() bool {
		v := c.View()
		return len(v.Shards) == 1 && v.Shards[0].KVUsed == 3 && v.Shards[0].State == "ready"
	})
	v := c.View()
	if !v.Ready || v.Placement != a.GetPlacementVersion() || v.LiveSequences != 1 || v.Shards[0].Stage != 0 {
		t.Fatalf("view = %+v", v)
	}
}

func TestClusterTombstoneBackstopResend(t *testing.T) {
	c := startCluster(t, t.TempDir(), 1, nil)
	sh := newFakeShard(t, c.GRPCAddr(), "node-a", 7, 1<<20)
	sh.mu.Lock()
	sh.noAck = true
	sh.mu.Unlock()
	sh.join()
	waitReady(t, c.Cluster)
	p := direct(t, c.Cluster)
	if err := p.Dispatch(&transport.MicroBatch{Epoch: c.Epoch(), ID: 1, Rows: []transport.Row{{Seq: 3, First: true, Tokens: []int32{1}, Blocks: []int32{0}, Sample: true}}}); err != nil {
		t.Fatal(err)
	}
	nextResult(t, p)
	tomb := transport.Tombstone{Epoch: c.Epoch(), Seq: 3, Reason: transport.ReasonAborted}
	if err := p.Dispatch(&transport.MicroBatch{Epoch: c.Epoch(), Tombstones: []transport.Tombstone{tomb}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the backstop tombstones", func() bool { _, ts, _, _ := sh.snapshot(); return len(ts) == 1 })
	_, ts, _, _ := sh.snapshot()
	if got := ts[0].GetTombstones(); len(got) != 1 || got[0].GetSeq() != 3 || got[0].GetReason() != pb.Tombstone_ABORTED || ts[0].GetAckId() == 0 {
		t.Fatalf("backstop = %v", ts[0])
	}
	waitUntil(t, "the in-band tombstone", func() bool { _, _, _, b := sh.snapshot(); return len(b) == 2 })
	_, _, _, batches := sh.snapshot()
	if got := batches[1].GetTombstones(); len(got) != 1 || got[0].GetSeq() != 3 {
		t.Fatalf("in-band tombstones = %v", got)
	}
	waitUntil(t, "1 unacked", func() bool { return c.UnackedTombstones()[sh.shardID] == 1 })

	// Reconnect: the unacked tombstones come again; this time they are
	// acked.
	sh.mu.Lock()
	sh.noAck = false
	sh.mu.Unlock()
	sh.openControl()
	waitUntil(t, "the resent tombstones", func() bool { _, ts, _, _ := sh.snapshot(); return len(ts) == 2 })
	_, ts, _, _ = sh.snapshot()
	if ts[1].GetAckId() != ts[0].GetAckId() || ts[1].GetTombstones()[0].GetSeq() != 3 {
		t.Fatalf("resent %v, first %v", ts[1], ts[0])
	}
	waitUntil(t, "0 unacked", func() bool { return c.UnackedTombstones()[sh.shardID] == 0 })
	if n := len(p.running(nil)); n != 0 {
		t.Fatalf("live sequences after the tombstone = %d", n)
	}
	// A heartbeat taken before the tombstone arrived does not name the
	// ending sequence unknown: the tombstone frees it, not reconcile.
	sh.heartbeat(3)
	waitUntil(t, "a heartbeat reply", func() bool { _, _, rep, _ := sh.snapshot(); return len(rep) > 0 })
	if _, _, rep, _ := sh.snapshot(); len(rep[0].GetUnknownSeqs()) != 0 {
		t.Fatalf("unknown = %v right after the tombstone", rep[0].GetUnknownSeqs())
	}
}

func TestClusterStageStreamDropFailsInflight(t *testing.T) {
	c, sh := holdingCluster(t)
	p := direct(t, c.Cluster)
	for id := uint64(1); id <= 2; id++ {
		if err := p.Dispatch(&transport.MicroBatch{Epoch: c.Epoch(), ID: id, Rows: []transport.Row{{Seq: id, First: true, Tokens: []int32{1}, Blocks: []int32{0}, Sample: true}}}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the shard to hold 2 batches", func() bool { _, _, _, b := sh.snapshot(); return len(b) == 2 })
	sh.breakStage()
	lost := map[uint64]bool{}
	for range 2 {
		r := nextResult(t, p)
		if !r.Lost || !strings.Contains(r.Reason, "stage-0 link") {
			t.Fatalf("result = %+v, want lost with the link's reason", r)
		}
		lost[r.ID] = true
	}
	if !lost[1] || !lost[2] {
		t.Fatalf("lost = %v", lost)
	}
	if got := c.BatchFailedByReason()["pipeline_lost"]; got != 2 {
		t.Fatalf("pipeline_lost = %d, want 2", got)
	}
	// The shard's control stream is fine: the link is reopened to the same
	// placement and dispatch resumes.
	sh.mu.Lock()
	sh.hold = false
	sh.mu.Unlock()
	waitReady(t, c.Cluster)
	if err := p.Dispatch(&transport.MicroBatch{Epoch: c.Epoch(), ID: 3, Rows: []transport.Row{{Seq: 3, First: true, Tokens: []int32{1}, Blocks: []int32{0}, Sample: true}}}); err != nil {
		t.Fatal(err)
	}
	if r := nextResult(t, p); r.ID != 3 || r.Lost {
		t.Fatalf("result = %+v", r)
	}
	if v := c.View(); v.Placement != 1 {
		t.Fatalf("placement %d after a stream break, want 1 kept", v.Placement)
	}
}

func TestClusterShardLossReplaces(t *testing.T) {
	c := startCluster(t, t.TempDir(), 2, nil)
	a := newFakeShard(t, c.GRPCAddr(), "node-a", 1, 1<<20)
	b := newFakeShard(t, c.GRPCAddr(), "node-b", 2, 1<<20)
	a.join()
	b.join()
	waitReady(t, c.Cluster)
	aa, _, _, _ := a.snapshot()
	ba, _, _, _ := b.snapshot()
	if aa[0].GetEndLayer() != 2 || !aa[0].GetEmbed() || aa[0].GetNextAddr() != b.ln.Addr().String() || ba[0].GetFirstLayer() != 2 || !ba[0].GetHead() {
		t.Fatalf("assigns a=%v b=%v", aa[0], ba[0])
	}
	p := direct(t, c.Cluster)
	if err := p.Dispatch(&transport.MicroBatch{Epoch: c.Epoch(), ID: 1, Rows: []transport.Row{{Seq: 1, First: true, Tokens: []int32{4}, Blocks: []int32{0}, Sample: true}}}); err != nil {
		t.Fatal(err)
	}
	if r := nextResult(t, p); r.Lost || r.Samples[0].Token != 5 {
		t.Fatalf("through 2 stages: %+v", r)
	}
	a.mu.Lock()
	a.hold = true
	a.mu.Unlock()
	if err := p.Dispatch(&transport.MicroBatch{Epoch: c.Epoch(), ID: 2, Rows: []transport.Row{{Seq: 2, First: true, Tokens: []int32{4}, Blocks: []int32{1}, Sample: true}}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "stage 0 to hold the batch", func() bool { _, _, _, bs := a.snapshot(); return len(bs) == 2 })
	// Shard b goes away for good: its control stream breaks, the fast
	// signal, which is the loss. The in-flight batch is failed and the
	// model re-placed at once onto a alone, though --min-shards is 2.
	b.closeControl()
	b.srv.Stop()
	if r := nextResult(t, p); r.ID != 2 || !r.Lost {
		t.Fatalf("in-flight batch: %+v, want lost", r)
	}
	a.mu.Lock()
	a.hold = false
	a.mu.Unlock()
	waitUntil(t, "placement 2 ready", func() bool { return c.View().Placement == 2 && c.Ready() == nil })
	aa, _, _, _ = a.snapshot()
	last := aa[len(aa)-1]
	if last.GetPlacementVersion() != 2 || last.GetFirstLayer() != 0 || last.GetEndLayer() != 4 || !last.GetHead() || last.GetNextAddr() != "" {
		t.Fatalf("survivor's new assign = %v, want version 2 with every layer", last)
	}
	if err := p.Dispatch(&transport.MicroBatch{Epoch: c.Epoch(), ID: 4, Rows: []transport.Row{{Seq: 4, First: true, Tokens: []int32{4}, Blocks: []int32{0}, Sample: true}}}); err != nil {
		t.Fatal(err)
	}
	if res := nextResult(t, p); res.ID != 4 || res.Lost || res.Samples[0].Token != 5 {
		t.Fatalf("after re-placement: %+v", res)
	}
	// A replacement joining the healthy (degraded) pipeline is a spare.
	r := newFakeShard(t, c.GRPCAddr(), "node-c", 3, 1<<20)
	r.join()
	waitUntil(t, "the replacement connected", func() bool {
		for _, s := range c.View().Shards {
			if s.NodeID == "node-c" {
				return s.Connected
			}
		}
		return false
	})
	v := c.View()
	states := map[string]string{}
	for _, s := range v.Shards {
		states[s.NodeID] = s.State
	}
	if states["node-b"] != "lost" || states["node-a"] != "ready" || states["node-c"] != "idle" || v.Placement != 2 {
		t.Fatalf("placement %d, states = %v", v.Placement, states)
	}
}

// connected reports whether v shows node's control stream up.
func connected(v ClusterView, node string) bool {
	for _, s := range v.Shards {
		if s.NodeID == node {
			return s.Connected
		}
	}
	return false
}

func TestClusterMinShardsAndSpare(t *testing.T) {
	c := startCluster(t, t.TempDir(), 2, nil)
	a := newFakeShard(t, c.GRPCAddr(), "node-a", 1, 1<<20)
	a.join()
	// The view is published after the loop has handled an event and
	// reconciled: once it shows a's stream, placement has been decided.
	waitUntil(t, "node-a connected", func() bool { return connected(c.View(), "node-a") })
	if v := c.View(); v.Placement != 0 {
		t.Fatalf("placement %d below --min-shards", v.Placement)
	}
	if as, _, _, _ := a.snapshot(); len(as) != 0 {
		t.Fatalf("assigned below --min-shards: %v", as)
	}
	if err := c.Ready(); err == nil || !strings.Contains(err.Error(), "1 of --min-shards 2") {
		t.Fatalf("Ready = %v", err)
	}
	b := newFakeShard(t, c.GRPCAddr(), "node-b", 2, 3<<20)
	b.join()
	waitReady(t, c.Cluster)
	// Memory-weighted: b has 3× a's memory.
	ba, _, _, _ := b.snapshot()
	if ba[0].GetFirstLayer() != 1 || ba[0].GetEndLayer() != 4 {
		t.Fatalf("b assign = %v", ba[0])
	}
	// A third shard joining a healthy pipeline is a spare.
	s := newFakeShard(t, c.GRPCAddr(), "node-s", 3, 1<<20)
	s.join()
	version := c.View().Placement
	waitUntil(t, "the spare connected", func() bool { return connected(c.View(), "node-s") })
	if v := c.View(); v.Placement != version {
		t.Fatalf("a spare's arrival re-placed: placement %d -> %d", version, v.Placement)
	}
	if as, _, _, _ := s.snapshot(); len(as) != 0 {
		t.Fatalf("spare assigned: %v", as)
	}
	for _, sv := range c.View().Shards {
		if sv.NodeID == "node-s" && (sv.Stage != -1 || sv.State != "idle") {
			t.Fatalf("spare view = %+v", sv)
		}
	}
}

func TestClusterRestartEpochAndPlacement(t *testing.T) {
	dir := t.TempDir()
	c := startCluster(t, dir, 1, nil)
	sh := newFakeShard(t, c.GRPCAddr(), "node-a", 7, 1<<20)
	sh.join()
	waitReady(t, c.Cluster)
	p := direct(t, c.Cluster)
	if err := p.Dispatch(&transport.MicroBatch{Epoch: c.Epoch(), ID: 1, Rows: []transport.Row{{Seq: 5000, First: true, Tokens: []int32{1}, Blocks: []int32{0}, Sample: true}}}); err != nil {
		t.Fatal(err)
	}
	nextResult(t, p)
	epoch1, first1 := c.Epoch(), c.FirstSeq()
	c.stop()

	c2 := startCluster(t, dir, 1, nil)
	if c2.Epoch() <= epoch1 {
		t.Fatalf("epoch %d after restart, before %d", c2.Epoch(), epoch1)
	}
	if c2.FirstSeq() <= 5000 || c2.FirstSeq() <= first1 {
		t.Fatalf("FirstSeq %d after dispatching 5000 (before %d)", c2.FirstSeq(), first1)
	}
	if r := c2.core.Restored(); r == nil || r.Version != 1 || len(r.Stages) != 1 {
		t.Fatalf("restored placement = %+v", r)
	}
	// The same shard process re-registers under the new epoch and gets the
	// restored ranges under a new version.
	sh.cc.Close()
	sh2 := newFakeShard(t, c2.GRPCAddr(), "node-a", 7, 1<<20)
	sh2.join()
	waitReady(t, c2.Cluster)
	as, _, _, _ := sh2.snapshot()
	if as[0].GetPlacementVersion() != 2 || as[0].GetFirstLayer() != 0 || as[0].GetEndLayer() != 4 {
		t.Fatalf("assign after restart = %v", as[0])
	}
	// A control stream from the old epoch is refused.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctl, err := sh2.client.Control(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ctl.Send(&pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Hello{Hello: &pb.StreamHello{ShardId: sh2.shardID, NodeId: "node-a", Incarnation: 7, Epoch: epoch1}}})
	if _, err := ctl.Recv(); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("old-epoch control stream: %v, want FailedPrecondition", err)
	}
}

// direct returns a DirectPipeline over c's running loop.
func direct(t *testing.T, c *Cluster) *DirectPipeline {
	t.Helper()
	p, err := c.Direct()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// holdingCluster is a cluster of one fake shard, ready, that holds every
// batch it receives unanswered; a stage-stream loss is declared after 5 s.
func holdingCluster(t *testing.T) (*testCluster, *fakeShard) {
	t.Helper()
	c := startCluster(t, t.TempDir(), 1, func(cfg *ClusterConfig) { cfg.LossConfirm = 5 * time.Second })
	sh := newFakeShard(t, c.GRPCAddr(), "node-a", 7, 1<<20)
	sh.join()
	waitReady(t, c.Cluster)
	sh.mu.Lock()
	sh.hold = true
	sh.mu.Unlock()
	return c, sh
}
