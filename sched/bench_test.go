package sched

import (
	"testing"
	"time"

	"github.com/strata-llm/strata/kv"
)

// busy builds a scheduler with about 1,000 running and 1,000 waiting
// requests in steady state: requests of 16 prompt tokens and 8 to 32 new
// tokens, a pool of 3,000 blocks (16 positions each) that holds 1,000 of
// them at their longest, and new arrivals replacing every request that ends.
type busy struct {
	s    *Scheduler
	out  Output // handed back to StepInto every turn, as a coordinator loop would
	now  time.Time
	next RequestID
}

func newBusy(b *testing.B) *busy {
	cfg := DefaultConfig()
	cfg.KV = kv.Config{Blocks: 3000, BlockSize: 16}
	cfg.Stages = 4 // 5 batches in flight: every running sequence can decode each Step
	cfg.MaxBatchTokens = 512
	cfg.MaxBatchRows = 256
	cfg.MaxWaiting = 2000
	cfg.QueueTimeout = 0
	cfg.RequestTimeout = 0
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	u := &busy{s: s, now: t0, next: 1}
	for range 2000 {
		u.add()
	}
	for range 2000 { // warm up until the pool is full and the queue long
		u.turn()
	}
	st := s.Stats()
	if st.Running < 900 || st.Waiting < 900 {
		b.Fatalf("not busy: %+v", st)
	}
	return u
}

func (u *busy) add() {
	prompt := make([]int32, 16)
	for i := range prompt {
		prompt[i] = int32(u.next)*31 + int32(i)
	}
	if err := u.s.Add(Request{ID: u.next, Prompt: prompt, MaxTokens: 8 + int(u.next%25), Stop: []int32{0}, Arrival: u.now}); err != nil {
		panic(err)
	}
	u.next++
}

// turn is one loop iteration: Step, then every batch's result, then an
// arrival for every request that ended. It returns how long Step took
// (time.Now here is the benchmark's clock, not the scheduler's).
func (u *busy) turn() time.Duration {
	u.now = u.now.Add(time.Millisecond)
	start := time.Now()
	u.s.StepInto(u.now, &u.out)
	d := time.Since(start)
	out := &u.out
	for _, bt := range out.Batches {
		res := Result{Batch: bt.ID, Samples: make([]Sample, 0, len(bt.Rows))}
		for _, r := range bt.Rows {
			if r.Sample {
				res.Samples = append(res.Samples, Sample{Seq: r.Seq, Token: 5})
			}
		}
		u.s.Complete(res, u.now)
	}
	for _, up := range out.Updates {
		if up.Done {
			u.add()
		}
	}
	return d
}

// BenchmarkStep runs loop turns with ~1,000 running and ~1,000 waiting
// requests (P = 4: up to five batches of 256 rows per Step) and reports the
// time spent in Step alone as ns/step; ns/op is the whole turn (Step,
// Complete for each batch, and the arrivals replacing ended requests).
// Stopping the benchmark timer around the rest would stop the world on every
// iteration, so Step is timed directly.
func BenchmarkStep(b *testing.B) {
	u := newBusy(b)
	var inStep time.Duration
	b.ReportAllocs()
	for b.Loop() {
		inStep += u.turn()
	}
	st := u.s.Stats()
	b.ReportMetric(float64(inStep.Nanoseconds())/float64(b.N), "ns/step")
	b.ReportMetric(float64(st.Running), "running")
	b.ReportMetric(float64(st.Waiting), "waiting")
}
