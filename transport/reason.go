package transport

import (
	"fmt"

	"github.com/strata-llm/strata/transport/pb"
)

// Reason says why a sequence ended: strata's one end-reason enum, from the
// coordinator's tombstones (in a batch header and on the control stream)
// to every shard's counters and the reason label of
// strata_tombstones_total and strata_tombstones_applied_total. Its values
// are pb.Tombstone_Reason's; 0 (REASON_UNSPECIFIED) is no reason, refused
// on the wire.
type Reason uint8

// Reasons. The first five are decided by the coordinator and travel in
// tombstones; the last three are recorded by a shard that freed a sequence
// on its own and never travel coordinator → shard.
const (
	ReasonFinished Reason = iota + 1
	ReasonAborted
	ReasonTimeout
	ReasonPreempted
	ReasonFailed
	ReasonLease     // the coordinator stopped renewing the sequence's lease
	ReasonEpoch     // a newer epoch (or placement) dropped every older sequence
	ReasonReconcile // the coordinator said it no longer knows the sequence
)

// NumReasons is one above the largest Reason: the length of an array
// indexed by Reason (index 0 unused).
const NumReasons = int(ReasonReconcile) + 1

var reasonNames = [NumReasons]string{"", "finished", "aborted", "timeout", "preempted", "failed", "lease", "epoch", "reconcile"}

// Valid reports whether r is one of the Reasons.
func (r Reason) Valid() bool { return r >= ReasonFinished && r <= ReasonReconcile }

// Coordinator reports whether r is a reason the coordinator decides, the
// only ones a tombstone may carry.
func (r Reason) Coordinator() bool { return r >= ReasonFinished && r <= ReasonFailed }

// String returns r's wire name in lower case ("finished", "lease", ...).
func (r Reason) String() string {
	if r.Valid() {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", r)
}

// Reasons lists every Reason in order.
func Reasons() []Reason {
	out := make([]Reason, 0, NumReasons-1)
	for r := ReasonFinished; r <= ReasonReconcile; r++ {
		out = append(out, r)
	}
	return out
}

// ParseReason returns the Reason named s (String's form).
func ParseReason(s string) (Reason, bool) {
	for r := ReasonFinished; r <= ReasonReconcile; r++ {
		if reasonNames[r] == s {
			return r, true
		}
	}
	return 0, false
}

// wire returns r's protobuf enum.
func (r Reason) wire() pb.Tombstone_Reason { return pb.Tombstone_Reason(r) }
