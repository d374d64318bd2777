package transport

import (
	"testing"

	"github.com/strata-llm/strata/transport/pb"
)

func TestReasonLabel(t *testing.T) {
	for r, want := range map[pb.Tombstone_Reason]string{
		pb.Tombstone_FINISHED:  "finished",
		pb.Tombstone_ABORTED:   "aborted",
		pb.Tombstone_TIMEOUT:   "timeout",
		pb.Tombstone_PREEMPTED: "preempted",
		pb.Tombstone_FAILED:    "failed",
		pb.Tombstone_LEASE:     "lease",
		pb.Tombstone_EPOCH:     "epoch",
		pb.Tombstone_RECONCILE: "reconcile",
	} {
		if got := ReasonLabel(r); got != want {
			t.Errorf("ReasonLabel(%d) = %q, want %q", r, got, want)
		}
	}
}
