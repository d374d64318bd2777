package coordinator

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/strata-llm/strata/sched"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// Errors Dispatch returns; the engine fails the batch.
var (
	// ErrNotReady: no pipeline is formed (placing, loading, or paused
	// after a loss).
	ErrNotReady = errors.New("coordinator: pipeline not ready")
	// ErrLinkFull: the stage-0 link's queue is full.
	ErrLinkFull = errors.New("coordinator: stage-0 link queue full")
)

// linkQueue bounds the stage-0 link's send queue. The engine keeps at most
// MaxInFlight (default stages + 1) batches with rows in flight, plus
// tombstone-only batches when idle, so 64 is reached only when the stream
// stalls; then Dispatch returns ErrLinkFull and the engine fails the batch
// (a tombstone-only batch waits in the pending list instead).
const linkQueue = 64

// ledger is the record of the batches in flight that the cluster's loop
// admits answers against, and of the live sequences reconcile spares: the
// scheduler's (engineLedger, while an engine runs the loop), the only
// record of either. The loop hands it every admitted answer. A nil ledger
// (no engine runs the loop) has nothing in flight and nothing live. Only
// the goroutine running the loop calls it.
type ledger interface {
	// rows appends the rows of batch id to dst while it is in flight.
	rows(id uint64, dst []sched.BatchRow) ([]sched.BatchRow, bool)
	// inFlight returns how many batches are in flight and the tokens
	// their rows carry.
	inFlight() (batches, tokens int)
	// answer takes an admitted result of a batch in flight, or its loss
	// (Lost).
	answer(r *transport.BatchResult)
	// drop ends the sequences seqs of batch id: a stage could not compute
	// their rows (reason).
	drop(id uint64, seqs []uint64, reason string)
	// lose takes every batch in flight as lost: the pipeline paused.
	lose(reason string)
	// running appends to dst the live sequences: dispatched, and not
	// tombstoned.
	running(dst []uint64) []uint64
}

// remote is the Pipeline over the cluster: Dispatch queues a batch on the
// stage-0 link's sender; answers come back to the cluster's loop, which
// admits each against the ledger and hands it over (takeResult,
// takeFailure). Every dispatched batch with an ID gets at most one answer:
// the ledger retires a batch with its answer, and a second one finds it
// gone.
//
// Its mutex guards plain state only; nothing is sent on a channel while it
// is held, except non-blocking sends.
type remote struct {
	epoch    uint64
	vocab    int                 // the model's vocabulary; sampled tokens lie in [0, vocab)
	refused  *transport.Refusals // the cluster's: messages refused before use
	tombKick chan struct{}       // size 1: backstop tombstones queued for the cluster loop
	// changed (size 1) tells the engine that readiness or the placement
	// moved (DynamicPipeline.Changed): the link came or went here, or the
	// cluster's published readiness changed (Cluster.publish).
	changed chan struct{}

	mu        sync.Mutex
	stages    int
	blocks    int
	blockSize int
	version   uint64   // the placement version batches are stamped with
	stageIDs  []string // the current placement's shards, stage order; never mutated (replaced)
	link      *link    // nil while not ready
	// busySince is since when batches have been in flight without an
	// answer to any of them (zero while none is): the control core's
	// progress clock (control.Core.Progress). A batch the scheduler
	// reclaimed got no answer: the clock keeps running for it.
	busySince time.Time
	// ended and endedOld hold sequences tombstoned in the current and the
	// previous rotation (see rotateEnded): a heartbeat that lists one was
	// taken before its tombstone arrived, so it is not named unknown (the
	// tombstone frees it, and reconcile counters stay zero when healthy).
	ended    map[uint64]struct{}
	endedOld map[uint64]struct{}
	maxSeq   uint64
	pending  []transport.Tombstone     // in-band tombstones waiting for the next batch
	backstop []transport.Tombstone     // for the cluster loop to fan out on control streams
	failed   map[transport.Code]uint64 // batches failed (BatchFailed and losses) by code
}

var _ Pipeline = (*remote)(nil)

// newRemote returns the remote pipeline of a coordinator start of epoch,
// for a model of vocab tokens (0: sampled tokens are not checked against a
// vocabulary), counting the answers it refuses on refused.
func newRemote(epoch uint64, vocab int, refused *transport.Refusals) *remote {
	if vocab <= 0 {
		vocab = math.MaxInt32
	}
	return &remote{
		epoch:    epoch,
		vocab:    vocab,
		refused:  refused,
		tombKick: make(chan struct{}, 1),
		changed:  make(chan struct{}, 1),
		ended:    map[uint64]struct{}{},
		endedOld: map[uint64]struct{}{},
		failed:   map[transport.Code]uint64{},
	}
}

// Stages implements Pipeline: the current placement's stage count (0
// before the first placement).
func (p *remote) Stages() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stages
}

// Blocks implements Pipeline: the current placement's KV pool.
func (p *remote) Blocks() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blocks
}

// BlockSize implements Pipeline.
func (p *remote) BlockSize() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blockSize
}

// Results implements Pipeline with a channel that never delivers: the
// cluster's answers reach the engine on the loop it runs, through its
// ledger (engineLedger.answer).
func (p *remote) Results() <-chan *transport.BatchResult { return nil }

// Dispatch implements Pipeline without blocking: it records the batch's
// tombstones as ended and for the backstop, then queues it on the stage-0
// link. Tombstones of a batch that cannot go now ride in the next one. The
// first batch into an idle pipeline starts the progress clock.
func (p *remote) Dispatch(b *transport.MicroBatch) error {
	p.mu.Lock()
	for _, t := range b.Tombstones {
		p.ended[t.Seq] = struct{}{}
	}
	kickTombs := len(b.Tombstones) > 0
	p.backstop = append(p.backstop, b.Tombstones...)
	for _, r := range b.Rows {
		p.maxSeq = max(p.maxSeq, r.Seq)
	}
	if len(p.pending) > 0 {
		b.Tombstones = append(p.pending, b.Tombstones...)
		p.pending = nil
	}
	l := p.link
	if l == nil {
		p.pending = b.Tombstones
		p.mu.Unlock()
		p.kick(kickTombs)
		if b.ID == 0 && len(b.Rows) == 0 {
			return nil
		}
		return ErrNotReady
	}
	if over := len(b.Tombstones) - transport.MaxBatchTombstones; over > 0 {
		// More than one header may carry: the rest ride in the next batch.
		p.pending = slices.Clone(b.Tombstones[transport.MaxBatchTombstones:])
		b.Tombstones = b.Tombstones[:transport.MaxBatchTombstones:transport.MaxBatchTombstones]
	}
	for i := range b.Rows {
		// A first row asks for logprobs unless its request shows none
		// (Params.NoLogprob, set by the engine): the last stage then skips
		// the vocabulary-wide sum behind them.
		b.Rows[i].Logprobs = b.Rows[i].First && (b.Rows[i].Params == nil || !b.Rows[i].Params.NoLogprob)
	}
	b.Placement = l.version
	h, err := transport.HeaderToWire(b, pb.HiddenType_HIDDEN_TYPE_F32)
	if err != nil {
		p.pending = slices.Concat(b.Tombstones, p.pending)
		p.mu.Unlock()
		p.kick(kickTombs)
		return fmt.Errorf("coordinator: batch %d: %w", b.ID, err)
	}
	select {
	case l.queue <- h:
		if b.ID != 0 && p.busySince.IsZero() {
			p.busySince = time.Now()
		}
		p.mu.Unlock()
		p.kick(kickTombs)
		return nil
	default:
	}
	p.pending = append(b.Tombstones, p.pending...)
	p.mu.Unlock()
	p.kick(kickTombs)
	if b.ID == 0 {
		return nil // its tombstones wait for the next batch
	}
	return ErrLinkFull
}

// notify signals the engine that readiness or the placement changed; call
// it after the change is visible (outside mu).
func (p *remote) notify() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

func (p *remote) kick(tombs bool) {
	if tombs {
		select {
		case p.tombKick <- struct{}{}:
		default:
		}
	}
}

// answered moves the progress clock after led took an answer: to now while
// batches are still in flight, to zero when none is.
func (p *remote) answered(led ledger) {
	n, _ := led.inFlight()
	p.mu.Lock()
	defer p.mu.Unlock()
	if n == 0 {
		p.busySince = time.Time{}
	} else {
		p.busySince = time.Now()
	}
}

// progress returns since when batches have been in flight unanswered
// (zero: none in flight) and how many tokens the batches led holds in
// flight carry.
func (p *remote) progress(led ledger) (time.Time, int) {
	tokens := 0
	if led != nil {
		_, tokens = led.inFlight()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.busySince, tokens
}

// takeBackstop returns the tombstones dispatched since the last call.
func (p *remote) takeBackstop() []transport.Tombstone {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.backstop
	p.backstop = nil
	return t
}

// unknown returns the sequences of live that the coordinator does not know:
// not running in led (never created by this coordinator, or ended), and not
// tombstoned within the last two rotations.
func (p *remote) unknown(live []uint64, led ledger) []uint64 {
	var running map[uint64]struct{}
	if led != nil {
		seqs := led.running(nil)
		running = make(map[uint64]struct{}, len(seqs))
		for _, s := range seqs {
			running[s] = struct{}{}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []uint64
	for _, s := range live {
		_, ok := running[s]
		_, ended := p.ended[s]
		_, endedOld := p.endedOld[s]
		if !ok && !ended && !endedOld {
			out = append(out, s)
		}
	}
	return out
}

// rotateEnded forgets the sequences tombstoned before the previous call.
// The loop calls it every few heartbeats, so a tombstoned sequence stays
// "ending" for at least that long: ample for the in-band tombstone to
// reach every stage.
func (p *remote) rotateEnded() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endedOld, p.ended = p.ended, p.endedOld
	clear(p.ended)
}

// highestSeq returns the highest sequence ID dispatched.
func (p *remote) highestSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.maxSeq
}

// failedByReason returns the failed batches by code name.
func (p *remote) failedByReason() map[string]uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]uint64, len(p.failed))
	for c, n := range p.failed {
		out[c.String()] = n
	}
	return out
}

// setPlacement switches to a new placement version (not ready until
// resume): every sequence of the old version ends on the shards, so the
// pending in-band tombstones are dropped. The pause before it (the core's
// ActPause) failed every batch in flight, so every batch in flight was
// sent on the current version.
func (p *remote) setPlacement(pl *Placement) {
	p.mu.Lock()
	p.stages, p.blocks, p.blockSize, p.version = len(pl.Stages), pl.Blocks, pl.BlockSize, pl.Version
	p.stageIDs = make([]string, len(pl.Stages))
	for i, st := range pl.Stages {
		p.stageIDs[i] = st.ShardID
	}
	p.pending = nil
	p.mu.Unlock()
	p.notify()
}

// resume starts dispatching on l (of the current version).
func (p *remote) resume(l *link) bool {
	p.mu.Lock()
	if l.version != p.version {
		p.mu.Unlock()
		return false
	}
	p.link = l
	p.mu.Unlock()
	p.notify()
	return true
}

// pause stops dispatching and has led take every batch in flight as lost
// with reason; it returns the link it detached (nil if none) for the
// caller to close.
func (p *remote) pause(reason string, led ledger) *link {
	n := 0
	if led != nil {
		n, _ = led.inFlight()
	}
	p.mu.Lock()
	l := p.link
	p.link = nil
	p.busySince = time.Time{}
	if n > 0 {
		p.failed[transport.CodePipelineLost] += uint64(n)
	}
	p.mu.Unlock()
	if n > 0 {
		led.lose(reason)
	}
	if l != nil {
		p.notify()
	}
	return l
}

// current reports whether l is the link batches go to.
func (p *remote) current(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.link == l
}

// ready reports whether batches can be dispatched.
func (p *remote) ready() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.link != nil
}

// source is where an answer about a batch came from: the stage-0 link it
// was sent on (whose replies relay every stage's failures), or the Results
// or control stream of the shard shard.
type source struct {
	link    *link
	results bool
	shard   string
}

func fromLink(l *link) source         { return source{link: l} }
func fromResults(shard string) source { return source{results: true, shard: shard} }
func fromControl(shard string) source { return source{shard: shard} }
func (s source) String() string {
	switch {
	case s.link != nil:
		return "stage-0 link to " + s.link.shardID
	case s.results:
		return "results stream of " + s.shard
	}
	return "control stream of " + s.shard
}

// flight is a batch in flight as an answer about it is admitted: its rows
// (the ledger's record) and the placement it was sent on, the current one
// (a pause fails every batch in flight before the placement changes).
type flight struct {
	version uint64
	stages  []string        // the placement's shards, stage order (the last returns the result)
	rows    map[uint64]bool // sequence → whether its row asked for a sample
}

// flight returns batch id as led holds it in flight, or nil.
func (p *remote) flight(led ledger, id uint64) *flight {
	if led == nil {
		return nil
	}
	rows, ok := led.rows(id, nil)
	if !ok {
		return nil
	}
	fl := &flight{rows: make(map[uint64]bool, len(rows))}
	for _, r := range rows {
		fl.rows[uint64(r.Seq)] = fl.rows[uint64(r.Seq)] || r.Sample
	}
	p.mu.Lock()
	fl.version, fl.stages = p.version, p.stageIDs
	p.mu.Unlock()
	return fl
}

// admits reports whether an answer about fl may come from src: on the
// link of fl's placement version, from the last stage of fl's placement on
// Results, or from any of its stages on Control; claimed is the shard the
// message names (a relayed failure names the stage that failed it).
func (src source) admits(fl *flight, claimed string) bool {
	switch {
	case src.link != nil:
		return src.link.version == fl.version && (claimed == "" || slices.Contains(fl.stages, claimed))
	case src.results:
		return len(fl.stages) > 0 && src.shard == fl.stages[len(fl.stages)-1] && (claimed == "" || claimed == src.shard)
	}
	return slices.Contains(fl.stages, src.shard) && (claimed == "" || claimed == src.shard)
}

// checkFailure checks a BatchFailed as it arrives, on the goroutine that
// read it: well formed (transport.FailedFromWire: its reason a Code, its
// epoch this start's). It returns the failure, or nil after counting the
// refusal; the loop then admits it (takeFailure).
func (p *remote) checkFailure(w *pb.BatchFailed) *transport.Failure {
	f, err := transport.FailedFromWire(w, p.epoch)
	if err != nil {
		p.refused.Count(err)
		return nil
	}
	return f
}

// takeFailure admits a checked failure from src for a batch led holds in
// flight that src may answer for, naming only that batch's rows. Without
// seqs the batch is lost; with seqs those rows are dropped (led.drop). It
// returns the refusal (counted) of a failure it did not take.
func (p *remote) takeFailure(f *transport.Failure, src source, led ledger) error {
	err := p.admitFailure(f, src, led)
	if err != nil {
		p.refused.Count(err)
		return err
	}
	p.mu.Lock()
	p.failed[f.Code]++
	p.mu.Unlock()
	if len(f.Seqs) > 0 {
		led.drop(f.Batch, f.Seqs, rowCode(f.Code).String())
		return nil
	}
	led.answer(&transport.BatchResult{Epoch: p.epoch, ID: f.Batch, Lost: true, Reason: fmt.Sprintf("shard %s: %s", f.Shard, f.Code)})
	p.answered(led)
	return nil
}

func (p *remote) admitFailure(f *transport.Failure, src source, led ledger) error {
	fl := p.flight(led, f.Batch)
	switch {
	case fl == nil:
		return &transport.RefusedError{Code: transport.CodeUnknownBatch, Detail: fmt.Sprintf("failure of batch %d, not in flight", f.Batch)}
	case !src.admits(fl, f.Shard):
		return &transport.RefusedError{Code: transport.CodeWrongSender, Detail: fmt.Sprintf("failure of batch %d on the %v, which does not carry it", f.Batch, src)}
	}
	for _, s := range f.Seqs {
		if _, ok := fl.rows[s]; !ok {
			return &transport.RefusedError{Code: transport.CodeUnknownBatch, Detail: fmt.Sprintf("failure of batch %d names sequence %d, not one of its rows", f.Batch, s)}
		}
	}
	return nil
}

// rowCode is the row code a BatchFailed naming rows reports them with:
// its own when it is one, else compute_error (the stage could not compute
// them).
func rowCode(c transport.Code) transport.Code {
	if c.Row() {
		return c
	}
	return transport.CodeComputeError
}

// failOwn fails batch id whole for code, if led holds it in flight: the
// coordinator's own verdict (its link refused to send it).
func (p *remote) failOwn(id uint64, code transport.Code, led ledger) {
	if p.flight(led, id) == nil {
		return
	}
	p.mu.Lock()
	p.failed[code]++
	p.mu.Unlock()
	led.answer(&transport.BatchResult{Epoch: p.epoch, ID: id, Lost: true, Reason: "coordinator: " + code.String()})
	p.answered(led)
}

// checkResult checks a result as it arrives on the Results stream, on the
// handler's goroutine: well formed (transport.ResultFromWire: its epoch,
// counts, tokens inside the vocabulary). It returns the result, or nil
// after counting the refusal; the loop then admits it (takeResult).
func (p *remote) checkResult(w *pb.BatchResult) *transport.BatchResult {
	r, err := transport.ResultFromWire(w, transport.ResultLimits{Epoch: p.epoch, Vocab: p.vocab})
	if err != nil {
		p.refused.Count(err)
		return nil
	}
	return r
}

// takeResult admits a checked result for a batch led holds in flight,
// from src: the last stage of the batch's placement, of that placement
// version, sampling only rows that asked and dropping only the batch's
// rows, each once; led then takes it. A result refused is counted and
// returned; the batch stays in flight (its reclaim deadline fails it if no
// good answer comes).
func (p *remote) takeResult(r *transport.BatchResult, src source, led ledger) error {
	if err := p.admitResult(r, src, led); err != nil {
		p.refused.Count(err)
		return err
	}
	led.answer(r)
	p.answered(led)
	return nil
}

func (p *remote) admitResult(r *transport.BatchResult, src source, led ledger) error {
	fl := p.flight(led, r.ID)
	switch {
	case fl == nil || fl.version != r.Placement:
		return &transport.RefusedError{Code: transport.CodeUnknownBatch, Detail: fmt.Sprintf("result of batch %d (placement %d), not in flight", r.ID, r.Placement)}
	case !src.admits(fl, ""):
		return &transport.RefusedError{Code: transport.CodeWrongSender, Detail: fmt.Sprintf("result of batch %d on the %v, which does not return it", r.ID, src)}
	}
	seen := make(map[uint64]bool, len(r.Samples)+len(r.Dropped))
	for _, s := range r.Samples {
		if sample, ok := fl.rows[s.Seq]; !ok || !sample || seen[s.Seq] {
			return &transport.RefusedError{Code: transport.CodeUnknownBatch, Detail: fmt.Sprintf("result of batch %d samples sequence %d, not a row of it that asked once", r.ID, s.Seq)}
		}
		seen[s.Seq] = true
	}
	for _, d := range r.Dropped {
		if _, ok := fl.rows[d.Seq]; !ok || seen[d.Seq] {
			return &transport.RefusedError{Code: transport.CodeUnknownBatch, Detail: fmt.Sprintf("result of batch %d drops sequence %d, not a row of it, or twice", r.ID, d.Seq)}
		}
		seen[d.Seq] = true
	}
	return nil
}

// link is the coordinator's stage stream to stage 0 of one placement
// version: a sender goroutine draining queue and a receiver of replies.
type link struct {
	version uint64
	shardID string
	addr    string
	queue   chan *pb.BatchHeader // linkQueue deep
	cancel  context.CancelFunc
}

// runLink dials stage 0, opens the stream on ctx (the link's own, which
// the loop cancels to drop it), reports it up, then sends batches until the
// stream breaks or ctx ends, and reports it down. Reports go to the loop
// under runCtx.
func (c *Cluster) runLink(runCtx, ctx context.Context, l *link) {
	defer l.cancel()
	cc, err := transport.Dial(l.addr, c.cfg.StageDialOptions...)
	if err != nil {
		c.post(runCtx, evLink{l: l, err: err})
		return
	}
	defer cc.Close()
	stream, err := pb.NewStageClient(cc).Stream(ctx)
	if err != nil {
		c.post(runCtx, evLink{l: l, err: fmt.Errorf("open stage stream to %s: %w", l.addr, err)})
		return
	}
	c.post(runCtx, evLink{l: l, up: true})
	recvErr := make(chan error, 1) // the receiver's one report
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			rep, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if w := rep.GetFailed(); w != nil {
				var f *transport.Failure
				transport.Recover(c.log, &c.refused, "stage-0 reply", func() { f = c.pipe.checkFailure(w) })
				if f != nil && !c.post(runCtx, evAnswer{failure: f, src: fromLink(l)}) {
					recvErr <- errors.New("cluster stopping")
					return
				}
			}
		}
	})
	err = c.sendLoop(ctx, l, stream, recvErr)
	l.cancel() // ends the receiver
	wg.Wait()
	if err == nil {
		err = errors.New("link closed")
	}
	c.post(runCtx, evLink{l: l, err: err})
}

func (c *Cluster) sendLoop(ctx context.Context, l *link, stream pb.Stage_StreamClient, recvErr <-chan error) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-recvErr:
			return fmt.Errorf("stage stream to %s: %w", l.addr, err)
		case h := <-l.queue:
			err := transport.SendBatch(stream, h, nil)
			if be, ok := errors.AsType[*transport.BatchError](err); ok {
				if !c.post(ctx, evFailOwn{id: be.BatchID, code: be.Reason}) {
					return nil
				}
				continue
			}
			if err != nil {
				return fmt.Errorf("stage stream to %s: %w", l.addr, err)
			}
		}
	}
}
