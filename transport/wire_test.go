package transport

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/transport/pb"
)

// testLimits bounds the batches of these tests: epoch 1700000000123,
// placement 2, a context of 64 positions in blocks of 16, a pool of 8
// blocks, 100 tokens, hidden width 8, 256 tokens a batch.
var testLimits = BatchLimits{Epoch: 1700000000123, Placement: 2, Context: 64, Vocab: 100, Blocks: 8, BlockSize: 16, Hidden: 8, MaxTokens: 256}

func TestBatchWireRoundTrip(t *testing.T) {
	params := sample.DefaultParams()
	params.Temperature, params.TopK, params.Seed, params.TopLogprobs = 0.8, 40, 12345, 3
	params.LogitBias = map[int32]float32{7: -100, 9: 2.5}
	const dim = 8
	want := &MicroBatch{
		Epoch:     1700000000123,
		Placement: 2,
		ID:        99,
		TTL:       250,
		Tombstones: []Tombstone{
			{Epoch: 1700000000123, Seq: 3, Reason: ReasonFinished},
			{Epoch: 1700000000123, Seq: 4, Reason: ReasonPreempted},
		},
		Rows: []Row{
			{Seq: 5, Pos: 0, First: true, Tokens: []int32{1, 2, 3}, Blocks: []int32{0}, Params: &params, Logprobs: true},
			{Seq: 6, Pos: 17, Tokens: []int32{4}, Blocks: []int32{1, 2}, Sample: true},
		},
		Dropped: []Dropped{{Seq: 8, Reason: CodeStaleCreate, Shard: "node-0000000000000001"}},
		Hidden:  randomHidden(4*dim, 5),
	}
	h, err := HeaderToWire(want, pb.HiddenType_HIDDEN_TYPE_F32)
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
	got, err := BatchFromWire(b, testLimits)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, want); diff != "" {
		t.Fatalf("round trip (-got +want):\n%s", diff)
	}

	// Tombstones only.
	h, err = HeaderToWire(&MicroBatch{Epoch: 1, Tombstones: []Tombstone{{Epoch: 1, Seq: 2, Reason: ReasonAborted}}}, pb.HiddenType_HIDDEN_TYPE_F32)
	if err != nil || len(h.GetRows()) != 0 || h.GetHiddenDim() != 0 {
		t.Fatalf("tombstone-only batch: %v, %v", h, err)
	}
}

func TestHeaderToWireErrors(t *testing.T) {
	for name, b := range map[string]*MicroBatch{
		"shard's reason": {Tombstones: []Tombstone{{Seq: 1, Reason: ReasonLease}}},
		"no reason":      {Tombstones: []Tombstone{{Seq: 1}}},
		"position":       {Rows: []Row{{Seq: 1, Pos: math.MaxInt32, Tokens: []int32{1}}}},
		"negative":       {Rows: []Row{{Seq: 1, Pos: -1, Tokens: []int32{1}}}},
		"hidden":         {Rows: []Row{{Seq: 1, Tokens: []int32{1, 2}}}, Hidden: make([]float32, 5)},
		"no tokens":      {Hidden: make([]float32, 4)},
		"top_k":          {Rows: []Row{{Seq: 1, First: true, Tokens: []int32{1}, Params: &sample.Params{TopK: -1}}}},
		"drop code":      {Dropped: []Dropped{{Seq: 1, Reason: CodeBackendError}}},
		"rows":           {Rows: make([]Row, MaxBatchRows+1)},
		"tombstones":     {Tombstones: make([]Tombstone, MaxBatchTombstones+1)},
		"slide widths":   {Rows: []Row{{Seq: 1, Tokens: []int32{1}, Blocks: []int32{0, 1}, Slides: []int32{2, 3, 4}}}},
		"slide_from":     {Rows: []Row{{Seq: 1, Tokens: []int32{1}, Blocks: []int32{0}, SlideFrom: 2}}},
		"slides, no row": {Rows: []Row{{Seq: 1, Tokens: []int32{1}, Blocks: []int32{0}, SlideFrom: 1, Slides: []int32{2}}}},
		"negative from":  {Rows: []Row{{Seq: 1, Tokens: []int32{1}, Blocks: []int32{0}, SlideFrom: -1}}},
	} {
		if h, err := HeaderToWire(b, pb.HiddenType_HIDDEN_TYPE_F32); err == nil {
			t.Errorf("%s: got %v and no error", name, h)
		}
	}
}

// goodHeader is a valid header under testLimits: one first row of three
// tokens at position 0 into stage 0 (no hidden state).
func goodHeader() *pb.BatchHeader {
	return &pb.BatchHeader{Epoch: testLimits.Epoch, PlacementVersion: 2, BatchId: 3,
		Rows: []*pb.Row{{Seq: 1, First: true, Tokens: []int32{1, 2, 3}, Blocks: []int32{0}, Sample: true}}}
}

// TestBatchFromWireRefusals: each malformed or forged field of a batch is
// refused with its code before anything uses it, and never panics.
func TestBatchFromWireRefusals(t *testing.T) {
	stage0 := testLimits
	stage0.Hidden = 0
	for _, tc := range []struct {
		name string
		edit func(h *pb.BatchHeader)
		code Code
	}{
		{"position -100", func(h *pb.BatchHeader) { h.Rows[0].Pos = -100 }, CodeBadPosition},
		{"position past the context", func(h *pb.BatchHeader) {
			h.Rows[0].Pos = 62
			h.Rows[0].First = false
			h.Rows[0].Blocks = []int32{0, 1, 2, 3}
		}, CodeBadPosition},
		{"position at int32 max", func(h *pb.BatchHeader) { h.Rows[0].Pos = math.MaxInt32 }, CodeBadPosition},
		{"epoch 2^62", func(h *pb.BatchHeader) { h.Epoch = 1 << 62 }, CodeFutureEpoch},
		{"older epoch", func(h *pb.BatchHeader) { h.Epoch-- }, CodeStaleEpoch},
		{"other placement", func(h *pb.BatchHeader) { h.PlacementVersion = 3 }, CodeStalePlacement},
		{"token past the vocabulary", func(h *pb.BatchHeader) { h.Rows[0].Tokens[1] = 100 }, CodeBadToken},
		{"negative token", func(h *pb.BatchHeader) { h.Rows[0].Tokens[1] = -1 }, CodeBadToken},
		{"block at the pool size", func(h *pb.BatchHeader) { h.Rows[0].Blocks = []int32{8} }, CodeBadBlocks},
		{"negative block", func(h *pb.BatchHeader) { h.Rows[0].Blocks = []int32{-1} }, CodeBadBlocks},
		{"more blocks than the context", func(h *pb.BatchHeader) { h.Rows[0].Blocks = []int32{0, 1, 2, 3, 4} }, CodeBadBlocks},
		{"too few blocks", func(h *pb.BatchHeader) { h.Rows[0].Tokens = make([]int32, 17); h.Rows[0].Blocks = []int32{0} }, CodeBadBlocks},
		{"no tokens", func(h *pb.BatchHeader) { h.Rows[0].Tokens = nil }, CodeBadField},
		{"too many rows", func(h *pb.BatchHeader) { h.Rows = make([]*pb.Row, MaxBatchRows+1) }, CodeTooLarge},
		{"too many tokens", func(h *pb.BatchHeader) {
			for i := range 5 {
				h.Rows = append(h.Rows, &pb.Row{Seq: uint64(10 + i), First: true, Tokens: make([]int32, 60), Blocks: []int32{0, 1, 2, 3}})
			}
		}, CodeTooLarge},
		{"tombstone of a shard's reason", func(h *pb.BatchHeader) {
			h.Tombstones = []*pb.Tombstone{{Epoch: h.Epoch, Seq: 1, Reason: pb.Tombstone_LEASE}}
		}, CodeBadReason},
		{"tombstone of no reason", func(h *pb.BatchHeader) { h.Tombstones = []*pb.Tombstone{{Seq: 1, Reason: 42}} }, CodeBadReason},
		{"tombstone of another epoch", func(h *pb.BatchHeader) {
			h.Tombstones = []*pb.Tombstone{{Epoch: 1 << 62, Seq: 1, Reason: pb.Tombstone_ABORTED}}
		}, CodeStaleEpoch},
		{"too many tombstones", func(h *pb.BatchHeader) { h.Tombstones = make([]*pb.Tombstone, MaxBatchTombstones+1) }, CodeTooLarge},
		{"free-text drop reason", func(h *pb.BatchHeader) {
			h.Dropped = []*pb.DroppedRow{{Seq: 1, Reason: "gremlins " + strings.Repeat("x", 100)}}
		}, CodeBadReason},
		{"batch code as drop reason", func(h *pb.BatchHeader) { h.Dropped = []*pb.DroppedRow{{Seq: 1, Reason: "backend_error"}} }, CodeBadReason},
		{"junk shard ID", func(h *pb.BatchHeader) {
			h.Dropped = []*pb.DroppedRow{{Seq: 1, Reason: "stale_create", ShardId: "a b\n"}}
		}, CodeBadString},
		{"logit bias outside the vocabulary", func(h *pb.BatchHeader) {
			h.Rows[0].Params = &pb.SampleParams{LogitBias: map[int32]float32{1000: 1}}
		}, CodeBadParams},
		{"NaN temperature", func(h *pb.BatchHeader) { h.Rows[0].Params = &pb.SampleParams{Temperature: float32(math.NaN())} }, CodeBadParams},
		{"negative ttl", func(h *pb.BatchHeader) { h.TtlMs = -1 }, CodeBadField},
		{"constraint over its limit", func(h *pb.BatchHeader) {
			h.Rows[0].Params = &pb.SampleParams{Constraint: make([]byte, sample.MaxConstraint+1)}
		}, CodeBadParams},
		{"output without a constraint", func(h *pb.BatchHeader) {
			h.Rows[0].Pos, h.Rows[0].Blocks = 3, []int32{0}
			h.Rows[0].Params = &pb.SampleParams{Output: []int32{5}}
		}, CodeBadParams},
		{"output past the first row", func(h *pb.BatchHeader) {
			h.Rows[0].Pos, h.Rows[0].Blocks = 3, []int32{0}
			h.Rows[0].Params = &pb.SampleParams{Constraint: []byte(`{"type":"json_object"}`), OutputStart: 2, Output: []int32{5, 6}}
		}, CodeBadParams},
		{"output outside the vocabulary", func(h *pb.BatchHeader) {
			h.Rows[0].Pos, h.Rows[0].Blocks = 3, []int32{0}
			h.Rows[0].Params = &pb.SampleParams{Constraint: []byte(`{"type":"json_object"}`), OutputStart: 2, Output: []int32{100}}
		}, CodeBadParams},
		{"output_start past the context", func(h *pb.BatchHeader) {
			h.Rows[0].Params = &pb.SampleParams{Constraint: []byte(`{"type":"json_object"}`), OutputStart: 64}
		}, CodeBadParams},
		{"negative output_start", func(h *pb.BatchHeader) {
			h.Rows[0].Params = &pb.SampleParams{Constraint: []byte(`{"type":"json_object"}`), OutputStart: -1}
		}, CodeBadParams},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := goodHeader()
			if _, err := BatchFromWire(&Batch{Header: h}, stage0); err != nil {
				t.Fatalf("the unedited batch: %v", err)
			}
			tc.edit(h)
			m, err := BatchFromWire(&Batch{Header: h}, stage0)
			re, ok := errors.AsType[*RefusedError](err)
			if !ok || re.Code != tc.code || !errors.Is(err, ErrRefused) {
				t.Fatalf("got %v, %v; want a refusal %v", m, err, tc.code)
			}
			if CodeOf(err) != tc.code {
				t.Fatalf("CodeOf = %v", CodeOf(err))
			}
		})
	}
	// A hidden state of the wrong width into a later stage.
	h := goodHeader()
	if _, err := BatchFromWire(&Batch{Header: h, Hidden: make([]float32, 3*7)}, testLimits); CodeOf(err) != CodeBadHeader {
		t.Fatalf("hidden of width 7: %v", err)
	}
	if _, err := BatchFromWire(&Batch{Header: h}, testLimits); CodeOf(err) != CodeBadHeader {
		t.Fatalf("no hidden state into a later stage: %v", err)
	}
	if _, err := BatchFromWire(&Batch{Header: h, Hidden: make([]float32, 3*8)}, testLimits); err != nil {
		t.Fatal(err)
	}
}

// slideLimits is testLimits for a model with two sliding tables per
// sequence (three KV groups) over a window of 20 positions, into stage 0.
func slideLimits() BatchLimits {
	lim := testLimits
	lim.Hidden, lim.Groups, lim.Window = 0, 3, 20
	return lim
}

// slideHeader is a valid header under slideLimits: sequence 1's row at
// position 40 reads sliding positions from 21 (block 1), so its sliding
// tables carry blocks 1 and 2 of each group.
func slideHeader() *pb.BatchHeader {
	return &pb.BatchHeader{Epoch: testLimits.Epoch, PlacementVersion: 2, BatchId: 3,
		Rows: []*pb.Row{{Seq: 1, Pos: 40, Tokens: []int32{7}, Blocks: []int32{0, 1, 2}, SlideFrom: 1, Slides: []int32{3, 4, 5, 6}, Sample: true}}}
}

// TestBatchFromWireSlides: sliding tables cross the wire as sent, and a
// stage refuses (bad_blocks) those its model has no room for, those that
// released a block the row still reads, those of the wrong number or
// width, and entries outside the pool.
func TestBatchFromWireSlides(t *testing.T) {
	want := &MicroBatch{Epoch: testLimits.Epoch, Placement: 2, ID: 4, Rows: []Row{
		{Seq: 1, Pos: 0, First: true, Tokens: []int32{1, 2}, Blocks: []int32{0}, Slides: []int32{1, 2}},
		{Seq: 2, Pos: 40, Tokens: []int32{3}, Blocks: []int32{3, 4, 5}, SlideFrom: 1, Slides: []int32{6, 7, 0, 1}, Sample: true},
	}}
	h, err := HeaderToWire(want, pb.HiddenType_HIDDEN_TYPE_F32)
	if err != nil {
		t.Fatal(err)
	}
	var s fakeStream
	if err := SendBatch(&s, h, nil); err != nil {
		t.Fatal(err)
	}
	b, err := RecvBatch(&s, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := BatchFromWire(b, slideLimits())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, want); diff != "" {
		t.Fatalf("round trip (-got +want):\n%s", diff)
	}

	noGroups := slideLimits()
	noGroups.Groups = 1
	noWindow := slideLimits()
	noWindow.Window = 0
	for _, tc := range []struct {
		name string
		edit func(r *pb.Row)
		lim  BatchLimits
	}{
		{"slides for a model without sliding tables", func(r *pb.Row) {}, noGroups},
		{"slide_from for a model without sliding tables", func(r *pb.Row) { r.Slides = nil }, noGroups},
		{"negative slide_from", func(r *pb.Row) { r.SlideFrom, r.Slides = -1, make([]int32, 8) }, slideLimits()},
		{"slide_from past the window", func(r *pb.Row) { r.SlideFrom, r.Slides = 2, []int32{4, 6} }, slideLimits()},
		{"slide_from one block early at the window's edge", func(r *pb.Row) { r.Pos = 34 }, slideLimits()},
		{"a release without a window", func(r *pb.Row) {}, noWindow},
		{"no sliding tables", func(r *pb.Row) { r.SlideFrom, r.Slides = 0, nil }, slideLimits()},
		{"one sliding table", func(r *pb.Row) { r.Slides = r.Slides[:2] }, slideLimits()},
		{"a sliding entry missing", func(r *pb.Row) { r.Slides = r.Slides[:3] }, slideLimits()},
		{"a sliding entry too many", func(r *pb.Row) { r.Slides = append(r.Slides, 7) }, slideLimits()},
		{"the entries of slide_from 0", func(r *pb.Row) { r.SlideFrom = 0 }, slideLimits()},
		{"sliding block at the pool size", func(r *pb.Row) { r.Slides[3] = 8 }, slideLimits()},
		{"negative sliding block", func(r *pb.Row) { r.Slides[0] = -1 }, slideLimits()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := slideHeader()
			if _, err := BatchFromWire(&Batch{Header: h}, slideLimits()); err != nil {
				t.Fatalf("the unedited batch: %v", err)
			}
			tc.edit(h.Rows[0])
			m, err := BatchFromWire(&Batch{Header: h}, tc.lim)
			if re, ok := errors.AsType[*RefusedError](err); !ok || re.Code != CodeBadBlocks {
				t.Fatalf("got %v, %v; want a refusal %v", m, err, CodeBadBlocks)
			}
		})
	}
	// At the window's edge: position 36 reads from 17, in block 1.
	h = slideHeader()
	h.Rows[0].Pos = 36
	if _, err := BatchFromWire(&Batch{Header: h}, slideLimits()); err != nil {
		t.Fatalf("slide_from 1 at position 36: %v", err)
	}
	// A model without sliding tables takes rows without them.
	if _, err := BatchFromWire(&Batch{Header: goodHeader()}, noGroups); err != nil {
		t.Fatal(err)
	}
}

func TestResultWire(t *testing.T) {
	want := &BatchResult{
		Epoch: 5, Placement: 2, ID: 6,
		Samples: []Sampled{{Seq: 1, Pos: 9, Token: 42, Logprob: -0.5, Top: []sample.TokenLogprob{{Token: 42, Logprob: -0.5}, {Token: 7, Logprob: -1.25}}}, {Seq: 2, Token: 3}},
		Dropped: []Dropped{{Seq: 9, Reason: CodeUnknownSequence, Shard: "s1"}},
	}
	m := ResultToWire(want)
	got, err := ResultFromWire(m.GetResult(), ResultLimits{Epoch: 5, Vocab: 100})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, want); diff != "" {
		t.Fatalf("result (-got +want):\n%s", diff)
	}
	for name, tc := range map[string]struct {
		w    *pb.BatchResult
		code Code
	}{
		"older epoch":           {&pb.BatchResult{Epoch: 4}, CodeStaleEpoch},
		"newer epoch":           {&pb.BatchResult{Epoch: 1 << 62}, CodeFutureEpoch},
		"token":                 {&pb.BatchResult{Epoch: 5, Samples: []*pb.SampledToken{{Token: 100}}}, CodeBadToken},
		"alternative":           {&pb.BatchResult{Epoch: 5, Samples: []*pb.SampledToken{{Token: 1, Top: []*pb.TokenLogprob{{Token: -1}}}}}, CodeBadToken},
		"too many alternatives": {&pb.BatchResult{Epoch: 5, Samples: []*pb.SampledToken{{Token: 1, Top: make([]*pb.TokenLogprob, sample.MaxTopLogprobs+1)}}}, CodeTooLarge},
		"position":              {&pb.BatchResult{Epoch: 5, Samples: []*pb.SampledToken{{Token: 1, Pos: -1}}}, CodeBadPosition},
		"drop reason":           {&pb.BatchResult{Epoch: 5, Dropped: []*pb.DroppedRow{{Reason: "why not"}}}, CodeBadReason},
		"samples":               {&pb.BatchResult{Epoch: 5, Samples: make([]*pb.SampledToken, MaxBatchRows+1)}, CodeTooLarge},
	} {
		if r, err := ResultFromWire(tc.w, ResultLimits{Epoch: 5, Vocab: 100}); CodeOf(err) != tc.code {
			t.Errorf("%s: got %v, %v; want a refusal %v", name, r, err, tc.code)
		}
	}
}

func TestFailedWire(t *testing.T) {
	want := &Failure{Epoch: 5, Batch: 8, Seqs: []uint64{1, 2}, Code: CodeBackendError, Shard: "node-1"}
	got, err := FailedFromWire(FailedToWire(want), 5)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, want); diff != "" {
		t.Fatalf("failure (-got +want):\n%s", diff)
	}
	if _, err := FailedFromWire(&pb.BatchFailed{BatchId: 8, Reason: "bad_chunks"}, 5); err != nil {
		t.Fatalf("a failure without an epoch (a stream-level BatchError): %v", err)
	}
	for name, tc := range map[string]struct {
		f    *pb.BatchFailed
		code Code
	}{
		"free text":   {&pb.BatchFailed{BatchId: 1, Reason: "disk on fire at 0x7ffe"}, CodeBadReason},
		"long reason": {&pb.BatchFailed{BatchId: 1, Reason: strings.Repeat("a", 1<<20)}, CodeBadReason},
		"epoch":       {&pb.BatchFailed{BatchId: 1, Reason: "backend_error", Epoch: 1 << 62}, CodeFutureEpoch},
		"old epoch":   {&pb.BatchFailed{BatchId: 1, Reason: "backend_error", Epoch: 4}, CodeStaleEpoch},
		"seqs":        {&pb.BatchFailed{BatchId: 1, Reason: "backend_error", Seqs: make([]uint64, MaxBatchRows+1)}, CodeTooLarge},
		"shard":       {&pb.BatchFailed{BatchId: 1, Reason: "backend_error", ShardId: strings.Repeat("s", MaxIDLen+1)}, CodeBadString},
	} {
		if f, err := FailedFromWire(tc.f, 5); CodeOf(err) != tc.code {
			t.Errorf("%s: got %v, %v; want a refusal %v", name, f, err, tc.code)
		}
	}
}

// TestEnums: Reason is pb.Tombstone_Reason by value and name, and every
// name of both enums parses back to its value.
func TestEnums(t *testing.T) {
	for _, r := range Reasons() {
		if got := strings.ToLower(r.wire().String()); got != r.String() {
			t.Errorf("Reason %d is %q, pb names it %q", r, r.String(), got)
		}
		if p, ok := ParseReason(r.String()); !ok || p != r {
			t.Errorf("ParseReason(%q) = %v, %v", r.String(), p, ok)
		}
	}
	if len(Reasons()) != len(pb.Tombstone_Reason_name)-1 {
		t.Errorf("%d reasons, pb has %d besides unspecified", len(Reasons()), len(pb.Tombstone_Reason_name)-1)
	}
	seen := map[string]bool{}
	for _, c := range Codes() {
		if seen[c.String()] || len(c.String()) > maxCodeLen {
			t.Errorf("code %d: name %q repeated or too long", c, c.String())
		}
		seen[c.String()] = true
		if p, ok := ParseCode(c.String()); !ok || p != c {
			t.Errorf("ParseCode(%q) = %v, %v", c.String(), p, ok)
		}
	}
	if _, ok := ParseCode(""); ok {
		t.Error("the empty code parses")
	}
}

func TestCheckRegister(t *testing.T) {
	good := func() *pb.RegisterRequest {
		return &pb.RegisterRequest{NodeId: "0123456789abcdef0123456789abcdef", GrpcAddr: "10.0.0.7:7071", ProtocolVersion: ProtocolVersion,
			Devices: &pb.Devices{CpuCores: 8, MemoryBytes: 1 << 30, Device: "cpu", Gpus: []*pb.Gpu{{Name: "NVIDIA H200"}}},
			Models:  []*pb.ModelFile{{Name: "m.gguf", Sha256: strings.Repeat("ab", 32), Size: 10}}}
	}
	if err := CheckRegister(good()); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(r *pb.RegisterRequest){
		"empty node":    func(r *pb.RegisterRequest) { r.NodeId = "" },
		"long node":     func(r *pb.RegisterRequest) { r.NodeId = strings.Repeat("a", MaxIDLen-16) },
		"node bytes":    func(r *pb.RegisterRequest) { r.NodeId = "a\x00b" },
		"addr":          func(r *pb.RegisterRequest) { r.GrpcAddr = "nowhere" },
		"long addr":     func(r *pb.RegisterRequest) { r.GrpcAddr = strings.Repeat("h", MaxAddrLen) + ":1" },
		"port":          func(r *pb.RegisterRequest) { r.GrpcAddr = "h:0" },
		"memory":        func(r *pb.RegisterRequest) { r.Devices.MemoryBytes = 0 },
		"device":        func(r *pb.RegisterRequest) { r.Devices.Device = strings.Repeat("d", MaxNameLen+1) },
		"gpus":          func(r *pb.RegisterRequest) { r.Devices.Gpus = make([]*pb.Gpu, MaxGPUs+1) },
		"models":        func(r *pb.RegisterRequest) { r.Models = make([]*pb.ModelFile, MaxModels+1) },
		"sha":           func(r *pb.RegisterRequest) { r.Models[0].Sha256 = "not a hash" },
		"gpu name ctrl": func(r *pb.RegisterRequest) { r.Devices.Gpus[0].Name = "a\nb" },
	} {
		r := good()
		edit(r)
		if err := CheckRegister(r); !errors.Is(err, ErrRefused) {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
}

func TestCheckControl(t *testing.T) {
	for name, m := range map[string]*pb.ShardToCoordinator{
		"empty":         {},
		"second hello":  {Msg: &pb.ShardToCoordinator_Hello{Hello: &pb.StreamHello{}}},
		"live seqs":     {Msg: &pb.ShardToCoordinator_Heartbeat{Heartbeat: &pb.Heartbeat{LiveSeqs: make([]uint64, MaxLiveSeqs+1)}}},
		"counter key":   {Msg: &pb.ShardToCoordinator_Heartbeat{Heartbeat: &pb.Heartbeat{Counters: &pb.Counters{TombstonesApplied: map[string]uint64{"x": 1}}}}},
		"status error":  {Msg: &pb.ShardToCoordinator_Status{Status: &pb.Status{State: pb.Status_FAILED, Error: strings.Repeat("e", MaxTextLen+1)}}},
		"status state":  {Msg: &pb.ShardToCoordinator_Status{Status: &pb.Status{State: 9}}},
		"failed reason": {Msg: &pb.ShardToCoordinator_Failed{Failed: &pb.BatchFailed{Reason: "?"}}},
	} {
		if err := CheckFromShard(m, 5); !errors.Is(err, ErrRefused) {
			t.Errorf("from shard, %s: %v, want a refusal", name, err)
		}
	}
	for name, m := range map[string]*pb.CoordinatorToShard{
		"empty":      {},
		"tombstones": {Msg: &pb.CoordinatorToShard_Tombstones{Tombstones: &pb.Tombstones{Tombstones: []*pb.Tombstone{{Seq: 1}}}}},
		"unknown":    {Msg: &pb.CoordinatorToShard_HeartbeatReply{HeartbeatReply: &pb.HeartbeatReply{UnknownSeqs: make([]uint64, MaxLiveSeqs+1)}}},
		"next addr":  {Msg: &pb.CoordinatorToShard_Assign{Assign: &pb.Assign{NextAddr: "x"}}},
	} {
		if err := CheckFromCoordinator(m); !errors.Is(err, ErrRefused) {
			t.Errorf("from coordinator, %s: %v, want a refusal", name, err)
		}
	}
	if got := Truncate("héllo", 5); len(got) > 5 || !strings.HasSuffix(got, "…") {
		t.Errorf("Truncate = %q", got)
	}
}

// TestNoLogprobCrossesTheWire: a request that shows no logprobs reaches the
// last stage's sampler with NoLogprob set; one that asks for them, or for
// alternatives, does not.
func TestNoLogprobCrossesTheWire(t *testing.T) {
	for _, tc := range []struct {
		logprobs bool
		top      int
		want     bool
	}{{false, 0, true}, {true, 0, false}, {false, 3, false}, {true, 3, false}} {
		p := sample.DefaultParams()
		p.TopLogprobs = tc.top
		w, err := ParamsToWire(&p, tc.logprobs)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParamsFromWire(w, 100)
		if err != nil {
			t.Fatal(err)
		}
		if got.NoLogprob != tc.want {
			t.Errorf("logprobs %v, top %d: NoLogprob %v, want %v", tc.logprobs, tc.top, got.NoLogprob, tc.want)
		}
	}
}

// TestConstraintCrossesTheWire: a constrained sequence's response format,
// output start and carried output reach the last stage as sent.
func TestConstraintCrossesTheWire(t *testing.T) {
	p := sample.DefaultParams()
	p.Constraint, p.OutputStart, p.Output = []byte(`{"type":"json_object"}`), 2, []int32{7}
	h, err := HeaderToWire(&MicroBatch{Epoch: testLimits.Epoch, Placement: 2, ID: 1,
		Rows: []Row{{Seq: 1, Pos: 3, First: true, Tokens: []int32{1}, Blocks: []int32{0}, Sample: true, Params: &p}}}, pb.HiddenType_HIDDEN_TYPE_F32)
	if err != nil {
		t.Fatal(err)
	}
	lim := testLimits
	lim.Hidden = 0
	m, err := BatchFromWire(&Batch{Header: h}, lim)
	if err != nil {
		t.Fatal(err)
	}
	got := m.Rows[0].Params
	if string(got.Constraint) != string(p.Constraint) || got.OutputStart != 2 || !slices.Equal(got.Output, p.Output) {
		t.Errorf("got %+v", got)
	}
	big := p
	big.Constraint = make([]byte, sample.MaxConstraint+1)
	if _, err := HeaderToWire(&MicroBatch{Rows: []Row{{Seq: 1, First: true, Tokens: []int32{1}, Params: &big}}}, pb.HiddenType_HIDDEN_TYPE_F32); CodeOf(err) != CodeBadParams {
		t.Errorf("an oversized constraint is sent: %v", err)
	}
}
