package coordinator

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// FuzzShardMessages feeds the coordinator what shards (or anyone reaching
// its gRPC port) send — Register requests, results and BatchFailed reports
// on Results, the stage-0 link and Control, control-stream messages —
// built from fuzzed numbers and strings or decoded from raw protobuf, to
// the code that handles them: the checks of transport, the loop's
// register and control handling (called directly: the loop is not
// running), and the remote pipeline's answers, with batches in flight on a
// two-stage placement. Nothing may panic, the registry stays within
// maxShards, every failure counted has a reason from transport's Code
// enum, and an answer is taken only for a batch in flight.
func FuzzShardMessages(f *testing.F) {
	cfg := DefaultClusterConfig()
	cfg.GossipAddr, cfg.GRPCAddr, cfg.DataDir, cfg.Shape = "", "127.0.0.1:0", f.TempDir(), testShape()
	cfg.Shape.Vocab = 100
	c, err := NewCluster(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = c.Run(ctx) // closes what NewCluster opened
	})
	p := c.pipe
	led := newDirectPipeline(p)
	c.ledger = led
	pl := &Placement{Version: 1, Stages: []Stage{{ShardID: "a-1"}, {ShardID: "b-2"}}, Blocks: 16, BlockSize: 16}
	p.setPlacement(pl)
	c.shards["a-1"] = &shardState{rec: ShardRecord{NodeID: "a", ShardID: "a-1"}, ctl: newOutbox()}
	var l *link
	nextID := uint64(1)
	now := time.Unix(1000, 0)

	f.Add(uint8(0), []byte{}, uint8(1), uint8(1), int32(5), "backend_error", "b-2", int8(0))
	f.Add(uint8(1), []byte{}, uint8(1), uint8(1), int32(5), "unknown_sequence", "b-2", int8(0))
	f.Add(uint8(1), []byte{}, uint8(2), uint8(9), int32(100), "why", "b-2", int8(0))
	f.Add(uint8(2), []byte{}, uint8(0), uint8(2), int32(0), "disk on fire", "evil", int8(1))
	f.Add(uint8(6), []byte{}, uint8(0), uint8(2), int32(0), "downstream_unavailable", "a-1", int8(0))
	f.Add(uint8(3), []byte{}, uint8(0), uint8(0), int32(0), "10.0.0.1:7", "node-x", int8(0))
	f.Add(uint8(4), []byte{}, uint8(0), uint8(3), int32(2), "load failed", "", int8(0))
	f.Fuzz(func(t *testing.T, kind uint8, raw []byte, id, seq uint8, tok int32, text, shard string, epochOff int8) {
		// Keep a link and a few batches in flight.
		if !p.ready() {
			l = &link{version: 1, shardID: "a-1", queue: make(chan *pb.BatchHeader, linkQueue), cancel: func() {}}
			p.resume(l)
		}
		for inflight(led) < 3 {
			b := &transport.MicroBatch{Epoch: c.Epoch(), ID: nextID, Rows: []transport.Row{
				{Seq: nextID, First: true, Tokens: []int32{1}, Blocks: []int32{0}, Sample: true},
				{Seq: nextID + 1<<32, First: true, Tokens: []int32{2}, Blocks: []int32{1}},
			}}
			nextID++
			if err := led.Dispatch(b); err != nil {
				t.Fatalf("dispatch: %v", err)
			}
			<-l.queue
		}
		base := nextID - 3
		epoch := uint64(int64(c.Epoch()) + int64(epochOff))
		batch := base + uint64(id%5)
		rowSeq := batch + uint64(seq%3)<<32
		switch kind % 7 {
		case 0, 6: // a BatchFailed on the stage-0 link, Results or Control
			w := &pb.BatchFailed{}
			if len(raw) == 0 || proto.Unmarshal(raw, w) != nil {
				w = &pb.BatchFailed{BatchId: batch, Reason: text, ShardId: shard, Epoch: epoch}
				if seq%2 == 1 {
					w.Seqs = []uint64{rowSeq}
				}
			}
			src := []source{fromLink(l), fromResults(shard), fromControl(shard)}[int(id)%3]
			if f := p.checkFailure(w); f != nil {
				if !f.Code.Valid() {
					t.Fatalf("checked failure %+v", f)
				}
				c.answer(evAnswer{failure: f, src: src}, now)
			}
		case 1, 2: // a result on Results
			w := &pb.BatchResult{}
			if len(raw) == 0 || proto.Unmarshal(raw, w) != nil {
				w = &pb.BatchResult{Epoch: epoch, BatchId: batch, PlacementVersion: 1,
					Samples: []*pb.SampledToken{{Seq: rowSeq, Token: tok, Pos: 1}}}
				if seq%2 == 1 {
					w.Dropped = []*pb.DroppedRow{{Seq: rowSeq, Reason: text, ShardId: shard}}
				}
			}
			before := inflight(led)
			if r := p.checkResult(w); r != nil && p.takeResult(r, fromResults(shard), led) == nil && inflight(led) != before-1 {
				t.Fatalf("a result taken for no batch in flight: %v", w)
			}
		case 3: // Register, checked at the handler, then the loop's
			req := &pb.RegisterRequest{}
			if len(raw) == 0 || proto.Unmarshal(raw, req) != nil {
				req = &pb.RegisterRequest{NodeId: shard, Incarnation: uint64(seq), GrpcAddr: text, ProtocolVersion: transport.ProtocolVersion,
					Devices: &pb.Devices{MemoryBytes: uint64(tok) + 1}}
			}
			if transport.CheckRegister(req) == nil {
				_, _ = c.register(req, now)
			}
		case 4, 5: // a control-stream message from a shard of the placement
			m := &pb.ShardToCoordinator{}
			if len(raw) == 0 || proto.Unmarshal(raw, m) != nil {
				m = &pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Status{Status: &pb.Status{State: pb.Status_State(tok), Error: text, PlacementVersion: uint64(id)}}}
				if kind%7 == 5 {
					m = &pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Heartbeat{Heartbeat: &pb.Heartbeat{LiveSeqs: []uint64{rowSeq},
						Counters: &pb.Counters{TombstonesApplied: map[string]uint64{text: 1}}}}}
				}
			}
			if s := c.shards["a-1"]; s != nil && transport.CheckFromShard(m, c.Epoch()) == nil {
				c.ctlMsg(s, m, now)
			}
		}
		now = now.Add(time.Second)
		c.expireShards(now)
		if len(c.shards) > maxShards {
			t.Fatalf("%d shards registered, limit %d", len(c.shards), maxShards)
		}
		for r := range p.failedByReason() {
			if _, ok := transport.ParseCode(r); !ok {
				t.Fatalf("batch failures counted under %q", r)
			}
		}
		for len(led.out) > 0 { // the engine's answers: not read here
			<-led.out
		}
	})
}

// inflight returns how many batches await their answer.
func inflight(led *DirectPipeline) int {
	n, _ := led.inFlight()
	return n
}
