package shard

import (
	"container/heap"
	"fmt"
	"slices"
	"time"

	"github.com/strata-llm/strata/transport"
)

// Reason says why a shard freed a sequence: transport's end-reason enum,
// the one vocabulary from the coordinator's tombstones to these counters.
type Reason = transport.Reason

// Reasons: the first five arrive in tombstones from the coordinator; the last
// three are the shard's own repairs, which stay zero in a healthy cluster.
const (
	Finished  = transport.ReasonFinished
	Aborted   = transport.ReasonAborted
	Timeout   = transport.ReasonTimeout
	Preempted = transport.ReasonPreempted
	Failed    = transport.ReasonFailed
	Lease     = transport.ReasonLease     // the coordinator stopped renewing the sequence's lease
	Epoch     = transport.ReasonEpoch     // a newer epoch dropped every older sequence
	Reconcile = transport.ReasonReconcile // the coordinator said it no longer knows the sequence
)

// Reasons lists every Reason, for metrics.
func Reasons() []Reason { return transport.Reasons() }

// MaxEarlyTombstones bounds the tombstones a table keeps for sequences
// above its high-water mark (not yet created here), and, once it has
// created a sequence, how far above the mark they may be. Such a tombstone
// exists only to refuse a create still on its way to this stage: a
// sequence the coordinator dispatched and this stage has not yet seen,
// when the tombstone overtook it on the control-stream backstop. The
// coordinator keeps at most MaxInFlight batches of at most MaxBatchRows
// rows in flight (by default stages + 1 batches of 256 rows: 2,304 rows
// for 8 stages), so a legitimate early tombstone lies within a few
// thousand IDs of the mark; after a re-placement a fresh table may also
// receive the backstop of every sequence the old pipeline was running,
// which 16 Ki covers as well. A tombstone beyond the limit is refused and
// counted (strata_tombstones_refused_total) instead of growing the table
// without end: the same tombstone also rides in-band behind the create on
// the stage stream and frees the sequence there, and reconcile frees it if
// that batch is lost, so refusing it delays a free and never loses one.
const MaxEarlyTombstones = 1 << 14

// RowError says why a row was refused; its Code is what the stage reports
// (DroppedRow.reason).
type RowError struct {
	Seq  uint64
	Code transport.Code // a row code: unknown_sequence, stale_create, bad_position, bad_blocks, ...
	Msg  string
}

func (e *RowError) Error() string {
	return fmt.Sprintf("shard: sequence %d: %s: %s", e.Seq, e.Code, e.Msg)
}

type replica struct {
	blocks []int32 // table 0: the global layers' (and every layer's when there are no sliding tables)
	// from and slides are the sliding groups' tables, for a model whose KV
	// has them (docs/sliding-window-kv.md): slides[g] holds sliding group
	// g+1's live entries, indexes [from, len(blocks)) of its table; those
	// before from were released. No slides, and from 0, for other models.
	from   int
	slides [][]int32
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
	early map[uint64]Reason // tombstones for IDs above hwm, not yet created: at most MaxEarlyTombstones
	// earlyOrder holds early's IDs, smallest first, so that a create
	// forgets those it passes without scanning the rest.
	earlyOrder seqHeap

	freed        [transport.NumReasons]uint64
	refused      map[transport.Code]uint64
	earlyRefused uint64 // tombstones refused past MaxEarlyTombstones

	// onEnd, when set, is called by free for every sequence that leaves
	// the table: the Runner drops the rest of the sequence's state there.
	onEnd func(seq uint64, r Reason)
}

// NewTable returns an empty table for a pool of pool blocks.
func NewTable(pool int) *Table {
	return &Table{pool: pool, live: map[uint64]*replica{}, early: map[uint64]Reason{}, refused: map[transport.Code]uint64{}}
}

// seqHeap is a min-heap of sequence IDs (container/heap).
type seqHeap []uint64

func (h seqHeap) Len() int           { return len(h) }
func (h seqHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h seqHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *seqHeap) Push(x any)        { *h = append(*h, x.(uint64)) }
func (h *seqHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
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
	t.earlyOrder = t.earlyOrder[:0]
	t.epoch, t.hwm = e, 0
	return true
}

// Tombstone ends seq: its blocks leave the table. A tombstone for a sequence
// not yet created (above the high-water mark) is remembered so that its
// create is refused, within MaxEarlyTombstones (beyond, it is refused and
// counted); one for an ID at or below the mark that is not live is a
// harmless repeat. It reports whether a live sequence was freed.
func (t *Table) Tombstone(seq uint64, r Reason) bool {
	if _, ok := t.live[seq]; ok {
		t.free(seq, r)
		return true
	}
	if _, dup := t.early[seq]; seq <= t.hwm || dup {
		return false
	}
	if (t.hwm > 0 && seq-t.hwm > MaxEarlyTombstones) || len(t.early) >= MaxEarlyTombstones {
		t.earlyRefused++
		return false
	}
	t.early[seq] = r
	heap.Push(&t.earlyOrder, seq)
	return false
}

// created raises the high-water mark to seq and forgets the early
// tombstones it passed; at the first create since the mark was reset (a
// new epoch or table), those more than MaxEarlyTombstones above seq are
// dropped too and counted as refused, so that from then on every early
// tombstone lies within the limit of the mark.
func (t *Table) created(seq uint64) {
	first := t.hwm == 0
	t.hwm = seq
	for len(t.earlyOrder) > 0 && t.earlyOrder[0] <= seq {
		delete(t.early, heap.Pop(&t.earlyOrder).(uint64))
	}
	if !first || len(t.earlyOrder) == 0 {
		return
	}
	t.earlyOrder = t.earlyOrder[:0]
	for s := range t.early {
		if s-seq > MaxEarlyTombstones {
			delete(t.early, s)
			t.earlyRefused++
			continue
		}
		t.earlyOrder = append(t.earlyOrder, s)
	}
	heap.Init(&t.earlyOrder)
}

// free is the one door through which a sequence leaves the table, for
// every reason: a tombstone (in a batch or on the backstop), a refused row,
// a lapsed lease, a newer epoch, reconcile, or the end of the table's
// placement (EndAll). It forgets the sequence's blocks, counts the reason
// and tells onEnd, which frees the state the table does not hold.
func (t *Table) free(seq uint64, r Reason) {
	delete(t.live, seq)
	t.freed[r]++
	if t.onEnd != nil {
		t.onEnd(seq, r)
	}
}

// EndAll frees every live sequence with reason r (a placement that ends
// takes its sequences with it) and returns how many it freed.
func (t *Table) EndAll(r Reason) int {
	n := len(t.live)
	for seq := range t.live {
		t.free(seq, r)
	}
	return n
}

// Place checks a row against the table and, when it fits, records it: a
// first row creates the sequence, any other extends it. Rows are placed in
// the order they arrive. now starts or keeps the sequence's lease.
//
// blocks is the sequence's table 0; slideFrom and slides are its sliding
// tables as transport.Row carries them (none for a model without them):
// entries [slideFrom, len(blocks)) of each, group g's (g >= 1) at
// slides[(g-1)*w:g*w] for w = len(blocks)-slideFrom. A later row may only
// release entries at their front (a larger slideFrom, never below the
// block of its first position, which every layer reads) and append at
// their back: one that brings a released entry back, changes a live one
// or has another number of tables is refused, like one that rewrites
// table 0.
func (t *Table) Place(seq uint64, pos int, first bool, n int, blocks []int32, slideFrom int, slides []int32, bs int, now time.Time) error {
	refuse := func(code transport.Code, format string, args ...any) error {
		t.refused[code]++
		return &RowError{Seq: seq, Code: code, Msg: fmt.Sprintf(format, args...)}
	}
	if pos < 0 || n <= 0 || bs <= 0 {
		return refuse(transport.CodeBadPosition, "%d tokens at position %d in blocks of %d", n, pos, bs)
	}
	need := (pos + n + bs - 1) / bs
	if len(blocks) < need {
		return refuse(transport.CodeBadBlocks, "%d tokens at position %d need %d blocks, row names %d", n, pos, need, len(blocks))
	}
	for i, b := range blocks[:need] {
		if b < 0 || int(b) >= t.pool {
			return refuse(transport.CodeBadBlocks, "block %d is %d, pool has %d", i, b, t.pool)
		}
	}
	// The sliding tables: as many as len(slides) holds of width w, of
	// which the entries up to need are the row's.
	w := len(blocks) - slideFrom
	if slideFrom < 0 || slideFrom > pos/bs || len(slides)%w != 0 || (len(slides) == 0 && slideFrom != 0) {
		return refuse(transport.CodeBadBlocks, "%d sliding entries from block %d, for %d blocks and positions from %d", len(slides), slideFrom, len(blocks), pos)
	}
	groups := len(slides) / w
	for g := range groups {
		for j, sb := range slides[g*w : g*w+need-slideFrom] {
			if sb < 0 || int(sb) >= t.pool {
				return refuse(transport.CodeBadBlocks, "sliding group %d block %d is %d, pool has %d", g+1, slideFrom+j, sb, t.pool)
			}
		}
	}
	if first {
		if _, dead := t.early[seq]; dead || seq <= t.hwm {
			return refuse(transport.CodeStaleCreate, "create of sequence %d at or below high-water mark %d, or already tombstoned", seq, t.hwm)
		}
		t.created(seq)
		r := &replica{blocks: slices.Clone(blocks[:need]), from: slideFrom, length: pos + n, renew: now}
		if groups > 0 {
			r.slides = make([][]int32, groups)
			for g := range r.slides {
				r.slides[g] = slices.Clone(slides[g*w : g*w+need-slideFrom])
			}
		}
		t.live[seq] = r
		return nil
	}
	r, ok := t.live[seq]
	if !ok {
		return refuse(transport.CodeUnknownSequence, "no live sequence %d", seq)
	}
	if pos != r.length {
		return refuse(transport.CodeBadPosition, "row at position %d, sequence has %d", pos, r.length)
	}
	if !slices.Equal(blocks[:min(len(r.blocks), need)], r.blocks[:min(len(r.blocks), need)]) {
		return refuse(transport.CodeBadBlocks, "block table changed under a live sequence")
	}
	switch {
	case groups != len(r.slides):
		return refuse(transport.CodeBadBlocks, "%d sliding tables for a live sequence with %d", groups, len(r.slides))
	case slideFrom < r.from:
		return refuse(transport.CodeBadBlocks, "sliding tables from block %d under a live sequence that released the blocks before %d", slideFrom, r.from)
	}
	// The sliding entries both hold: [lo, have), lo being slideFrom once
	// the checks above passed.
	lo, have := max(slideFrom, r.from), min(len(r.blocks), need)
	for g, live := range r.slides {
		if !slices.Equal(slides[g*w+lo-slideFrom:g*w+have-slideFrom], live[lo-r.from:have-r.from]) {
			return refuse(transport.CodeBadBlocks, "sliding group %d's table changed under a live sequence", g+1)
		}
	}
	if need > len(r.blocks) {
		r.blocks = append(r.blocks, blocks[len(r.blocks):need]...)
	}
	// Each sliding table drops the entries the row released (in place:
	// its live entries stay few) and appends the row's new ones.
	for g, live := range r.slides {
		if d := slideFrom - r.from; d > 0 {
			live = live[:copy(live, live[d:])]
		}
		r.slides[g] = append(live, slides[g*w+have-slideFrom:g*w+need-slideFrom]...)
	}
	r.from = slideFrom
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

// BlocksUsed is the number of distinct blocks named by live tables, table
// 0 and the live entries of the sliding ones (shared prefix blocks count
// once).
func (t *Table) BlocksUsed() int {
	seen := map[int32]struct{}{}
	for _, r := range t.live {
		for _, b := range r.blocks {
			seen[b] = struct{}{}
		}
		for _, live := range r.slides {
			for _, b := range live {
				seen[b] = struct{}{}
			}
		}
	}
	return len(seen)
}

// BlocksOf returns the blocks a live sequence's table 0 names (nil if not
// live).
func (t *Table) BlocksOf(seq uint64) []int32 {
	if r, ok := t.live[seq]; ok {
		return slices.Clone(r.blocks)
	}
	return nil
}

// SlidesOf returns a live sequence's sliding tables: the index of their
// first live entry, and each table's live entries (group g's at g-1). It
// returns 0 and nil for a sequence that is not live or has none.
func (t *Table) SlidesOf(seq uint64) (from int, slides [][]int32) {
	r, ok := t.live[seq]
	if !ok || len(r.slides) == 0 {
		return 0, nil
	}
	slides = make([][]int32, len(r.slides))
	for g, live := range r.slides {
		slides[g] = slices.Clone(live)
	}
	return r.from, slides
}

// Freed returns how many sequences were freed for reason r.
func (t *Table) Freed(r Reason) uint64 { return t.freed[r] }

// Refused returns how many rows were refused with the given code.
func (t *Table) Refused(code transport.Code) uint64 { return t.refused[code] }

// Early returns how many tombstones the table keeps for sequences above its
// high-water mark.
func (t *Table) Early() int { return len(t.early) }

// EarlyRefused returns how many tombstones the table refused past
// MaxEarlyTombstones.
func (t *Table) EarlyRefused() uint64 { return t.earlyRefused }

// CheckInvariants verifies the table's own consistency for blocks of bs
// positions: every live sequence at or below the high-water mark, its block
// table exactly covering its length, its sliding tables (if any) each
// holding the entries from their first live one, at or before the block of
// its last position, to the table's end, every block inside the pool, and
// no pending tombstone at or below the mark. It is what
// strata_kv_invariant_ok reports while the coordinator's heartbeat replies
// carry no block counts.
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
		if r.from < 0 || r.from >= len(r.blocks) || (len(r.slides) == 0 && r.from != 0) {
			return fmt.Errorf("shard: sequence %d of %d blocks has %d sliding tables from block %d", seq, len(r.blocks), len(r.slides), r.from)
		}
		for g, live := range r.slides {
			if len(live) != len(r.blocks)-r.from {
				return fmt.Errorf("shard: sequence %d sliding group %d holds %d blocks from block %d, want %d", seq, g+1, len(live), r.from, len(r.blocks)-r.from)
			}
			for i, b := range live {
				if b < 0 || int(b) >= t.pool {
					return fmt.Errorf("shard: sequence %d sliding group %d block %d is %d, pool has %d", seq, g+1, r.from+i, b, t.pool)
				}
			}
		}
	}
	if len(t.early) > MaxEarlyTombstones || len(t.earlyOrder) != len(t.early) {
		return fmt.Errorf("shard: %d early tombstones (%d ordered), limit %d", len(t.early), len(t.earlyOrder), MaxEarlyTombstones)
	}
	for seq := range t.early {
		if seq <= t.hwm {
			return fmt.Errorf("shard: pending tombstone for sequence %d at or below high-water mark %d", seq, t.hwm)
		}
		if t.hwm > 0 && seq-t.hwm > MaxEarlyTombstones {
			return fmt.Errorf("shard: pending tombstone for sequence %d more than %d above high-water mark %d", seq, MaxEarlyTombstones, t.hwm)
		}
	}
	return nil
}
