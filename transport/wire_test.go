package transport

import (
	"errors"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/transport/pb"
)

func TestMicroBatchWireRoundTrip(t *testing.T) {
	params := sample.DefaultParams()
	params.Temperature, params.TopK, params.Seed, params.TopLogprobs = 0.8, 40, 12345, 3
	params.LogitBias = map[int32]float32{7: -100, 9: 2.5}
	const dim = 8
	want := &MicroBatch{
		Epoch:     1700000000123,
		Placement: 2,
		ID:        99,
		Tombstones: []Tombstone{
			{Epoch: 1700000000123, Seq: 3, Reason: "finished"},
			{Epoch: 1700000000123, Seq: 4, Reason: "preempted"},
		},
		Rows: []Row{
			{Seq: 5, Pos: 0, First: true, Tokens: []int32{1, 2, 3}, Blocks: []int32{0}, Params: &params},
			{Seq: 6, Pos: 17, Tokens: []int32{4}, Blocks: []int32{1, 2}, Sample: true},
		},
		Hidden: randomHidden(4*dim, 5),
	}
	h, err := MicroBatchToWire(want)
	if err != nil {
		t.Fatal(err)
	}
	if h.GetHiddenDim() != dim {
		t.Fatalf("hidden dim %d, want %d", h.GetHiddenDim(), dim)
	}
	var s fakeStream
	if err := SendBatch(&s, h, want.Hidden); err != nil {
		t.Fatal(err)
	}
	b, err := RecvBatch(&s, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := MicroBatchFromWire(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, want); diff != "" {
		t.Fatalf("round trip (-got +want):\n%s", diff)
	}

	// Tombstones only.
	h, err = MicroBatchToWire(&MicroBatch{Epoch: 1, Tombstones: []Tombstone{{Epoch: 1, Seq: 2, Reason: "aborted"}}})
	if err != nil || len(h.GetRows()) != 0 || h.GetHiddenDim() != 0 {
		t.Fatalf("tombstone-only batch: %v, %v", h, err)
	}
}

func TestMicroBatchToWireErrors(t *testing.T) {
	for name, b := range map[string]*MicroBatch{
		"reason":       {Tombstones: []Tombstone{{Seq: 1, Reason: "vanished"}}},
		"empty reason": {Tombstones: []Tombstone{{Seq: 1}}},
		"position":     {Rows: []Row{{Seq: 1, Pos: math.MaxInt32 + 1, Tokens: []int32{1}}}},
		"hidden":       {Rows: []Row{{Seq: 1, Tokens: []int32{1, 2}}}, Hidden: make([]float32, 5)},
		"no tokens":    {Hidden: make([]float32, 4)},
		"top_k":        {Rows: []Row{{Seq: 1, Tokens: []int32{1}, Params: &sample.Params{TopK: -1}}}},
	} {
		if h, err := MicroBatchToWire(b); err == nil {
			t.Errorf("%s: got %v and no error", name, h)
		}
	}
}

func TestMicroBatchFromWireErrors(t *testing.T) {
	for name, h := range map[string]*pb.BatchHeader{
		"reason":   {BatchId: 3, Tombstones: []*pb.Tombstone{{Seq: 1, Reason: 42}}},
		"unset":    {BatchId: 3, Tombstones: []*pb.Tombstone{{Seq: 1}}},
		"position": {BatchId: 3, Rows: []*pb.Row{{Seq: 1, Pos: -1}}},
	} {
		_, err := MicroBatchFromWire(&Batch{Header: h})
		var be *BatchError
		if !errors.As(err, &be) || be.BatchID != 3 {
			t.Errorf("%s: got %v, want a BatchError for batch 3", name, err)
		}
	}
	p := ParamsFromWire(&pb.SampleParams{TopK: -5, TopLogprobs: -1})
	if p.TopK != 0 || p.TopLogprobs != 0 {
		t.Errorf("negative counts not clamped: %+v", p)
	}
}

func TestResultWire(t *testing.T) {
	want := &BatchResult{
		Epoch: 5, ID: 6,
		Samples: []Sampled{{Seq: 1, Token: 42, Logprob: -0.5, Top: []sample.TokenLogprob{{Token: 42, Logprob: -0.5}, {Token: 7, Logprob: -1.25}}}, {Seq: 2, Token: 3}},
		Dropped: []Dropped{{Seq: 9, Reason: "unknown_sequence"}},
	}
	m := ResultToWire(want)
	if diff := cmp.Diff(ResultFromWire(m.GetResult()), want); diff != "" {
		t.Fatalf("result (-got +want):\n%s", diff)
	}
	lost := &BatchResult{Epoch: 5, ID: 7, Lost: true, Reason: "ttl_expired"}
	m = ResultToWire(lost)
	if diff := cmp.Diff(FailedFromWire(m.GetFailed()), lost); diff != "" {
		t.Fatalf("lost (-got +want):\n%s", diff)
	}
	f := FailedFromWire(&pb.BatchFailed{BatchId: 8, Reason: "bad_chunks", ShardId: "s1"})
	if !f.Lost || f.ID != 8 || f.Reason != "shard s1: bad_chunks" {
		t.Fatalf("FailedFromWire = %+v", f)
	}
}
