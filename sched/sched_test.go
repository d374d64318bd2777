package sched

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/strata-llm/strata/kv"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// harness wraps a Scheduler with a fixed clock, checks invariants after every
// call and records every tombstone and ending.
type harness struct {
	t     *testing.T
	s     *Scheduler
	now   time.Time
	tombs map[SeqID]Reason
	ends  map[RequestID]Reason
	toks  map[RequestID][]int32
}

func testConfig() Config {
	cfg := DefaultConfig()
	cfg.KV = kv.Config{Blocks: 16, BlockSize: 4}
	cfg.MaxBatchTokens = 16
	cfg.MaxBatchRows = 8
	cfg.MaxModelLen = 64
	cfg.WatermarkBlocks = 0
	cfg.QueueTimeout = 10 * time.Second
	cfg.RequestTimeout = time.Minute
	cfg.ReclaimTimeout = 5 * time.Second
	return cfg
}

func newHarness(t *testing.T, mod func(*Config)) *harness {
	t.Helper()
	cfg := testConfig()
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, s: s, now: t0, tombs: map[SeqID]Reason{}, ends: map[RequestID]Reason{}, toks: map[RequestID][]int32{}}
}

func (h *harness) check() {
	h.t.Helper()
	if err := h.s.CheckInvariants(); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) add(id RequestID, prompt, max int) {
	h.t.Helper()
	if err := h.s.Add(h.req(id, prompt, max)); err != nil {
		h.t.Fatal(err)
	}
	h.check()
}

func (h *harness) req(id RequestID, prompt, max int) Request {
	p := make([]int32, prompt)
	for i := range p {
		p[i] = int32(100*int(id) + i + 1)
	}
	return Request{ID: id, Prompt: p, MaxTokens: max, Stop: []int32{0}, Arrival: h.now}
}

func (h *harness) step() Output {
	h.t.Helper()
	out := h.s.Step(h.now)
	h.check()
	for _, tb := range out.Tombstones {
		if r, ok := h.tombs[tb.Seq]; ok {
			h.t.Fatalf("sequence %d tombstoned twice: %v then %v", tb.Seq, r, tb.Reason)
		}
		h.tombs[tb.Seq] = tb.Reason
	}
	for _, u := range out.Updates {
		if _, ok := h.ends[u.Request]; ok {
			h.t.Fatalf("update after the end of request %d", u.Request)
		}
		h.toks[u.Request] = append(h.toks[u.Request], u.Tokens...)
		if u.Done {
			h.ends[u.Request] = u.Reason
		}
	}
	return out
}

// complete answers batch b, sampling tok for every row that asks.
func (h *harness) complete(b Batch, tok int32) {
	h.t.Helper()
	res := Result{Batch: b.ID}
	for _, r := range b.Rows {
		if r.Sample {
			res.Samples = append(res.Samples, Sample{Seq: r.Seq, Token: tok})
		}
	}
	h.s.Complete(res, h.now)
	h.check()
}

func (h *harness) abort(id RequestID, reason Reason) {
	h.t.Helper()
	if err := h.s.Abort(id, reason); err != nil {
		h.t.Fatal(err)
	}
	h.check()
}

func (h *harness) used() int { return h.s.Stats().KV.Used }

// rowsOf returns the rows of out for request id.
func rowsOf(out Output, id RequestID) []Row {
	var rows []Row
	for _, b := range out.Batches {
		for _, r := range b.Rows {
			if r.Request == id {
				rows = append(rows, r)
			}
		}
	}
	return rows
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	for _, tc := range []struct {
		field string
		mod   func(*Config)
	}{
		{"Stages", func(c *Config) { c.Stages = 0 }},
		{"MaxInFlight", func(c *Config) { c.MaxInFlight = -1 }},
		{"MaxBatchTokens", func(c *Config) { c.MaxBatchTokens = 0 }},
		{"MaxBatchRows", func(c *Config) { c.MaxBatchRows = 0 }},
		{"MaxModelLen", func(c *Config) { c.MaxModelLen = 1 }},
		{"MaxWaiting", func(c *Config) { c.MaxWaiting = 0 }},
		{"MaxWaitingTokens", func(c *Config) { c.MaxWaitingTokens = 0 }},
		{"QueueTimeout", func(c *Config) { c.QueueTimeout = -1 }},
		{"RequestTimeout", func(c *Config) { c.RequestTimeout = -1 }},
		{"ReclaimTimeout", func(c *Config) { c.ReclaimTimeout = 0 }},
		{"MaxRetries", func(c *Config) { c.MaxRetries = -1 }},
		{"WatermarkBlocks", func(c *Config) { c.WatermarkBlocks = -1 }},
		{"FirstSeq", func(c *Config) { c.FirstSeq = 0 }},
		{"BlockSize", func(c *Config) { c.KV.BlockSize = 0 }},
	} {
		cfg := DefaultConfig()
		tc.mod(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: Validate = %v, want an error naming it", tc.field, err)
		}
	}
}

func TestAddRefuses(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxWaiting = 2; c.MaxWaitingTokens = 30; c.MaxModelLen = 100 })
	for _, tc := range []struct {
		name string
		req  Request
		want error
		msg  string
	}{
		{"empty prompt", h.req(1, 0, 1), ErrInvalid, ""},
		{"no max tokens", h.req(1, 4, 0), ErrInvalid, ""},
		{"no arrival", Request{ID: 1, Prompt: []int32{1}, MaxTokens: 1}, ErrInvalid, ""},
		{"past context", h.req(1, 40, 70), ErrNeverFits, "prompt 40 + max_tokens 70 exceeds max_model_len 100"},
		// The pool holds 64 positions; the last token is never stored.
		{"past pool", h.req(1, 20, 46), ErrNeverFits, "prompt 20 + max_tokens 46 - 1 exceeds kv_positions 64"},
		{"past queue tokens", h.req(1, 31, 1), ErrNeverFits, "max_waiting_tokens 30"},
	} {
		err := h.s.Add(tc.req)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: Add = %v, want %v containing %q", tc.name, err, tc.want, tc.msg)
		}
	}
	h.add(1, 20, 45) // 64 positions: fits

	if err := h.s.Add(h.req(1, 2, 4)); !errors.Is(err, ErrDuplicate) {
		t.Errorf("duplicate = %v", err)
	}
	var le *LimitError
	if err := h.s.Add(h.req(2, 11, 4)); !errors.Is(err, ErrQueueFull) || !errors.As(err, &le) || le.Limit != "max_waiting_tokens" {
		t.Errorf("token bound = %v", err)
	}
	h.add(2, 10, 4)
	if err := h.s.Add(h.req(3, 1, 1)); !errors.Is(err, ErrQueueFull) || !errors.As(err, &le) || le.Limit != "max_waiting" {
		t.Errorf("count bound = %v", err)
	}
	if st := h.s.Stats(); st.Waiting != 2 || st.WaitingTokens != 30 {
		t.Errorf("stats = %+v", st)
	}
}

// A request's whole life: admission, prefill, decodes, finish by length.
func TestLifeToLength(t *testing.T) {
	h := newHarness(t, nil)
	h.add(1, 6, 3)
	out := h.step()
	want := []Row{{Request: 1, Seq: 1, Pos: 0, First: true, Tokens: []int32{101, 102, 103, 104, 105, 106}, Blocks: []kv.BlockID{0, 1}, Sample: true}}
	if diff := cmp.Diff(out.Batches[0].Rows, want); diff != "" {
		t.Fatalf("first batch (-got +want):\n%s", diff)
	}
	if len(out.Batches) != 1 {
		t.Fatalf("%d batches, want 1: nothing else to do", len(out.Batches))
	}
	// Its decode waits for the token.
	if out := h.step(); len(out.Batches) != 0 {
		t.Fatalf("a batch before the token came back: %+v", out.Batches)
	}
	h.complete(out.Batches[0], 7)
	out = h.step()
	want = []Row{{Request: 1, Seq: 1, Pos: 6, Tokens: []int32{7}, Blocks: []kv.BlockID{0, 1}, Sample: true}}
	if diff := cmp.Diff(out.Batches[0].Rows, want); diff != "" {
		t.Fatalf("decode (-got +want):\n%s", diff)
	}
	if diff := cmp.Diff(out.Updates, []Update{{Request: 1, Tokens: []int32{7}}}); diff != "" {
		t.Fatalf("updates (-got +want):\n%s", diff)
	}
	h.complete(out.Batches[0], 8)
	out = h.step()
	if got := out.Batches[0].Rows[0].Blocks; len(got) != 2 {
		t.Fatalf("position 7 needs 2 blocks, row names %v", got)
	}
	h.complete(out.Batches[0], 9)
	out = h.step()
	if diff := cmp.Diff(out.Tombstones, []Tombstone{{Seq: 1, Reason: Length}}); diff != "" {
		t.Fatalf("tombstones (-got +want):\n%s", diff)
	}
	if diff := cmp.Diff(out.Updates, []Update{{Request: 1, Tokens: []int32{9}, Done: true, Reason: Length}}); diff != "" {
		t.Fatalf("updates (-got +want):\n%s", diff)
	}
	if h.used() != 0 || h.s.Pending() {
		t.Fatalf("after the end: used %d, pending %v", h.used(), h.s.Pending())
	}
}

func TestStopToken(t *testing.T) {
	h := newHarness(t, nil)
	h.add(1, 3, 10)
	out := h.step()
	h.complete(out.Batches[0], 0)
	h.step()
	if h.ends[1] != Stop || h.tombs[1] != Stop || h.used() != 0 {
		t.Fatalf("end %v, tombstone %v, used %d", h.ends[1], h.tombs[1], h.used())
	}
	if diff := cmp.Diff(h.toks[1], []int32{0}); diff != "" {
		t.Fatalf("the stop token is reported: %s", diff)
	}
}

// Consecutive prefill chunks ride in consecutive batches of one Step.
func TestChunkedPrefill(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Stages = 2; c.MaxBatchTokens = 8 }) // 3 in flight
	h.add(1, 20, 2)
	out := h.step()
	if len(out.Batches) != 3 {
		t.Fatalf("%d batches, want 3", len(out.Batches))
	}
	var got []Row
	for _, b := range out.Batches {
		got = append(got, b.Rows...)
	}
	for i, r := range got {
		pos := 8 * i
		end := min(pos+8, 20)
		if r.Pos != pos || len(r.Tokens) != end-pos || r.First != (i == 0) || r.Sample != (i == 2) || len(r.Blocks) != (end+3)/4 {
			t.Errorf("chunk %d: %+v", i, r)
		}
	}
	// The pipeline is full: nothing more until something returns.
	h.add(2, 4, 2)
	if out := h.step(); len(out.Batches) != 0 {
		t.Fatalf("batch beyond MaxInFlight: %+v", out.Batches)
	}
	h.complete(out.Batches[0], 5)
	if out := h.step(); len(rowsOf(out, 2)) != 1 {
		t.Fatalf("request 2 not admitted when a slot freed: %+v", out.Batches)
	}
}

// Decodes go first; prefill and admissions share what is left of the budget.
func TestDecodesFirst(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxBatchTokens = 4 })
	h.add(1, 2, 5)
	out := h.step()
	h.complete(out.Batches[0], 9)
	h.add(2, 10, 2)
	out = h.step()
	rows := out.Batches[0].Rows
	if len(rows) != 2 || rows[0].Request != 1 || len(rows[0].Tokens) != 1 || rows[1].Request != 2 || len(rows[1].Tokens) != 3 {
		t.Fatalf("rows = %+v, want the decode of 1 then 3 tokens of 2", rows)
	}
}

// FCFS: a head that does not fit blocks everyone behind it.
func TestFCFSAdmission(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxModelLen = 100; c.MaxBatchTokens = 64 })
	h.add(1, 40, 2) // 10 blocks
	h.step()
	h.add(2, 30, 2) // 8 blocks: does not fit in the 6 left
	h.add(3, 4, 2)  // 1 block: would fit, but waits its turn
	out := h.step()
	if len(out.Batches) != 0 {
		t.Fatalf("admitted past the head: %+v", out.Batches)
	}
	if st := h.s.Stats(); st.Waiting != 2 || st.Running != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

// runTo finishes request 1's prefill and returns its in-flight decode batch.
func decoding(h *harness, id RequestID) Batch {
	h.t.Helper()
	out := h.step()
	rows := rowsOf(out, id)
	if len(rows) != 1 || !rows[0].Sample {
		h.t.Fatalf("request %d: rows %+v", id, rows)
	}
	for _, b := range out.Batches {
		h.complete(b, 5)
	}
	out = h.step()
	for _, b := range out.Batches {
		for _, r := range b.Rows {
			if r.Request == id {
				return b
			}
		}
	}
	h.t.Fatalf("request %d not decoding", id)
	return Batch{}
}

func TestAbort(t *testing.T) {
	// Each case aborts request 1 in a different place and checks that it
	// ends once, with one tombstone for its live sequence (if any), freeing
	// its blocks.
	for _, tc := range []struct {
		name     string
		setup    func(h *harness)
		tomb     Reason // want for request 1's last sequence; 0: none
		reason   Reason // the abort's
		want     Reason // the request's ending
		ignored  bool   // a result arrives afterwards and is ignored
		noTokens bool
	}{
		{name: "waiting, never allocated", setup: func(h *harness) {}, reason: Aborted, want: Aborted},
		{name: "running, prefill in flight", setup: func(h *harness) { h.step() }, tomb: Aborted, reason: Aborted, want: Aborted, ignored: true},
		{name: "running, decode in flight, timeout", setup: func(h *harness) { decoding(h, 1) }, tomb: Timeout, reason: Timeout, want: Timeout, ignored: true},
		{name: "running, waiting for nothing, stop string", setup: func(h *harness) {
			out := h.step()
			h.complete(out.Batches[0], 5)
		}, tomb: Stop, reason: Stop, want: Stop},
		{name: "finishing in the same step: abort wins", setup: func(h *harness) {
			out := h.step()
			h.complete(out.Batches[0], 0) // stop token: ends now, reported at the next Step
		}, tomb: Aborted, reason: Aborted, want: Aborted},
		{name: "finishing in the same step: a stop string does not override", setup: func(h *harness) {
			out := h.step()
			h.complete(out.Batches[0], 0)
		}, tomb: Stop, reason: Stop, want: Stop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.add(1, 6, 4)
			tc.setup(h)
			var inflight []BatchID
			for _, b := range h.s.inflight {
				inflight = append(inflight, b.id)
			}
			h.abort(1, tc.reason)
			if h.used() != 0 || h.s.Stats().Running != 0 || h.s.Stats().Waiting != 0 {
				t.Fatalf("after abort: %+v", h.s.Stats())
			}
			for _, id := range inflight { // results for the dead sequence
				h.s.Complete(Result{Batch: id, Samples: []Sample{{Seq: h.s.nextSeq - 1, Token: 3}}}, h.now)
				h.check()
			}
			out := h.step()
			if h.ends[1] != tc.want {
				t.Fatalf("ended %v, want %v", h.ends[1], tc.want)
			}
			var want []Tombstone
			if tc.tomb != 0 {
				want = []Tombstone{{Seq: h.s.nextSeq - 1, Reason: tc.tomb}}
			}
			if diff := cmp.Diff(out.Tombstones, want); diff != "" {
				t.Fatalf("tombstones (-got +want):\n%s", diff)
			}
			if got := h.s.Stats().Ignored > 0; got != tc.ignored {
				t.Fatalf("ignored results %v, want %v", got, tc.ignored)
			}
			// Aborting again, or an unknown request, does nothing.
			h.abort(1, Aborted)
			h.abort(99, Aborted)
			if out := h.step(); !out.Empty() || h.s.Pending() {
				t.Fatalf("second abort produced %+v", out)
			}
			if err := h.s.Abort(1, Preempted); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Abort(Preempted) = %v", err)
			}
		})
	}
}

// preempting sets up two decoding requests in a pool too small for both to
// grow, and returns after request 2 (the younger) was preempted.
func preempting(t *testing.T) (*harness, Output) {
	h := newHarness(t, func(c *Config) { c.KV.Blocks = 4 }) // 16 positions
	h.add(1, 4, 12)                                         // 1 block, grows to 4
	h.add(2, 4, 12)
	out := h.step()
	if len(out.Batches[0].Rows) != 2 {
		t.Fatalf("rows %+v", out.Batches[0].Rows)
	}
	for range 8 {
		if h.s.Stats().Preemptions > 0 {
			break
		}
		for _, b := range out.Batches {
			h.complete(b, 5)
		}
		out = h.step()
	}
	if h.s.Stats().Preemptions != 1 {
		t.Fatalf("no preemption: %+v", h.s.Stats())
	}
	return h, out
}

func TestPreemption(t *testing.T) {
	h, out := preempting(t)
	if diff := cmp.Diff(out.Tombstones, []Tombstone{{Seq: 2, Reason: Preempted}}); diff != "" {
		t.Fatalf("tombstones (-got +want):\n%s", diff)
	}
	if rows := rowsOf(out, 2); len(rows) != 0 {
		t.Fatalf("preempted sequence still has rows: %+v", rows)
	}
	if st := h.s.Stats(); st.Waiting != 1 || st.Running != 1 {
		t.Fatalf("stats = %+v", st)
	}
	// Request 2's tokens are kept and recomputed by a new sequence once 1 ends.
	gen := len(h.toks[2])
	if gen == 0 {
		t.Fatal("request 2 generated nothing before preemption")
	}
	for range 20 {
		for _, b := range out.Batches {
			h.complete(b, 5)
		}
		out = h.step()
		if rows := rowsOf(out, 2); len(rows) > 0 {
			r := rows[0]
			if !r.First || r.Seq <= 2 || r.Pos != 0 || len(r.Tokens) != 4+gen || r.Tokens[4] != 5 {
				t.Fatalf("readmission row = %+v, want a new sequence recomputing 4 + %d tokens", r, gen)
			}
			if h.ends[1] != Length {
				t.Fatalf("request 2 readmitted before 1 ended")
			}
			return
		}
	}
	t.Fatal("request 2 never readmitted")
}

func TestAbortAfterPreemption(t *testing.T) {
	h, _ := preempting(t)
	h.abort(2, Aborted)
	out := h.step()
	if len(out.Tombstones) != 0 || h.ends[2] != Aborted {
		t.Fatalf("tombstones %v, end %v: the preempted sequence already had its tombstone", out.Tombstones, h.ends[2])
	}
	if st := h.s.Stats(); st.Waiting != 0 || st.Running != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestTimeouts(t *testing.T) {
	t.Run("queue timeout while waiting", func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.MaxModelLen = 100; c.ReclaimTimeout = time.Hour })
		h.add(1, 60, 4) // all 16 blocks
		h.step()
		h.add(2, 4, 4)
		h.now = h.now.Add(10 * time.Second)
		out := h.step()
		// Never allocated: no sequence, no tombstone.
		if h.ends[2] != Timeout || len(out.Tombstones) != 0 || h.s.Stats().Running != 1 {
			t.Fatalf("ends %v, tombstones %v", h.ends, out.Tombstones)
		}
	})
	t.Run("queue timeout is checked before admission", func(t *testing.T) {
		h := newHarness(t, nil)
		h.add(1, 4, 4)
		h.now = h.now.Add(10 * time.Second)
		out := h.step()
		if h.ends[1] != Timeout || len(out.Batches) != 0 || len(out.Tombstones) != 0 {
			t.Fatalf("end %v, out %+v", h.ends[1], out)
		}
	})
	t.Run("deadline while running", func(t *testing.T) {
		h := newHarness(t, nil)
		r := h.req(1, 4, 4)
		r.Deadline = h.now.Add(time.Second)
		if err := h.s.Add(r); err != nil {
			t.Fatal(err)
		}
		b := decoding(h, 1)
		h.now = h.now.Add(time.Second)
		out := h.step()
		if h.ends[1] != Timeout || h.tombs[1] != Timeout || h.used() != 0 {
			t.Fatalf("end %v, tombstones %v, used %d", h.ends[1], h.tombs, h.used())
		}
		h.complete(b, 3)
		if len(out.Batches) != 0 || len(h.toks[1]) != 1 {
			t.Fatalf("tokens after the deadline: %v", h.toks[1])
		}
	})
	t.Run("deadline when the result returns", func(t *testing.T) {
		h := newHarness(t, nil)
		h.add(1, 4, 4)
		out := h.step()
		h.now = h.now.Add(time.Minute)
		h.complete(out.Batches[0], 3)
		out = h.step()
		if h.ends[1] != Timeout || len(h.toks[1]) != 0 || h.tombs[1] != Timeout {
			t.Fatalf("end %v, tokens %v, tombstones %v", h.ends[1], h.toks[1], h.tombs)
		}
	})
}

func TestLostWork(t *testing.T) {
	t.Run("batch failed: requeued, then failed after MaxRetries", func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.MaxRetries = 1 })
		h.add(1, 4, 4)
		out := h.step()
		h.s.BatchFailed(Failure{Batch: out.Batches[0].ID, Reason: "hop 1"})
		h.check()
		out2 := h.step()
		if diff := cmp.Diff(out2.Tombstones, []Tombstone{{Seq: 1, Reason: Failed}}); diff != "" {
			t.Fatalf("tombstones (-got +want):\n%s", diff)
		}
		if rows := rowsOf(out2, 1); len(rows) != 1 || rows[0].Seq != 2 || !rows[0].First {
			t.Fatalf("requeued request's rows: %+v", rows)
		}
		h.complete(out.Batches[0], 4) // the failed batch's late result
		if h.s.Stats().Ignored != 1 {
			t.Fatalf("late result not ignored: %+v", h.s.Stats())
		}
		h.s.BatchFailed(Failure{Batch: out2.Batches[0].ID})
		h.check()
		h.step()
		if h.ends[1] != Failed || h.tombs[2] != Failed || h.used() != 0 {
			t.Fatalf("end %v, tombstones %v", h.ends[1], h.tombs)
		}
	})
	t.Run("rows dropped: only those sequences", func(t *testing.T) {
		h := newHarness(t, nil)
		h.add(1, 4, 4)
		h.add(2, 4, 4)
		out := h.step()
		h.s.BatchFailed(Failure{Batch: out.Batches[0].ID, Seqs: []SeqID{2}})
		h.check()
		h.complete(out.Batches[0], 7)
		out = h.step()
		if diff := cmp.Diff(out.Tombstones, []Tombstone{{Seq: 2, Reason: Failed}}); diff != "" {
			t.Fatalf("tombstones (-got +want):\n%s", diff)
		}
		if diff := cmp.Diff(h.toks[1], []int32{7}); diff != "" {
			t.Fatalf("request 1 lost its token: %s", diff)
		}
		if rows := rowsOf(out, 2); len(rows) != 1 || rows[0].Seq != 3 {
			t.Fatalf("request 2 not readmitted: %+v", rows)
		}
	})
	t.Run("lost completion reclaimed", func(t *testing.T) {
		h := newHarness(t, nil)
		h.add(1, 4, 4)
		out := h.step()
		h.now = h.now.Add(4 * time.Second)
		if out := h.step(); len(out.Tombstones) != 0 {
			t.Fatalf("reclaimed early: %+v", out)
		}
		h.now = h.now.Add(time.Second)
		out2 := h.step()
		if diff := cmp.Diff(out2.Tombstones, []Tombstone{{Seq: 1, Reason: Failed}}); diff != "" {
			t.Fatalf("tombstones (-got +want):\n%s", diff)
		}
		if h.s.Stats().Reclaimed != 1 || len(rowsOf(out2, 1)) != 1 {
			t.Fatalf("not reclaimed and requeued: %+v", h.s.Stats())
		}
		h.complete(out.Batches[0], 3) // arrives after all
		if h.s.Stats().Ignored != 1 || len(h.toks[1]) != 0 {
			t.Fatalf("late result applied: %+v", h.s.Stats())
		}
	})
	t.Run("sample missing from the result", func(t *testing.T) {
		h := newHarness(t, nil)
		h.add(1, 4, 4)
		out := h.step()
		h.s.Complete(Result{Batch: out.Batches[0].ID}, h.now)
		h.check()
		out = h.step()
		if len(out.Tombstones) != 1 || out.Tombstones[0].Reason != Failed || len(rowsOf(out, 1)) != 1 {
			t.Fatalf("out = %+v", out)
		}
	})
}

func TestPrefixCacheHit(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.KV.PrefixCaching = true })
	h.add(1, 10, 2)
	out := h.step()
	h.complete(out.Batches[0], 5)
	req := h.req(1, 10, 2) // request 1's prompt
	req.ID = 3
	if err := h.s.Add(req); err != nil {
		t.Fatal(err)
	}
	out = h.step()
	rows := rowsOf(out, 3)
	if len(rows) != 1 || !rows[0].First || rows[0].Pos != 8 || len(rows[0].Tokens) != 2 {
		t.Fatalf("rows = %+v, want a first row at position 8", rows)
	}
	if st := h.s.Stats().KV; st.PrefixHit != 8 {
		t.Fatalf("kv stats = %+v", st)
	}
}

// The caller owns what Step returns: later calls never change it.
func TestOutputOwned(t *testing.T) {
	h := newHarness(t, nil)
	h.add(1, 6, 4)
	out := h.step()
	keep := out.Batches[0].Rows[0]
	tokens, blocks := append([]int32{}, keep.Tokens...), append([]kv.BlockID{}, keep.Blocks...)
	h.complete(out.Batches[0], 5)
	out2 := h.step()
	out2.Batches[0].Rows[0].Tokens[0] = -1
	_ = append(out.Batches[0].Rows[0].Blocks, 99)
	h.complete(out2.Batches[0], 5)
	h.step()
	if !cmp.Equal(keep.Tokens, tokens) || !cmp.Equal(keep.Blocks, blocks) {
		t.Fatalf("returned row changed: %+v", keep)
	}
}

// StepInto reusing one Output returns what Step returns, and clears the
// entries of its reused arrays that a smaller Output no longer uses. Two
// schedulers get the same events, with load rising and falling so that the
// Outputs grow and shrink, with prefix hits, preemptions and aborts.
func TestStepIntoMatchesStep(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	mod := func(c *Config) {
		c.KV = kv.Config{Blocks: 24, BlockSize: 4, PrefixCaching: true}
		c.MaxBatchTokens = 24
		c.MaxBatchRows = 6
		c.Stages = 2
		c.MaxWaiting = 64
		c.MaxWaitingTokens = 4096
	}
	a, b := newHarness(t, mod), newHarness(t, mod)
	var out Output // reused by b
	next := RequestID(1)
	for step := range 600 {
		burst := step%200 < 100 // load rises, then falls away
		for range rng.IntN(4) {
			if !burst {
				break
			}
			req := a.req(next, 1+rng.IntN(12), 1+rng.IntN(10))
			if rng.IntN(2) == 0 {
				copy(req.Prompt, []int32{1, 2, 3, 4, 5, 6, 7, 8}) // a shared prefix
			}
			errA, errB := a.s.Add(req), b.s.Add(req)
			if (errA == nil) != (errB == nil) {
				t.Fatalf("step %d: Add = %v and %v", step, errA, errB)
			}
			next++
		}
		if rng.IntN(10) == 0 && next > 1 {
			id := RequestID(1 + rng.IntN(int(next-1)))
			a.abort(id, Aborted)
			b.abort(id, Aborted)
		}
		a.now = a.now.Add(time.Millisecond)
		b.now = a.now
		want := a.step()
		b.s.StepInto(b.now, &out)
		b.check()
		if diff := cmp.Diff(out, want, cmpopts.IgnoreUnexported(Output{}), cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("step %d: (-StepInto +Step):\n%s", step, diff)
		}
		for i, r := range out.rows[len(out.rows):cap(out.rows)] {
			if r.Tokens != nil || r.Blocks != nil {
				t.Fatalf("step %d: unused row %d still holds %+v", step, len(out.rows)+i, r)
			}
		}
		for i, u := range out.Updates[len(out.Updates):cap(out.Updates)] {
			if u.Tokens != nil {
				t.Fatalf("step %d: unused update %d still holds %+v", step, len(out.Updates)+i, u)
			}
		}
		for _, bt := range want.Batches {
			tok := int32(1 + rng.IntN(30))
			if rng.IntN(8) == 0 {
				tok = 0 // the stop token
			}
			a.complete(bt, tok)
			b.complete(bt, tok)
		}
	}
	if st := a.s.Stats(); st.Preemptions == 0 || st.KV.PrefixHit == 0 || st.Ended < 100 {
		t.Fatalf("the test does not exercise enough: %+v", st)
	}
}

// TestInFlightRow: the scheduler's record of an in-flight batch answers
// which request a row is for and where its sampled token goes in the
// request's output (the engine keeps no record of its own); a batch that
// completed, or a sequence the batch does not carry, is not found.
func TestInFlightRow(t *testing.T) {
	h := newHarness(t, nil)
	h.add(1, 6, 3)
	h.add(2, 4, 3)
	out := h.step()
	b := out.Batches[0]
	for _, r := range b.Rows {
		req, idx, ok := h.s.InFlightRow(b.ID, r.Seq)
		if !ok || req != r.Request || idx != 0 {
			t.Fatalf("prefill row of seq %d: request %d, output index %d, %v; want request %d, index 0", r.Seq, req, idx, ok, r.Request)
		}
	}
	if _, _, ok := h.s.InFlightRow(b.ID, 99); ok {
		t.Fatal("found a row for a sequence the batch does not carry")
	}
	h.complete(b, 7)
	if _, _, ok := h.s.InFlightRow(b.ID, b.Rows[0].Seq); ok {
		t.Fatal("found a row of a batch that completed")
	}
	out = h.step()
	d := out.Batches[0]
	for _, r := range d.Rows {
		if _, idx, ok := h.s.InFlightRow(d.ID, r.Seq); !ok || idx != 1 {
			t.Fatalf("decode row of seq %d: output index %d, %v; want 1 (the second token)", r.Seq, idx, ok)
		}
	}
}

// TestInFlightBatch: the record a shell admits answers against lists the
// rows each in-flight batch carries (sequence, tokens, whether it samples)
// and nothing once the batch retired; InFlightTokens sums them;
// RunningSeqs names the live sequences and drops an ended one at once;
// FailInFlight fails every batch in flight, each as BatchFailed would.
func TestInFlightBatch(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Stages = 1; c.MaxBatchTokens = 8 })
	h.add(1, 6, 3)
	h.add(2, 5, 3)
	out := h.step() // batch 1: request 1's prompt and 2 of request 2's
	if len(out.Batches) != 2 {
		t.Fatalf("%d batches, want 2 (P+1 in flight)", len(out.Batches))
	}
	want := map[BatchID][]BatchRow{}
	total := 0
	for _, b := range out.Batches {
		for _, r := range b.Rows {
			want[b.ID] = append(want[b.ID], BatchRow{Seq: r.Seq, Tokens: len(r.Tokens), Sample: r.Sample})
			total += len(r.Tokens)
		}
	}
	for id, rows := range want {
		got, ok := h.s.InFlightBatch(id, nil)
		if !ok || !slices.Equal(got, rows) {
			t.Fatalf("batch %d: rows %+v, %v; want %+v", id, got, ok, rows)
		}
	}
	if got := h.s.InFlightTokens(); got != total || total != 11 {
		t.Fatalf("tokens in flight %d, want %d (both prompts)", got, total)
	}
	if got := h.s.RunningSeqs(nil); len(got) != 2 {
		t.Fatalf("running %v, want both sequences", got)
	}
	b1 := out.Batches[0]
	h.complete(b1, 7)
	if rows, ok := h.s.InFlightBatch(b1.ID, nil); ok {
		t.Fatalf("a completed batch is still in flight: %+v", rows)
	}
	left := 0
	for _, r := range want[out.Batches[1].ID] {
		left += r.Tokens
	}
	if got := h.s.InFlightTokens(); got != left {
		t.Fatalf("tokens in flight %d after batch %d's result, want the other batch's %d", got, b1.ID, left)
	}
	h.abort(1, Aborted)
	if got := h.s.RunningSeqs(nil); slices.Contains(got, b1.Rows[0].Seq) {
		t.Fatalf("running %v still names the aborted request's sequence", got)
	}
	if n := h.s.FailInFlight("pipeline lost"); n != 1 {
		t.Fatalf("FailInFlight failed %d batches, want 1", n)
	}
	h.check()
	if st := h.s.Stats(); st.InFlight != 0 || st.Retries != 1 {
		t.Fatalf("after FailInFlight: %+v, want nothing in flight and request 2 requeued once", st)
	}
	if got := h.s.InFlightTokens(); got != 0 {
		t.Fatalf("tokens in flight %d with no batch in flight", got)
	}
}

// TestSlidingGroupsRelease: with three KV groups (one global table, two
// sliding) and a window of 6 positions, a long generation keeps every
// position in its global table and at most the window's blocks in each
// sliding table: each row slides from the block of the first position it
// reads, carries both sliding tables from there, and the pool's used
// blocks stay bounded however long the sequence runs; its end frees all.
func TestSlidingGroupsRelease(t *testing.T) {
	const window, bs, groups = 6, 4, 3
	h := newHarness(t, func(c *Config) {
		c.KV = kv.Config{Blocks: 64, BlockSize: bs, Groups: groups}
		c.KV.Window = window
	})
	h.add(1, 9, 40)
	maxUsed, rows := 0, 0
	for i := 0; i < 200 && h.ends[1] == 0; i++ {
		out := h.step()
		for _, r := range rowsOf(out, 1) {
			rows++
			lo := max(0, r.Pos-window+1)
			w := len(r.Blocks) - r.SlideFrom
			if r.SlideFrom != lo/bs || len(r.Slides) != (groups-1)*w || len(r.Blocks) != (r.Pos+len(r.Tokens)+bs-1)/bs {
				t.Fatalf("row at %d with %d tokens: %d blocks, slides from %d with %d entries; want from %d, %d entries", r.Pos, len(r.Tokens), len(r.Blocks), r.SlideFrom, len(r.Slides), lo/bs, (groups-1)*w)
			}
			seen := map[kv.BlockID]bool{}
			for _, id := range append(slices.Clone(r.Blocks), r.Slides...) {
				if seen[id] {
					t.Fatalf("row at %d names block %d twice", r.Pos, id)
				}
				seen[id] = true
			}
		}
		maxUsed = max(maxUsed, h.used())
		for _, b := range out.Batches {
			h.complete(b, 7)
		}
	}
	if h.ends[1] != Length || rows < 40 {
		t.Fatalf("request ended %v after %d rows", h.ends[1], rows)
	}
	// 49 positions: 13 global blocks; a sliding table holds the window's
	// blocks and the one being written, at most 3.
	if maxUsed > 13+(groups-1)*3 {
		t.Fatalf("%d blocks used at most, want at most %d", maxUsed, 13+(groups-1)*3)
	}
	h.step()
	if h.used() != 0 {
		t.Fatalf("%d blocks used after the end", h.used())
	}
}

// TestSlidingPrefixCacheHit: a chat's next turn with KV groups and prefix
// caching. The first turn's sequence ends holding, in each sliding table,
// the window of its last row; the next turn, whose prompt is the first
// turn's tokens and more, hits every committed block: its first row starts
// past them, shares the first turn's global blocks and the sliding blocks
// of the window its first position reads, and slides from that window.
func TestSlidingPrefixCacheHit(t *testing.T) {
	const window, bs, groups = 6, 4, 3
	h := newHarness(t, func(c *Config) {
		c.KV = kv.Config{Blocks: 64, BlockSize: bs, Groups: groups, Window: window, PrefixCaching: true}
	})
	first := h.req(1, 9, 20)
	if err := h.s.Add(first); err != nil {
		t.Fatal(err)
	}
	tokens := slices.Clone(first.Prompt)
	var last Row
	for i := 0; i < 100 && h.ends[1] == 0; i++ {
		out := h.step()
		for _, r := range rowsOf(out, 1) {
			last = r
			last.Blocks, last.Slides = slices.Clone(r.Blocks), slices.Clone(r.Slides)
		}
		for _, b := range out.Batches {
			h.complete(b, 7)
			tokens = append(tokens, 7)
		}
	}
	// 29 tokens, 28 computed: the last row, at 27, reads from 22 on.
	if h.ends[1] != Length || len(tokens) != 29 || last.Pos != 27 || last.SlideFrom != 5 {
		t.Fatalf("first turn: ended %v with %d tokens, last row at %d sliding from %d", h.ends[1], len(tokens), last.Pos, last.SlideFrom)
	}
	h.step()
	next := Request{ID: 2, Prompt: append(slices.Clone(tokens), 11, 12, 13), MaxTokens: 2, Stop: []int32{0}, Arrival: h.now}
	if err := h.s.Add(next); err != nil {
		t.Fatal(err)
	}
	rows := rowsOf(h.step(), 2)
	// 7 blocks hit; position 28 reads from 23 on: block 5.
	if len(rows) != 1 || !rows[0].First || rows[0].Pos != 28 || rows[0].SlideFrom != 5 {
		t.Fatalf("next turn's rows %+v, want a first row at 28 sliding from 5", rows)
	}
	r := rows[0]
	if !slices.Equal(r.Blocks[:7], last.Blocks[:7]) {
		t.Fatalf("next turn's global blocks %v, want the first turn's %v", r.Blocks, last.Blocks)
	}
	w, lw := len(r.Blocks)-5, len(last.Blocks)-5
	for g := range groups - 1 {
		if got, want := r.Slides[g*w:g*w+2], last.Slides[g*lw:g*lw+2]; !slices.Equal(got, want) {
			t.Fatalf("sliding table %d starts %v, want the first turn's window %v", g+1, got, want)
		}
	}
	if st := h.s.Stats().KV; st.PrefixHit != 28 {
		t.Fatalf("kv stats %+v, want 28 positions hit", st)
	}
}

// TestSlidingGroupsLongPrompt: with KV groups a prompt is allocated chunk
// by chunk, and its sliding tables release as the chunks go, so a 200-token
// prompt never holds Groups times its blocks.
func TestSlidingGroupsLongPrompt(t *testing.T) {
	const window, bs, groups = 6, 4, 3
	h := newHarness(t, func(c *Config) {
		c.KV = kv.Config{Blocks: 256, BlockSize: bs, Groups: groups}
		c.KV.Window, c.MaxModelLen, c.MaxWaitingTokens = window, 400, 400
	})
	h.add(1, 200, 4)
	maxUsed := 0
	for i := 0; i < 100 && h.ends[1] == 0; i++ {
		out := h.step()
		maxUsed = max(maxUsed, h.used())
		for _, b := range out.Batches {
			h.complete(b, 7)
		}
	}
	if h.ends[1] != Length {
		t.Fatalf("request ended %v", h.ends[1])
	}
	// 203 positions: 51 global blocks. A sliding table holds the window,
	// the last chunk and the one being built: 16 positions a chunk, so at
	// most (6+2*16)/4+2 = 12 blocks; all three tables whole would be 153.
	if maxUsed > 51+(groups-1)*12 {
		t.Fatalf("%d blocks used at most, want at most %d", maxUsed, 51+(groups-1)*12)
	}
}

// TestSlidingGroupsPreemptionEnds: two long generations that do not fit
// side by side in a pool with KV groups: one is preempted and recomputed
// (a long prompt then, allocated chunk by chunk again), and both end by
// length in a bounded number of steps: nothing wedges. A request that can
// never fit is refused at once, by a bound that counts the sliding tables.
func TestSlidingGroupsPreemptionEnds(t *testing.T) {
	const window, bs, groups = 6, 4, 3
	h := newHarness(t, func(c *Config) {
		c.KV = kv.Config{Blocks: 60, BlockSize: bs, Groups: groups}
		c.KV.Window, c.MaxModelLen, c.MaxWaitingTokens = window, 400, 400
	})
	// slide = ceil((6 + (2+1)*16)/4) + 1 = 15 blocks; 60 - 2*15 = 30
	// blocks alone: 120 positions.
	if err := h.s.Add(h.req(9, 20, 102)); !errors.Is(err, ErrNeverFits) {
		t.Fatalf("20 + 102 - 1 positions in a pool of 120 for one sequence: %v, want ErrNeverFits", err)
	}
	h.add(1, 20, 90)
	h.add(2, 20, 90)
	for i := 0; i < 2000 && (h.ends[1] == 0 || h.ends[2] == 0); i++ {
		h.now = h.now.Add(time.Millisecond)
		out := h.step()
		for _, b := range out.Batches {
			h.complete(b, 7)
		}
	}
	if h.ends[1] != Length || h.ends[2] != Length {
		t.Fatalf("requests ended %v and %v after 2000 steps", h.ends[1], h.ends[2])
	}
	if h.s.Stats().Preemptions == 0 {
		t.Fatal("nothing was preempted: the pool did not run short")
	}
	h.step()
	if h.used() != 0 {
		t.Fatalf("%d blocks used after the end", h.used())
	}
}

// TestSlidingGroupsNoThrash: four long generations in a pool with KV
// groups where two fit at a time. A preempted sequence is recomputed as a
// long prompt; admitting it with a first chunk's blocks while the pool
// cannot hold the rest would preempt it again at its next chunk, over and
// over. Admission waits until the whole prompt fits, as it does with one
// table, so the preemptions stay few and all four end.
func TestSlidingGroupsNoThrash(t *testing.T) {
	const window, bs, groups = 40, 4, 3
	h := newHarness(t, func(c *Config) {
		c.KV = kv.Config{Blocks: 150, BlockSize: bs, Groups: groups}
		c.KV.Window, c.MaxModelLen, c.MaxWaitingTokens = window, 400, 400
	})
	// One sequence at 200 positions: 50 global blocks and two sliding
	// tables of about 12: 74. Two fit in 150, three do not.
	for id := RequestID(1); id <= 4; id++ {
		h.add(id, 3, 196)
	}
	steps := 0
	for ; steps < 5000 && len(h.ends) < 4; steps++ {
		h.now = h.now.Add(time.Millisecond)
		out := h.step()
		for _, b := range out.Batches {
			h.complete(b, 7)
		}
	}
	for id := RequestID(1); id <= 4; id++ {
		if h.ends[id] != Length {
			t.Fatalf("after %d steps request %d ended %v (%d preemptions)", steps, id, h.ends[id], h.s.Stats().Preemptions)
		}
	}
	if p := h.s.Stats().Preemptions; p > 8 {
		t.Fatalf("%d preemptions in %d steps: admitted sequences keep preempting each other", p, steps)
	}
	t.Logf("%d steps, %d preemptions", steps, h.s.Stats().Preemptions)
}
