package coordinator

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/strata-llm/strata/model/sample"
)

// placedPipeline is the fake pipeline seen as a DynamicPipeline whose first
// placement the test makes: no shape and not ready until placed.
type placedPipeline struct {
	*fakePipeline
	version atomic.Uint64
	changed chan struct{} // size 1
}

var _ DynamicPipeline = (*placedPipeline)(nil)

func (p *placedPipeline) Stages() int {
	if p.version.Load() == 0 {
		return 0
	}
	return p.fakePipeline.Stages()
}

func (p *placedPipeline) Blocks() int {
	if p.version.Load() == 0 {
		return 0
	}
	return p.fakePipeline.Blocks()
}

func (p *placedPipeline) Ready() error {
	if p.version.Load() == 0 {
		return ErrNotReady
	}
	return nil
}

func (p *placedPipeline) Version() uint64 { return p.version.Load() }

func (p *placedPipeline) Changed() <-chan struct{} { return p.changed }

// place makes the first placement and signals it.
func (p *placedPipeline) place() {
	p.version.Store(1)
	p.changed <- struct{}{}
}

// TestSubmitBeforeFirstPlacement: before a DynamicPipeline's first placement
// a request is refused as not ready (503), not judged against the
// scheduler's one-block placeholder (which would call it one that can never
// fit); right after the placement, before the loop's next tick, it is judged
// against the placement's shape and runs.
func TestSubmitBeforeFirstPlacement(t *testing.T) {
	info := testInfo(t)
	pipe := &placedPipeline{fakePipeline: newFakePipeline(info.Vocab, 256), changed: make(chan struct{}, 1)}
	ec := DefaultEngineConfig()
	ec.Sched.MaxModelLen = info.Context
	ec.Tick = time.Hour // the loop steps only on events
	eng, err := NewEngine(ec, pipe)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { pipe.run(ctx) })
	wg.Go(func() { eng.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	params := GenParams{Prompt: []int32{1, 5, 6, 7}, MaxTokens: 40, Sample: sample.DefaultParams()}
	_, err = eng.Submit(ctx, params)
	if !errors.Is(err, ErrNotReady) {
		t.Fatalf("Submit before the first placement: %v, want ErrNotReady", err)
	}
	if ae := submitError(err); ae.status != http.StatusServiceUnavailable {
		t.Errorf("Submit before the first placement answers %d, want 503", ae.status)
	}

	pipe.place()
	st, err := eng.Submit(ctx, params)
	if err != nil {
		t.Fatalf("Submit right after the first placement: %v", err)
	}
	n := 0
	for {
		toks, done, reason, err := st.Next(ctx)
		n += len(toks)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			if reason != FinishLength || n != 40 {
				t.Fatalf("ended %s after %d tokens, want length after 40", reason, n)
			}
			return
		}
	}
}
