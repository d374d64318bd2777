package shard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-llm/strata/transport"
)

// Stats is a snapshot of one stage's KV replica and counters.
type Stats struct {
	Stage       int
	FirstLayer  int
	LastLayer   int // exclusive
	BlocksUsed  int
	BlocksTotal int
	Sequences   int
	Freed       map[string]uint64 // by reason
	Refused     map[string]uint64 // rows dropped, by code
	Batches     uint64
	Busy        time.Duration // time spent computing
}

// Stats returns a snapshot of the runner's table.
func (r *Runner) Stats() Stats {
	t := r.table
	st := Stats{BlocksUsed: t.BlocksUsed(), BlocksTotal: t.pool, Sequences: t.Sequences(), Freed: map[string]uint64{}, Refused: map[string]uint64{}}
	for _, reason := range Reasons() {
		st.Freed[reason.String()] = t.Freed(reason)
	}
	for code, n := range t.refused {
		st.Refused[code] = n
	}
	return st
}

// ErrQueueFull is returned by Local.Dispatch when the first stage's queue is
// full; the coordinator fails the batch.
var ErrQueueFull = errors.New("shard: first stage queue full")

// localQueue bounds each stage's inbox: the scheduler keeps at most P+1
// batches in flight, so 64 is never reached by batches with rows; a full
// inbox refuses the batch (the coordinator fails it).
const localQueue = 64

// Local runs a pipeline's stages in this process, one goroutine per stage,
// passing batches over channels. It implements the coordinator's Pipeline.
// Tombstone-only batches never wait for room: they join a pending list that
// the first stage applies ahead of its next batch.
type Local struct {
	runners []*Runner
	ranges  [][2]int
	blocks  int
	bs      int
	in      []chan *localBatch
	results chan *transport.BatchResult
	stats   []atomic.Pointer[Stats]

	mu      sync.Mutex // serialises Dispatch with the first stage's pending check
	pending []transport.Tombstone
}

type localBatch struct {
	b       *transport.MicroBatch
	dropped []transport.Dropped
}

// NewLocal chains runners (stage 0 first); blocks and bs describe the KV pool
// every stage holds.
func NewLocal(runners []*Runner, blocks, bs int) *Local {
	l := &Local{runners: runners, blocks: blocks, bs: bs, results: make(chan *transport.BatchResult, localQueue)}
	l.stats = make([]atomic.Pointer[Stats], len(runners))
	for i, r := range runners {
		l.in = append(l.in, make(chan *localBatch, localQueue))
		first, last := r.stage.Range()
		l.ranges = append(l.ranges, [2]int{first, last})
		l.publish(i)
	}
	return l
}

// Stages implements the Pipeline.
func (l *Local) Stages() int { return len(l.runners) }

// Blocks implements the Pipeline.
func (l *Local) Blocks() int { return l.blocks }

// BlockSize implements the Pipeline.
func (l *Local) BlockSize() int { return l.bs }

// Results implements the Pipeline.
func (l *Local) Results() <-chan *transport.BatchResult { return l.results }

// Dispatch implements the Pipeline without blocking. Batches keep their
// order: a tombstone-only batch that finds the first stage's inbox full waits
// in a pending list, which rides in the header of the next batch dispatched,
// or is applied by the first stage once its inbox is empty.
func (l *Local) Dispatch(b *transport.MicroBatch) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pending) > 0 {
		b.Tombstones = append(l.pending, b.Tombstones...)
		l.pending = nil
	}
	select {
	case l.in[0] <- &localBatch{b: b}:
		return nil
	default:
	}
	if b.ID == 0 && len(b.Rows) == 0 {
		l.pending = b.Tombstones
		return nil
	}
	l.pending = b.Tombstones // the batch fails, its tombstones must not
	return ErrQueueFull
}

// StageStats returns the latest snapshot of every stage.
func (l *Local) StageStats() []Stats {
	out := make([]Stats, len(l.stats))
	for i := range l.stats {
		out[i] = *l.stats[i].Load()
	}
	return out
}

func (l *Local) publish(i int) {
	st := l.runners[i].Stats()
	st.Stage = i
	st.FirstLayer, st.LastLayer = l.ranges[i][0], l.ranges[i][1]
	if old := l.stats[i].Load(); old != nil {
		st.Batches, st.Busy = old.Batches, old.Busy
	}
	l.stats[i].Store(&st)
}

// Run runs the stages until ctx ends.
func (l *Local) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for i := range l.runners {
		wg.Go(func() { l.stage(ctx, i) })
	}
	wg.Wait()
	return nil
}

func (l *Local) stage(ctx context.Context, i int) {
	for {
		select {
		case <-ctx.Done():
			return
		case lb := <-l.in[i]:
			if !l.process(ctx, i, lb) {
				return
			}
		}
		if i == 0 && !l.flushPending(ctx) {
			return
		}
	}
}

// flushPending applies tombstones left pending by a full inbox once the
// first stage has nothing queued ahead of them.
func (l *Local) flushPending(ctx context.Context) bool {
	l.mu.Lock()
	if len(l.in[0]) > 0 || len(l.pending) == 0 {
		l.mu.Unlock()
		return true
	}
	p := l.pending
	l.pending = nil
	l.mu.Unlock()
	return l.process(ctx, 0, &localBatch{b: &transport.MicroBatch{Epoch: p[len(p)-1].Epoch, Tombstones: p}})
}

// process runs one batch on stage i and passes on what it produced; false
// means ctx ended.
func (l *Local) process(ctx context.Context, i int, lb *localBatch) bool {
	r := l.runners[i]
	last := i == len(l.runners)-1
	start := time.Now()
	res, err := r.Process(fromWire(lb.b), start)
	busy := time.Since(start)
	l.publish(i)
	if st := l.stats[i].Load(); st != nil {
		c := *st
		c.Batches++
		c.Busy += busy
		l.stats[i].Store(&c)
	}
	if err != nil {
		if lb.b.ID == 0 {
			return true
		}
		return l.send(ctx, &transport.BatchResult{Epoch: lb.b.Epoch, ID: lb.b.ID, Lost: true, Reason: fmt.Sprintf("stage %d: %v", i, err)})
	}
	for _, d := range res.Dropped {
		lb.dropped = append(lb.dropped, transport.Dropped{Seq: d.Seq, Reason: d.Code})
	}
	if last {
		if lb.b.ID == 0 {
			return true
		}
		out := &transport.BatchResult{Epoch: lb.b.Epoch, ID: lb.b.ID, Dropped: lb.dropped}
		for _, s := range res.Samples {
			out.Samples = append(out.Samples, transport.Sampled{Seq: s.Seq, Token: s.Result.Token, Logprob: s.Result.Logprob, Top: s.Result.Top})
		}
		return l.send(ctx, out)
	}
	next := &transport.MicroBatch{Epoch: lb.b.Epoch, Placement: lb.b.Placement, ID: lb.b.ID, Tombstones: lb.b.Tombstones, Hidden: slices.Clone(res.Hidden)}
	for _, row := range res.Rows {
		next.Rows = append(next.Rows, transport.Row{Seq: row.Seq, Pos: row.Pos, First: row.First, Tokens: row.Tokens, Blocks: row.Blocks, Sample: row.Sample, Params: row.Params})
	}
	select {
	case l.in[i+1] <- &localBatch{b: next, dropped: lb.dropped}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (l *Local) send(ctx context.Context, r *transport.BatchResult) bool {
	select {
	case l.results <- r:
		return true
	case <-ctx.Done():
		return false
	}
}

// fromWire converts a transport batch to the runner's form.
func fromWire(b *transport.MicroBatch) *Batch {
	out := &Batch{Epoch: b.Epoch, ID: b.ID, Hidden: b.Hidden}
	for _, t := range b.Tombstones {
		out.Tombstones = append(out.Tombstones, Tombstone{Seq: t.Seq, Reason: ParseReason(t.Reason)})
	}
	out.Rows = make([]Row, len(b.Rows))
	for i, r := range b.Rows {
		out.Rows[i] = Row{Seq: r.Seq, Pos: r.Pos, First: r.First, Tokens: r.Tokens, Blocks: r.Blocks, Sample: r.Sample, Params: r.Params}
	}
	return out
}

// ParseReason maps a wire reason to a Reason; unknown names count as Failed.
func ParseReason(s string) Reason {
	for r := Reason(0); r < numReasons; r++ {
		if r.String() == s {
			return r
		}
	}
	return Failed
}
