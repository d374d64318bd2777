package transport

import "fmt"

// Code says why a stage dropped a row, why a stage (or the coordinator)
// failed a batch, or why the wire layer refused a message: the one
// vocabulary of DroppedRow.reason and BatchFailed.reason (sent by name)
// and of the reason labels of strata_rows_dropped_total,
// strata_batches_failed_total, strata_batch_failed_total and
// strata_wire_refused_total. A name outside it is refused on the wire, so
// those labels stay a fixed set whatever a peer sends.
type Code uint8

// Codes. Those up to CodeComputeError are rows a stage refused (its
// replica table or its model); the rest fail or refuse a whole message.
const (
	CodeUnknownSequence Code = iota + 1 // a row of a sequence that is not live here
	CodeStaleCreate                     // a create at or below the high-water mark, or of a tombstoned sequence
	CodeBadPosition                     // a position that is not the sequence's length, negative, or past the context
	CodeBadBlocks                       // a block table that does not cover the row, changed, or names a block outside the pool
	CodeBadToken                        // a token ID outside the vocabulary
	CodeComputeError                    // the model refused rows the table had admitted

	CodeNotReady              // the shard serves no range
	CodeStalePlacement        // a batch of another placement version
	CodeStaleEpoch            // a message of an older epoch
	CodeFutureEpoch           // a message of a newer epoch than the coordinator's control stream announced
	CodeBackendError          // the stage's computation failed
	CodeDownstreamQueueFull   // the link to the next stage is full
	CodeDownstreamUnavailable // the next stage cannot be reached
	CodeResultsUnavailable    // the coordinator's Results stream cannot be reached
	CodeBadHeader             // a batch header that contradicts itself or its hidden state
	CodeHiddenTooLarge        // a hidden state above the receiver's limit
	CodeBadChunks             // hidden-state chunks out of order or of the wrong size
	CodePipelineLost          // the coordinator failed an in-flight batch of a broken pipeline

	CodeTooLarge     // a count or length above its named limit
	CodeBadReason    // a reason outside its enum
	CodeBadParams    // sampling parameters out of range
	CodeBadString    // a string too long, empty where required, or with characters outside its alphabet
	CodeBadField     // another field out of range
	CodeUnknownBatch // a result or failure for a batch not in flight where it came from
	CodeWrongSender  // a message from a shard the placement does not name for it
	CodeRegistryFull // a Register beyond the registry's limit
	CodePanic        // a handler panicked; recovered
	// CodeUnauthenticated: a call without a verified cluster certificate
	// where one is required, or a Join whose token is refused.
	CodeUnauthenticated
	// CodeWrongIdentity: a message claiming a node ID other than the one
	// in the sender's certificate, or a stage stream from a peer the
	// placement does not name as this stage's upstream.
	CodeWrongIdentity
	numCodes
)

var codeNames = [numCodes]string{
	"",
	"unknown_sequence", "stale_create", "bad_position", "bad_blocks", "bad_token", "compute_error",
	"not_ready", "stale_placement", "stale_epoch", "future_epoch", "backend_error",
	"downstream_queue_full", "downstream_unavailable", "results_unavailable",
	"bad_header", "hidden_too_large", "bad_chunks", "pipeline_lost",
	"too_large", "bad_reason", "bad_params", "bad_string", "bad_field",
	"unknown_batch", "wrong_sender", "registry_full", "panic",
	"unauthenticated", "wrong_identity",
}

// Valid reports whether c is one of the Codes.
func (c Code) Valid() bool { return c > 0 && c < numCodes }

// Row reports whether c is a code a stage drops a single row for (the
// reason of a DroppedRow).
func (c Code) Row() bool { return c >= CodeUnknownSequence && c <= CodeComputeError }

// String returns c's name in snake_case, as the wire and metrics carry it.
func (c Code) String() string {
	if c.Valid() {
		return codeNames[c]
	}
	return fmt.Sprintf("code(%d)", c)
}

// Codes lists every Code in order.
func Codes() []Code {
	out := make([]Code, 0, numCodes-1)
	for c := Code(1); c < numCodes; c++ {
		out = append(out, c)
	}
	return out
}

// ParseCode returns the Code named s (String's form).
func ParseCode(s string) (Code, bool) {
	if len(s) > maxCodeLen {
		return 0, false
	}
	for c := Code(1); c < numCodes; c++ {
		if codeNames[c] == s {
			return c, true
		}
	}
	return 0, false
}

// maxCodeLen is the longest code name: a longer string is refused before
// it is compared.
const maxCodeLen = 32
