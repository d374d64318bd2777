package main

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// wireView is the part of GET /v1/cluster an attacker on the network
// reads to make a poisoned batch otherwise valid.
type wireView struct {
	Epoch     uint64 `json:"epoch"`
	Placement uint64 `json:"placement_version"`
	Shards    []struct {
		ShardID string `json:"shard_id"`
		NodeID  string `json:"node_id"`
		Addr    string `json:"addr"`
		Stage   int    `json:"stage"`
	} `json:"shards"`
}

// TestE2EPoisonedStageBatches: the two single Stage batches that took a
// shard process down or poisoned it for good — a row at position -100 (a
// panic in the replica table, which also killed a coordinator running the
// shard in its process) and a batch of epoch 2^62 (adopted, after which
// every request failed with 500 while /readyz said 200) — sent straight to
// each running `shard join` process's stage endpoint (by a client holding a
// member's certificate) while a greedy
// completion streams, are each answered with a BatchFailed of their code.
// Every shard process stays up, the completion gives llama.cpp's text,
// /readyz stays 200, a second completion gives the same text, and each
// shard counts the refusals on its /metrics.
func TestE2EPoisonedStageBatches(t *testing.T) {
	c := startE2E(t, 2)
	resp, err := http.Get("http://" + c.api + "/v1/cluster")
	if err != nil {
		t.Fatal(err)
	}
	var v wireView
	err = json.NewDecoder(resp.Body).Decode(&v)
	resp.Body.Close()
	if err != nil || len(v.Shards) != 2 {
		t.Fatalf("/v1/cluster: %+v, %v", v, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), guard(2*time.Minute))
	defer cancel()
	type completion struct {
		text string
		err  error
	}
	good := make(chan completion, 1)
	go func() { // waited for below
		text, _, err := c.complete(ctx, "Once upon a time", 64, true)
		good <- completion{text, err}
	}()

	// The sender is a member gone bad: it holds the certificate the
	// placement names upstream of each stage (the coordinator's for stage
	// 0, minted here from the CA in its data dir; stage 0's shard's for
	// stage 1),
	// without which no stage endpoint would take the batch at all.
	for _, s := range v.Shards {
		st := openStage(t, ctx, s.Addr, upstreamCreds(t, c, v, s.Stage))
		for _, a := range []struct {
			h    *pb.BatchHeader
			want transport.Code
		}{
			{&pb.BatchHeader{Epoch: v.Epoch, PlacementVersion: v.Placement, BatchId: 1 << 40,
				Rows: []*pb.Row{{Seq: 1 << 50, Pos: -100, Tokens: []int32{1}, Blocks: []int32{0}, Sample: true}}}, transport.CodeBadPosition},
			{&pb.BatchHeader{Epoch: 1 << 62, PlacementVersion: v.Placement, BatchId: 1<<40 + 1,
				Rows: []*pb.Row{{Seq: 1 << 50, First: true, Tokens: []int32{1}, Blocks: []int32{0}, Sample: true}}}, transport.CodeFutureEpoch},
		} {
			if err := transport.SendBatch(st, a.h, nil); err != nil {
				t.Fatalf("shard %s: send batch %d: %v", s.ShardID, a.h.GetBatchId(), err)
			}
			r, err := st.Recv()
			if err != nil {
				t.Fatalf("shard %s: batch %d: no reply: %v", s.ShardID, a.h.GetBatchId(), err)
			}
			if f := r.GetFailed(); f.GetBatchId() != a.h.GetBatchId() || f.GetReason() != a.want.String() {
				t.Fatalf("shard %s: batch %d answered %v, want a BatchFailed %v", s.ShardID, a.h.GetBatchId(), f, a.want)
			}
		}
		if err := st.CloseSend(); err != nil {
			t.Fatal(err)
		}
	}

	// A member that the placement does not name upstream: stage 1's own
	// certificate, a shard's like its upstream's, sending into stage 1.
	addr := ""
	for _, s := range v.Shards {
		if s.Stage == 1 {
			addr = s.Addr
		}
	}
	st := openStage(t, ctx, addr, shardCreds(t, c, v, 1))
	if err := transport.SendBatch(st, &pb.BatchHeader{Epoch: v.Epoch, PlacementVersion: v.Placement, BatchId: 1<<40 + 2}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a batch into stage 1 from a shard that is not its upstream: %v, want PermissionDenied", err)
	}
	_, i := shardAt(t, c, v, 1)
	if n, _ := metricWith(t, c.shardMets[i], "strata_wire_refused_total", `reason="wrong_identity"`); n != 1 {
		t.Errorf(`stage 1's shard: strata_wire_refused_total{reason="wrong_identity"} = %v, want 1`, n)
	}

	g := <-good
	if g.err != nil || g.text != onceUponATime {
		t.Fatalf("completion beside the poisoned batches: %q, %v", g.text, g.err)
	}
	for i, p := range c.shards {
		if p.exited() {
			t.Fatalf("shard %d exited", i)
		}
	}
	resp, err = http.Get("http://" + c.api + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz %d after the poisoned batches", resp.StatusCode)
	}
	text, _, err := c.complete(ctx, "Once upon a time", 64, false)
	if err != nil || text != onceUponATime {
		t.Fatalf("completion after the poisoned batches: %q, %v", text, err)
	}
	for i, m := range c.shardMets {
		for _, code := range []transport.Code{transport.CodeBadPosition, transport.CodeFutureEpoch} {
			if n, _ := metricWith(t, m, "strata_wire_refused_total", `reason="`+code.String()+`"`); n != 1 {
				t.Errorf("shard %d: strata_wire_refused_total{reason=%q} = %v, want 1", i, code, n)
			}
		}
	}
}

// openStage opens a stage stream to addr with creds, closed at the end of
// the test.
func openStage(t *testing.T, ctx context.Context, addr string, creds grpc.DialOption) pb.Stage_StreamClient {
	t.Helper()
	cc, err := transport.Dial(addr, creds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	st, err := pb.NewStageClient(cc).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
