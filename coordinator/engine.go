package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/strata-llm/strata/kv"
	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/sched"
	"github.com/strata-llm/strata/transport"
)

// Errors Submit returns; the HTTP layer maps them to status codes.
var (
	ErrQueueFull = sched.ErrQueueFull                                // 429
	ErrNeverFits = sched.ErrNeverFits                                // 400
	ErrStopped   = errors.New("coordinator: not accepting requests") // 503
	// ErrUnavailable ends a request (or refuses one) because no pipeline
	// can serve it: the shards left after a loss cannot hold the model, or
	// none has formed for the cluster's bounded wait. 503, with why.
	ErrUnavailable = errors.New("coordinator: no pipeline can serve the request")
)

// EngineConfig configures the loop that owns the scheduler.
type EngineConfig struct {
	Sched sched.Config // KV and Stages are taken from the pipeline
	Epoch uint64       // stamped on every batch
	// StreamLimit is how many tokens a client may leave unread before its
	// request is aborted, so the loop never waits for a reader.
	StreamLimit int
	// Tick is how often the loop steps with no other event, to judge
	// deadlines and reclaim lost batches.
	Tick time.Duration
	Log  *slog.Logger
}

// DefaultEngineConfig returns the loop's defaults.
func DefaultEngineConfig() EngineConfig {
	return EngineConfig{
		Sched: sched.DefaultConfig(),
		// 4096 tokens: minutes of output for a streaming client; only a
		// reader that has stopped reading falls that far behind.
		StreamLimit: 4096,
		// 20 ms: deadlines are judged within a fraction of an inter-token
		// interval, at negligible cost for an idle loop.
		Tick: 20 * time.Millisecond,
		Log:  slog.New(slog.DiscardHandler),
	}
}

// GenParams is a validated, tokenized request.
type GenParams struct {
	ID        string // request ID (X-Request-ID)
	Prompt    []int32
	MaxTokens int
	Sample    sample.Params
	Logprobs  bool    // report each token's logprob (and Sample.TopLogprobs alternatives)
	Stop      []int32 // token IDs that end generation (the model's end-of-generation tokens)
	Deadline  time.Time
}

// EngineStats is a snapshot of the loop for metrics and /v1/cluster.
type EngineStats struct {
	Running, Waiting, InFlight int
	KV                         kv.Stats
	Tombstones                 map[string]uint64
	Preemptions                uint64
	GeneratedTokens            uint64
	PromptTokens               uint64
	LastStep                   time.Time // when a batch last completed
}

type submission struct {
	p     GenParams
	s     *Stream
	reply chan error // size 1: the loop never waits for the submitter
}

type abortMsg struct {
	id     sched.RequestID
	reason sched.Reason
}

type live struct {
	s         *Stream
	p         GenParams
	promptLen int
	delivered int           // tokens pushed to the stream
	logprobs  map[int]Token // output index → token with logprobs, until delivered
	// dispatched: some batch carried a row of this request. failErr is
	// why the loop failed it (it ends with FinishFailed and this error).
	dispatched bool
	failErr    error
	// output is a constrained request's generated tokens, which a
	// recomputed sequence's first row carries when a prefix-cache hit
	// skips them (sample.Params.Output).
	output []int32
}

// Engine is the coordinator's loop: it owns the scheduler (and so the KV
// allocator), turns requests, aborts and results into scheduler events, and
// dispatches batches to the pipeline. Only Run's goroutine touches the
// scheduler; everything else talks to it through channels.
type Engine struct {
	cfg  EngineConfig
	pipe Pipeline
	s    *sched.Scheduler

	submit   chan submission
	abort    chan abortMsg
	draining atomic.Bool
	stopped  chan struct{} // closed when Run returns
	stats    atomic.Pointer[EngineStats]

	// Loop-owned.
	version    uint64 // the DynamicPipeline placement the scheduler is shaped for
	noPipeline error  // why requests are failing (the cluster gave up), or nil
	nextID     sched.RequestID
	reqs       map[sched.RequestID]*live
	// lost: a pause of the cluster's loop took the batches in flight as
	// lost, for why; they are failed once the turn is followed (turn).
	lost      string
	genTok    uint64
	promptTok uint64
	lastStep  time.Time
}

// NewEngine returns a loop over pipe; Run starts it. A DynamicPipeline not
// placed yet may report a zero shape: the engine starts paused on a
// one-block placeholder and takes the real shape at the first placement.
func NewEngine(cfg EngineConfig, pipe Pipeline) (*Engine, error) {
	sc := cfg.Sched
	sc.Stages = max(1, pipe.Stages())
	sc.KV.Blocks = max(1, pipe.Blocks())
	if bs := pipe.BlockSize(); bs > 0 {
		sc.KV.BlockSize = bs
	}
	s, err := sched.New(sc)
	if err != nil {
		return nil, err
	}
	if cfg.StreamLimit <= 0 {
		return nil, fmt.Errorf("coordinator: StreamLimit must be > 0, got %d", cfg.StreamLimit)
	}
	if cfg.Tick <= 0 {
		return nil, fmt.Errorf("coordinator: Tick must be > 0, got %v", cfg.Tick)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cfg.Sched = sc
	e := &Engine{
		cfg: cfg, pipe: pipe, s: s,
		submit:  make(chan submission),
		abort:   make(chan abortMsg),
		stopped: make(chan struct{}),
		nextID:  1,
		reqs:    map[sched.RequestID]*live{},
	}
	e.publish()
	return e, nil
}

// Config returns the engine's configuration (with the pipeline's KV shape).
func (e *Engine) Config() EngineConfig { return e.cfg }

// Drain stops admitting: Submit returns ErrStopped from now on, while
// requests already admitted run to their end.
func (e *Engine) Drain() { e.draining.Store(true) }

// Draining reports whether Drain was called.
func (e *Engine) Draining() bool { return e.draining.Load() }

// Stats returns the latest snapshot published by the loop.
func (e *Engine) Stats() EngineStats { return *e.stats.Load() }

// Submit hands a request to the loop and returns its token stream. It
// returns a *sched.LimitError wrapping ErrQueueFull or ErrNeverFits when the
// scheduler refuses, ErrStopped when the loop is not running, and an error
// wrapping ErrNotReady when a DynamicPipeline has had no placement yet.
func (e *Engine) Submit(ctx context.Context, p GenParams) (*Stream, error) {
	if e.draining.Load() {
		return nil, ErrStopped
	}
	// A request that shows no logprobs spares the last stage the sum over
	// the vocabulary behind the sampled token's (the same token either way).
	p.Sample.NoLogprob = !p.Logprobs && p.Sample.TopLogprobs == 0
	// A constrained request's automaton reads its output from here on.
	// max_tokens reserves room to close the document (sample.Params.OutputEnd).
	p.Sample.OutputStart, p.Sample.Output, p.Sample.OutputEnd = 0, nil, 0
	if len(p.Sample.Constraint) > 0 {
		p.Sample.OutputStart = len(p.Prompt)
		if p.MaxTokens > 0 {
			p.Sample.OutputEnd = len(p.Prompt) + p.MaxTokens
		}
	}
	st := newStream(p.ID, e.cfg.StreamLimit)
	sub := submission{p: p, s: st, reply: make(chan error, 1)}
	select {
	case e.submit <- sub:
	case <-e.stopped:
		return nil, ErrStopped
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case err := <-sub.reply:
		if err != nil {
			return nil, err
		}
		return st, nil
	case <-e.stopped:
		return nil, ErrStopped
	}
}

// sendAbort tells the loop to end a request; it never blocks past the loop's
// end.
func (e *Engine) sendAbort(id sched.RequestID, r sched.Reason) {
	select {
	case e.abort <- abortMsg{id, r}:
	case <-e.stopped:
	}
}

// Run is the loop. It returns when ctx ends, after failing every request
// still open.
func (e *Engine) Run(ctx context.Context) error {
	defer close(e.stopped)
	tick := time.NewTicker(e.cfg.Tick)
	defer tick.Stop()
	results := e.pipe.Results()
	var changed <-chan struct{} // nil for a fixed pipeline: never ready
	if dp, ok := e.pipe.(DynamicPipeline); ok {
		changed = dp.Changed()
		e.follow()
	}
	// Over a cluster, the engine asks for the cluster's loop and runs it
	// here (clusterLoop): one goroutine then owns the scheduler and the
	// control core. It gives the loop back when it stops, or stops running
	// it when the cluster stops.
	var (
		cl      *clusterLoop
		adopt   chan<- any // the cluster's events until adopted
		taken   chan *clusterLoop
		back    chan struct{}
		request any
	)
	if cp, ok := e.pipe.(clusterPipeline); ok {
		taken, back = make(chan *clusterLoop, 1), make(chan struct{})
		adopt, request = cp.c.ev, evAdopt{taken: taken, back: back}
	}
	giveBack := func() {
		if back != nil {
			if cl != nil {
				cl.c.ledger = nil
			}
			close(back)
			back, cl = nil, nil
		}
	}
	defer giveBack()
	for {
		select {
		case <-ctx.Done():
			for _, l := range e.reqs {
				l.s.finish(FinishFailed, errors.New("coordinator: shutting down"))
			}
			return nil
		case sub := <-e.submit:
			sub.reply <- e.add(sub, time.Now())
		case a := <-e.abort:
			if err := e.s.Abort(a.id, a.reason); err != nil {
				e.cfg.Log.Error("abort", "request", a.id, "err", err)
			}
		case r := <-results:
			e.complete(r, time.Now())
		case <-changed:
			e.follow()
		case <-tick.C:
		case adopt <- request:
			adopt, cl = nil, <-taken // nil: another engine runs it
			if cl != nil {
				// Answers are admitted against the scheduler's record
				// and handed to it on this goroutine.
				cl.c.ledger = engineLedger{e}
			}
		case ev := <-cl.events():
			e.turn(cl, ev)
		case m := <-cl.memberEvents():
			e.turn(cl, m)
		case <-cl.tombKick():
			e.turn(cl, evTombKick{})
		case <-cl.ticks():
			e.turn(cl, evTick{})
		case <-cl.done():
			giveBack()
		}
		e.step(time.Now())
	}
}

// turn runs one turn of the cluster's loop, then follows what it changed
// (a pause, a new placement) before the step that follows: that step must
// not dispatch into a pipeline the turn paused, which would fail the batch
// and cost its requests a retry though nothing of theirs was lost.
//
// Batches a pause failed (engineLedger.lose) are failed after the follow:
// when the turn also moved to a new placement, the scheduler's Reset has
// forgotten them (its sequences recomputed, no retry counted), as a switch
// between placements should; after a loss alone they are lost work.
func (e *Engine) turn(cl *clusterLoop, ev any) {
	cl.turn(ev)
	e.followPending()
	if e.lost != "" {
		e.s.FailInFlight(e.lost)
		e.lost = ""
	}
}

// engineLedger is the ledger of the cluster's loop while the engine runs
// it: the scheduler's record of what each batch in flight carries and
// which sequences live, the only one.
type engineLedger struct{ e *Engine }

func (l engineLedger) rows(id uint64, dst []sched.BatchRow) ([]sched.BatchRow, bool) {
	return l.e.s.InFlightBatch(sched.BatchID(id), dst)
}

func (l engineLedger) inFlight() (batches, tokens int) {
	return l.e.s.Stats().InFlight, l.e.s.InFlightTokens()
}

func (l engineLedger) answer(r *transport.BatchResult) { l.e.complete(r, time.Now()) }

func (l engineLedger) drop(id uint64, seqs []uint64, reason string) {
	ss := make([]sched.SeqID, len(seqs))
	for i, s := range seqs {
		ss[i] = sched.SeqID(s)
	}
	l.e.s.BatchFailed(sched.Failure{Batch: sched.BatchID(id), Seqs: ss, Reason: reason})
}

func (l engineLedger) lose(reason string) { l.e.lost = reason }

func (l engineLedger) running(dst []uint64) []uint64 {
	for _, s := range l.e.s.RunningSeqs(nil) {
		dst = append(dst, uint64(s))
	}
	return dst
}

func (e *Engine) add(sub submission, now time.Time) error {
	// Judge the request against the newest placement, not the one of the
	// last step: a cluster that just became ready has a shape the
	// scheduler has not taken yet (its signal may still be pending).
	e.followPending()
	if e.noPipeline != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, e.noPipeline)
	}
	if _, ok := e.pipe.(DynamicPipeline); ok && e.version == 0 {
		// The scheduler holds a one-block placeholder until the first
		// placement: every request would look as if it could never fit.
		return fmt.Errorf("%w: no placement yet", ErrNotReady)
	}
	id := e.nextID
	e.nextID++
	err := e.s.Add(sched.Request{
		ID: id, Prompt: sub.p.Prompt, MaxTokens: sub.p.MaxTokens, Stop: sub.p.Stop,
		Arrival: now, Deadline: sub.p.Deadline,
	})
	if err != nil {
		return err
	}
	st := sub.s
	st.Submitted = now
	st.mu.Lock()
	st.abort = func() { e.sendAbort(id, sched.Aborted) }
	st.stop = func() { e.sendAbort(id, sched.Stop) }
	st.mu.Unlock()
	e.reqs[id] = &live{s: st, p: sub.p, promptLen: len(sub.p.Prompt)}
	e.promptTok += uint64(len(sub.p.Prompt))
	return nil
}

func (e *Engine) complete(r *transport.BatchResult, now time.Time) {
	bid := sched.BatchID(r.ID)
	if r.Lost {
		e.s.BatchFailed(sched.Failure{Batch: bid, Reason: r.Reason})
		return
	}
	// Which request each sample is for, and where in its output: the
	// scheduler's record of the batch (asked before the batch retires).
	samples := make([]sched.Sample, len(r.Samples))
	for i, sm := range r.Samples {
		samples[i] = sched.Sample{Seq: sched.SeqID(sm.Seq), Token: sm.Token}
		req, outIdx, ok := e.s.InFlightRow(bid, sched.SeqID(sm.Seq))
		if l := e.reqs[req]; ok && l != nil && l.p.Logprobs {
			if l.logprobs == nil {
				l.logprobs = map[int]Token{}
			}
			l.logprobs[outIdx] = Token{ID: sm.Token, Logprob: sm.Logprob, Top: sm.Top}
		}
	}
	if len(r.Dropped) > 0 {
		seqs := make([]sched.SeqID, len(r.Dropped))
		for i, d := range r.Dropped {
			seqs[i] = sched.SeqID(d.Seq)
		}
		e.s.BatchFailed(sched.Failure{Batch: bid, Seqs: seqs, Reason: r.Dropped[0].Reason.String()})
	}
	e.lastStep = now
	e.s.Complete(sched.Result{Batch: sched.BatchID(r.ID), Samples: samples}, now)
}

// followPending follows a DynamicPipeline's change signalled and not yet
// taken.
func (e *Engine) followPending() {
	dp, ok := e.pipe.(DynamicPipeline)
	if !ok {
		return
	}
	select {
	case <-dp.Changed():
		e.follow()
	default:
	}
}

// follow keeps the scheduler in step with a DynamicPipeline: paused while
// it cannot take batches, reset onto each new placement (the old one's
// sequences are tombstoned and their requests requeued, to be recomputed);
// the requests it had dispatched failed at once when the shards left
// cannot hold the model (waiting ones wait on, up to their queue timeout);
// and every request failed once the cluster gives up forming a pipeline.
// It runs when the pipeline signals a change (DynamicPipeline.Changed), not
// every step: the pipeline's shape and readiness are the cluster's, which
// says when they move.
func (e *Engine) follow() {
	dp, ok := e.pipe.(DynamicPipeline)
	if !ok {
		return
	}
	if v := dp.Version(); v != e.version && dp.Blocks() > 0 && dp.Stages() > 0 {
		kc := e.cfg.Sched.KV
		kc.Blocks, kc.BlockSize = dp.Blocks(), dp.BlockSize()
		if err := e.s.Reset(kc, dp.Stages()); err != nil {
			e.cfg.Log.Error("reshape onto new placement", "version", v, "err", err)
		} else {
			e.cfg.Log.Info("new placement", "version", v, "stages", dp.Stages(), "kv_blocks", kc.Blocks)
			e.version = v
		}
	}
	err := dp.Ready()
	if err == nil && e.version == 0 {
		err = errors.New("no placement yet")
	}
	e.s.SetPaused(err != nil)
	e.noPipeline = nil
	switch {
	case errors.Is(err, ErrNoPipeline):
		e.noPipeline = err
		e.failAll(func(*live) bool { return true }, err)
	case errors.Is(err, ErrNoFit):
		e.failAll(func(l *live) bool { return l.dispatched }, err)
	}
}

// failAll ends every request that which picks, and has not been failed
// yet, with FinishFailed and an error wrapping ErrUnavailable and why.
func (e *Engine) failAll(which func(*live) bool, why error) {
	for id, l := range e.reqs {
		if l.failErr != nil || !which(l) {
			continue
		}
		l.failErr = fmt.Errorf("%w: %v", ErrUnavailable, why)
		if err := e.s.Abort(id, sched.Failed); err != nil {
			e.cfg.Log.Error("fail request", "request", id, "err", err)
		}
	}
}

func (e *Engine) step(now time.Time) {
	out := e.s.Step(now)
	for _, u := range out.Updates {
		e.update(u)
	}
	tombs := make([]transport.Tombstone, len(out.Tombstones))
	for i, t := range out.Tombstones {
		tombs[i] = transport.Tombstone{Epoch: e.cfg.Epoch, Seq: uint64(t.Seq), Reason: wireReason(t.Reason)}
	}
	if len(out.Batches) == 0 && len(tombs) > 0 {
		// An empty batch carries tombstones through an idle pipeline; it
		// has no scheduler ID, and its result is ignored.
		if err := e.pipe.Dispatch(&transport.MicroBatch{Epoch: e.cfg.Epoch, Tombstones: tombs}); err != nil {
			e.cfg.Log.Warn("dispatch tombstones", "err", err, "tombstones", len(tombs))
		}
	}
	for i, b := range out.Batches {
		wb := &transport.MicroBatch{Epoch: e.cfg.Epoch, ID: uint64(b.ID), Rows: make([]transport.Row, len(b.Rows))}
		if i == 0 {
			wb.Tombstones = tombs
		}
		for j, r := range b.Rows {
			l := e.reqs[r.Request]
			if l != nil {
				l.dispatched = true
			}
			wr := transport.Row{Seq: uint64(r.Seq), Pos: r.Pos, First: r.First, Tokens: r.Tokens, Blocks: blockIDs(r.Blocks), Sample: r.Sample,
				SlideFrom: r.SlideFrom, Slides: blockIDs(r.Slides)}
			if r.First && l != nil {
				p := l.p.Sample
				if len(p.Constraint) > 0 && r.Pos > l.promptLen {
					p.Output = l.output[:min(len(l.output), r.Pos-l.promptLen)]
				}
				wr.Params = &p
			}
			wb.Rows[j] = wr
		}
		if err := e.pipe.Dispatch(wb); err != nil {
			e.cfg.Log.Warn("dispatch", "batch", wb.ID, "err", err)
			e.s.BatchFailed(sched.Failure{Batch: b.ID, Reason: "dispatch: " + err.Error()})
		}
	}
	e.publish() // every turn: /metrics and 429 decisions read fresh counts
}

// update forwards one scheduler update to its client.
func (e *Engine) update(u sched.Update) {
	l := e.reqs[u.Request]
	if l == nil {
		return
	}
	if len(u.Tokens) > 0 {
		toks := make([]Token, len(u.Tokens))
		for i, id := range u.Tokens {
			idx := l.delivered + i
			if t, ok := l.logprobs[idx]; ok && t.ID == id {
				toks[i] = t
			} else {
				toks[i] = Token{ID: id}
			}
			delete(l.logprobs, idx)
		}
		l.delivered += len(toks)
		if len(l.p.Sample.Constraint) > 0 {
			l.output = append(l.output, u.Tokens...)
		}
		e.genTok += uint64(len(toks))
		if !l.s.push(toks) && !u.Done {
			// The reader fell too far behind: end the request now rather
			// than let its tokens pile up.
			if err := e.s.Abort(u.Request, sched.Aborted); err != nil {
				e.cfg.Log.Error("abort slow reader", "err", err)
			}
			l.s.finish(FinishAborted, ErrSlowReader)
		}
	}
	if u.Done {
		err := finishErr(u.Reason)
		if u.Reason == sched.Failed && l.failErr != nil {
			err = l.failErr
		}
		l.s.finish(finishReason(u.Reason), err)
		delete(e.reqs, u.Request)
	}
}

func (e *Engine) publish() {
	st := e.s.Stats()
	tombs := map[string]uint64{}
	for r, n := range st.Tombstones {
		if n > 0 {
			tombs[wireReason(sched.Reason(r)).String()] += n
		}
	}
	e.stats.Store(&EngineStats{
		Running: st.Running, Waiting: st.Waiting, InFlight: st.InFlight, KV: st.KV,
		Tombstones: tombs, Preemptions: st.Preemptions,
		GeneratedTokens: e.genTok, PromptTokens: e.promptTok, LastStep: e.lastStep,
	})
}

// wireReason is a tombstone's reason on the wire: natural ends are
// finished; an ending sched has no name for (a lost batch's) is failed.
func wireReason(r sched.Reason) transport.Reason {
	switch r {
	case sched.Stop, sched.Length:
		return transport.ReasonFinished
	case sched.Aborted:
		return transport.ReasonAborted
	case sched.Timeout:
		return transport.ReasonTimeout
	case sched.Preempted:
		return transport.ReasonPreempted
	}
	return transport.ReasonFailed
}

func finishReason(r sched.Reason) FinishReason {
	switch r {
	case sched.Stop:
		return FinishStop
	case sched.Length:
		return FinishLength
	case sched.Aborted:
		return FinishAborted
	case sched.Timeout:
		return FinishTimeout
	}
	return FinishFailed
}

func finishErr(r sched.Reason) error {
	switch r {
	case sched.Timeout:
		return errors.New("coordinator: request timed out")
	case sched.Failed:
		return errors.New("coordinator: request failed: its work was lost more often than the retry limit allows")
	}
	return nil
}

// blockIDs converts the scheduler's block IDs to the wire's (nil for none).
func blockIDs(ids []kv.BlockID) []int32 {
	if len(ids) == 0 {
		return nil
	}
	out := make([]int32, len(ids))
	for k, id := range ids {
		out[k] = int32(id)
	}
	return out
}
