package shard

import (
	"errors"
	"testing"
	"time"
)

func code(err error) string {
	var re *RowError
	if errors.As(err, &re) {
		return re.Code.String()
	}
	if err != nil {
		return "other"
	}
	return ""
}

func TestTablePlacement(t *testing.T) {
	now := time.Unix(100, 0)
	const bs = 4
	type step struct {
		name   string
		do     func(tb *Table) error
		want   string // error code, "" for success
		used   int
		live   int
		freeOf Reason
		freed  uint64
	}
	place := func(seq uint64, pos int, first bool, n int, blocks ...int32) func(*Table) error {
		return func(tb *Table) error { return tb.Place(seq, pos, first, n, blocks, bs, now) }
	}
	tomb := func(seq uint64, r Reason) func(*Table) error {
		return func(tb *Table) error { tb.Tombstone(seq, r); return nil }
	}
	steps := []step{
		{name: "create 5", do: place(5, 0, true, 3, 0), used: 1, live: 1},
		{name: "extend 5 across a block", do: place(5, 3, false, 2, 0, 1), used: 2, live: 1},
		{name: "row at the wrong position", do: place(5, 4, false, 1, 0, 1), want: "bad_position", used: 2, live: 1},
		{name: "block table rewritten", do: place(5, 5, false, 1, 0, 2), want: "bad_blocks", used: 2, live: 1},
		{name: "block outside the pool", do: place(6, 0, true, 1, 99), want: "bad_blocks", used: 2, live: 1},
		{name: "too few blocks", do: place(6, 0, true, 5, 3), want: "bad_blocks", used: 2, live: 1},
		{name: "row for a sequence never created", do: place(4, 3, false, 1, 0), want: "unknown_sequence", used: 2, live: 1},
		{name: "create at or below the high-water mark", do: place(3, 0, true, 1, 3), want: "stale_create", used: 2, live: 1},
		{name: "tombstone 7 before its create", do: tomb(7, Aborted), used: 2, live: 1},
		{name: "create of tombstoned 7 refused", do: place(7, 0, true, 1, 3), want: "stale_create", used: 2, live: 1},
		{name: "create 8", do: place(8, 0, true, 2, 3), used: 3, live: 2},
		{name: "finish 5", do: tomb(5, Finished), used: 1, live: 1, freeOf: Finished, freed: 1},
		{name: "late row of 5 dropped", do: place(5, 5, false, 1, 0, 1), want: "unknown_sequence", used: 1, live: 1},
		{name: "tombstone 5 again is harmless", do: tomb(5, Finished), used: 1, live: 1, freeOf: Finished, freed: 1},
		{name: "create 9 sharing 8's first block (prefix cache)", do: place(9, 4, true, 1, 3, 4), used: 2, live: 2},
	}
	tb := NewTable(8)
	tb.SetEpoch(1)
	for _, s := range steps {
		err := s.do(tb)
		if got := code(err); got != s.want {
			t.Fatalf("%s: error code %q (%v), want %q", s.name, got, err, s.want)
		}
		if got := tb.BlocksUsed(); got != s.used {
			t.Fatalf("%s: %d blocks used, want %d", s.name, got, s.used)
		}
		if got := tb.Sequences(); got != s.live {
			t.Fatalf("%s: %d live, want %d", s.name, got, s.live)
		}
		if s.freed != 0 && tb.Freed(s.freeOf) != s.freed {
			t.Fatalf("%s: freed(%v) = %d, want %d", s.name, s.freeOf, tb.Freed(s.freeOf), s.freed)
		}
	}
}

func TestTableEpochLeaseReconcile(t *testing.T) {
	t0 := time.Unix(100, 0)
	tb := NewTable(16)
	if !tb.SetEpoch(10) {
		t.Fatal("first epoch refused")
	}
	for seq := uint64(1); seq <= 4; seq++ {
		if err := tb.Place(seq, 0, true, 1, []int32{int32(seq)}, 16, t0); err != nil {
			t.Fatal(err)
		}
	}
	if tb.SetEpoch(9) {
		t.Fatal("older epoch accepted")
	}
	// Reconcile: the coordinator no longer knows 2.
	tb.Renew([]uint64{2}, t0.Add(time.Second))
	if tb.Has(2) || tb.Freed(Reconcile) != 1 {
		t.Fatalf("reconcile did not free 2: live %v", tb.Live())
	}
	// 4 is created later; leases of 1 and 3 were renewed at t0+1s.
	if n := tb.Expire(t0.Add(2*time.Second), 5*time.Second); n != 0 {
		t.Fatalf("expired %d before the lease ran out", n)
	}
	if n := tb.Expire(t0.Add(7*time.Second), 5*time.Second); n != 3 || tb.Freed(Lease) != 3 {
		t.Fatalf("expired %d (freed by lease %d), want 3", n, tb.Freed(Lease))
	}
	if err := tb.Place(5, 0, true, 1, []int32{5}, 16, t0); err != nil {
		t.Fatal(err)
	}
	if !tb.SetEpoch(11) || tb.Sequences() != 0 || tb.Freed(Epoch) != 1 {
		t.Fatalf("new epoch: %d live, freed by epoch %d", tb.Sequences(), tb.Freed(Epoch))
	}
	// The high-water mark restarts with the epoch: sequence 1 of epoch 11 is new.
	if err := tb.Place(1, 0, true, 1, []int32{1}, 16, t0); err != nil {
		t.Fatalf("create in the new epoch: %v", err)
	}
}

// TestTableEarlyTombstonesBounded checks that tombstones for uncreated
// sequences are forgotten once the high-water mark passes them.
func TestTableEarlyTombstonesBounded(t *testing.T) {
	tb := NewTable(4)
	tb.SetEpoch(1)
	for seq := uint64(2); seq < 1000; seq += 2 {
		tb.Tombstone(seq, Aborted)
	}
	if len(tb.early) != 499 {
		t.Fatalf("%d early tombstones", len(tb.early))
	}
	if err := tb.Place(1001, 0, true, 1, []int32{0}, 16, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if len(tb.early) != 0 {
		t.Fatalf("%d early tombstones kept below the high-water mark", len(tb.early))
	}
}
