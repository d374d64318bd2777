package coordinator

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/transport"
)

// fakePipeline answers each batch with deterministic tokens: a row's token
// is (its last token + 1) % vocab. One worker goroutine (run) answers
// batches in order, after an optional delay and while not paused. It keeps
// the live sequences the way a shard would, so tests can check that every
// ending reached it as a tombstone.
type fakePipeline struct {
	vocab  int
	blocks int
	in     chan *transport.MicroBatch // bounded by MaxInFlight plus tombstone-only batches; Dispatch fails when full
	out    chan *transport.BatchResult

	mu      sync.Mutex
	delay   time.Duration
	hold    chan struct{} // non-nil: paused until closed
	live    map[uint64]*sample.Params
	tombs   map[string]int
	batches int
}

var _ Pipeline = (*fakePipeline)(nil)

func newFakePipeline(vocab, blocks int) *fakePipeline {
	return &fakePipeline{
		vocab: vocab, blocks: blocks,
		in:    make(chan *transport.MicroBatch, 1024),
		out:   make(chan *transport.BatchResult),
		live:  map[uint64]*sample.Params{},
		tombs: map[string]int{},
	}
}

func (f *fakePipeline) Stages() int                            { return 1 }
func (f *fakePipeline) Blocks() int                            { return f.blocks }
func (f *fakePipeline) BlockSize() int                         { return 16 }
func (f *fakePipeline) Results() <-chan *transport.BatchResult { return f.out }

func (f *fakePipeline) Dispatch(b *transport.MicroBatch) error {
	select {
	case f.in <- b:
		return nil
	default:
		return errors.New("fake pipeline: queue full")
	}
}

func (f *fakePipeline) setDelay(d time.Duration) {
	f.mu.Lock()
	f.delay = d
	f.mu.Unlock()
}

// pause holds every batch not yet answered until resume.
func (f *fakePipeline) pause() {
	f.mu.Lock()
	if f.hold == nil {
		f.hold = make(chan struct{})
	}
	f.mu.Unlock()
}

func (f *fakePipeline) resume() {
	f.mu.Lock()
	if f.hold != nil {
		close(f.hold)
		f.hold = nil
	}
	f.mu.Unlock()
}

// liveSeqs is how many sequences the fake holds (created, not tombstoned).
func (f *fakePipeline) liveSeqs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}

// run answers batches until ctx ends.
func (f *fakePipeline) run(ctx context.Context) {
	for {
		var b *transport.MicroBatch
		select {
		case <-ctx.Done():
			return
		case b = <-f.in:
		}
		f.mu.Lock()
		for _, t := range b.Tombstones {
			delete(f.live, t.Seq)
			f.tombs[t.Reason.String()]++
		}
		hold, delay := f.hold, f.delay
		f.mu.Unlock()
		if b.ID == 0 {
			continue
		}
		if hold != nil {
			select {
			case <-hold:
			case <-ctx.Done():
				return
			}
		}
		if delay > 0 {
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return
			}
		}
		res := &transport.BatchResult{Epoch: b.Epoch, ID: b.ID}
		f.mu.Lock()
		f.batches++
		for _, r := range b.Rows {
			if r.First {
				f.live[r.Seq] = r.Params
			}
			if !r.Sample || len(r.Tokens) == 0 {
				continue
			}
			tok := (r.Tokens[len(r.Tokens)-1] + 1) % int32(f.vocab)
			sm := transport.Sampled{Seq: r.Seq, Token: tok, Logprob: fakeLogprob(tok)}
			if p := f.live[r.Seq]; p != nil {
				for i := range p.TopLogprobs {
					alt := (tok + int32(i)) % int32(f.vocab)
					sm.Top = append(sm.Top, sample.TokenLogprob{Token: alt, Logprob: fakeLogprob(tok) - float32(i)})
				}
			}
			res.Samples = append(res.Samples, sm)
		}
		f.mu.Unlock()
		select {
		case f.out <- res:
		case <-ctx.Done():
			return
		}
	}
}

func fakeLogprob(tok int32) float32 { return -float32(tok%8) / 4 }
