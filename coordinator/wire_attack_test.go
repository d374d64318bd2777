package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// The tests of this file send the coordinator the single messages a
// review found could fail every request, grow its state without bound or
// learn its secrets, while good batches are in flight: each must be a
// refused message (counted in strata_wire_refused_total by a reason from
// transport's Code enum), the good batches must get their own answers and
// the pipeline must stay ready.

// twoStages starts a cluster of two fake shards (vocabulary 100) and
// returns it with the stages in order, once the pipeline is ready.
func twoStages(t *testing.T, opts ...func(*ClusterConfig)) (*testCluster, [2]*fakeShard) {
	t.Helper()
	c := startCluster(t, t.TempDir(), 2, func(cfg *ClusterConfig) {
		cfg.Shape.Vocab = 100
		for _, o := range opts {
			o(cfg)
		}
	})
	a := newFakeShard(t, c.GRPCAddr(), "node-a", 1, 1<<20)
	b := newFakeShard(t, c.GRPCAddr(), "node-b", 2, 1<<20)
	a.join()
	b.join()
	waitReady(t, c.Cluster)
	var st [2]*fakeShard
	for _, f := range []*fakeShard{a, b} {
		assigns, _, _, _ := f.snapshot()
		st[assigns[len(assigns)-1].GetStage()] = f
	}
	return c, st
}

// answerHeld makes the held last stage f answer every batch it received,
// as it would have (fakeShard.process).
func (f *fakeShard) answerHeld() {
	f.mu.Lock()
	held := f.batches
	f.batches, f.hold = nil, false
	f.mu.Unlock()
	for _, h := range held {
		f.process(h)
	}
}

// attacker is a process that reached the coordinator's gRPC port.
func attacker(t *testing.T, c *testCluster) pb.CoordinatorClient {
	t.Helper()
	cc, err := transport.Dial(c.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewCoordinatorClient(cc)
}

// TestClusterRefusesForgedAnswers: with three batches held in flight at
// the last stage, BatchFailed reports for all of them sprayed on Results
// streams that the placement does not name as the last stage's, with
// free-text reasons, on the control stream of a shard outside the
// placement, or naming sequences not in the batch, fail none of them;
// each is refused and counted, no reason of theirs reaches
// strata_batch_failed_total. So are results from stage 0, with a token
// outside the vocabulary or sampling a sequence the batch does not have.
// When the last stage answers, each batch gets its own result and the
// pipeline stays ready.
func TestClusterRefusesForgedAnswers(t *testing.T) {
	c, st := twoStages(t)
	last := st[1]
	last.mu.Lock()
	last.hold = true
	last.mu.Unlock()
	p := direct(t, c.Cluster)
	for id := uint64(1); id <= 3; id++ {
		b := &transport.MicroBatch{Epoch: c.Epoch(), ID: id, Rows: []transport.Row{
			{Seq: 10 + id, First: true, Tokens: []int32{5, int32(id)}, Blocks: []int32{int32(id)}, Sample: true}}}
		if err := p.Dispatch(b); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the held batches", func() bool { _, _, _, b := last.snapshot(); return len(b) == 3 })

	cl := attacker(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	spray := func(hello *pb.StreamHello, fs ...*pb.BatchFailed) {
		t.Helper()
		rs, err := cl.Results(ctx)
		if err != nil {
			t.Fatal(err)
		}
		msgs := []*pb.ResultMessage{{Msg: &pb.ResultMessage_Hello{Hello: hello}}}
		for _, f := range fs {
			msgs = append(msgs, &pb.ResultMessage{Msg: &pb.ResultMessage_Failed{Failed: f}})
		}
		for _, m := range msgs {
			if err := rs.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := rs.CloseAndRecv(); err != nil {
			t.Fatalf("results stream: %v", err)
		}
	}
	all := func(reason, shard string) []*pb.BatchFailed {
		var out []*pb.BatchFailed
		for id := uint64(1); id <= 3; id++ {
			out = append(out, &pb.BatchFailed{BatchId: id, Reason: reason, ShardId: shard, Epoch: c.Epoch()})
		}
		return out
	}
	before := c.refused.Snapshot()
	// A shard nobody placed.
	spray(&pb.StreamHello{ShardId: "evil-0000000000000001", NodeId: "evil", Epoch: c.Epoch()}, all("backend_error", "evil-0000000000000001")...)
	// Stage 0, which does not return results.
	spray(&pb.StreamHello{ShardId: st[0].shardID, NodeId: st[0].nodeID, Incarnation: st[0].inc, Epoch: c.Epoch()}, all("backend_error", st[0].shardID)...)
	// Free text, which would become a metric series each.
	var junk []*pb.BatchFailed
	for i := range 50 {
		junk = append(junk, &pb.BatchFailed{BatchId: 1, Reason: fmt.Sprintf("disk %d on fire", i), ShardId: last.shardID})
	}
	spray(&pb.StreamHello{ShardId: last.shardID, NodeId: last.nodeID, Incarnation: last.inc, Epoch: c.Epoch()}, junk...)
	// Rows the batch does not have, a batch not in flight, another epoch.
	spray(&pb.StreamHello{ShardId: last.shardID, NodeId: last.nodeID, Incarnation: last.inc, Epoch: c.Epoch()},
		&pb.BatchFailed{BatchId: 1, Seqs: []uint64{999}, Reason: "backend_error", ShardId: last.shardID},
		&pb.BatchFailed{BatchId: 77, Reason: "backend_error", ShardId: last.shardID},
		&pb.BatchFailed{BatchId: 2, Reason: "backend_error", ShardId: last.shardID, Epoch: 1 << 62})
	// A registered shard outside the placement, on its control stream.
	evil := newFakeShard(t, c.GRPCAddr(), "node-evil", 3, 1<<20)
	evil.join()
	for _, f := range all("backend_error", evil.shardID) {
		evil.sendCtl(&pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Failed{Failed: f}})
	}
	// Results: one with a token outside the vocabulary, one sampling a
	// sequence the batch does not have, and a well-formed one from stage 0,
	// which does not return results.
	forge := func(from *fakeShard, r *pb.BatchResult) {
		t.Helper()
		rs, err := cl.Results(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []*pb.ResultMessage{
			{Msg: &pb.ResultMessage_Hello{Hello: &pb.StreamHello{ShardId: from.shardID, NodeId: from.nodeID, Incarnation: from.inc, Epoch: c.Epoch()}}},
			{Msg: &pb.ResultMessage_Result{Result: r}},
		} {
			if err := rs.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := rs.CloseAndRecv(); err != nil {
			t.Fatal(err)
		}
	}
	forge(last, &pb.BatchResult{Epoch: c.Epoch(), BatchId: 3, PlacementVersion: c.PlacementVersion(),
		Samples: []*pb.SampledToken{{Seq: 13, Token: 100, Pos: 2}}})
	forge(last, &pb.BatchResult{Epoch: c.Epoch(), BatchId: 3, PlacementVersion: c.PlacementVersion(),
		Samples: []*pb.SampledToken{{Seq: 99, Token: 7, Pos: 2}}})
	forge(st[0], &pb.BatchResult{Epoch: c.Epoch(), BatchId: 2, PlacementVersion: c.PlacementVersion(),
		Samples: []*pb.SampledToken{{Seq: 12, Token: 77, Pos: 2}}})

	wantRefused := map[transport.Code]uint64{
		transport.CodeWrongSender: 10, transport.CodeBadReason: 50, transport.CodeUnknownBatch: 3,
		transport.CodeFutureEpoch: 1, transport.CodeBadToken: 1,
	}
	waitUntil(t, "every forged message refused", func() bool {
		for code, n := range wantRefused {
			if c.refused.Get(code)-before[code.String()] < n {
				return false
			}
		}
		return true
	})
	last.answerHeld()
	for range 3 {
		r := nextResult(t, p)
		if r.Lost || len(r.Samples) != 1 || r.Samples[0].Seq != 10+r.ID || r.Samples[0].Token != int32(r.ID)+1 {
			t.Fatalf("batch %d: %+v, want its own sample", r.ID, r)
		}
	}
	if err := c.Ready(); err != nil {
		t.Fatalf("not ready after the forged answers: %v", err)
	}
	if v := c.View(); len(v.BatchFailed) != 0 {
		t.Fatalf("batch failures counted: %v", v.BatchFailed)
	}
	for r := range c.View().WireRefused {
		if _, ok := transport.ParseCode(r); !ok {
			t.Fatalf("refusal reason %q is not a code", r)
		}
	}
}

// TestClusterRegistryBounded: 2,000 junk Register calls from the network,
// and some with oversized or malformed fields, leave the registry at its
// limit (maxShards), /v1/cluster and the store small, and the pipeline
// ready and answering; the ones past the limit are refused
// (ResourceExhausted, counted as registry_full), the malformed ones
// before the loop sees them.
func TestClusterRegistryBounded(t *testing.T) {
	// No registration expires during the test, however long its 2,000
	// Registers take on a loaded machine (expiry has its own test below).
	c, _ := twoStages(t, func(cfg *ClusterConfig) { cfg.RegisterGrace = time.Hour })
	cl := attacker(t, c)
	// A bound, not a speed: a starved run (a niced mutation run beside
	// .ci/run and two hogs) took 60 s for 406 of them.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	accepted, full := 0, 0
	for i := range 2000 {
		_, err := cl.Register(ctx, &pb.RegisterRequest{NodeId: fmt.Sprintf("junk-%04d", i), Incarnation: uint64(i), GrpcAddr: "10.9.8.7:" + strconv.Itoa(1000+i),
			ProtocolVersion: transport.ProtocolVersion, Devices: &pb.Devices{MemoryBytes: 1 << 40, Device: "cpu"}})
		switch status.Code(err) {
		case codes.OK:
			accepted++
		case codes.ResourceExhausted:
			full++
		default:
			t.Fatalf("register %d: %v", i, err)
		}
	}
	if accepted != maxShards-2 || full != 2000-accepted {
		t.Fatalf("%d accepted, %d refused as full; want %d and %d", accepted, full, maxShards-2, 2000-(maxShards-2))
	}
	for name, req := range map[string]*pb.RegisterRequest{
		"long node ID": {NodeId: strings.Repeat("n", 1<<16), GrpcAddr: "10.0.0.1:7", ProtocolVersion: transport.ProtocolVersion, Devices: &pb.Devices{MemoryBytes: 1}},
		"long device":  {NodeId: "x", GrpcAddr: "10.0.0.1:7", ProtocolVersion: transport.ProtocolVersion, Devices: &pb.Devices{MemoryBytes: 1, Device: strings.Repeat("d", 1<<20)}},
		"many models": {NodeId: "x", GrpcAddr: "10.0.0.1:7", ProtocolVersion: transport.ProtocolVersion, Devices: &pb.Devices{MemoryBytes: 1},
			Models: make([]*pb.ModelFile, 1000)},
		"address": {NodeId: "x", GrpcAddr: "not an address", ProtocolVersion: transport.ProtocolVersion, Devices: &pb.Devices{MemoryBytes: 1}},
	} {
		if _, err := cl.Register(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if got := c.refused.Get(transport.CodeRegistryFull); got != uint64(full) {
		t.Fatalf("registry_full counted %d, want %d", got, full)
	}
	v := c.View()
	if len(v.Shards) != maxShards {
		t.Fatalf("the view lists %d shards, want %d", len(v.Shards), maxShards)
	}
	js, _ := json.Marshal(v)
	if len(js) > 256<<10 {
		t.Fatalf("/v1/cluster is %d bytes", len(js))
	}
	if st, err := os.Stat(filepath.Join(c.cfg.DataDir, storeFile)); err != nil || st.Size() > 2<<20 {
		t.Fatalf("store: %v, %v", st.Size(), err)
	}
	if err := c.Ready(); err != nil {
		t.Fatalf("not ready after the registrations: %v", err)
	}
	p := direct(t, c.Cluster)
	if err := p.Dispatch(&transport.MicroBatch{Epoch: c.Epoch(), ID: 1, Rows: []transport.Row{{Seq: 1, First: true, Tokens: []int32{4}, Blocks: []int32{0}, Sample: true}}}); err != nil {
		t.Fatal(err)
	}
	if r := nextResult(t, p); r.Lost || len(r.Samples) != 1 || r.Samples[0].Token != 5 {
		t.Fatalf("result after the registrations: %+v", r)
	}
}

// TestRegistryExpiry drives the loop's registry by hand: junk registered
// without ever a heartbeat fills it to maxShards and is refused beyond;
// registerGrace later every one of them has expired, from the store too,
// while a connected shard and a placed one stay; a shard whose stream
// closed expires shardExpiry after its last heartbeat.
func TestRegistryExpiry(t *testing.T) {
	cfg := DefaultClusterConfig()
	cfg.GossipAddr, cfg.GRPCAddr, cfg.DataDir, cfg.Shape = "", "127.0.0.1:0", t.TempDir(), testShape()
	c, err := NewCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = c.Run(ctx) // closes what NewCluster opened
	})
	now := time.Unix(1000, 0)
	reg := func(node string, at time.Time) (string, error) {
		rep, err := c.register(&pb.RegisterRequest{NodeId: node, GrpcAddr: "10.0.0.1:7", ProtocolVersion: transport.ProtocolVersion,
			Devices: &pb.Devices{MemoryBytes: 1}}, at)
		return rep.GetShardId(), err
	}
	connected, _ := reg("connected", now)
	placed, _ := reg("placed", now)
	gone, _ := reg("gone", now)
	c.shards[connected].ctl = newOutbox()
	c.active = &Placement{Version: 1, Stages: []Stage{{ShardID: placed}}}
	c.shards[gone].hbAt = now.Add(time.Minute) // it had a stream; its heartbeats stopped a minute later
	for i := 3; i < maxShards; i++ {
		if _, err := reg(fmt.Sprintf("junk-%d", i), now); err != nil {
			t.Fatalf("register %d: %v", i, err)
		}
	}
	if _, err := reg("one-too-many", now); !errors.Is(err, errRegistryFull) {
		t.Fatalf("register past the limit: %v", err)
	}
	c.expireShards(now.Add(registerGrace - time.Second))
	if len(c.shards) != maxShards {
		t.Fatalf("%d shards before the grace ran out, want %d", len(c.shards), maxShards)
	}
	c.expireShards(now.Add(registerGrace))
	if len(c.shards) != 3 {
		t.Fatalf("%d shards after the grace, want the connected, the placed and the recently gone", len(c.shards))
	}
	if recs, err := c.store.Shards(); err != nil || len(recs) != 3 {
		t.Fatalf("store holds %d shards (%v), want 3", len(recs), err)
	}
	if _, err := reg("newcomer", now.Add(registerGrace)); err != nil {
		t.Fatalf("register after the expiry: %v", err)
	}
	c.expireShards(now.Add(time.Minute + shardExpiry - time.Second))
	if _, ok := c.shards[gone]; !ok {
		t.Fatal("a shard expired before shardExpiry after its last heartbeat")
	}
	c.expireShards(now.Add(time.Minute + shardExpiry))
	if _, ok := c.shards[gone]; ok {
		t.Fatal("a shard gone for shardExpiry is kept")
	}
	for _, id := range []string{connected, placed} {
		if _, ok := c.shards[id]; !ok {
			t.Fatalf("%s expired", id)
		}
	}
}

// TestClusterErrorsDoNotEcho: what the coordinator answers a caller with
// the wrong epoch or the wrong model names neither the coordinator's epoch
// nor its model's SHA-256.
func TestClusterErrorsDoNotEcho(t *testing.T) {
	c := startCluster(t, t.TempDir(), 1, func(cfg *ClusterConfig) {
		cfg.ModelPath = "/nonexistent/model.gguf" // Weights checks the hash first
		cfg.Shape.Model = strings.Repeat("5a", 32)
	})
	cl := attacker(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	epoch := strconv.FormatUint(c.Epoch(), 10)
	secret := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		if msg := err.Error(); strings.Contains(msg, epoch) || strings.Contains(msg, c.cfg.Shape.Model) {
			t.Fatalf("%s: the error echoes a secret: %v", what, msg)
		}
	}
	ws, err := cl.Weights(ctx, &pb.WeightsRequest{ModelSha256: "00"})
	if err == nil {
		_, err = ws.Recv()
	}
	secret("weights of another model", err)
	rs, err := cl.Results(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&pb.ResultMessage{Msg: &pb.ResultMessage_Hello{Hello: &pb.StreamHello{ShardId: "a-1", NodeId: "a", Epoch: c.Epoch() - 1}}}); err != nil {
		t.Fatal(err)
	}
	_, err = rs.CloseAndRecv()
	secret("results of another epoch", err)
	cs, err := cl.Control(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.Send(&pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Hello{Hello: &pb.StreamHello{ShardId: "a-1", NodeId: "a", Epoch: c.Epoch() - 1}}}); err != nil {
		t.Fatal(err)
	}
	_, err = cs.Recv()
	secret("control of another epoch", err)
}
