package coordinator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

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
	results  chan *transport.BatchResult // unbuffered: the forwarder goroutine sends
	resKick  chan struct{}               // size 1: results queued
	tombKick chan struct{}               // size 1: backstop tombstones queued for the cluster loop

	mu        sync.Mutex
	stages    int
	blocks    int
	blockSize int
	version   uint64 // the placement version batches are stamped with
	link      *link  // nil while not ready
	inflight  map[uint64]*flight
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
	failed   map[string]uint64 // BatchFailed (and losses) by reason
}

// flight is a dispatched batch awaiting its answer.
type flight struct {
	version uint64
	dropped []transport.Dropped // rows named by BatchFailed reports so far
}

var _ Pipeline = (*remote)(nil)

func newRemote(epoch uint64) *remote {
	return &remote{
		epoch:    epoch,
		results:  make(chan *transport.BatchResult),
		resKick:  make(chan struct{}, 1),
		tombKick: make(chan struct{}, 1),
		inflight: map[uint64]*flight{},
		live:     map[uint64]struct{}{},
		ended:    map[uint64]struct{}{},
		endedOld: map[uint64]struct{}{},
		failed:   map[string]uint64{},
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
	if b.ID != 0 {
		p.inflight[b.ID] = &flight{version: l.version}
	}
	h := headerFromBatch(b, l.version, 0)
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

func (p *remote) kick(tombs bool) {
	if tombs {
		select {
		case p.tombKick <- struct{}{}:
		default:
		}
	}
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

// failedByReason returns a copy of the BatchFailed counters.
func (p *remote) failedByReason() map[string]uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.failed)
}

// setPlacement switches to a new placement version (not ready until
// resume): every sequence of the old version is gone on the shards, so the
// live set and the pending in-band tombstones are dropped.
func (p *remote) setPlacement(pl *Placement) {
	p.mu.Lock()
	p.stages, p.blocks, p.blockSize, p.version = len(pl.Stages), pl.Blocks, pl.BlockSize, pl.Version
	clear(p.live)
	p.pending = nil
	p.mu.Unlock()
}

// resume starts dispatching on l (of the current version).
func (p *remote) resume(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.version != p.version {
		return false
	}
	p.link = l
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
	if n > 0 {
		p.failed["pipeline_lost"] += uint64(n)
	}
	p.mu.Unlock()
	p.kickResults()
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

// batchFailed takes a BatchFailed from a stage reply stream or a control
// stream: without seqs the batch is lost, with seqs those rows are noted
// and reported with the batch's result.
func (p *remote) batchFailed(f *pb.BatchFailed) {
	if f.GetEpoch() != 0 && f.GetEpoch() != p.epoch {
		return
	}
	p.mu.Lock()
	fl := p.inflight[f.GetBatchId()]
	reason := f.GetReason()
	if reason == "" {
		reason = "unspecified"
	}
	p.failed[reason]++
	if fl == nil {
		p.mu.Unlock()
		return
	}
	if len(f.GetSeqs()) > 0 {
		for _, s := range f.GetSeqs() {
			fl.dropped = append(fl.dropped, transport.Dropped{Seq: s, Reason: reason})
		}
		p.mu.Unlock()
		return
	}
	delete(p.inflight, f.GetBatchId())
	p.queue = append(p.queue, &transport.BatchResult{Epoch: p.epoch, ID: f.GetBatchId(), Lost: true,
		Reason: fmt.Sprintf("shard %s: %s", f.GetShardId(), reason)})
	p.mu.Unlock()
	p.kickResults()
}

// deliver takes the last stage's result for a batch still in flight.
func (p *remote) deliver(r *pb.BatchResult) {
	if r.GetEpoch() != p.epoch {
		return
	}
	p.mu.Lock()
	fl := p.inflight[r.GetBatchId()]
	if fl == nil || fl.version != r.GetPlacementVersion() {
		p.mu.Unlock()
		return
	}
	delete(p.inflight, r.GetBatchId())
	p.queue = append(p.queue, resultFromPB(r, fl.dropped))
	p.mu.Unlock()
	p.kickResults()
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
			if f := rep.GetFailed(); f != nil {
				c.pipe.batchFailed(f)
				if len(f.GetSeqs()) == 0 && downstreamDown(f.GetReason()) {
					c.post(runCtx, evDownstream{version: l.version, shardID: f.GetShardId(), reason: f.GetReason()})
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
			var be *transport.BatchError
			if errors.As(err, &be) {
				c.pipe.batchFailed(be.BatchFailed("coordinator"))
				continue
			}
			if err != nil {
				return fmt.Errorf("stage stream to %s: %w", l.addr, err)
			}
		}
	}
}
