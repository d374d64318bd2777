package shard

import (
	"fmt"
	"slices"
	"time"
)

// Reason says why a shard freed a sequence.
type Reason uint8

// Reasons: the first five arrive in tombstones from the coordinator; the last
// three are the shard's own repairs, which stay zero in a healthy cluster.
const (
	Finished Reason = iota
	Aborted
	Timeout
	Preempted
	Failed
	Lease     // the coordinator stopped renewing the sequence's lease
	Epoch     // a newer epoch dropped every older sequence
	Reconcile // the coordinator said it no longer knows the sequence
	numReasons
)

var reasonNames = [numReasons]string{"finished", "aborted", "timeout", "preempted", "failed", "lease", "epoch", "reconcile"}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", r)
}

// Reasons lists every Reason, for metrics.
func Reasons() []Reason {
	out := make([]Reason, numReasons)
	for i := range out {
		out[i] = Reason(i)
	}
	return out
}

// RowError says why a row was refused; its Code is what BatchFailed reports.
type RowError struct {
	Seq  uint64
	Code string // "unknown_sequence", "stale_create", "bad_position", "bad_blocks"
	Msg  string
}

func (e *RowError) Error() string {
	return fmt.Sprintf("shard: sequence %d: %s: %s", e.Seq, e.Code, e.Msg)
}

type replica struct {
	blocks []int32
	length int       // positions written
	renew  time.Time // last lease renewal (shard's monotonic clock)
}

// Table is a shard's replica of the live sequences' block tables. It is not
// safe for concurrent use.
type Table struct {
	pool  int // blocks in the physical pool; valid IDs are [0, pool)
	epoch uint64
	hwm   uint64 // highest sequence ID created in this epoch
	live  map[uint64]*replica
	early map[uint64]Reason // tombstones for IDs above hwm, not yet created

	freed   [numReasons]uint64
	refused map[string]uint64
}

// NewTable returns an empty table for a pool of pool blocks.
func NewTable(pool int) *Table {
	return &Table{pool: pool, live: map[uint64]*replica{}, early: map[uint64]Reason{}, refused: map[string]uint64{}}
}

// Epoch is the newest epoch the table has seen.
func (t *Table) Epoch() uint64 { return t.epoch }

// SetEpoch moves the table to epoch e. A newer epoch frees every sequence of
// older ones (reason Epoch) and resets the high-water mark; it returns
// whether e is acceptable: false for an older epoch, whose work must be
// refused.
func (t *Table) SetEpoch(e uint64) bool {
	switch {
	case e < t.epoch:
		return false
	case e == t.epoch:
		return true
	}
	for seq := range t.live {
		t.free(seq, Epoch)
	}
	clear(t.early)
	t.epoch, t.hwm = e, 0
	return true
}

// Tombstone ends seq: its blocks leave the table. A tombstone for a sequence
// not yet created (above the high-water mark) is remembered so that its
// create is refused; one for an ID at or below the mark that is not live is
// a harmless repeat. It reports whether a live sequence was freed.
func (t *Table) Tombstone(seq uint64, r Reason) bool {
	if _, ok := t.live[seq]; ok {
		t.free(seq, r)
		return true
	}
	if seq > t.hwm {
		t.early[seq] = r
	}
	return false
}

// free is the one door through which a sequence leaves the table.
func (t *Table) free(seq uint64, r Reason) {
	delete(t.live, seq)
	t.freed[r]++
}

// Place checks a row against the table and, when it fits, records it: a
// first row creates the sequence, any other extends it. Rows are placed in
// the order they arrive. now starts or keeps the sequence's lease.
func (t *Table) Place(seq uint64, pos int, first bool, n int, blocks []int32, bs int, now time.Time) error {
	refuse := func(code, format string, args ...any) error {
		t.refused[code]++
		return &RowError{Seq: seq, Code: code, Msg: fmt.Sprintf(format, args...)}
	}
	need := (pos + n + bs - 1) / bs
	if n <= 0 || len(blocks) < need {
		return refuse("bad_blocks", "%d tokens at position %d need %d blocks, row names %d", n, pos, need, len(blocks))
	}
	for i, b := range blocks[:need] {
		if b < 0 || int(b) >= t.pool {
			return refuse("bad_blocks", "block %d is %d, pool has %d", i, b, t.pool)
		}
	}
	if first {
		if _, dead := t.early[seq]; dead || seq <= t.hwm {
			return refuse("stale_create", "create of sequence %d at or below high-water mark %d, or already tombstoned", seq, t.hwm)
		}
		t.hwm = seq
		for s := range t.early {
			if s <= seq {
				delete(t.early, s)
			}
		}
		t.live[seq] = &replica{blocks: slices.Clone(blocks[:need]), length: pos + n, renew: now}
		return nil
	}
	r, ok := t.live[seq]
	if !ok {
		return refuse("unknown_sequence", "no live sequence %d", seq)
	}
	if pos != r.length {
		return refuse("bad_position", "row at position %d, sequence has %d", pos, r.length)
	}
	if !slices.Equal(blocks[:min(len(r.blocks), need)], r.blocks[:min(len(r.blocks), need)]) {
		return refuse("bad_blocks", "block table changed under a live sequence")
	}
	if need > len(r.blocks) {
		r.blocks = append(r.blocks, blocks[len(r.blocks):need]...)
	}
	r.length = pos + n
	return nil
}

// Renew extends the lease of every live sequence not in unknown and frees
// those in unknown (reason Reconcile): the coordinator's heartbeat reply.
func (t *Table) Renew(unknown []uint64, now time.Time) {
	for _, seq := range unknown {
		if _, ok := t.live[seq]; ok {
			t.free(seq, Reconcile)
		}
	}
	for _, r := range t.live {
		r.renew = now
	}
}

// Expire frees every sequence whose lease was last renewed more than lease
// before now (reason Lease), and returns how many it freed.
func (t *Table) Expire(now time.Time, lease time.Duration) int {
	n := 0
	for seq, r := range t.live {
		if now.Sub(r.renew) > lease {
			t.free(seq, Lease)
			n++
		}
	}
	return n
}

// Live returns the live sequence IDs in increasing order.
func (t *Table) Live() []uint64 {
	out := make([]uint64, 0, len(t.live))
	for seq := range t.live {
		out = append(out, seq)
	}
	slices.Sort(out)
	return out
}

// Has reports whether seq is live.
func (t *Table) Has(seq uint64) bool { _, ok := t.live[seq]; return ok }

// Sequences is the number of live sequences.
func (t *Table) Sequences() int { return len(t.live) }

// BlocksUsed is the number of distinct blocks named by live tables (shared
// prefix blocks count once).
func (t *Table) BlocksUsed() int {
	seen := map[int32]struct{}{}
	for _, r := range t.live {
		for _, b := range r.blocks {
			seen[b] = struct{}{}
		}
	}
	return len(seen)
}

// BlocksOf returns the blocks a live sequence's table names (nil if not live).
func (t *Table) BlocksOf(seq uint64) []int32 {
	if r, ok := t.live[seq]; ok {
		return slices.Clone(r.blocks)
	}
	return nil
}

// Freed returns how many sequences were freed for reason r.
func (t *Table) Freed(r Reason) uint64 { return t.freed[r] }

// Refused returns how many rows were refused with the given code.
func (t *Table) Refused(code string) uint64 { return t.refused[code] }

// CheckInvariants verifies the table's own consistency for blocks of bs
// positions: every live sequence at or below the high-water mark, its block
// table exactly covering its length, every block inside the pool, and no
// pending tombstone at or below the mark. It is what strata_kv_invariant_ok
// reports while the coordinator's heartbeat replies carry no block counts.
func (t *Table) CheckInvariants(bs int) error {
	for seq, r := range t.live {
		if seq > t.hwm {
			return fmt.Errorf("shard: live sequence %d above high-water mark %d", seq, t.hwm)
		}
		if need := (r.length + bs - 1) / bs; len(r.blocks) != need {
			return fmt.Errorf("shard: sequence %d of length %d holds %d blocks, want %d", seq, r.length, len(r.blocks), need)
		}
		for i, b := range r.blocks {
			if b < 0 || int(b) >= t.pool {
				return fmt.Errorf("shard: sequence %d block %d is %d, pool has %d", seq, i, b, t.pool)
			}
		}
	}
	for seq := range t.early {
		if seq <= t.hwm {
			return fmt.Errorf("shard: pending tombstone for sequence %d at or below high-water mark %d", seq, t.hwm)
		}
	}
	return nil
}
