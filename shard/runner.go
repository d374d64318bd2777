package shard

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cuda"
	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/transport"
)

// Tombstone ends a sequence on this shard (its Epoch is the caller's to
// judge; the Runner ignores it).
type Tombstone = transport.Tombstone

// Row is one sequence's part of a batch as a shard sees it: Params (first
// rows) are the sequence's sampling settings, kept by the last stage until
// the sequence ends.
type Row = transport.Row

// Batch is one micro-batch arriving at a stage, as transport.BatchFromWire
// returns it: Tombstones are applied before any row is touched; Hidden is
// the previous stage's output (nil on stage 0).
type Batch = transport.MicroBatch

// Sampled is one token chosen by the last stage. Logprobs says whether the
// sequence asked for logprobs (its first row's Logprobs): Result's
// logprob and alternatives go to the coordinator only then.
type Sampled struct {
	Seq      uint64
	Result   sample.Result
	Logprobs bool
}

// Dropped is a row a stage refused; the coordinator tombstones its sequence
// and recomputes the request.
type Dropped struct {
	Seq  uint64
	Code transport.Code
}

// Result is what a stage produces from a batch: for the next stage, the rows
// it kept and their hidden states (Rows and Hidden alias the input and the
// Runner's buffers: valid until the next Process); on the last stage, the
// sampled tokens. Dropped lists refused rows.
type Result struct {
	Rows    []Row
	Hidden  []float32
	Samples []Sampled
	Dropped []Dropped
}

// Errors Process refuses a whole batch with: a batch is of the epoch the
// runner was moved to (SetEpoch, from the coordinator's control stream),
// never of an older one, and a newer one is not adopted from a batch.
var (
	ErrStaleEpoch  = errors.New("shard: batch from an older epoch")
	ErrFutureEpoch = errors.New("shard: batch from an epoch the control stream has not announced")
	// ErrClosed refuses a batch for a runner whose placement ended (Close).
	ErrClosed = errors.New("shard: the stage's placement ended")
)

// seqSampler is the last stage's state for one sequence: everything it
// holds leaves with the sequence, in Runner.endLocked.
type seqSampler struct {
	params   sample.Params
	history  []int32
	logprobs bool        // the sequence asked for logprobs
	con      *constraint // nil unless decoding is constrained (constrain.go)
}

// Stage is what a Runner computes with: a model.Stage on the CPU, or a
// cuda.Stage on a GPU.
type Stage interface {
	// Forward runs a batch (model.Stage.Forward's contract).
	Forward(rows []model.Row, in []float32) ([]float32, error)
	Model() *model.Model
	First() bool
	Last() bool
}

var (
	_ Stage = (*model.Stage)(nil)
	_ Stage = (*cuda.Stage)(nil)
)

// Runner runs one pipeline stage: a layer range, its KV table and, on the
// last stage, the sequences' sampler states. It owns its sequences' state
// and guards it with its own lock, held briefly: tombstones, heartbeats,
// lease checks and metrics may come from any goroutine while a batch
// computes, and never wait for the forward pass. Process calls are
// serialized (one forward pass at a time on the stage's KV pool).
//
// A sequence's state ends in one place: the table's free, for every
// reason, calls endLocked, which drops what the runner keeps beside the
// block table (sampler state, token history, logprob wish, grammar
// matcher).
type Runner struct {
	stage Stage
	bs    int
	// forward is stage.Forward; tests put a blocking fake in front of it.
	forward func(rows []model.Row, hidden []float32) ([]float32, error)
	vocab   VocabSource // for constrained sequences (constrain.go); set before use

	// compute serializes Process and guards the fields below it to mu:
	// the batch buffers and the sampler's scratch.
	compute sync.Mutex
	sampler sample.Sampler
	rows    []model.Row
	kept    []Row
	hidden  []float32

	// mu guards the sequences' state: held by Process except across the
	// forward pass, and by every other method.
	mu     sync.Mutex
	table  *Table
	states map[uint64]*seqSampler
	closed bool // Close was called: every later batch is refused
}

// NewRunner wraps a model stage whose KV pool has pool blocks of bs positions.
func NewRunner(stage Stage, pool, bs int) *Runner {
	r := &Runner{stage: stage, forward: stage.Forward, table: NewTable(pool), bs: bs, states: map[uint64]*seqSampler{}}
	r.table.onEnd = r.endLocked
	return r
}

// endLocked is the end of a sequence's state beside its block table: the
// table's free calls it, under mu, whatever the reason.
func (r *Runner) endLocked(seq uint64, _ Reason) {
	delete(r.states, seq)
}

// Table returns the runner's replica table, for tests: it is not safe to
// use while another goroutine calls the runner.
func (r *Runner) Table() *Table { return r.table }

// Tombstone applies one tombstone outside a batch (the control-stream
// backstop); applying it twice is harmless.
func (r *Runner) Tombstone(t Tombstone) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tombstoneLocked(t)
}

func (r *Runner) tombstoneLocked(t Tombstone) {
	if !r.closed {
		r.table.Tombstone(t.Seq, t.Reason)
	}
}

// Epoch is the newest epoch the runner has seen.
func (r *Runner) Epoch() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.table.Epoch()
}

// SetEpoch moves to epoch e, dropping every older sequence; false means e is
// older than what the runner has seen.
func (r *Runner) SetEpoch(e uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.table.SetEpoch(e)
}

// Renew and Expire apply the coordinator's heartbeat reply and the lease
// clock (see Table); sampler states of freed sequences go with them.
func (r *Runner) Renew(unknown []uint64, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.table.Renew(unknown, now)
}

// Expire frees sequences whose lease lapsed.
func (r *Runner) Expire(now time.Time, lease time.Duration) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.table.Expire(now, lease)
}

// Close ends the runner with its placement: it waits for a batch in
// progress, frees every live sequence (reason Epoch: a placement change
// drops them like an epoch) and refuses every later batch (ErrClosed);
// tombstones and lease checks after it change nothing. Closing twice is
// harmless.
func (r *Runner) Close() {
	r.compute.Lock()
	defer r.compute.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.table.EndAll(Epoch)
		r.closed = true
	}
}

// RunnerStats is a consistent snapshot of a runner's sequence state.
type RunnerStats struct {
	Epoch        uint64
	Sequences    int // live sequences
	States       int // sampler states (the last stage's; at most Sequences)
	BlocksUsed   int // distinct blocks named by live tables
	BlocksTotal  int // the pool
	Live         []uint64
	Freed        [transport.NumReasons]uint64
	Refused      map[transport.Code]uint64
	Early        int    // tombstones kept above the high-water mark
	EarlyRefused uint64 // tombstones refused past MaxEarlyTombstones
	Invariant    error  // CheckInvariants' verdict
}

// Stats snapshots the runner's state without waiting for a forward pass;
// live also lists the live sequences.
func (r *Runner) Stats(live bool) RunnerStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.table
	s := RunnerStats{Epoch: t.epoch, Sequences: len(t.live), States: len(r.states), BlocksUsed: t.BlocksUsed(), BlocksTotal: t.pool,
		Freed: t.freed, Refused: make(map[transport.Code]uint64, len(t.refused)), Early: len(t.early), EarlyRefused: t.earlyRefused,
		Invariant: r.checkLocked()}
	for k, v := range t.refused {
		s.Refused[k] = v
	}
	if live {
		s.Live = t.Live()
	}
	return s
}

// Process runs a batch: tombstones first, then every row the table can
// place, computed together; rows it cannot place are dropped and reported.
// A batch of another epoch than the runner's is refused whole, with
// ErrStaleEpoch when older and ErrFutureEpoch when newer: only SetEpoch
// moves the epoch.
//
// The runner's lock is held throughout but across the forward pass, when a
// tombstone, an epoch or a lease may end a sequence of the batch: its
// computed row is then dropped from the sampling, and its state stays gone.
// Inside Process, sequences end through r.table (the one exit), never
// through the locking Tombstone.
func (r *Runner) Process(b *Batch, now time.Time) (*Result, error) {
	r.compute.Lock()
	defer r.compute.Unlock()
	r.mu.Lock()
	locked := true
	defer func() {
		if locked {
			r.mu.Unlock()
		}
	}()
	if r.closed {
		return nil, fmt.Errorf("%w: batch %d", ErrClosed, b.ID)
	}
	switch cur := r.table.Epoch(); {
	case b.Epoch < cur:
		return nil, fmt.Errorf("%w: batch %d", ErrStaleEpoch, b.ID)
	case b.Epoch > cur:
		return nil, fmt.Errorf("%w: batch %d", ErrFutureEpoch, b.ID)
	}
	for _, t := range b.Tombstones {
		r.tombstoneLocked(t)
	}
	m := r.stage.Model()
	E := m.Embd
	if !r.stage.First() {
		n := 0
		for _, row := range b.Rows {
			n += len(row.Tokens)
		}
		if len(b.Hidden) != n*E {
			return nil, fmt.Errorf("%w: batch %d has %d hidden values for %d tokens", model.ErrBadBatch, b.ID, len(b.Hidden), n)
		}
	}
	res := &Result{}
	r.kept, r.rows, r.hidden = r.kept[:0], r.rows[:0], r.hidden[:0]
	t := 0
	for _, row := range b.Rows {
		n := len(row.Tokens)
		err := r.table.Place(row.Seq, row.Pos, row.First, n, row.Blocks, row.SlideFrom, row.Slides, r.bs, now)
		if err == nil && r.stage.First() {
			for _, tok := range row.Tokens {
				if tok < 0 || int(tok) >= m.Vocab {
					r.table.Tombstone(row.Seq, Failed)
					err = &RowError{Seq: row.Seq, Code: transport.CodeBadToken, Msg: fmt.Sprintf("token %d outside vocabulary of %d", tok, m.Vocab)}
					break
				}
			}
		}
		if err == nil && r.stage.Last() && row.First {
			p := sample.DefaultParams()
			if row.Params != nil {
				p = *row.Params
			}
			st := &seqSampler{params: p, logprobs: row.Logprobs}
			if len(p.Constraint) > 0 {
				if st.con, err = r.newConstraint(&p, row.Pos); err != nil {
					r.table.Tombstone(row.Seq, Failed)
					err = &RowError{Seq: row.Seq, Code: transport.CodeComputeError, Msg: "constraint: " + err.Error()}
				}
			}
			if err == nil {
				r.states[row.Seq] = st
			}
		}
		if err != nil {
			code := transport.CodeBadPosition
			if re, ok := errors.AsType[*RowError](err); ok {
				code = re.Code
			}
			res.Dropped = append(res.Dropped, Dropped{Seq: row.Seq, Code: code})
		} else {
			r.kept = append(r.kept, row)
			if !r.stage.First() {
				r.hidden = append(r.hidden, b.Hidden[t*E:(t+n)*E]...)
			}
		}
		t += n
	}
	res.Rows = r.kept
	if len(r.kept) == 0 {
		return res, nil
	}
	r.rows = toModel(r.kept, r.rows)
	r.mu.Unlock()
	locked = false
	out, err := r.forward(r.rows, r.hidden)
	r.mu.Lock()
	locked = true
	if err != nil {
		// The table admitted rows the model refused: a broken invariant on
		// our side. Free those sequences rather than keep unwritten KV.
		for _, row := range r.kept {
			r.table.Tombstone(row.Seq, Failed)
			res.Dropped = append(res.Dropped, Dropped{Seq: row.Seq, Code: transport.CodeComputeError})
		}
		res.Rows = nil
		return res, fmt.Errorf("shard: batch %d: %w", b.ID, err)
	}
	if !r.stage.Last() {
		res.Hidden = out
		return res, nil
	}
	V := m.Vocab
	j := 0
	for _, row := range r.kept {
		if !r.table.Has(row.Seq) { // ended during the forward pass
			if row.Sample {
				j++
			}
			continue
		}
		st := r.states[row.Seq]
		if st == nil { // created on an earlier placement of this shard's range without sampler state
			st = &seqSampler{params: sample.DefaultParams()}
			r.states[row.Seq] = st
		}
		st.history = append(st.history, row.Tokens...)
		if st.con != nil {
			if err := st.con.read(row.Pos, row.Tokens); err != nil {
				// Only tokens sampled under the mask are read, so this is a
				// broken invariant: end the sequence rather than leave the
				// grammar.
				r.table.Tombstone(row.Seq, Failed)
				res.Dropped = append(res.Dropped, Dropped{Seq: row.Seq, Code: transport.CodeBadToken})
				if row.Sample {
					j++
				}
				continue
			}
		}
		if !row.Sample {
			continue
		}
		pos := row.Pos + len(row.Tokens)
		logits := out[j*V : (j+1)*V]
		if st.con != nil {
			st.con.apply(logits)
		}
		s := r.sampler.Sample(logits, &st.params, st.history, pos)
		if st.con != nil {
			s = st.con.fit(logits, pos, func() sample.Result { return r.sampler.Sample(logits, &st.params, st.history, pos) }, s)
		}
		res.Samples = append(res.Samples, Sampled{Seq: row.Seq, Result: s, Logprobs: st.logprobs})
		j++
	}
	return res, nil
}

// toModel converts rows to the model's row type, reusing dst.
func toModel(rows []Row, dst []model.Row) []model.Row {
	dst = dst[:0]
	for _, row := range rows {
		dst = append(dst, model.Row{Seq: row.Seq, Pos: row.Pos, First: row.Pos == 0, Tokens: row.Tokens, Blocks: row.Blocks, Logits: row.Sample,
			SlideFrom: row.SlideFrom, Slides: row.Slides})
	}
	return dst
}

// CheckInvariants checks the runner's replica table (see
// Table.CheckInvariants) and that sampler state exists only for live
// sequences.
func (r *Runner) CheckInvariants() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.checkLocked()
}

func (r *Runner) checkLocked() error {
	if err := r.table.CheckInvariants(r.bs); err != nil {
		return err
	}
	for seq := range r.states {
		if !r.table.Has(seq) {
			return fmt.Errorf("shard: sampler state for sequence %d, which is not live", seq)
		}
	}
	return nil
}
