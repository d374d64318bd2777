package shard

import (
	"errors"
	"fmt"
	"time"

	"github.com/strata-llm/strata/model"
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

// Sampled is one token chosen by the last stage.
type Sampled struct {
	Seq    uint64
	Result sample.Result
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
)

// seqSampler is the last stage's state for one sequence.
type seqSampler struct {
	params  sample.Params
	history []int32
}

// Runner runs one pipeline stage: a layer range, its KV table and, on the
// last stage, the sequences' sampler states. One goroutine uses it at a time.
type Runner struct {
	stage   *model.Stage
	table   *Table
	bs      int
	states  map[uint64]*seqSampler
	sampler sample.Sampler

	rows   []model.Row
	kept   []Row
	hidden []float32
}

// NewRunner wraps a model stage whose KV pool has pool blocks of bs positions.
func NewRunner(stage *model.Stage, pool, bs int) *Runner {
	return &Runner{stage: stage, table: NewTable(pool), bs: bs, states: map[uint64]*seqSampler{}}
}

// Table returns the runner's replica table (for metrics and tests).
func (r *Runner) Table() *Table { return r.table }

// Tombstone applies one tombstone outside a batch (the control-stream
// backstop); applying it twice is harmless.
func (r *Runner) Tombstone(t Tombstone) {
	r.table.Tombstone(t.Seq, t.Reason)
	delete(r.states, t.Seq)
}

// SetEpoch moves to epoch e, dropping every older sequence; false means e is
// older than what the runner has seen.
func (r *Runner) SetEpoch(e uint64) bool {
	if !r.table.SetEpoch(e) {
		return false
	}
	r.dropDeadStates()
	return true
}

// Renew and Expire apply the coordinator's heartbeat reply and the lease
// clock (see Table); sampler states of freed sequences go with them.
func (r *Runner) Renew(unknown []uint64, now time.Time) {
	r.table.Renew(unknown, now)
	r.dropDeadStates()
}

// Expire frees sequences whose lease lapsed.
func (r *Runner) Expire(now time.Time, lease time.Duration) int {
	n := r.table.Expire(now, lease)
	r.dropDeadStates()
	return n
}

func (r *Runner) dropDeadStates() {
	for seq := range r.states {
		if !r.table.Has(seq) {
			delete(r.states, seq)
		}
	}
}

// Process runs a batch: tombstones first, then every row the table can
// place, computed together; rows it cannot place are dropped and reported.
// A batch of another epoch than the runner's is refused whole, with
// ErrStaleEpoch when older and ErrFutureEpoch when newer: only SetEpoch
// moves the epoch.
func (r *Runner) Process(b *Batch, now time.Time) (*Result, error) {
	switch cur := r.table.Epoch(); {
	case b.Epoch < cur:
		return nil, fmt.Errorf("%w: batch %d", ErrStaleEpoch, b.ID)
	case b.Epoch > cur:
		return nil, fmt.Errorf("%w: batch %d", ErrFutureEpoch, b.ID)
	}
	for _, t := range b.Tombstones {
		r.Tombstone(t)
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
		err := r.table.Place(row.Seq, row.Pos, row.First, n, row.Blocks, r.bs, now)
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
			r.states[row.Seq] = &seqSampler{params: p}
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
	out, err := r.stage.Forward(r.rows, r.hidden)
	if err != nil {
		// The table admitted rows the model refused: a broken invariant on
		// our side. Free those sequences rather than keep unwritten KV.
		for _, row := range r.kept {
			r.Tombstone(Tombstone{Seq: row.Seq, Reason: Failed})
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
		st := r.states[row.Seq]
		if st == nil { // created on an earlier placement of this shard's range without sampler state
			st = &seqSampler{params: sample.DefaultParams()}
			r.states[row.Seq] = st
		}
		st.history = append(st.history, row.Tokens...)
		if !row.Sample {
			continue
		}
		pos := row.Pos + len(row.Tokens)
		s := r.sampler.Sample(out[j*V:(j+1)*V], &st.params, st.history, pos)
		res.Samples = append(res.Samples, Sampled{Seq: row.Seq, Result: s})
		j++
	}
	return res, nil
}

// toModel converts rows to the model's row type, reusing dst.
func toModel(rows []Row, dst []model.Row) []model.Row {
	dst = dst[:0]
	for _, row := range rows {
		dst = append(dst, model.Row{Seq: row.Seq, Pos: row.Pos, First: row.Pos == 0, Tokens: row.Tokens, Blocks: row.Blocks, Logits: row.Sample})
	}
	return dst
}

// CheckInvariants checks the runner's replica table (see
// Table.CheckInvariants) and that sampler state exists only for live
// sequences.
func (r *Runner) CheckInvariants() error {
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
