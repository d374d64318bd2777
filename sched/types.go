package sched

import (
	"errors"
	"fmt"
	"time"

	"github.com/strata-llm/strata/kv"
)

// Errors returned by Add and Abort.
var (
	// ErrQueueFull means the waiting queue is at its count or token bound;
	// the HTTP layer answers 429.
	ErrQueueFull = errors.New("sched: waiting queue full")
	// ErrNeverFits means the request could never run: it is longer than the
	// model's context or than the whole KV pool. Add returns it inside a
	// *LimitError.
	ErrNeverFits = errors.New("sched: request can never fit")
	// ErrInvalid means a malformed request or argument (a bug in the caller,
	// which validates at the edge).
	ErrInvalid = errors.New("sched: invalid")
	// ErrDuplicate means a request with the same ID is already known.
	ErrDuplicate = errors.New("sched: duplicate request")
)

// LimitError says which limit a request broke. It unwraps to ErrQueueFull or
// ErrNeverFits, and its message names the limit, its value and what the
// request brought, e.g.
//
//	sched: request can never fit: prompt 812 + max_tokens 9000 exceeds max_model_len 4096
type LimitError struct {
	Err   error  // ErrQueueFull or ErrNeverFits
	What  string // what was measured, e.g. "prompt 812 + max_tokens 9000"
	Limit string // the limit's name, e.g. "max_model_len"
	Got   int    // the measured value
	Max   int    // the limit's value
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%v: %s exceeds %s %d", e.Err, e.What, e.Limit, e.Max)
}

func (e *LimitError) Unwrap() error { return e.Err }

// RequestID is the coordinator's handle for a request. The scheduler only
// compares it; the coordinator maps it to the client's X-Request-ID, the
// request's sampling parameters and its token sink.
type RequestID uint64

// SeqID names one admission of a request into the pipeline.
type SeqID = kv.SeqID

// BatchID names a micro-batch; IDs increase in dispatch order.
type BatchID uint64

// Request is what Add takes. The scheduler copies what it keeps.
type Request struct {
	ID     RequestID
	Prompt []int32 // token IDs; at least one
	// MaxTokens bounds the tokens generated; at least one.
	MaxTokens int
	// Stop lists token IDs (EOS and the like) that end generation; the token
	// is reported, then the request ends with reason Stop. Stop strings are
	// matched by the HTTP layer, which then calls Abort(id, Stop).
	Stop []int32
	// Arrival is when the coordinator received the request (its monotonic
	// clock); the queue timeout counts from it.
	Arrival time.Time
	// Deadline ends the request with reason Timeout wherever it is. Zero
	// means Arrival + Config.RequestTimeout.
	Deadline time.Time
}

// Reason says why a sequence or a request ended.
type Reason uint8

// Reasons. Tombstones carry Stop and Length as "finished" on the wire.
const (
	_         Reason = iota
	Stop             // a stop token, or Abort(id, Stop) for a stop string
	Length           // MaxTokens or the model's context reached
	Aborted          // the client went away or asked to cancel
	Timeout          // the queue timeout or the request's deadline passed
	Preempted        // sequence only: blocks ran out; the request was requeued
	Failed           // lost work past the retry limit, or failed by the shell
)

var reasonNames = [...]string{"none", "stop", "length", "aborted", "timeout", "preempted", "failed"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", r)
}

// Finished reports whether r is a natural end (Stop or Length), which a
// tombstone calls "finished".
func (r Reason) Finished() bool { return r == Stop || r == Length }

// Tombstone says a sequence ended; every stage frees its blocks. The shell
// stamps the epoch.
type Tombstone struct {
	Seq    SeqID
	Reason Reason
}

// Row is one sequence's part of a micro-batch.
type Row struct {
	Request RequestID // whose sampling parameters apply (the coordinator attaches them)
	Seq     SeqID
	Pos     int  // position of Tokens[0]
	First   bool // the sequence's first row: stages create it (Pos may be > 0 after a prefix-cache hit)
	Tokens  []int32
	// Blocks is the sequence's block table covering positions
	// [0, Pos+len(Tokens)).
	Blocks []kv.BlockID
	// SlideFrom and Slides are the sliding groups' tables when the KV has
	// them (Config.KV.Groups > 1): entries [SlideFrom, len(Blocks)) of each
	// sliding table, group g's at Slides[(g-1)*w:g*w] for w =
	// len(Blocks)-SlideFrom. The entries before SlideFrom were released
	// when this row was emitted: no position it reads lies in them.
	SlideFrom int
	Slides    []kv.BlockID
	// Sample asks the last stage for logits and a sampled token: set on the
	// last chunk of a prefill and on every decode.
	Sample bool
}

// Batch is one micro-batch to dispatch.
type Batch struct {
	ID   BatchID
	Rows []Row
}

// Output is what Step returns. The caller owns every slice in it.
//
// The shell sends Tombstones first (in the header of the first of Batches, or
// in an empty batch when Batches is empty), then Batches in order, and
// forwards Updates to the requests' clients.
type Output struct {
	Tombstones []Tombstone
	Batches    []Batch
	Updates    []Update

	// Backing arrays of the rows, their tokens and blocks and the updates'
	// tokens, kept for StepInto to reuse.
	rows    []Row
	toks    []int32
	blks    []kv.BlockID
	updToks []int32
}

// reset empties o for reuse. It leaves the elements of rows and Updates for
// emit, which overwrites those it reuses and clears the rest.
func (o *Output) reset() {
	o.Tombstones = o.Tombstones[:0]
	clear(o.Batches)
	o.Batches = o.Batches[:0]
	o.Updates = o.Updates[:0]
}

// Empty reports whether there is nothing to send.
func (o *Output) Empty() bool {
	return len(o.Tombstones) == 0 && len(o.Batches) == 0 && len(o.Updates) == 0
}

// Update is news for one request's client since the previous Step.
type Update struct {
	Request RequestID
	Tokens  []int32 // tokens generated since the previous update, in order
	Done    bool    // the request ended; no more updates follow
	Reason  Reason  // why it ended, when Done
}

// Sample is one sampled token in a Result.
type Sample struct {
	Seq   SeqID
	Token int32
}

// Result is what the last stage returned for a batch: every stage has
// computed its rows. Samples holds one token for each row that asked, in row
// order.
type Result struct {
	Batch   BatchID
	Samples []Sample
}

// BatchRow is one row of a batch in flight, as InFlightBatch reports it.
type BatchRow struct {
	Seq    SeqID
	Tokens int  // positions the row carries
	Sample bool // the row asked for a sampled token
}

// Failure reports lost work: a hop dropped a batch, or rows of it.
type Failure struct {
	Batch BatchID
	// Seqs lists the sequences whose rows were dropped; empty means the whole
	// batch was lost and no Result for it will come.
	Seqs   []SeqID
	Reason string // for the shell's logs and metrics; the scheduler ignores it
}

// Stats is a snapshot of the scheduler.
type Stats struct {
	Waiting       int // requests waiting for admission
	WaitingTokens int // their tokens
	Running       int // live sequences
	InFlight      int // batches dispatched and not yet retired
	KV            kv.Stats

	Added       uint64 // requests accepted by Add
	Ended       uint64 // requests ended (each exactly once)
	Preemptions uint64
	Retries     uint64 // requests requeued after lost work
	Reclaimed   uint64 // batches failed for passing ReclaimTimeout
	Ignored     uint64 // results, samples and failures for retired batches or dead sequences
	Tombstones  [Failed + 1]uint64
}
