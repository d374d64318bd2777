package shard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// placement is the range a shard serves under one placement version: the
// loaded model, its Runner (fresh replica table) and the downstream link.
// Its fields other than busy are immutable; the Runner guards its own
// state (a batch computes outside Node.mu).
type placement struct {
	// busy serializes the batches run on this placement, from the Runner's
	// Process to the outgoing message: a Result aliases the Runner's
	// buffers until its next batch. Two upstream streams may overlap for a
	// moment (a reconnect); only the batch path takes it.
	busy sync.Mutex

	version    uint64
	assign     *pb.Assign
	runner     *Runner
	release    func() // frees the stage's device memory; nil on the CPU
	model      *loadedModel
	link       *link
	last       bool
	embd       int
	hiddenType pb.HiddenType
	maxHidden  int64 // RecvBatch's limit, bytes
	// limits is what BatchFromWire checks a batch against, but for the
	// epoch, which is the runner's (batchLimits).
	limits transport.BatchLimits
}

// batchLimits returns what a batch for p must satisfy now: p's shapes and
// the epoch its runner was moved to by the control stream.
func (p *placement) batchLimits() transport.BatchLimits {
	l := p.limits
	l.Epoch = p.runner.Epoch()
	return l
}

// close ends the runner (waiting for a batch in progress, freeing every
// sequence), stops the link (waiting for its goroutine) and releases the
// model.
func (p *placement) close() {
	p.runner.Close()
	p.link.close()
	if p.release != nil {
		p.release() // device memory: the runner has no batch in progress now
	}
	p.model.release()
}

// newPlacement loads a's range and builds its KV pool, Runner and link.
func (n *Node) newPlacement(runCtx, lctx context.Context, a *pb.Assign) (*placement, error) {
	lm, err := n.models.get(lctx, n, a)
	if err != nil {
		return nil, err
	}
	p, err := n.buildPlacement(runCtx, lm, a)
	if err != nil {
		lm.release()
		return nil, err
	}
	return p, nil
}

func (n *Node) buildPlacement(runCtx context.Context, lm *loadedModel, a *pb.Assign) (*placement, error) {
	m := lm.m
	first, end := int(a.GetFirstLayer()), int(a.GetEndLayer())
	if first >= end || end > m.Layers {
		return nil, fmt.Errorf("assigned layers [%d, %d) are not inside the model's [0, %d)", first, end, m.Layers)
	}
	if a.GetEmbed() != (first == 0) || a.GetHead() != (end == m.Layers) {
		return nil, fmt.Errorf("assign says embed=%v head=%v for layers [%d, %d) of %d", a.GetEmbed(), a.GetHead(), first, end, m.Layers)
	}
	if a.GetHead() != (a.GetNextAddr() == "") {
		return nil, fmt.Errorf("assign has head=%v with next_addr %q: the last stage, and only it, sends results to the coordinator", a.GetHead(), a.GetNextAddr())
	}
	var typ ggml.Type
	switch a.GetKvType() {
	case pb.KVType_KV_TYPE_F16:
		typ = ggml.F16
	case pb.KVType_KV_TYPE_F32:
		typ = ggml.F32
	default:
		return nil, fmt.Errorf("assign names KV type %v, which this shard does not know", a.GetKvType())
	}
	if _, err := transport.ElemSize(a.GetHiddenType()); err != nil {
		return nil, fmt.Errorf("assign: %w", err)
	}
	bs := int(a.GetBlockSize())
	if bs == 0 {
		bs = cpu.DefaultBlockSize
	}
	blocks := int(a.GetKvBlocks())
	if blocks <= 0 {
		return nil, fmt.Errorf("assign names a KV pool of %d blocks", blocks)
	}
	var st Stage
	var release func()
	// A model with more than one block table per sequence (Gemma's
	// sliding layers) groups its KV on the CPU: a block ID holds one
	// group's layers, so the pool needs only the stage's largest group's
	// slots per block, and rows carry the sliding tables
	// (docs/sliding-window-kv.md). The CUDA plan refuses such models.
	groups := m.KVGroups()
	grouped := groups.Groups > 1 && n.gpu == nil
	if n.gpu != nil {
		var err error
		if st, release, err = n.gpuStage(m, first, end, blocks, bs, typ == ggml.F16); err != nil {
			return nil, err
		}
	} else {
		kcfg := cpu.KVConfig{Layers: end - first, Blocks: blocks, BlockSize: bs, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: typ}
		if grouped {
			kcfg.Layers = groups.Slots(first, end)
		}
		if need := cpu.KVBytes(kcfg); n.cfg.KVMemory > 0 && need > n.cfg.KVMemory {
			return nil, fmt.Errorf("assigned KV pool of %d blocks × %d positions needs %d bytes, --kv-memory is %d", blocks, bs, need, n.cfg.KVMemory)
		}
		kv, err := cpu.NewKV(kcfg)
		if err != nil {
			return nil, err
		}
		ms, err := model.NewStage(m, first, end, cpu.NewBackend(n.pool), kv)
		if err != nil {
			return nil, err
		}
		if grouped {
			ms.GroupKV()
		}
		st = ms
	}
	p := &placement{
		version:    a.GetPlacementVersion(),
		assign:     a,
		release:    release,
		runner:     NewRunner(st, blocks, bs),
		model:      lm,
		last:       a.GetHead(),
		embd:       m.Embd,
		hiddenType: a.GetHiddenType(),
	}
	if p.last {
		p.runner.SetVocab(ModelVocab(lm.sha, lm.file)) // constrained decoding
	}
	if t := int64(a.GetMaxBatchTokens()); t > 0 {
		p.maxHidden = t * int64(m.Embd) * 4
	}
	p.limits = transport.BatchLimits{Placement: p.version, Context: m.Context, Vocab: m.Vocab, Blocks: blocks, BlockSize: bs, MaxTokens: int(a.GetMaxBatchTokens())}
	if grouped {
		p.limits.Groups, p.limits.Window = groups.Groups, m.SlidingWindow
	}
	if !a.GetEmbed() {
		p.limits.Hidden = m.Embd
	}
	p.link = n.startLink(runCtx, a.GetNextAddr())
	return p, nil
}

// stageServer serves Stage.Stream.
type stageServer struct {
	pb.UnimplementedStageServer
	n *Node
}

var _ pb.StageServer = stageServer{}

// upstream is the reply side of the current upstream stage stream.
type upstream struct {
	// replies bound: 64 failure reports, far more than batches in flight;
	// when full, reports go to the control stream (Node.report).
	replies chan *pb.BatchFailed
}

// replyQueue is upstream.replies' bound.
const replyQueue = 64

// Stream receives batches from the upstream hop, in order, and runs them.
// Failures go back on the same stream from one reply goroutine.
func (s stageServer) Stream(stream pb.Stage_StreamServer) error {
	n := s.n
	ctx := stream.Context()
	up := &upstream{replies: make(chan *pb.BatchFailed, replyQueue)}
	n.upMu.Lock()
	n.up = up
	n.upMu.Unlock()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case f := <-up.replies:
				if err := stream.Send(&pb.StageReply{Msg: &pb.StageReply_Failed{Failed: f}}); err != nil {
					return
				}
			}
		}
	})
	var last *pb.BatchFailed // a receive error's report, sent after the reply goroutine ends
	defer func() {
		n.upMu.Lock()
		if n.up == up {
			n.up = nil
		}
		n.upMu.Unlock()
		close(done)
		wg.Wait()
		// This goroutine is now the stream's only sender.
		for {
			select {
			case f := <-up.replies:
				if stream.Send(&pb.StageReply{Msg: &pb.StageReply_Failed{Failed: f}}) != nil {
					return
				}
				continue
			default:
			}
			break
		}
		if last != nil {
			_ = stream.Send(&pb.StageReply{Msg: &pb.StageReply_Failed{Failed: last}})
		}
	}()
	for {
		b, err := transport.RecvBatch(stream, n.maxHiddenBytes())
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if be, ok := errors.AsType[*transport.BatchError](err); ok {
				n.counters.fail(be.Reason)
				n.refused.Count(err)
				last = be.BatchFailed(n.ShardID())
				n.log.Warn("malformed batch; closing stage stream", "err", err)
				return status.Error(codes.InvalidArgument, err.Error())
			}
			return err
		}
		n.handle(b, up)
	}
}

// maxHiddenBytes is the current placement's hidden-state limit.
func (n *Node) maxHiddenBytes() int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	var m int64
	if n.p != nil {
		m = n.p.maxHidden
	}
	if n.staged != nil {
		m = max(m, n.staged.maxHidden)
	}
	return m
}

// outMsg is one message for a downstream link: a batch for the next stage
// (header and hidden state) or, on the last stage, a result.
type outMsg struct {
	header *pb.BatchHeader
	hidden []float32
	result *pb.BatchResult
}

// batchHeader returns the header naming m's batch.
func (m *outMsg) batchHeader() *pb.BatchHeader {
	if m.header != nil {
		return m.header
	}
	r := m.result
	return &pb.BatchHeader{BatchId: r.GetBatchId(), Epoch: r.GetEpoch(), PlacementVersion: r.GetPlacementVersion()}
}

// stageError is why a stage failed a batch whole, or the rows of seqs.
type stageError struct {
	code transport.Code
	seqs []uint64
	err  error
}

func (e *stageError) Error() string { return e.err.Error() }

// handle runs one batch that arrived on up: it is checked against the
// placement it would run on (transport.BatchFromWire: a refused batch is
// failed whole with the refusal's code, and nothing of it is applied,
// computed or forwarded), then the Runner applies its tombstones, places
// or drops its rows and computes, and what it produced is queued
// downstream.
func (n *Node) handle(b *transport.Batch, up *upstream) {
	h := b.Header
	start := time.Now()
	out, err := n.process(b, start)
	if err != nil {
		se, ok := errors.AsType[*stageError](err)
		if !ok {
			se = &stageError{code: transport.CodeBackendError, err: err}
		}
		n.failBatch(up, h, se.code, se.seqs, err.Error())
		return
	}
	took := time.Since(start)
	n.counters.batch(out.tokens, took)
	n.collector.latency.WithLabelValues(n.shardLabel()).Observe(took.Seconds())
	if out.dropped > 0 {
		n.log.Debug("rows dropped", "batch", h.GetBatchId(), "dropped", out.dropped)
	}
	if out.msg == nil {
		return // a tombstone-only batch ends at the last stage
	}
	if !out.link.enqueue(out.msg) {
		n.failBatch(up, h, transport.CodeDownstreamQueueFull, nil, "the link's queue is full or closed")
	}
}

// processed is what process made of one batch.
type processed struct {
	msg     *outMsg // nil: nothing goes downstream
	link    *link
	tokens  int // tokens computed or refused
	dropped int // rows this stage dropped
}

// process checks and runs b on the current placement. Node.mu is held only
// to read which placement that is: the batch computes outside it, so
// heartbeats, lease checks, tombstones and metrics never wait for a
// forward pass (the Runner guards its own state).
func (n *Node) process(b *transport.Batch, now time.Time) (*processed, error) {
	shardID := n.ShardID()
	n.mu.Lock()
	staged := n.staged != nil && b.Header.GetPlacementVersion() == n.staged.version
	n.mu.Unlock()
	if staged {
		n.promote(b.Header.GetPlacementVersion())
	}
	n.mu.Lock()
	p := n.p
	n.mu.Unlock()
	if p == nil {
		return nil, &stageError{code: transport.CodeNotReady, err: errors.New("no range assigned")}
	}
	p.busy.Lock()
	defer p.busy.Unlock()
	mb, err := transport.BatchFromWire(b, p.batchLimits())
	if err != nil {
		n.refused.Count(err)
		return nil, &stageError{code: transport.CodeOf(err), err: err}
	}
	res, err := p.runner.Process(mb, now)
	switch {
	case errors.Is(err, ErrStaleEpoch):
		return nil, &stageError{code: transport.CodeStaleEpoch, err: err}
	case errors.Is(err, ErrFutureEpoch):
		return nil, &stageError{code: transport.CodeFutureEpoch, err: err}
	case errors.Is(err, ErrClosed):
		return nil, &stageError{code: transport.CodeNotReady, err: err}
	case err != nil:
		se := &stageError{code: transport.CodeBackendError, err: err}
		for _, r := range mb.Rows {
			se.seqs = append(se.seqs, r.Seq)
		}
		return nil, se
	}
	out := &processed{link: p.link, dropped: len(res.Dropped)}
	for _, r := range mb.Rows {
		out.tokens += len(r.Tokens)
	}
	dropped := slices.Clip(mb.Dropped)
	for _, d := range res.Dropped {
		dropped = append(dropped, transport.Dropped{Seq: d.Seq, Reason: d.Code, Shard: shardID})
	}
	if !p.last {
		fwd := &transport.MicroBatch{
			Epoch: mb.Epoch, Placement: mb.Placement, ID: mb.ID, TTL: mb.TTL,
			Tombstones: mb.Tombstones, Rows: res.Rows, Dropped: dropped,
			Hidden: slices.Clone(res.Hidden), // res.Hidden is the Stage's buffer
		}
		h, err := transport.HeaderToWire(fwd, p.hiddenType)
		if err != nil {
			return nil, &stageError{code: transport.CodeOf(err), err: err}
		}
		out.msg = &outMsg{header: h, hidden: fwd.Hidden}
		return out, nil
	}
	// A tombstone-only batch (ID 0, nothing dropped) ends at the last stage:
	// the coordinator expects no result for it.
	if mb.ID == 0 && len(dropped) == 0 && len(res.Samples) == 0 {
		return out, nil
	}
	next := make(map[uint64]int, len(res.Rows)) // a sampled row's next position
	for _, r := range res.Rows {
		next[r.Seq] = r.Pos + len(r.Tokens)
	}
	result := &transport.BatchResult{Epoch: mb.Epoch, Placement: mb.Placement, ID: mb.ID, Dropped: dropped}
	for _, s := range res.Samples {
		sm := transport.Sampled{Seq: s.Seq, Pos: next[s.Seq], Token: s.Result.Token}
		if s.Logprobs {
			sm.Logprob, sm.Top = s.Result.Logprob, s.Result.Top
		}
		result.Samples = append(result.Samples, sm)
	}
	out.msg = &outMsg{result: transport.ResultToWire(result).GetResult()}
	return out, nil
}

// failBatch reports that this shard failed the batch h (every row when seqs
// is empty) for code and counts it. The report goes back on up, the stream
// the batch came on, when there is one.
func (n *Node) failBatch(up *upstream, h *pb.BatchHeader, code transport.Code, seqs []uint64, detail string) {
	n.counters.fail(code)
	n.log.Warn("batch failed", "batch", h.GetBatchId(), "epoch", h.GetEpoch(), "placement", h.GetPlacementVersion(), "reason", code, "detail", detail)
	n.reportTo(up, transport.FailedToWire(&transport.Failure{Epoch: h.GetEpoch(), Batch: h.GetBatchId(), Seqs: seqs, Code: code, Shard: n.ShardID()}))
}

// report sends a failure upstream without blocking: on the current
// upstream stage stream, or, without one (or when its queue is full), on
// the control stream; when both are full it is counted and dropped (the
// coordinator's reclaim deadline fails the batch).
func (n *Node) report(f *pb.BatchFailed) { n.reportTo(nil, f) }

// reportTo is report on up, the stream the failed batch came on, or, when
// up is nil, the current upstream stream.
func (n *Node) reportTo(up *upstream, f *pb.BatchFailed) {
	if up == nil {
		n.upMu.Lock()
		up = n.up
		n.upMu.Unlock()
	}
	if up != nil {
		select {
		case up.replies <- f:
			return
		default:
		}
	}
	select {
	case n.ctlOut <- f:
	default:
		n.counters.lose()
	}
}

// link is a placement's downstream hop: one sender goroutine draining a
// bounded queue onto a Stage.Stream to the next stage, or onto
// Coordinator.Results on the last stage.
type link struct {
	// queue holds batches waiting for the network, at most
	// Config.QueueDepth; when it is full the batch is failed upstream
	// (downstream_queue_full) rather than blocking the stage.
	queue  chan *outMsg
	done   chan struct{} // closed when the sender goroutine exited
	cancel context.CancelFunc
}

// enqueue queues m without blocking; false means the queue is full or the
// link is closed.
func (l *link) enqueue(m *outMsg) bool {
	select {
	case <-l.done:
		return false
	default:
	}
	select {
	case l.queue <- m:
		return true
	default:
		return false
	}
}

// close stops the sender and waits for it.
func (l *link) close() {
	l.cancel()
	<-l.done
}

// startLink starts the sender for next ("" sends results to the
// coordinator); it runs until close or ctx ends.
func (n *Node) startLink(ctx context.Context, next string) *link {
	ctx, cancel := context.WithCancel(ctx)
	l := &link{queue: make(chan *outMsg, n.cfg.QueueDepth), done: make(chan struct{}), cancel: cancel}
	n.wg.Go(func() {
		defer close(l.done)
		if next == "" {
			n.runResults(ctx, l)
		} else {
			n.runNext(ctx, l, next)
		}
		// Whatever is still queued will never be sent.
		for {
			select {
			case m := <-l.queue:
				n.failBatch(nil, m.batchHeader(), transport.CodeDownstreamUnavailable, nil, "link closed")
			default:
				return
			}
		}
	})
	return l
}

// runNext sends batches to the next stage. The stream is opened on the
// first batch and reopened after a failure; a batch whose send fails is
// failed upstream, never retried. A second goroutine relays the next
// stage's BatchFailed replies upstream.
func (n *Node) runNext(ctx context.Context, l *link, next string) {
	cc, err := transport.Dial(next, n.shardDial...)
	if err != nil {
		n.log.Error("dial next stage", "next", next, "err", err)
		<-ctx.Done()
		return
	}
	defer cc.Close()
	var (
		stream  pb.Stage_StreamClient
		scancel context.CancelFunc
		relay   sync.WaitGroup
	)
	closeStream := func() {
		if stream == nil {
			return
		}
		_ = stream.CloseSend()
		scancel()
		relay.Wait()
		stream = nil
	}
	defer closeStream()
	for {
		var m *outMsg
		select {
		case <-ctx.Done():
			return
		case m = <-l.queue:
		}
		if stream == nil {
			sctx, cancel := context.WithCancel(ctx)
			s, err := pb.NewStageClient(cc).Stream(sctx)
			if err != nil {
				cancel()
				n.failBatch(nil, m.header, transport.CodeDownstreamUnavailable, nil, fmt.Sprintf("open stage stream to %s: %v", next, err))
				continue
			}
			stream, scancel = s, cancel
			relay.Go(func() {
				for {
					r, err := s.Recv()
					if err != nil {
						return
					}
					if f := r.GetFailed(); f != nil {
						n.report(f)
					}
				}
			})
		}
		if err := transport.SendBatch(stream, m.header, m.hidden); err != nil {
			n.failBatch(nil, m.header, transport.CodeDownstreamUnavailable, nil, fmt.Sprintf("send to %s: %v", next, err))
			closeStream()
		}
	}
}

// runResults sends the last stage's results on Coordinator.Results, opened
// with StreamHello on the first result and reopened when it broke or the
// registration changed (a new coordinator or epoch).
func (n *Node) runResults(ctx context.Context, l *link) {
	var (
		cc      *grpc.ClientConn
		ccAddr  string
		stream  pb.Coordinator_ResultsClient
		scancel context.CancelFunc
		epoch   uint64
	)
	closeStream := func() {
		if stream == nil {
			return
		}
		_ = stream.CloseSend()
		scancel()
		stream = nil
	}
	defer func() {
		closeStream()
		if cc != nil {
			cc.Close()
		}
	}()
	open := func() error {
		addr, e, shardID := n.coordinator()
		if addr == "" {
			return errors.New("not registered with a coordinator")
		}
		if cc == nil || addr != ccAddr {
			closeStream()
			if cc != nil {
				cc.Close()
			}
			c, err := transport.Dial(addr, n.coordDial...)
			if err != nil {
				return err
			}
			cc, ccAddr = c, addr
		}
		sctx, cancel := context.WithCancel(ctx)
		s, err := pb.NewCoordinatorClient(cc).Results(sctx)
		if err == nil {
			err = s.Send(&pb.ResultMessage{Msg: &pb.ResultMessage_Hello{Hello: &pb.StreamHello{ShardId: shardID, NodeId: n.nodeID, Incarnation: n.incarnation, Epoch: e}}})
		}
		if err != nil {
			cancel()
			return err
		}
		stream, scancel, epoch = s, cancel, e
		return nil
	}
	for {
		var m *outMsg
		select {
		case <-ctx.Done():
			return
		case m = <-l.queue:
		}
		msg := &pb.ResultMessage{Msg: &pb.ResultMessage_Result{Result: m.result}}
		var err error
		for try := 0; try < 2; try++ {
			if addr, e, _ := n.coordinator(); stream != nil && (e != epoch || addr != ccAddr) {
				closeStream()
			}
			if stream == nil {
				if err = open(); err != nil {
					break
				}
			}
			if err = stream.Send(msg); err == nil {
				break
			}
			// io.EOF: the coordinator ended the stream and the message was
			// not sent; reopen and send it once more.
			closeStream()
			if err != io.EOF {
				break
			}
		}
		if err != nil {
			n.failBatch(nil, m.batchHeader(), transport.CodeResultsUnavailable, nil, err.Error())
		}
	}
}
