package shard

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// exitSeqs are the sequences TestShardSeqExitFreesEverything creates.
var exitSeqs = []uint64{1, 2, 3}

// createWithState creates exitSeqs on r (first and last stage) at epoch 100
// and now, each with sampling settings and a logprob wish, so that the
// runner keeps a sampler state beside each block table.
func createWithState(t *testing.T, r *Runner, now time.Time) {
	t.Helper()
	r.SetEpoch(100)
	b := &Batch{Epoch: 100, ID: 1}
	p := sample.DefaultParams()
	for _, s := range exitSeqs {
		b.Rows = append(b.Rows, Row{Seq: s, First: true, Tokens: []int32{1, int32(s)}, Blocks: []int32{int32(s)}, Sample: true, Params: &p, Logprobs: true})
	}
	res, err := r.Process(b, now)
	if err != nil || len(res.Dropped) != 0 {
		t.Fatalf("create %v: %v, dropped %v", exitSeqs, err, res.Dropped)
	}
	for _, s := range res.Samples {
		if !s.Logprobs {
			t.Fatalf("sequence %d asked for logprobs; its sample does not say so", s.Seq)
		}
	}
	if st := r.Stats(false); st.Sequences != len(exitSeqs) || st.States != len(exitSeqs) {
		t.Fatalf("after the creates: %d sequences, %d sampler states, want %d of each", st.Sequences, st.States, len(exitSeqs))
	}
}

// decodeRows are a decode row for each of exitSeqs, with token tok.
func decodeRows(tok int32) []Row {
	var rows []Row
	for _, s := range exitSeqs {
		rows = append(rows, Row{Seq: s, Pos: 2, Tokens: []int32{tok}, Blocks: []int32{int32(s)}, Sample: true})
	}
	return rows
}

// TestShardSeqExitFreesEverything ends a last stage's sequences by every
// way a sequence can end on a shard and checks that each frees everything
// the shard keeps for it through the one exit: the block table, the
// sampler state (params, history, logprob wish) and the count of that
// reason, with the replica consistent after.
func TestShardSeqExitFreesEverything(t *testing.T) {
	m := randomModel(t)
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name   string
		reason Reason
		end    func(t *testing.T, r *Runner)
	}{
		{"tombstones in a batch", Finished, func(t *testing.T, r *Runner) {
			b := &Batch{Epoch: 100}
			for _, s := range exitSeqs {
				b.Tombstones = append(b.Tombstones, Tombstone{Epoch: 100, Seq: s, Reason: Finished})
			}
			if _, err := r.Process(b, t0); err != nil {
				t.Fatal(err)
			}
		}},
		{"backstop tombstones", Aborted, func(t *testing.T, r *Runner) {
			for _, s := range exitSeqs {
				r.Tombstone(Tombstone{Epoch: 100, Seq: s, Reason: Aborted})
			}
		}},
		{"lease", Lease, func(t *testing.T, r *Runner) {
			if n := r.Expire(t0.Add(2*time.Second), time.Second); n != len(exitSeqs) {
				t.Fatalf("Expire freed %d, want %d", n, len(exitSeqs))
			}
		}},
		{"epoch", Epoch, func(t *testing.T, r *Runner) {
			if !r.SetEpoch(101) {
				t.Fatal("a newer epoch refused")
			}
		}},
		{"reconcile", Reconcile, func(t *testing.T, r *Runner) {
			r.Renew(exitSeqs, t0)
		}},
		{"placement ends", Epoch, func(t *testing.T, r *Runner) {
			r.Close()
			if _, err := r.Process(&Batch{Epoch: 100, ID: 2, Rows: decodeRows(5)}, t0); !errors.Is(err, ErrClosed) {
				t.Fatalf("a batch after Close: %v, want ErrClosed", err)
			}
		}},
		{"token outside the vocabulary", Failed, func(t *testing.T, r *Runner) {
			res, err := r.Process(&Batch{Epoch: 100, ID: 2, Rows: decodeRows(int32(m.Vocab))}, t0)
			if err != nil || len(res.Dropped) != len(exitSeqs) {
				t.Fatalf("%v, dropped %v", err, res)
			}
		}},
		{"forward pass fails", Failed, func(t *testing.T, r *Runner) {
			r.forward = func([]model.Row, []float32) ([]float32, error) { return nil, model.ErrBadBatch }
			if _, err := r.Process(&Batch{Epoch: 100, ID: 2, Rows: decodeRows(5)}, t0); err == nil {
				t.Fatal("a failed forward pass returned no error")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := randomPipe(t, m)[0]
			createWithState(t, r, t0)
			tc.end(t, r)
			st := r.Stats(true)
			if st.Sequences != 0 || st.States != 0 || st.BlocksUsed != 0 || len(st.Live) != 0 {
				t.Errorf("left %d sequences (%v), %d sampler states, %d blocks", st.Sequences, st.Live, st.States, st.BlocksUsed)
			}
			if got := st.Freed[tc.reason]; got != uint64(len(exitSeqs)) {
				t.Errorf("freed %d for reason %v, want %d", got, tc.reason, len(exitSeqs))
			}
			if st.Invariant != nil {
				t.Error(st.Invariant)
			}
		})
	}
}

// within runs f and fails t unless it returns within a generous bound: a
// watchdog for a call that must not wait for a blocked forward pass.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { // waited for below, or the test fails and the process ends
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second): // a watchdog, not a wait
		t.Fatalf("%s waited for the forward pass", what)
	}
}

// TestShardComputeOutsideNodeLock holds a batch's forward pass inside the
// model and, meanwhile, takes a heartbeat, a metrics scrape, a heartbeat
// reply that reconciles one of the batch's sequences away and a lease
// check: none waits for the forward pass. Once the pass ends, the ended
// sequence gets no sample and keeps no state; the other gets its token.
func TestShardComputeOutsideNodeLock(t *testing.T) {
	m := randomModel(t)
	r := randomPipe(t, m)[0]
	n := fuzzNode(t, m, r, true, true)
	createSeqs(t, n, 100, time.Now(), 1, 2)
	entered, release := make(chan struct{}), make(chan struct{})
	fwd := r.forward
	r.forward = func(rows []model.Row, hidden []float32) ([]float32, error) {
		close(entered)
		<-release
		return fwd(rows, hidden)
	}
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	h := &pb.BatchHeader{Epoch: 100, PlacementVersion: 1, BatchId: 2, Rows: []*pb.Row{
		{Seq: 1, Pos: 2, Tokens: []int32{7}, Blocks: []int32{1}, Sample: true},
		{Seq: 2, Pos: 2, Tokens: []int32{7}, Blocks: []int32{2}, Sample: true},
	}}
	type outcome struct {
		out *processed
		err error
	}
	done := make(chan outcome, 1)
	go func() { // waited for below
		out, err := n.process(&transport.Batch{Header: h}, time.Now())
		done <- outcome{out, err}
	}()
	select {
	case <-entered:
	case o := <-done:
		t.Fatalf("the batch ended without computing: %v", o.err)
	}

	within(t, "a heartbeat", func() {
		if hb := n.heartbeat(100); !slices.Equal(hb.GetLiveSeqs(), []uint64{1, 2}) {
			t.Errorf("heartbeat lists %v, want [1 2]", hb.GetLiveSeqs())
		}
	})
	within(t, "a metrics scrape", func() {
		reg := prometheus.NewRegistry()
		reg.MustRegister(n.collector)
		if _, err := reg.Gather(); err != nil {
			t.Error(err)
		}
	})
	within(t, "a heartbeat reply", func() {
		reply := &pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_HeartbeatReply{HeartbeatReply: &pb.HeartbeatReply{Epoch: 100, UnknownSeqs: []uint64{2}}}}
		if _, err := n.handleControl(t.Context(), reply, 100); err != nil {
			t.Error(err)
		}
	})
	within(t, "a lease check", func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.p.runner.Expire(time.Now(), time.Hour)
	})
	if st := r.Stats(true); !slices.Equal(st.Live, []uint64{1}) || st.States != 1 {
		t.Fatalf("while computing, after the reply: live %v, %d sampler states, want [1] and 1", st.Live, st.States)
	}

	close(release)
	released = true
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	res := o.out.msg.result
	if len(res.GetSamples()) != 1 || res.GetSamples()[0].GetSeq() != 1 {
		t.Fatalf("samples %v, want one for sequence 1", res.GetSamples())
	}
	st := r.Stats(true)
	if !slices.Equal(st.Live, []uint64{1}) || st.States != 1 || st.Freed[Reconcile] != 1 || st.Invariant != nil {
		t.Fatalf("after the batch: live %v, %d sampler states, %d reconciled, invariant %v", st.Live, st.States, st.Freed[Reconcile], st.Invariant)
	}
}
