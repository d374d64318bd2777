package sched

import (
	"fmt"
	"slices"
	"time"

	"github.com/strata-llm/strata/kv"
)

type state uint8

const (
	waiting state = iota + 1
	running
	ended // ended, its Update not yet returned by Step
)

// lost is the internal reason for lost work: the sequence's tombstone says
// Failed and the request is requeued, or fails after MaxRetries.
const lost Reason = 255

// request is a request's state for its whole life.
type request struct {
	id        RequestID
	tokens    []int32 // prompt, then generated tokens
	prompt    int
	maxTokens int
	stop      []int32
	order     uint64 // Add order; the waiting list is sorted by it

	queueDue    time.Time // first admission deadline, while hasQueueDue
	hasQueueDue bool
	deadline    time.Time
	hasDeadline bool
	heapIdx     int // position in the deadline heap, -1 when absent

	state    state
	seq      *sequence // live sequence while running
	tries    int       // sequences lost with their batch
	reason   Reason    // when ended
	reported int       // tokens[:reported] were returned in Updates
	dirty    bool      // in Scheduler.dirty
	tomb     int       // index in Scheduler.tombs of the tombstone its ending emitted, or -1

	prev, next *request // waiting list links
}

// sequence is one admission of a request.
type sequence struct {
	id        SeqID
	req       *request
	table     *kv.Table // its block table's handle, while running (nil once ended)
	scheduled int       // positions dispatched: r.tokens[:scheduled]
	computed  int       // positions whose results came back
	capacity  int       // positions its block table covers
	dead      bool      // ended; rows and queue entries naming it are ignored
	prefill   bool      // in Scheduler.prefill
	seen      int       // scratch for CheckInvariants

	prev, next *sequence // running list links
}

// recRow is the scheduler's record of one dispatched row.
type recRow struct {
	seq    *sequence
	pos, n int
	nblk   int // blocks covering [0, pos+n), set by emit
	first  bool
	sample bool
}

// batchRec is the record of one batch being built or in flight.
type batchRec struct {
	id      BatchID
	sent    time.Time
	rows    []recRow
	decodes bool // some row is a decode (see fill)
}

// Scheduler decides what the pipeline computes. See the package
// documentation for the calling contract.
type Scheduler struct {
	cfg         Config
	maxInFlight int
	kv          *kv.Allocator

	reqs map[RequestID]*request

	// Waiting list, sorted by Add order: requeued requests go back ahead of
	// newer ones.
	waitHead, waitTail *request
	nWaiting           int
	waitingTokens      int

	// Running list: live sequences by ascending ID (admission order), so the
	// tail is the youngest.
	runHead, runTail *sequence
	nRunning         int

	decode  []*sequence // FIFO of sequences whose next token arrived (dead ones skipped)
	decHead int
	prefill []*sequence // sequences with prompt left to dispatch, admission order

	deadlines []*request // min-heap by due()

	building []*batchRec
	inflight []*batchRec // dispatched, by ascending ID
	spare    []*batchRec

	tombs []Tombstone
	dirty []*request

	nextSeq   SeqID
	nextBatch BatchID
	nextOrder uint64
	blocked   bool // admission failed in this Step: FCFS admits no one behind the head
	paused    bool // SetPaused: Step forms no batches

	stats Stats
}

// New returns an empty scheduler with its own block allocator.
func New(cfg Config) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a, err := kv.New(cfg.KV)
	if err != nil {
		return nil, fmt.Errorf("sched: %w", err)
	}
	return &Scheduler{
		cfg:         cfg,
		maxInFlight: cfg.inFlight(),
		kv:          a,
		reqs:        make(map[RequestID]*request),
		nextSeq:     cfg.FirstSeq,
		nextBatch:   1,
	}, nil
}

// Add queues a request. It refuses, changing nothing, a request that can
// never run (*LimitError wrapping ErrNeverFits), one that finds the waiting
// queue full (*LimitError wrapping ErrQueueFull), a duplicate ID
// (ErrDuplicate) and a malformed request (ErrInvalid).
func (s *Scheduler) Add(req Request) error {
	switch {
	case len(req.Prompt) == 0:
		return fmt.Errorf("%w: request %d has an empty prompt", ErrInvalid, req.ID)
	case req.MaxTokens < 1:
		return fmt.Errorf("%w: request %d: max_tokens must be >= 1, got %d", ErrInvalid, req.ID, req.MaxTokens)
	case req.Arrival.IsZero():
		return fmt.Errorf("%w: request %d has no arrival time", ErrInvalid, req.ID)
	}
	if _, ok := s.reqs[req.ID]; ok {
		return fmt.Errorf("%w: %d", ErrDuplicate, req.ID)
	}
	p, m := len(req.Prompt), req.MaxTokens
	what := fmt.Sprintf("prompt %d + max_tokens %d", p, m)
	if p+m > s.cfg.MaxModelLen {
		return &LimitError{Err: ErrNeverFits, What: what, Limit: "max_model_len", Got: p + m, Max: s.cfg.MaxModelLen}
	}
	// The last token is never fed back, so it needs no KV position.
	if pool := s.kvPositions(); p+m-1 > pool {
		return &LimitError{Err: ErrNeverFits, What: what + " - 1", Limit: "kv_positions", Got: p + m - 1, Max: pool}
	}
	if p > s.cfg.MaxWaitingTokens {
		return &LimitError{Err: ErrNeverFits, What: fmt.Sprintf("prompt %d", p), Limit: "max_waiting_tokens", Got: p, Max: s.cfg.MaxWaitingTokens}
	}
	if s.nWaiting+1 > s.cfg.MaxWaiting {
		return &LimitError{Err: ErrQueueFull, What: fmt.Sprintf("waiting %d + 1", s.nWaiting), Limit: "max_waiting", Got: s.nWaiting + 1, Max: s.cfg.MaxWaiting}
	}
	if s.waitingTokens+p > s.cfg.MaxWaitingTokens {
		return &LimitError{Err: ErrQueueFull, What: fmt.Sprintf("waiting tokens %d + prompt %d", s.waitingTokens, p), Limit: "max_waiting_tokens", Got: s.waitingTokens + p, Max: s.cfg.MaxWaitingTokens}
	}

	tokens := make([]int32, p, p+m)
	copy(tokens, req.Prompt)
	r := &request{
		id:        req.ID,
		tokens:    tokens,
		prompt:    p,
		maxTokens: m,
		stop:      slices.Clone(req.Stop),
		order:     s.nextOrder,
		heapIdx:   -1,
		tomb:      -1,
		reported:  p,
	}
	s.nextOrder++
	if s.cfg.QueueTimeout > 0 {
		r.queueDue, r.hasQueueDue = req.Arrival.Add(s.cfg.QueueTimeout), true
	}
	switch {
	case !req.Deadline.IsZero():
		r.deadline, r.hasDeadline = req.Deadline, true
	case s.cfg.RequestTimeout > 0:
		r.deadline, r.hasDeadline = req.Arrival.Add(s.cfg.RequestTimeout), true
	}
	s.reqs[r.id] = r
	s.enqueue(r)
	s.heapUpdate(r)
	s.stats.Added++
	return nil
}

// Abort ends a request wherever it is, with reason Aborted, Timeout, Failed,
// or Stop (the HTTP layer matched a stop string). Its live sequence, if any,
// is removed from every structure, its blocks are freed and one tombstone is
// emitted. Aborting an unknown or ended request does nothing, except that an
// abort wins over a natural finish (Stop or Length) not yet returned by Step:
// the request's and the tombstone's reason become the abort's. Any other
// reason returns ErrInvalid.
func (s *Scheduler) Abort(id RequestID, reason Reason) error {
	switch reason {
	case Stop, Aborted, Timeout, Failed:
	default:
		return fmt.Errorf("%w: abort reason %v", ErrInvalid, reason)
	}
	r, ok := s.reqs[id]
	if !ok {
		return nil
	}
	if r.state == ended {
		if r.reason.Finished() && !reason.Finished() {
			r.reason = reason
			if r.tomb >= 0 {
				s.tombs[r.tomb].Reason = reason
			}
		}
		return nil
	}
	s.end(r, reason)
	return nil
}

// Complete takes a batch's result: every stage has computed its rows, and
// each row that asked carries a sampled token. The tokens are appended to
// their requests, which finish on a stop token or on their length; a request
// past its deadline at now ends with Timeout instead. Rows of dead sequences
// are ignored, and so is a result for a batch that was already retired
// (failed, reclaimed or completed). A sampled row missing its token counts as
// lost work.
func (s *Scheduler) Complete(res Result, now time.Time) {
	b := s.retire(res.Batch)
	if b == nil {
		s.stats.Ignored++
		return
	}
	j := 0
	for _, row := range b.rows {
		seq := row.seq
		var tok int32
		got := false
		if row.sample {
			tok, got, j = findSample(res.Samples, j, seq.id)
		}
		if seq.dead {
			if got {
				s.stats.Ignored++
			}
			continue
		}
		r := seq.req
		if end := row.pos + row.n; end > seq.computed {
			seq.computed = end
			s.kv.Commit(seq.id, r.tokens[:end])
		}
		if !row.sample {
			continue
		}
		switch {
		case !got:
			s.end(r, lost)
			continue
		case r.hasDeadline && !now.Before(r.deadline):
			s.end(r, Timeout)
			continue
		}
		r.tokens = append(r.tokens, tok)
		s.markDirty(r)
		switch {
		case slices.Contains(r.stop, tok):
			s.end(r, Stop)
		case len(r.tokens)-r.prompt >= r.maxTokens || len(r.tokens) >= s.cfg.MaxModelLen:
			s.end(r, Length)
		default:
			s.decode = append(s.decode, seq)
		}
	}
	s.recycle(b)
}

// findSample finds seq's token, looking at samples[j] first (results come in
// row order) and then everywhere.
func findSample(samples []Sample, j int, seq SeqID) (int32, bool, int) {
	if j < len(samples) && samples[j].Seq == seq {
		return samples[j].Token, true, j + 1
	}
	for _, sm := range samples {
		if sm.Seq == seq {
			return sm.Token, true, j
		}
	}
	return 0, false, j
}

// InFlightRow looks up the row of in-flight batch b that names seq: its
// request, and its output index, the place in the request's output of the
// token the row samples (its position after the row's tokens, less the
// prompt). ok is false when b is not in flight or has no such row. The
// scheduler's record of what each batch carries is the only one: a caller
// that needs a row's request (to attach a sample's logprobs) asks here
// before Complete retires the batch.
func (s *Scheduler) InFlightRow(b BatchID, seq SeqID) (req RequestID, outIdx int, ok bool) {
	i := s.findInflight(b)
	if i < 0 {
		return 0, 0, false
	}
	for _, row := range s.inflight[i].rows {
		if row.seq.id == seq {
			return row.seq.req.id, row.pos + row.n - row.seq.req.prompt, true
		}
	}
	return 0, 0, false
}

// InFlightBatch appends the rows of in-flight batch b to dst, in row
// order, and returns it; ok is false when b is not in flight (never
// dispatched, or retired: completed, failed, reclaimed, or forgotten by
// Reset). It is the record a shell admits an answer about b against: which
// sequences b carries and which of them may come back sampled. A row whose
// sequence has ended since stays in the record (its answer is ignored).
func (s *Scheduler) InFlightBatch(b BatchID, dst []BatchRow) ([]BatchRow, bool) {
	i := s.findInflight(b)
	if i < 0 {
		return dst, false
	}
	for _, row := range s.inflight[i].rows {
		dst = append(dst, BatchRow{Seq: row.seq.id, Tokens: row.n, Sample: row.sample})
	}
	return dst, true
}

// InFlightTokens returns how many tokens the rows of the batches in flight
// carry (a prefill chunk counts its length, a decode one).
func (s *Scheduler) InFlightTokens() int {
	n := 0
	for _, b := range s.inflight {
		for _, row := range b.rows {
			n += row.n
		}
	}
	return n
}

// FailInFlight takes every batch in flight as lost, as BatchFailed of each
// would (the pipeline that carried them is gone), and returns how many
// there were.
func (s *Scheduler) FailInFlight(reason string) int {
	n := len(s.inflight)
	for len(s.inflight) > 0 {
		s.BatchFailed(Failure{Batch: s.inflight[0].id, Reason: reason})
	}
	return n
}

// RunningSeqs appends the live sequences to dst, oldest first, and returns
// it: admitted and not ended. A sequence that ended is gone from it at
// once, while its tombstone waits for the next Step's Output.
func (s *Scheduler) RunningSeqs(dst []SeqID) []SeqID {
	for q := s.runHead; q != nil; q = q.next {
		dst = append(dst, q.id)
	}
	return dst
}

// BatchFailed takes a report of lost work. The sequences named (all of the
// batch's when f.Seqs is empty, which also retires the batch) are tombstoned
// with reason Failed and their requests requeued, or failed after
// MaxRetries. Nothing is retried in place. A report for a retired batch or a
// dead sequence is ignored.
func (s *Scheduler) BatchFailed(f Failure) {
	var b *batchRec
	if len(f.Seqs) == 0 {
		b = s.retire(f.Batch)
	} else if i := s.findInflight(f.Batch); i >= 0 {
		b = s.inflight[i]
	}
	if b == nil {
		s.stats.Ignored++
		return
	}
	for _, row := range b.rows {
		if row.seq.dead {
			continue
		}
		if len(f.Seqs) == 0 || slices.Contains(f.Seqs, row.seq.id) {
			s.end(row.seq.req, lost)
		}
	}
	if len(f.Seqs) == 0 {
		s.recycle(b)
	}
}

// Step judges deadlines and reclaims lost batches at now, forms the
// micro-batches the in-flight limit allows, and returns them with every
// tombstone and update recorded since the previous Step. The Output is new
// and belongs to the caller.
func (s *Scheduler) Step(now time.Time) Output {
	var out Output
	s.StepInto(now, &out)
	return out
}

// StepInto is Step writing into out, reusing the memory of out's previous
// contents: a loop that hands back each Output once it has sent it allocates
// almost nothing per Step. The caller must not use out's previous contents
// any more; out still belongs to the caller, and the scheduler keeps no
// reference to it.
func (s *Scheduler) StepInto(now time.Time, out *Output) {
	s.expire(now)
	s.reclaim(now)
	s.blocked = false
	s.building = s.building[:0]
	for !s.paused && len(s.inflight)+len(s.building) < s.maxInFlight {
		b := s.newBatch()
		s.fill(b)
		if len(b.rows) == 0 {
			s.recycle(b)
			break
		}
		s.building = append(s.building, b)
	}
	s.compactDecode()
	s.emit(now, out)
}

// SetPaused stops (true) or resumes (false) forming batches: while the
// pipeline cannot take work, Step still judges deadlines, reclaims lost
// batches and returns tombstones and updates, but dispatches nothing.
func (s *Scheduler) SetPaused(paused bool) { s.paused = paused }

// Reset moves the scheduler onto a new pipeline (a new placement, whose
// stages hold none of the old sequences). Every batch in flight is
// forgotten (a late result for it is ignored); every live sequence ends with
// a tombstone (reason Preempted) and its request goes back to the waiting
// list with its tokens and deadlines, no retry counted; the allocator is
// replaced by a new one of kc (the new pool) and the pipeline has stages
// stages. Waiting requests that can no longer fit the new pool end with
// Failed. On an invalid kc or stages nothing changes.
func (s *Scheduler) Reset(kc kv.Config, stages int) error {
	cfg := s.cfg
	cfg.KV, cfg.Stages = kc, stages
	if err := cfg.Validate(); err != nil {
		return err
	}
	a, err := kv.New(kc)
	if err != nil {
		return fmt.Errorf("sched: %w", err)
	}
	for _, b := range s.inflight {
		s.recycle(b)
	}
	s.inflight = s.inflight[:0]
	for s.runHead != nil {
		s.end(s.runHead.req, Preempted)
	}
	s.kv = a
	s.cfg = cfg
	s.maxInFlight = cfg.inFlight()
	pool := s.kvPositions()
	for r := s.waitHead; r != nil; {
		next := r.next
		if r.prompt+r.maxTokens-1 > pool {
			s.end(r, Failed)
		}
		r = next
	}
	return nil
}

// compactDecode drops the decode queue's consumed head: once per Step, as
// the batches built drain it, mostly completely.
func (s *Scheduler) compactDecode() {
	if s.decHead == len(s.decode) {
		s.decode, s.decHead = s.decode[:0], 0
	} else if s.decHead > 256 && s.decHead > len(s.decode)/2 {
		n := copy(s.decode, s.decode[s.decHead:])
		clear(s.decode[n:])
		s.decode, s.decHead = s.decode[:n], 0
	}
}

// end is the one way anything ends. It removes r's live sequence from every
// structure, frees its blocks and records its tombstone; then it requeues r
// (Preempted, or lost work within MaxRetries) or ends it and records its
// final Update.
func (s *Scheduler) end(r *request, reason Reason) {
	r.tomb = -1
	if seq := r.seq; seq != nil {
		tr := reason
		if tr == lost {
			tr = Failed
		}
		seq.dead = true
		s.removeRunning(seq)
		s.kv.End(seq.id)
		seq.table = nil // the allocator recycles it
		r.seq = nil
		r.tomb = len(s.tombs)
		s.tombs = append(s.tombs, Tombstone{Seq: seq.id, Reason: tr})
		s.stats.Tombstones[tr]++
	}
	if r.state == waiting {
		s.unlink(r)
	}
	switch reason {
	case Preempted:
		s.stats.Preemptions++
		s.enqueue(r)
		return
	case lost:
		r.tries++
		if r.tries <= s.cfg.MaxRetries {
			s.stats.Retries++
			s.enqueue(r)
			return
		}
		reason = Failed
	}
	r.state = ended
	r.reason = reason
	s.heapRemove(r)
	s.markDirty(r)
	s.stats.Ended++
}

// expire ends every request whose queue timeout or deadline has passed.
func (s *Scheduler) expire(now time.Time) {
	for len(s.deadlines) > 0 {
		r := s.deadlines[0]
		if now.Before(r.due()) {
			return
		}
		s.end(r, Timeout)
	}
}

// reclaim fails the in-flight batches dispatched ReclaimTimeout or longer
// ago: their results are taken as lost.
func (s *Scheduler) reclaim(now time.Time) {
	for i := 0; i < len(s.inflight); {
		b := s.inflight[i]
		if now.Before(b.sent.Add(s.cfg.ReclaimTimeout)) {
			i++
			continue
		}
		s.stats.Reclaimed++
		s.BatchFailed(Failure{Batch: b.id, Reason: "reclaimed"})
	}
}

// fill puts work into b: decodes first, then the next chunks of running
// prefills, then admissions from the head of the waiting list.
func (s *Scheduler) fill(b *batchRec) {
	tokens, rows := s.cfg.MaxBatchTokens, s.cfg.MaxBatchRows
	// Decodes ride in at most P batches at once. The batch beyond P (of the
	// default P+1) covers the trip back with prefill work; were decodes let
	// into it too, the running sequences would split into P+1 groups that
	// never merge again (each group's batch is always in flight when the
	// other's returns), and every stage would stream its weights P+1 times
	// instead of P per generated token of every sequence: on one CPU shard
	// that halved 8-stream serving (issue 11). A sequence that became ready
	// meanwhile waits for the next decode batch and joins it.
	decodes := s.decodeBatches() < s.cfg.Stages
	for decodes && rows > 0 && tokens > 0 && s.decHead < len(s.decode) {
		seq := s.decode[s.decHead]
		s.decode[s.decHead] = nil
		s.decHead++
		if seq.dead || !s.grow(seq, seq.scheduled+1) {
			continue
		}
		b.add(seq, seq.scheduled, 1, false, true)
		b.decodes = true
		seq.scheduled++
		rows--
		tokens--
	}

	for _, seq := range s.prefill {
		if rows == 0 || tokens == 0 {
			break
		}
		if seq.dead {
			continue
		}
		tokens -= s.chunk(b, seq, tokens, false)
		rows--
	}
	s.prefill = slices.DeleteFunc(s.prefill, func(seq *sequence) bool {
		if seq.dead || seq.scheduled == len(seq.req.tokens) {
			seq.prefill = false
			return true
		}
		return false
	})

	for rows > 0 && tokens > 0 && !s.blocked && s.waitHead != nil {
		seq := s.admit(s.waitHead, tokens)
		if seq == nil {
			s.blocked = true
			break
		}
		tokens -= s.chunk(b, seq, tokens, true)
		rows--
		if seq.scheduled < len(seq.req.tokens) {
			seq.prefill = true
			s.prefill = append(s.prefill, seq)
		}
	}
}

// chunk adds seq's next prefill chunk, at most budget tokens, to b and
// returns its length. Without KV groups its blocks were allocated at
// admission; with them each chunk grows the tables as a decode does
// (grow), so that a long prompt's sliding blocks are released as it goes.
// It returns 0 when seq was preempted for want of blocks.
func (s *Scheduler) chunk(b *batchRec, seq *sequence, budget int, first bool) int {
	n := min(len(seq.req.tokens)-seq.scheduled, budget)
	if !s.grow(seq, seq.scheduled+n) {
		return 0
	}
	b.add(seq, seq.scheduled, n, first, seq.scheduled+n == len(seq.req.tokens))
	seq.scheduled += n
	return n
}

// grow makes seq's table cover positions, preempting the youngest running
// sequences (seq itself last) until it does, and admitting no one else in
// this Step once it had to. It reports whether seq lives.
func (s *Scheduler) grow(seq *sequence, positions int) bool {
	if positions <= seq.capacity {
		return true
	}
	for {
		if s.kv.Extend(seq.id, positions) == nil {
			seq.capacity = seq.table.Len() * s.cfg.KV.BlockSize
			return true
		}
		victim := s.runTail
		s.end(victim.req, Preempted)
		s.blocked = true // admitting now would only feed the next preemption
		if victim == seq {
			return false
		}
	}
}

// admit gives r a new sequence with blocks for all its tokens, or returns nil
// when the allocator cannot supply them (keeping WatermarkBlocks free while
// others run). A prefix-cache hit starts the sequence past the cached
// positions.
//
// With KV groups it allocates only the first chunk's blocks, at most
// budget tokens: every table takes blocks for every position it covers,
// and the sliding ones release theirs only as rows are emitted, so a long
// prompt allocated whole would need Groups times its blocks at once (and a
// preempted sequence, recomputed as one long prompt, might never fit
// again). It admits r only when the blocks its whole prompt will hold at
// once are available (peakBlocks), as one table's admission does by
// taking them.
func (s *Scheduler) admit(r *request, budget int) *sequence {
	reserve := 0
	if s.nRunning > 0 {
		reserve = s.cfg.WatermarkBlocks
	}
	// Every admission needs at least one new block: the last token is never
	// served from the cache. Checking first keeps a blocked head cheap.
	if s.kv.Available() < 1+reserve {
		return nil
	}
	var prefix []int32
	if s.cfg.KV.PrefixCaching {
		prefix = r.tokens[:len(r.tokens)-1]
	}
	positions := len(r.tokens)
	if s.cfg.KV.Groups > 1 {
		// Let in on its first chunk's blocks alone, a sequence would
		// preempt itself at the next chunk, be recomputed and let in
		// again, over and over.
		if s.kv.Available() < s.peakBlocks(positions)+reserve {
			return nil
		}
		positions = min(positions, budget)
	}
	cached, err := s.kv.Allocate(s.nextSeq, prefix, positions, reserve)
	if err != nil {
		return nil
	}
	t := s.kv.Table(s.nextSeq)
	seq := &sequence{id: s.nextSeq, req: r, table: t, scheduled: cached, computed: cached,
		capacity: t.Len() * s.cfg.KV.BlockSize}
	s.nextSeq++
	s.unlink(r)
	r.state = running
	r.seq = seq
	if r.hasQueueDue {
		r.hasQueueDue = false
		s.heapUpdate(r)
	}
	seq.prev = s.runTail
	if s.runTail == nil {
		s.runHead = seq
	} else {
		s.runTail.next = seq
	}
	s.runTail = seq
	s.nRunning++
	return seq
}

// kvPositions is the most positions one sequence can reach in the pool
// with every other sequence gone: the pool's positions with one table per
// sequence, the most whose peakBlocks fit with KV groups.
func (s *Scheduler) kvPositions() int {
	blocks, bs := s.cfg.KV.Blocks, s.cfg.KV.BlockSize
	if s.cfg.KV.Groups <= 1 {
		return blocks * bs
	}
	lo, hi := 0, blocks*bs // peakBlocks grows with positions
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if s.peakBlocks(mid) <= blocks {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// peakBlocks bounds the blocks a sequence of the given positions holds at
// once (a recomputed one too, its positions then one long prompt). With
// one table, one block per BlockSize positions. With KV groups, that many
// in the global table and, in each sliding table, at most the entries from
// the block of the first position the last emitted row reads (Window
// back from it) to the end of the rows built since: that row and a chunk
// in each batch of a Step, (maxInFlight+1)*MaxBatchTokens positions, and
// never more than the sequence has.
func (s *Scheduler) peakBlocks(positions int) int {
	b := s.kv.BlocksFor(positions)
	if s.cfg.KV.Groups <= 1 {
		return b
	}
	span := s.cfg.KV.Window + min(positions, (s.maxInFlight+1)*s.cfg.MaxBatchTokens)
	slide := s.kv.BlocksFor(span) + 1
	return b + (s.cfg.KV.Groups-1)*min(b, slide)
}

// emit turns the batches built in this Step into Output, with the pending
// tombstones and updates. Rows of sequences that died while building (by
// preemption) are dropped first.
func (s *Scheduler) emit(now time.Time, out *Output) {
	// Entries of out.rows and out.Updates beyond those this Step writes are
	// cleared at the end, so that they pin no old arrays; the ones written are
	// overwritten whole, so clearing them first would only cost write barriers.
	usedRows, usedUpdates := len(out.rows), len(out.Updates)
	out.reset()
	nb, nrows, ntok, nblk := 0, 0, 0, 0
	groups := max(1, s.cfg.KV.Groups)
	for _, b := range s.building {
		b.rows = slices.DeleteFunc(b.rows, func(row recRow) bool { return row.seq.dead })
		if len(b.rows) == 0 {
			s.recycle(b)
			continue
		}
		s.building[nb] = b
		nb++
		nrows += len(b.rows)
		for k := range b.rows {
			row := &b.rows[k]
			row.nblk = s.kv.BlocksFor(row.pos + row.n)
			ntok += row.n
			nblk += groups * row.nblk // at most: the sliding tables are cut below
		}
	}
	clear(s.building[nb:])
	s.building = s.building[:nb]
	if nb > 0 {
		out.Batches = grow(out.Batches, nb)
		out.rows = grow(out.rows, nrows)
		out.toks = grow(out.toks, ntok)
		out.blks = grow(out.blks, nblk)[:0]
		rows, toks, blks := out.rows, out.toks, out.blks
		for i, b := range s.building {
			b.id, b.sent = s.nextBatch, now
			s.nextBatch++
			s.inflight = append(s.inflight, b)
			out.Batches[i] = Batch{ID: b.id, Rows: rows[:len(b.rows):len(b.rows)]}
			for k := range b.rows {
				row := &b.rows[k]
				seq, r := row.seq, row.seq.req
				t := toks[:row.n:row.n]
				toks = toks[row.n:]
				copy(t, r.tokens[row.pos:row.pos+row.n])
				start := len(blks)
				blks = seq.table.AppendBlocks(blks, row.nblk)
				blocks := blks[start:len(blks):len(blks)]
				slideFrom, slides := 0, []kv.BlockID(nil)
				if groups > 1 {
					// Release what no row from here on reads: rows are
					// emitted in position order, and batches run in
					// dispatch order on every stage, so a released block
					// is written by its next owner only in a later batch,
					// after every read of it.
					if err := s.kv.Slide(seq.id, max(0, row.pos-s.cfg.KV.Window+1)); err != nil {
						panic(fmt.Sprintf("sched: slide of running sequence %d: %v", seq.id, err))
					}
					slideFrom = seq.table.First()
					start = len(blks)
					for g := 1; g < groups; g++ {
						blks = seq.table.AppendSliding(blks, g, row.nblk)
					}
					slides = blks[start:len(blks):len(blks)]
				}
				// Field by field: assigning a Row literal copies it with a
				// bulk write barrier, which dominates while the GC runs.
				o := &rows[k]
				o.Request = r.id
				o.Seq = seq.id
				o.Pos = row.pos
				o.First = row.first
				setSlice(&o.Tokens, t)
				setSlice(&o.Blocks, blocks)
				o.SlideFrom = slideFrom
				setSlice(&o.Slides, slides)
				o.Sample = row.sample
			}
			rows = rows[len(b.rows):]
		}
		s.building = s.building[:0]
	}
	if usedRows > nrows {
		clear(out.rows[nrows:usedRows])
	}
	out.rows = out.rows[:nrows]
	if len(s.tombs) > 0 {
		out.Tombstones = append(out.Tombstones[:0], s.tombs...)
		s.tombs = s.tombs[:0]
	}
	if len(s.dirty) > 0 {
		n := 0
		for _, r := range s.dirty {
			n += len(r.tokens) - r.reported
		}
		out.updToks = grow(out.updToks, n)
		toks := out.updToks
		out.Updates = grow(out.Updates, len(s.dirty))
		for i, r := range s.dirty {
			u := &out.Updates[i] // field by field, as for rows
			u.Request = r.id
			if k := copy(toks, r.tokens[r.reported:]); k > 0 {
				setSlice(&u.Tokens, toks[:k:k])
				toks = toks[k:]
			} else {
				u.Tokens = nil
			}
			u.Done, u.Reason = false, 0
			r.reported = len(r.tokens)
			r.dirty = false
			r.tomb = -1
			if r.state == ended {
				u.Done, u.Reason = true, r.reason
				delete(s.reqs, r.id)
			}
		}
		clear(s.dirty)
		s.dirty = s.dirty[:0]
	}
	if n := len(out.Updates); usedUpdates > n {
		clear(out.Updates[n:usedUpdates])
	}
}

// setSlice stores v in *p unless *p already is v (the same elements of the
// same array, with the same capacity). While the GC marks, every pointer
// store pays a write barrier, and an Output handed back to StepInto often
// holds the same slices step after step.
func setSlice[T any](p *[]T, v []T) {
	if len(v) > 0 && len(*p) == len(v) && cap(*p) == cap(v) && &(*p)[0] == &v[0] {
		return
	}
	*p = v
}

// grow returns a slice of length n, reusing buf when it is large enough.
func grow[T any](buf []T, n int) []T {
	if cap(buf) >= n {
		return buf[:n]
	}
	return make([]T, n, n+n/4)
}

func (s *Scheduler) markDirty(r *request) {
	if !r.dirty {
		r.dirty = true
		s.dirty = append(s.dirty, r)
	}
}

func (s *Scheduler) removeRunning(seq *sequence) {
	if seq.prev == nil && s.runHead != seq {
		panic(fmt.Sprintf("sched: sequence %d of request %d is not running", seq.id, seq.req.id))
	}
	if seq.prev == nil {
		s.runHead = seq.next
	} else {
		seq.prev.next = seq.next
	}
	if seq.next == nil {
		s.runTail = seq.prev
	} else {
		seq.next.prev = seq.prev
	}
	seq.prev, seq.next = nil, nil
	s.nRunning--
}

// add appends a row to b. It stores the fields one by one: appending a
// recRow literal copies it with a bulk write barrier, costly while the GC
// marks.
func (b *batchRec) add(seq *sequence, pos, n int, first, sample bool) {
	if len(b.rows) == cap(b.rows) {
		b.rows = slices.Grow(b.rows, 1)
	}
	b.rows = b.rows[:len(b.rows)+1]
	r := &b.rows[len(b.rows)-1]
	r.seq, r.pos, r.n, r.nblk, r.first, r.sample = seq, pos, n, 0, first, sample
}

func (s *Scheduler) newBatch() *batchRec {
	if n := len(s.spare); n > 0 {
		b := s.spare[n-1]
		s.spare = s.spare[:n-1]
		return b
	}
	return &batchRec{}
}

func (s *Scheduler) recycle(b *batchRec) {
	clear(b.rows)
	b.rows = b.rows[:0]
	b.id = 0
	b.decodes = false
	s.spare = append(s.spare, b)
}

// decodeBatches counts the batches in flight or being built that carry
// decodes.
func (s *Scheduler) decodeBatches() int {
	n := 0
	for _, b := range s.inflight {
		if b.decodes {
			n++
		}
	}
	for _, b := range s.building {
		if b.decodes {
			n++
		}
	}
	return n
}

func (s *Scheduler) findInflight(id BatchID) int {
	for i, b := range s.inflight {
		if b.id == id {
			return i
		}
	}
	return -1
}

// retire removes batch id from the in-flight list and returns it, or nil.
func (s *Scheduler) retire(id BatchID) *batchRec {
	i := s.findInflight(id)
	if i < 0 {
		return nil
	}
	b := s.inflight[i]
	s.inflight = slices.Delete(s.inflight, i, i+1)
	return b
}

// Stats returns a snapshot of the scheduler and its allocator.
func (s *Scheduler) Stats() Stats {
	st := s.stats
	st.Waiting = s.nWaiting
	st.WaitingTokens = s.waitingTokens
	st.Running = s.nRunning
	st.InFlight = len(s.inflight)
	st.KV = s.kv.Stats()
	return st
}

// Pending reports whether any request is waiting or running, or any batch is
// in flight: whether the caller should keep calling Step.
func (s *Scheduler) Pending() bool {
	return s.nWaiting > 0 || s.nRunning > 0 || len(s.inflight) > 0 || len(s.tombs) > 0 || len(s.dirty) > 0
}
