package shard

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// The tests of this file send a shard the single messages a review found
// could take it down or poison it, each on its own stage stream, while a
// good request decodes on another: each must be refused (a BatchFailed
// with its code, counted in strata_wire_refused_total) without a panic,
// the good request's tokens must be those of a run without the attacks,
// and the node must stay ready with consistent tables.

// servedNode is a Node whose one placement runs every layer of m (embed
// and head) on a pool of 16 blocks, registered at epoch 100 under
// placement 1, serving Stage.Stream over bufconn. Its results are read
// from its link's queue (no coordinator is dialed).
type servedNode struct {
	n     *Node
	m     *model.Model
	queue chan *outMsg
	cc    *grpc.ClientConn
}

func newServedNode(t *testing.T, m *model.Model) *servedNode {
	t.Helper()
	r := randomPipe(t, m)[0]
	n := testNode(r, 100)
	n.collector = newCollector(n)
	q := make(chan *outMsg, 64)
	n.p.link = &link{queue: q, done: make(chan struct{}), cancel: func() {}}
	n.p.limits = transport.BatchLimits{Placement: 1, Context: m.Context, Vocab: m.Vocab, Blocks: 16, BlockSize: r.bs, MaxTokens: 512}
	lis := bufconn.Listen(1 << 20)
	srv := transport.NewServer(transport.RecoverOptions(n.log, &n.refused)...)
	pb.RegisterStageServer(srv, stageServer{n: n})
	go srv.Serve(lis) // ended by Stop below
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient("passthrough:///shard",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(transport.MaxMessageBytes), grpc.MaxCallRecvMsgSize(transport.MaxMessageBytes)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &servedNode{n: n, m: m, queue: q, cc: cc}
}

// stream opens a stage stream; its replies (BatchFailed) arrive on the
// channel, which closes when the stream ends.
func (s *servedNode) stream(t *testing.T) (pb.Stage_StreamClient, <-chan *pb.BatchFailed) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := pb.NewStageClient(s.cc).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	replies := make(chan *pb.BatchFailed, 64)
	go func() { // ends with the stream
		defer close(replies)
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			replies <- r.GetFailed()
		}
	}()
	return st, replies
}

// refusedOn sends h on st and waits for its BatchFailed, which must carry
// code.
func refusedOn(t *testing.T, st pb.Stage_StreamClient, replies <-chan *pb.BatchFailed, h *pb.BatchHeader, code transport.Code) {
	t.Helper()
	if err := transport.SendBatch(st, h, nil); err != nil {
		t.Fatalf("send batch %d: %v", h.GetBatchId(), err)
	}
	select {
	case f, ok := <-replies:
		if !ok {
			t.Fatalf("batch %d: the stream ended where a BatchFailed %v was due", h.GetBatchId(), code)
		}
		if f.GetBatchId() != h.GetBatchId() || f.GetReason() != code.String() {
			t.Fatalf("batch %d: BatchFailed %v, want reason %v", h.GetBatchId(), f, code)
		}
	case <-time.After(20 * time.Second): // a watchdog, not a wait
		t.Fatalf("batch %d: no BatchFailed", h.GetBatchId())
	}
}

// referenceGreedy decodes steps tokens of prompt greedily on a fresh
// runner of m, without a network: what the served node must produce.
func referenceGreedy(t *testing.T, m *model.Model, prompt []int32, steps int) []int32 {
	t.Helper()
	r := randomPipe(t, m)[0]
	r.SetEpoch(100)
	blocks := []int32{0, 1}
	rows := []Row{{Seq: 1, First: true, Tokens: prompt, Blocks: blocks, Sample: true}}
	pos := len(prompt)
	var out []int32
	for i := range steps {
		res, err := r.Process(&Batch{Epoch: 100, ID: uint64(i + 1), Rows: rows}, time.Now())
		if err != nil || len(res.Samples) != 1 {
			t.Fatalf("reference step %d: %v, %v", i, err, res)
		}
		tok := res.Samples[0].Result.Token
		out = append(out, tok)
		rows = []Row{{Seq: 1, Pos: pos, Tokens: []int32{tok}, Blocks: blocks, Sample: true}}
		pos++
	}
	return out
}

// goodDecode decodes steps tokens of prompt as sequence seq through s on
// its own stream, calling between after each step; it returns the tokens
// or fails t.
func (s *servedNode) goodDecode(t *testing.T, seq uint64, prompt []int32, steps int, between func(step int)) []int32 {
	t.Helper()
	st, replies := s.stream(t)
	blocks := []int32{0, 1}
	rows := []*pb.Row{{Seq: seq, First: true, Tokens: prompt, Blocks: blocks, Sample: true}}
	pos := int32(len(prompt))
	var out []int32
	for i := range steps {
		id := uint64(1000 + i)
		if err := transport.SendBatch(st, &pb.BatchHeader{Epoch: 100, PlacementVersion: 1, BatchId: id, Rows: rows}, nil); err != nil {
			t.Errorf("good batch %d: %v", id, err)
			return nil
		}
		var r *pb.BatchResult
		select {
		case m := <-s.queue:
			r = m.result
		case f := <-replies:
			t.Errorf("good batch %d failed: %v", id, f)
			return nil
		case <-time.After(20 * time.Second): // a watchdog, not a wait
			t.Errorf("good batch %d: no result", id)
			return nil
		}
		if r.GetBatchId() != id || len(r.GetSamples()) != 1 || len(r.GetDropped()) != 0 {
			t.Errorf("good batch %d: result %v", id, r)
			return nil
		}
		tok := r.GetSamples()[0].GetToken()
		out = append(out, tok)
		rows = []*pb.Row{{Seq: seq, Pos: pos, Tokens: []int32{tok}, Blocks: blocks, Sample: true}}
		pos++
		if between != nil {
			between(i)
		}
	}
	return out
}

// checkServing fails t unless the node still serves its placement with
// consistent tables holding exactly live.
func (s *servedNode) checkServing(t *testing.T, live ...uint64) {
	t.Helper()
	st := s.n.stats(true)
	if !st.Ready || !st.InvariantOK || st.Placement != 1 {
		t.Fatalf("node ready=%v invariant_ok=%v placement %d", st.Ready, st.InvariantOK, st.Placement)
	}
	if !slices.Equal(st.Live, live) {
		t.Fatalf("live %v, want %v", st.Live, live)
	}
	s.n.mu.Lock()
	defer s.n.mu.Unlock()
	if e := s.n.p.runner.Table().Epoch(); e != 100 {
		t.Fatalf("the runner moved to epoch %d", e)
	}
}

// TestShardRefusesPoisonedBatches: the poisoned Stage batches — a row at
// position -100 (which panicked the shard, and with it a coordinator
// running it in process), a batch of epoch 2^62 (which was adopted, failing
// every later request), rows naming blocks outside the pool or tokens
// outside the vocabulary, free-text reasons, out-of-range sampling
// parameters — are each refused with a BatchFailed of their code and
// counted, while a good request decodes the tokens of a run without them
// on another stream; the node keeps serving epoch 100.
func TestShardRefusesPoisonedBatches(t *testing.T) {
	m := randomModel(t)
	prompt := []int32{1, 17, 42, 99}
	want := referenceGreedy(t, m, prompt, 8)
	s := newServedNode(t, m)
	bad, replies := s.stream(t)
	first := func(r *pb.Row) *pb.BatchHeader {
		return &pb.BatchHeader{Epoch: 100, PlacementVersion: 1, BatchId: 7, Rows: []*pb.Row{r}}
	}
	attacks := []struct {
		name string
		h    *pb.BatchHeader
		code transport.Code
	}{
		{"position -100", first(&pb.Row{Seq: 5, Pos: -100, Tokens: []int32{1}, Blocks: []int32{2}, Sample: true}), transport.CodeBadPosition},
		{"epoch 2^62", &pb.BatchHeader{Epoch: 1 << 62, PlacementVersion: 1, BatchId: 8,
			Rows: []*pb.Row{{Seq: 1 << 40, First: true, Tokens: []int32{1}, Blocks: []int32{3}, Sample: true}}}, transport.CodeFutureEpoch},
		{"position past the context", first(&pb.Row{Seq: 5, Pos: int32(m.Context), Tokens: []int32{1}, Blocks: []int32{2}}), transport.CodeBadPosition},
		{"block outside the pool", first(&pb.Row{Seq: 5, First: true, Tokens: []int32{1}, Blocks: []int32{16}}), transport.CodeBadBlocks},
		{"token outside the vocabulary", first(&pb.Row{Seq: 5, First: true, Tokens: []int32{int32(m.Vocab)}, Blocks: []int32{2}}), transport.CodeBadToken},
		{"logit bias outside the vocabulary", first(&pb.Row{Seq: 5, First: true, Tokens: []int32{1}, Blocks: []int32{2},
			Params: &pb.SampleParams{LogitBias: map[int32]float32{-7: 1}}}), transport.CodeBadParams},
		{"free-text dropped reason", &pb.BatchHeader{Epoch: 100, PlacementVersion: 1, BatchId: 9,
			Dropped: []*pb.DroppedRow{{Seq: 3, Reason: "the moon is full"}}}, transport.CodeBadReason},
		{"a shard's own tombstone reason", &pb.BatchHeader{Epoch: 100, PlacementVersion: 1,
			Tombstones: []*pb.Tombstone{{Epoch: 100, Seq: 1, Reason: pb.Tombstone_RECONCILE}}}, transport.CodeBadReason},
	}
	got := s.goodDecode(t, 1, prompt, len(want), func(step int) {
		if step < len(attacks) {
			a := attacks[step]
			refusedOn(t, bad, replies, a.h, a.code)
		}
	})
	if !slices.Equal(got, want) {
		t.Fatalf("good request decoded %v beside the attacks, %v alone", got, want)
	}
	s.checkServing(t, 1)
	for _, a := range attacks {
		if s.n.refused.Get(a.code) == 0 {
			t.Errorf("%s: refusal %v not counted", a.name, a.code)
		}
	}
	if n := s.n.refused.Get(transport.CodePanic); n != 0 {
		t.Errorf("%d panics recovered, want none", n)
	}
}

// TestShardBoundsFarFutureTombstones: 600 Ki tombstones for far-future
// sequences, sent in-band in tombstone-only batches of the current epoch
// (each within MaxBatchTombstones), keep at most MaxEarlyTombstones in the
// table; the rest are refused and counted (strata_tombstones_refused_total).
// The first half arrives before any create, so the table keeps exactly the
// limit; the second half races a good request, whose create drops every
// kept tombstone farther than the limit above it. The good request's tokens
// are those of a run without the flood.
func TestShardBoundsFarFutureTombstones(t *testing.T) {
	m := randomModel(t)
	prompt := []int32{1, 5, 6}
	want := referenceGreedy(t, m, prompt, 4)
	s := newServedNode(t, m)
	flood, replies := s.stream(t)
	const total = 600 << 10
	next := uint64(1 << 40)
	send := func(n int) {
		for sent := 0; sent < n; sent += transport.MaxBatchTombstones {
			h := &pb.BatchHeader{Epoch: 100, PlacementVersion: 1}
			for range min(n-sent, transport.MaxBatchTombstones) {
				h.Tombstones = append(h.Tombstones, &pb.Tombstone{Epoch: 100, Seq: next, Reason: pb.Tombstone_ABORTED})
				next += 7
			}
			if err := transport.SendBatch(flood, h, nil); err != nil {
				t.Errorf("flood: %v", err)
				return
			}
		}
	}
	send(total / 2)
	// A tombstone-only batch sends nothing back: wait until the node has
	// counted every tombstone of the first half.
	waitFor(t, 20*time.Second, "the first half of the flood", func() bool {
		st := s.n.stats(false)
		return st.Early+int(st.EarlyRefused) == total/2
	})
	if st := s.n.stats(false); st.Early != MaxEarlyTombstones || st.EarlyRefused != total/2-MaxEarlyTombstones {
		t.Fatalf("before any create: %d early tombstones kept, %d refused; want %d and %d", st.Early, st.EarlyRefused, MaxEarlyTombstones, total/2-MaxEarlyTombstones)
	}

	var wg sync.WaitGroup
	wg.Go(func() {
		send(total - total/2)
		if err := flood.CloseSend(); err != nil {
			t.Errorf("flood: %v", err)
		}
		for f := range replies { // ends once the node has read every batch
			t.Errorf("flood batch failed: %v", f)
		}
	})
	got := s.goodDecode(t, 1, prompt, len(want), nil)
	wg.Wait()
	if !slices.Equal(got, want) {
		t.Fatalf("good request decoded %v beside the flood, %v alone", got, want)
	}
	s.checkServing(t, 1)
	if st := s.n.stats(false); st.Early != 0 || st.EarlyRefused != total {
		t.Fatalf("after the create of 1: %d early tombstones kept, %d refused; want 0 and %d", st.Early, st.EarlyRefused, total)
	}
}
