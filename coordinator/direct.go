package coordinator

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/strata-llm/strata/sched"
	"github.com/strata-llm/strata/transport"
)

// DirectPipeline drives the cluster's pipeline without an engine: for
// tests and tools that form batches themselves (the tombstone paths under
// loss, a forged answer, a placement switch). It keeps the ledger the
// engine's scheduler otherwise keeps (engineLedger): Dispatch records each
// batch's rows and the sequences its first rows create, then dispatches
// it; each answer the cluster's loop admits comes out of Results, a loss
// with the rows dropped before it. An engine that runs the loop later
// replaces it.
type DirectPipeline struct {
	pipe *remote
	out  chan *transport.BatchResult

	mu      sync.Mutex
	batches map[uint64][]sched.BatchRow
	dropped map[uint64][]transport.Dropped
	live    map[uint64]bool
}

var (
	_ ledger   = (*DirectPipeline)(nil)
	_ Pipeline = (*DirectPipeline)(nil)
)

func newDirectPipeline(p *remote) *DirectPipeline {
	return &DirectPipeline{pipe: p, out: make(chan *transport.BatchResult, 256),
		batches: map[uint64][]sched.BatchRow{}, dropped: map[uint64][]transport.Dropped{}, live: map[uint64]bool{}}
}

// Direct puts a new DirectPipeline in the cluster's loop in place of any
// ledger, and returns it. It fails when the loop is not running, or an
// engine runs it (whose answers it would take).
func (c *Cluster) Direct() (*DirectPipeline, error) {
	if c.lent.Load() {
		return nil, errors.New("coordinator: an engine runs the cluster's loop")
	}
	l := newDirectPipeline(c.pipe)
	done := make(chan struct{})
	if !c.post(context.Background(), evLedger{led: l, done: done}) {
		return nil, errors.New("coordinator: the cluster's loop is not running")
	}
	<-done
	return l, nil
}

// Stages, Blocks and BlockSize implement Pipeline: the current
// placement's.
func (l *DirectPipeline) Stages() int    { return l.pipe.Stages() }
func (l *DirectPipeline) Blocks() int    { return l.pipe.Blocks() }
func (l *DirectPipeline) BlockSize() int { return l.pipe.BlockSize() }

// Results implements Pipeline: the admitted answers, in the order the
// loop took them (256 may wait; the loop blocks on more).
func (l *DirectPipeline) Results() <-chan *transport.BatchResult { return l.out }

// Dispatch records b, then dispatches it; a batch that could not go is
// forgotten, as the engine fails it at once.
func (l *DirectPipeline) Dispatch(b *transport.MicroBatch) error {
	l.mu.Lock()
	for _, t := range b.Tombstones {
		delete(l.live, t.Seq)
	}
	if b.ID != 0 {
		rows := make([]sched.BatchRow, len(b.Rows))
		for i, r := range b.Rows {
			rows[i] = sched.BatchRow{Seq: sched.SeqID(r.Seq), Tokens: len(r.Tokens), Sample: r.Sample}
		}
		l.batches[b.ID] = rows
	}
	for _, r := range b.Rows {
		if r.First {
			l.live[r.Seq] = true
		}
	}
	l.mu.Unlock()
	err := l.pipe.Dispatch(b)
	if err != nil && b.ID != 0 {
		l.mu.Lock()
		delete(l.batches, b.ID)
		l.mu.Unlock()
	}
	return err
}

func (l *DirectPipeline) rows(id uint64, dst []sched.BatchRow) ([]sched.BatchRow, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rows, ok := l.batches[id]
	return append(dst, rows...), ok
}

func (l *DirectPipeline) inFlight() (batches, tokens int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, rows := range l.batches {
		for _, r := range rows {
			tokens += r.Tokens
		}
	}
	return len(l.batches), tokens
}

func (l *DirectPipeline) answer(r *transport.BatchResult) {
	l.mu.Lock()
	delete(l.batches, r.ID)
	for _, d := range l.dropped[r.ID] {
		if !slices.ContainsFunc(r.Dropped, func(x transport.Dropped) bool { return x.Seq == d.Seq }) {
			r.Dropped = append(r.Dropped, d)
		}
	}
	delete(l.dropped, r.ID)
	l.mu.Unlock()
	l.out <- r
}

func (l *DirectPipeline) drop(id uint64, seqs []uint64, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	code, _ := transport.ParseCode(reason)
	for _, s := range seqs {
		l.dropped[id] = append(l.dropped[id], transport.Dropped{Seq: s, Reason: code})
	}
}

func (l *DirectPipeline) lose(reason string) {
	l.mu.Lock()
	ids := make([]uint64, 0, len(l.batches))
	for id := range l.batches {
		ids = append(ids, id)
	}
	clear(l.batches)
	l.mu.Unlock()
	slices.Sort(ids)
	for _, id := range ids {
		l.out <- &transport.BatchResult{Epoch: l.pipe.epoch, ID: id, Lost: true, Reason: reason}
	}
}

func (l *DirectPipeline) running(dst []uint64) []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range l.live {
		dst = append(dst, s)
	}
	slices.Sort(dst)
	return dst
}
