package transport

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-llm/strata/transport/pb"
)

// testStage is a fake shard's stage endpoint. With next set it relays each
// batch downstream after adding 1 to every hidden value (its "layers"), and
// relays downstream replies upstream; without, it is the last stage: it
// hands batches to got and fails every batch whose ID is failID.
type testStage struct {
	pb.UnimplementedStageServer
	next   pb.StageClient
	got    chan *Batch
	failID uint64
}

func (s *testStage) Stream(up pb.Stage_StreamServer) error {
	if s.next == nil {
		return s.last(up)
	}
	down, err := s.next.Stream(up.Context())
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	// The relay goroutine is the only sender on up.
	wg.Go(func() {
		for {
			r, err := down.Recv()
			if err != nil {
				return
			}
			if up.Send(r) != nil {
				return
			}
		}
	})
	for {
		b, err := RecvBatch(up, 0)
		if err == io.EOF {
			return down.CloseSend()
		}
		if err != nil {
			return err
		}
		for i := range b.Hidden {
			b.Hidden[i]++
		}
		if err := SendBatch(down, b.Header, b.Hidden); err != nil {
			return err
		}
	}
}

func (s *testStage) last(up pb.Stage_StreamServer) error {
	for {
		b, err := RecvBatch(up, 0)
		if err == io.EOF {
			return nil
		}
		var be *BatchError
		if errors.As(err, &be) {
			// Report, then end the stream: RecvBatch's errors are fatal.
			_ = up.Send(&pb.StageReply{Msg: &pb.StageReply_Failed{Failed: be.BatchFailed("last")}})
			return status.Error(codes.InvalidArgument, be.Error())
		}
		if err != nil {
			return err
		}
		if b.Header.GetBatchId() == s.failID {
			var seqs []uint64
			for _, r := range b.Header.GetRows() {
				seqs = append(seqs, r.GetSeq())
			}
			if err := up.Send(&pb.StageReply{Msg: &pb.StageReply_Failed{Failed: &pb.BatchFailed{
				BatchId: b.Header.GetBatchId(), Seqs: seqs, Reason: "backend_error", ShardId: "last",
			}}}); err != nil {
				return err
			}
			continue
		}
		select {
		case s.got <- b:
		case <-up.Context().Done():
			return up.Context().Err()
		}
	}
}

// startStage serves st on a fresh loopback port and returns its address.
func startStage(t *testing.T, st *testStage) string {
	t.Helper()
	ln, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer()
	pb.RegisterStageServer(srv, st)
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	t.Cleanup(func() {
		srv.Stop()
		wg.Wait()
	})
	return ln.Addr().String()
}

func dialStage(t *testing.T, addr string) pb.StageClient {
	t.Helper()
	cc, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return pb.NewStageClient(cc)
}

// TestStageStreamGRPC runs coordinator -> stage 0 -> stage 1 over real gRPC
// on loopback: batches (one of 10 MiB) arrive intact and in order, and a
// failure on the last stage comes back to the coordinator through stage 0.
func TestStageStreamGRPC(t *testing.T) {
	const dim = 256
	last := &testStage{got: make(chan *Batch), failID: 3}
	lastAddr := startStage(t, last)
	first := &testStage{next: dialStage(t, lastAddr)}
	firstAddr := startStage(t, first)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream, err := dialStage(t, firstAddr).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type sent struct {
		h      *pb.BatchHeader
		hidden []float32
	}
	batches := []sent{
		{testHeader(1, dim, 10240), randomHidden(10240*dim, 1)}, // 10 MiB
		{testHeader(2, 0), nil},                                 // tombstones only
		{testHeader(3, dim, 1, 2), randomHidden(3*dim, 3)},      // fails on the last stage
		{testHeader(4, dim, 7), randomHidden(7*dim, 4)},
	}
	sendErr := make(chan error, 1)
	go func() { // the coordinator's sender for this link
		for _, b := range batches {
			if err := SendBatch(stream, b.h, b.hidden); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- nil
	}()
	for _, want := range []sent{batches[0], batches[1], batches[3]} {
		var b *Batch
		select {
		case b = <-last.got:
		case <-ctx.Done():
			t.Fatalf("waiting for batch %d: %v", want.h.GetBatchId(), ctx.Err())
		}
		if b.Header.GetBatchId() != want.h.GetBatchId() {
			t.Fatalf("got batch %d, want %d", b.Header.GetBatchId(), want.h.GetBatchId())
		}
		if len(b.Header.GetTombstones()) != 1 || len(b.Header.GetRows()) != len(want.h.GetRows()) {
			t.Fatalf("batch %d: header lost content: %v", want.h.GetBatchId(), b.Header)
		}
		if len(b.Hidden) != len(want.hidden) {
			t.Fatalf("batch %d: %d hidden values, want %d", want.h.GetBatchId(), len(b.Hidden), len(want.hidden))
		}
		for i := range want.hidden {
			if b.Hidden[i] != want.hidden[i]+1 {
				t.Fatalf("batch %d: hidden[%d] = %v, want %v", want.h.GetBatchId(), i, b.Hidden[i], want.hidden[i]+1)
			}
		}
	}
	if err := <-sendErr; err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if f := r.GetFailed(); f.GetBatchId() != 3 || len(f.GetSeqs()) != 2 || f.GetReason() != "backend_error" {
		t.Fatalf("got reply %v, want batch 3 failed", r)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("after CloseSend: got %v, want io.EOF", err)
	}
}

// TestStageStreamGRPCCorrupt sends a batch whose chunk is missing: the
// stage replies BatchFailed(bad_chunks) and ends the stream with an error.
func TestStageStreamGRPCCorrupt(t *testing.T) {
	st := &testStage{got: make(chan *Batch)}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	stream, err := dialStage(t, startStage(t, st)).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range validBatch(t) {
		if i == 2 {
			continue // lose chunk 1
		}
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if f := r.GetFailed(); f.GetBatchId() != 7 || f.GetReason() != "bad_chunks" {
		t.Fatalf("got reply %v, want batch 7 failed with bad_chunks", r)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v, want InvalidArgument", err)
	}
}

// TestMaxMessageBytes checks that both sides enforce MaxMessageBytes
// rather than gRPC's 4 MB default.
func TestMaxMessageBytes(t *testing.T) {
	st := &testStage{got: make(chan *Batch, 1)}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	stream, err := dialStage(t, startStage(t, st)).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 8 MiB in one chunk: over gRPC's default, under ours.
	const dim = 1024
	h := testHeader(1, dim, 2048)
	h.HiddenElems, h.HiddenChunks = 2048*dim, 1
	if err := stream.Send(&pb.StageMessage{Msg: &pb.StageMessage_Header{Header: h}}); err != nil {
		t.Fatal(err)
	}
	big := &pb.StageMessage{Msg: &pb.StageMessage_Chunk{Chunk: &pb.HiddenChunk{BatchId: 1, Data: make([]byte, 4*2048*dim)}}}
	if err := stream.Send(big); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-st.got:
		if len(b.Hidden) != 2048*dim {
			t.Fatalf("got %d values", len(b.Hidden))
		}
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	// Over MaxMessageBytes: refused by the client before it is sent.
	huge := &pb.StageMessage{Msg: &pb.StageMessage_Chunk{Chunk: &pb.HiddenChunk{BatchId: 2, Data: make([]byte, MaxMessageBytes+1)}}}
	if err := stream.Send(huge); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("sending %d bytes: got %v, want ResourceExhausted", MaxMessageBytes+1, err)
	}
}
