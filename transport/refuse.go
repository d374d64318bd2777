package transport

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// Named limits on what one message may carry. Every receiver checks them
// (wire.go, control.go) before it allocates or indexes by a peer's value;
// every sender stays inside them.
const (
	// MaxBatchRows bounds a batch's rows, its dropped rows, a result's
	// samples and a BatchFailed's sequences: sched's default is 256 rows
	// (vLLM's max_num_seqs), and 4096 leaves room for any configuration
	// whose hidden state still fits the message limits.
	MaxBatchRows = 4096
	// MaxBatchTokens bounds a batch's tokens when the stage's Assign names
	// no max_batch_tokens: 64 Ki, 128 times sched's default of 512.
	MaxBatchTokens = 1 << 16
	// MaxBatchTombstones bounds the tombstones one batch header or one
	// backstop message carries. The coordinator emits one per ended
	// sequence, and a pause can collect those of every running sequence;
	// 64 Ki covers far more sequences than a pool of blocks holds in
	// practice, and a sender with more splits them over several messages
	// (remote.Dispatch, Cluster.fanOut).
	MaxBatchTombstones = 1 << 16
	// MaxLiveSeqs bounds a heartbeat's live sequences and a heartbeat
	// reply's unknown ones: a shard holds at most one sequence per block of
	// its pool, and 1 Mi is above any pool this project sizes.
	MaxLiveSeqs = 1 << 20
	// MaxIDLen bounds node and shard IDs. A node ID (32 hex digits when a
	// shard makes its own) may have at most MaxIDLen - 17 bytes, so that
	// its shard IDs (node ID, '-', 16 hex digits) fit.
	MaxIDLen = 128
	// MaxAddrLen bounds a host:port address (a DNS name is at most 253
	// characters).
	MaxAddrLen = 270
	// MaxNameLen bounds short names: a device, a GPU's, a model file's.
	MaxNameLen = 256
	// MaxTextLen bounds free text a peer sends: a status's load error.
	// Senders cut theirs to it (Truncate).
	MaxTextLen = 1024
	// MaxModels bounds the model files a shard lists in Register, and
	// MaxGPUs its GPUs.
	MaxModels = 16
	MaxGPUs   = 64
)

// ErrRefused is matched (errors.Is) by every *RefusedError.
var ErrRefused = errors.New("transport: refused")

// RefusedError is a message the wire layer refused: Code is the bounded
// reason (the label of strata_wire_refused_total, and a refused batch's
// BatchFailed.reason); Detail says what was wrong, with the numbers, for
// the receiver's log. Detail may name what the peer sent, never the
// receiver's own state (its epoch, its model), so it is safe to return.
type RefusedError struct {
	Code   Code
	Detail string
}

// Error implements error.
func (e *RefusedError) Error() string {
	return fmt.Sprintf("transport: refused (%s): %s", e.Code, e.Detail)
}

// Is makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

func refuse(c Code, format string, args ...any) *RefusedError {
	return &RefusedError{Code: c, Detail: fmt.Sprintf(format, args...)}
}

// CodeOf returns err's Code: a *RefusedError's or a *BatchError's, and 0
// for any other error.
func CodeOf(err error) Code {
	if re, ok := errors.AsType[*RefusedError](err); ok {
		return re.Code
	}
	if be, ok := errors.AsType[*BatchError](err); ok {
		return be.Reason
	}
	return 0
}

// Refusals counts refused messages by Code. It is safe for concurrent use;
// the zero value is ready.
type Refusals struct {
	n [numCodes]atomic.Uint64
}

// Add counts one refusal for c (an invalid c counts as CodeBadField).
func (r *Refusals) Add(c Code) {
	if !c.Valid() {
		c = CodeBadField
	}
	r.n[c].Add(1)
}

// Count counts err when it carries a Code (CodeOf) and reports whether it
// did.
func (r *Refusals) Count(err error) bool {
	c := CodeOf(err)
	if c == 0 {
		return false
	}
	r.Add(c)
	return true
}

// Get returns the refusals counted for c.
func (r *Refusals) Get(c Code) uint64 {
	if !c.Valid() {
		return 0
	}
	return r.n[c].Load()
}

// Snapshot returns the non-zero counts by code name.
func (r *Refusals) Snapshot() map[string]uint64 {
	out := map[string]uint64{}
	for c := Code(1); c < numCodes; c++ {
		if v := r.n[c].Load(); v > 0 {
			out[c.String()] = v
		}
	}
	return out
}

// Truncate returns s cut to at most n bytes, at a rune boundary, with "…"
// marking the cut: what a sender does to free text before a peer's limit
// (MaxTextLen) would refuse it.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	cut := max(n-len(mark), 0)
	for cut > 0 && cut < len(s) && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + mark
}
