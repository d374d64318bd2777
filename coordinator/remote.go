package coordinator

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

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

// remote is the Pipeline over the cluster: Dispatch queues a batch on the
// stage-0 link's sender, results and failures come back through Results.
// Every dispatched batch with an ID gets exactly one answer: the inflight
// map is the gate (an answer removes the entry; a second one finds none).
//
// Its mutex guards plain state only; nothing is sent on a channel while it
// is held, except the non-blocking notifications after Unlock.
type remote struct {
	epoch    uint64
	vocab    int                         // the model's vocabulary; sampled tokens lie in [0, vocab)
	refused  *transport.Refusals         // the cluster's: messages refused before use
	results  chan *transport.BatchResult // unbuffered: the forwarder goroutine sends
	resKick  chan struct{}               // size 1: results queued
	tombKick chan struct{}               // size 1: backstop tombstones queued for the cluster loop
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
	inflight  map[uint64]*flight
	// busySince is since when batches have been in flight without an
	// answer to any of them (zero while none is): the control core's
	// progress clock (control.Core.Progress).
	busySince time.Time
	live      map[uint64]struct{} // sequences created by dispatched first rows and not yet tombstoned
	// ended and endedOld hold sequences tombstoned in the current and the
	// previous rotation (see rotateEnded): a heartbeat that lists one was
	// taken before its tombstone arrived, so it is not named unknown (the
	// tombstone frees it, and reconcile counters stay zero when healthy).
	ended    map[uint64]struct{}
	endedOld map[uint64]struct{}
	maxSeq   uint64
	pending  []transport.Tombstone // in-band tombstones waiting for the next batch
	backstop []transport.Tombstone // for the cluster loop to fan out on control streams
	queue    []*transport.BatchResult
	failed   map[transport.Code]uint64 // batches failed (BatchFailed and losses) by code
}

// flight is a dispatched batch awaiting its answer, and what answers it
// may name: the batch's rows, sent under placement version, whose stages
// are stages (the last one returns the result).
type flight struct {
	version uint64
	stages  []string
	rows    map[uint64]bool     // sequence → whether its row asked for a sample
	dropped []transport.Dropped // rows named by BatchFailed reports so far
	tokens  int                 // the tokens its rows carry (the progress deadline's)
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
		results:  make(chan *transport.BatchResult),
		resKick:  make(chan struct{}, 1),
		tombKick: make(chan struct{}, 1),
		changed:  make(chan struct{}, 1),
		inflight: map[uint64]*flight{},
		live:     map[uint64]struct{}{},
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

// Results implements Pipeline.
func (p *remote) Results() <-chan *transport.BatchResult { return p.results }

// Dispatch implements Pipeline without blocking: it records the batch's
// tombstones for the backstop and its first rows as live sequences, then
// queues it on the stage-0 link. Tombstones of a batch that cannot go now
// ride in the next one.
func (p *remote) Dispatch(b *transport.MicroBatch) error {
	p.mu.Lock()
	for _, t := range b.Tombstones {
		delete(p.live, t.Seq)
		p.ended[t.Seq] = struct{}{}
	}
	kickTombs := len(b.Tombstones) > 0
	p.backstop = append(p.backstop, b.Tombstones...)
	for _, r := range b.Rows {
		if r.First {
			p.live[r.Seq] = struct{}{}
		}
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
	var fl *flight
	if b.ID != 0 {
		fl = &flight{version: l.version, stages: p.stageIDs, rows: make(map[uint64]bool, len(b.Rows))}
		if len(p.inflight) == 0 {
			p.busySince = time.Now()
		}
		p.inflight[b.ID] = fl
	}
	for i := range b.Rows {
		// A first row asks for logprobs unless its request shows none
		// (Params.NoLogprob, set by the engine): the last stage then skips
		// the vocabulary-wide sum behind them.
		b.Rows[i].Logprobs = b.Rows[i].First && (b.Rows[i].Params == nil || !b.Rows[i].Params.NoLogprob)
		if fl != nil {
			fl.rows[b.Rows[i].Seq] = fl.rows[b.Rows[i].Seq] || b.Rows[i].Sample
			fl.tokens += len(b.Rows[i].Tokens)
		}
	}
	b.Placement = l.version
	h, err := transport.HeaderToWire(b, pb.HiddenType_HIDDEN_TYPE_F32)
	if err != nil {
		if b.ID != 0 {
			delete(p.inflight, b.ID)
			p.answeredLocked()
		}
		p.pending = slices.Concat(b.Tombstones, p.pending)
		p.mu.Unlock()
		p.kick(kickTombs)
		return fmt.Errorf("coordinator: batch %d: %w", b.ID, err)
	}
	p.mu.Unlock()
	p.kick(kickTombs)

	select {
	case l.queue <- h:
		return nil
	default:
	}
	p.mu.Lock()
	_, mine := p.inflight[b.ID]
	delete(p.inflight, b.ID)
	if mine {
		p.answeredLocked()
	}
	if p.link == l {
		p.pending = append(b.Tombstones, p.pending...)
	}
	p.mu.Unlock()
	if b.ID == 0 || !mine {
		// Tombstones wait for the next batch; a batch the loss handler
		// already failed has its answer.
		return nil
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

// answeredLocked moves the progress clock: an answer came, or batches
// left the flight (p.mu held).
func (p *remote) answeredLocked() {
	if len(p.inflight) == 0 {
		p.busySince = time.Time{}
	} else {
		p.busySince = time.Now()
	}
}

// progress returns since when batches have been in flight unanswered
// (zero: none in flight) and how many tokens they carry.
func (p *remote) progress() (time.Time, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	tokens := 0
	for _, fl := range p.inflight {
		tokens += fl.tokens
	}
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
// never created by this coordinator, or tombstoned before the last two
// rotations.
func (p *remote) unknown(live []uint64) []uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []uint64
	for _, s := range live {
		_, ok := p.live[s]
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

// liveCount returns how many sequences the coordinator believes live.
func (p *remote) liveCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.live)
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
// live set (moved to the ending ones) and the pending in-band tombstones
// are dropped.
func (p *remote) setPlacement(pl *Placement) {
	p.mu.Lock()
	p.stages, p.blocks, p.blockSize, p.version = len(pl.Stages), pl.Blocks, pl.BlockSize, pl.Version
	p.stageIDs = make([]string, len(pl.Stages))
	for i, st := range pl.Stages {
		p.stageIDs[i] = st.ShardID
	}
	// The old version's sequences are ending, not unknown: a shard frees
	// them when it switches (at the new version's first batch), and a
	// heartbeat taken before that is not answered with a reconcile.
	for seq := range p.live {
		p.ended[seq] = struct{}{}
	}
	clear(p.live)
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

// pause stops dispatching and fails every in-flight batch as lost with
// reason; it returns the link it detached (nil if none) for the caller to
// close.
func (p *remote) pause(reason string) *link {
	p.mu.Lock()
	l := p.link
	p.link = nil
	n := 0
	for id := range p.inflight {
		p.queue = append(p.queue, &transport.BatchResult{Epoch: p.epoch, ID: id, Lost: true, Reason: reason})
		n++
	}
	clear(p.inflight)
	p.busySince = time.Time{}
	if n > 0 {
		p.failed[transport.CodePipelineLost] += uint64(n)
	}
	p.mu.Unlock()
	p.kickResults()
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

// batchFailed takes a BatchFailed from src after checking it: well formed
// (transport.FailedFromWire: its reason a Code, its epoch this start's), for
// a batch in flight that src may answer for, naming only that batch's rows.
// Without seqs the batch is lost; with seqs those rows are noted and
// reported with the batch's result. It returns the failure it took, or the
// refusal (counted) of one it did not.
func (p *remote) batchFailed(w *pb.BatchFailed, src source) (*transport.Failure, error) {
	f, err := transport.FailedFromWire(w, p.epoch)
	if err == nil {
		err = p.takeFailure(f, src)
	}
	if err != nil {
		p.refused.Count(err)
		return nil, err
	}
	return f, nil
}

func (p *remote) takeFailure(f *transport.Failure, src source) error {
	p.mu.Lock()
	fl := p.inflight[f.Batch]
	switch {
	case fl == nil:
		p.mu.Unlock()
		return &transport.RefusedError{Code: transport.CodeUnknownBatch, Detail: fmt.Sprintf("failure of batch %d, not in flight", f.Batch)}
	case !src.admits(fl, f.Shard):
		p.mu.Unlock()
		return &transport.RefusedError{Code: transport.CodeWrongSender, Detail: fmt.Sprintf("failure of batch %d on the %v, which does not carry it", f.Batch, src)}
	}
	for _, s := range f.Seqs {
		if _, ok := fl.rows[s]; !ok {
			p.mu.Unlock()
			return &transport.RefusedError{Code: transport.CodeUnknownBatch, Detail: fmt.Sprintf("failure of batch %d names sequence %d, not one of its rows", f.Batch, s)}
		}
	}
	p.failed[f.Code]++
	if len(f.Seqs) > 0 {
		for _, s := range f.Seqs {
			if !slices.ContainsFunc(fl.dropped, func(d transport.Dropped) bool { return d.Seq == s }) {
				fl.dropped = append(fl.dropped, transport.Dropped{Seq: s, Reason: rowCode(f.Code), Shard: f.Shard})
			}
		}
		p.mu.Unlock()
		return nil
	}
	delete(p.inflight, f.Batch)
	p.answeredLocked()
	p.queue = append(p.queue, &transport.BatchResult{Epoch: p.epoch, ID: f.Batch, Lost: true,
		Reason: fmt.Sprintf("shard %s: %s", f.Shard, f.Code)})
	p.mu.Unlock()
	p.kickResults()
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

// failOwn fails in-flight batch id whole for code: the coordinator's own
// verdict (its link refused to send it).
func (p *remote) failOwn(id uint64, code transport.Code) {
	p.mu.Lock()
	if _, ok := p.inflight[id]; !ok {
		p.mu.Unlock()
		return
	}
	delete(p.inflight, id)
	p.answeredLocked()
	p.failed[code]++
	p.queue = append(p.queue, &transport.BatchResult{Epoch: p.epoch, ID: id, Lost: true, Reason: "coordinator: " + code.String()})
	p.mu.Unlock()
	p.kickResults()
}

// deliver takes the last stage's result for a batch still in flight, from
// the Results stream of shard, after checking it: well formed
// (transport.ResultFromWire: its epoch, counts, tokens inside the
// vocabulary), from the last stage of the batch's placement, of that
// placement version, sampling only rows that asked and dropping only the
// batch's rows, each once. A result refused is counted and returned; the
// batch stays in flight (its reclaim deadline fails it if no good answer
// comes).
func (p *remote) deliver(w *pb.BatchResult, shard string) error {
	r, err := transport.ResultFromWire(w, transport.ResultLimits{Epoch: p.epoch, Vocab: p.vocab})
	if err == nil {
		err = p.takeResult(r, fromResults(shard))
	}
	if err != nil {
		p.refused.Count(err)
	}
	return err
}

func (p *remote) takeResult(r *transport.BatchResult, src source) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	fl := p.inflight[r.ID]
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
	delete(p.inflight, r.ID)
	p.answeredLocked()
	for _, d := range fl.dropped {
		if !seen[d.Seq] {
			r.Dropped = append(r.Dropped, d)
		}
	}
	p.queue = append(p.queue, r)
	p.kickResults()
	return nil
}

func (p *remote) kickResults() {
	select {
	case p.resKick <- struct{}{}:
	default:
	}
}

// forward hands queued answers to Results until ctx ends. The queue holds
// at most one answer per dispatched batch, so it is bounded by the batches
// the engine keeps in flight.
func (p *remote) forward(ctx context.Context) {
	for {
		p.mu.Lock()
		q := p.queue
		p.queue = nil
		p.mu.Unlock()
		for _, r := range q {
			select {
			case p.results <- r:
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-p.resKick:
		case <-ctx.Done():
			return
		}
	}
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
				transport.Recover(c.log, &c.refused, "stage-0 reply", func() { f, _ = c.pipe.batchFailed(w, fromLink(l)) })
				if f != nil && len(f.Seqs) == 0 && downstreamDown(f.Code) {
					c.post(runCtx, evDownstream{version: l.version, shardID: f.Shard, reason: f.Code.String()})
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
				c.pipe.failOwn(be.BatchID, be.Reason)
				continue
			}
			if err != nil {
				return fmt.Errorf("stage stream to %s: %w", l.addr, err)
			}
		}
	}
}
