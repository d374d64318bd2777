package shard

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/strata-llm/strata/transport"
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
		return func(tb *Table) error { return tb.Place(seq, pos, first, n, blocks, 0, nil, bs, now) }
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
		if err := tb.Place(seq, 0, true, 1, []int32{int32(seq)}, 0, nil, 16, t0); err != nil {
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
	if err := tb.Place(5, 0, true, 1, []int32{5}, 0, nil, 16, t0); err != nil {
		t.Fatal(err)
	}
	if !tb.SetEpoch(11) || tb.Sequences() != 0 || tb.Freed(Epoch) != 1 {
		t.Fatalf("new epoch: %d live, freed by epoch %d", tb.Sequences(), tb.Freed(Epoch))
	}
	// The high-water mark restarts with the epoch: sequence 1 of epoch 11 is new.
	if err := tb.Place(1, 0, true, 1, []int32{1}, 0, nil, 16, t0); err != nil {
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
	if err := tb.Place(1001, 0, true, 1, []int32{0}, 0, nil, 16, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if len(tb.early) != 0 {
		t.Fatalf("%d early tombstones kept below the high-water mark", len(tb.early))
	}
}

// TestTableSlides: a sequence's sliding tables (two here) are recorded at
// its create and follow its rows: a row releases entries at their front and
// appends at their back, and one that brings a released entry back,
// changes a live one, has another number of tables, releases the block of
// its own first position or names a block outside the pool is refused
// (bad_blocks) and changes nothing. BlocksUsed counts every live entry.
func TestTableSlides(t *testing.T) {
	now := time.Unix(100, 0)
	const bs = 4
	// place places a row whose sliding tables are given one per group.
	place := func(seq uint64, pos int, first bool, n int, blocks []int32, from int, groups ...[]int32) func(*Table) error {
		var slides []int32
		for _, g := range groups {
			slides = append(slides, g...)
		}
		return func(tb *Table) error { return tb.Place(seq, pos, first, n, blocks, from, slides, bs, now) }
	}
	flat := func(seq uint64, pos int, n int, blocks []int32, from int, slides []int32) func(*Table) error {
		return func(tb *Table) error { return tb.Place(seq, pos, false, n, blocks, from, slides, bs, now) }
	}
	type step struct {
		name      string
		do        func(tb *Table) error
		want      string // error code, "" for success
		used      int
		from      int     // sequence 1's first live sliding entry
		g1, g2    []int32 // sequence 1's sliding tables
		blocksOf1 []int32 // sequence 1's table 0
	}
	b3 := []int32{0, 1, 2}
	steps := []step{
		{name: "create 1 with two sliding tables", do: place(1, 0, true, 6, []int32{0, 1}, 0, []int32{10, 11}, []int32{20, 21}),
			used: 6, g1: []int32{10, 11}, g2: []int32{20, 21}, blocksOf1: []int32{0, 1}},
		{name: "extend into block 2, releasing block 0", do: place(1, 6, false, 3, b3, 1, []int32{11, 12}, []int32{21, 22}),
			used: 7, from: 1, g1: []int32{11, 12}, g2: []int32{21, 22}, blocksOf1: b3},
		{name: "a released entry comes back", do: place(1, 9, false, 1, b3, 0, []int32{10, 11, 12}, []int32{20, 21, 22}), want: "bad_blocks"},
		{name: "a live entry changes", do: place(1, 9, false, 1, b3, 1, []int32{11, 13}, []int32{21, 22}), want: "bad_blocks"},
		{name: "the first live entry changes", do: place(1, 9, false, 1, b3, 1, []int32{11, 12}, []int32{15, 22}), want: "bad_blocks"},
		{name: "one sliding table", do: place(1, 9, false, 1, b3, 1, []int32{11, 12}), want: "bad_blocks"},
		{name: "three sliding tables", do: place(1, 9, false, 1, b3, 1, []int32{11, 12}, []int32{21, 22}, []int32{3, 4}), want: "bad_blocks"},
		{name: "no sliding tables", do: place(1, 9, false, 1, b3, 0), want: "bad_blocks"},
		{name: "the row's own first block released", do: place(1, 9, false, 1, []int32{0, 1, 2, 3}, 3, []int32{13}, []int32{23}), want: "bad_blocks"},
		{name: "every block released", do: place(1, 9, false, 1, b3, 3), want: "bad_blocks"},
		{name: "tables of unequal widths", do: flat(1, 9, 1, b3, 1, []int32{11, 12, 21}), want: "bad_blocks"},
		{name: "negative slide_from", do: place(1, 9, false, 1, b3, -1, []int32{10, 11, 12, 13}, []int32{20, 21, 22, 23}), want: "bad_blocks"},
		{name: "sliding block at the pool size", do: place(1, 9, false, 1, b3, 1, []int32{11, 12}, []int32{21, 32}), want: "bad_blocks"},
		{name: "negative sliding block", do: place(1, 9, false, 1, b3, 1, []int32{11, 12}, []int32{-1, 22}), want: "bad_blocks"},
		{name: "new sliding block outside the pool", do: place(1, 9, false, 4, []int32{0, 1, 2, 3}, 2, []int32{12, 40}, []int32{22, 23}), want: "bad_blocks"},
		{name: "slide_from without sliding tables on a create", do: place(2, 8, true, 1, b3, 1), want: "bad_blocks"},
		{name: "negative slide_from on a create", do: place(2, 8, true, 1, b3, -1, []int32{14, 15, 16, 17}, []int32{24, 25, 26, 27}), want: "bad_blocks"},
		{name: "extend into block 3, releasing block 1", do: place(1, 9, false, 4, []int32{0, 1, 2, 3}, 2, []int32{12, 13}, []int32{22, 23}),
			used: 8, from: 2, g1: []int32{12, 13}, g2: []int32{22, 23}, blocksOf1: []int32{0, 1, 2, 3}},
		{name: "a row inside the last block, no release", do: place(1, 13, false, 1, []int32{0, 1, 2, 3}, 2, []int32{12, 13}, []int32{22, 23}),
			used: 8, from: 2, g1: []int32{12, 13}, g2: []int32{22, 23}, blocksOf1: []int32{0, 1, 2, 3}},
		{name: "a release with nothing new (ignoring entries past the row's)", do: place(1, 14, false, 1, []int32{0, 1, 2, 3, 9}, 3, []int32{13, 19}, []int32{23, 29}),
			used: 6, from: 3, g1: []int32{13}, g2: []int32{23}, blocksOf1: []int32{0, 1, 2, 3}},
		{name: "create 2 past its prefix's window, sharing 1's block 0", do: place(2, 8, true, 1, b3, 2, []int32{14}, []int32{24}),
			used: 8, from: 3, g1: []int32{13}, g2: []int32{23}, blocksOf1: []int32{0, 1, 2, 3}},
	}
	tb := NewTable(32)
	tb.SetEpoch(1)
	var last step
	for _, s := range steps {
		err := s.do(tb)
		if got := code(err); got != s.want {
			t.Fatalf("%s: error code %q (%v), want %q", s.name, got, err, s.want)
		}
		if s.want != "" {
			s.used, s.from, s.g1, s.g2, s.blocksOf1 = last.used, last.from, last.g1, last.g2, last.blocksOf1
		}
		last = s
		if got := tb.BlocksUsed(); got != s.used {
			t.Fatalf("%s: %d blocks used, want %d", s.name, got, s.used)
		}
		from, slides := tb.SlidesOf(1)
		if from != s.from || len(slides) != 2 || !slices.Equal(slides[0], s.g1) || !slices.Equal(slides[1], s.g2) {
			t.Fatalf("%s: sequence 1 slides from %d: %v, want %d: %v %v", s.name, from, slides, s.from, s.g1, s.g2)
		}
		if got := tb.BlocksOf(1); !slices.Equal(got, s.blocksOf1) {
			t.Fatalf("%s: sequence 1's table 0 is %v, want %v", s.name, got, s.blocksOf1)
		}
		if err := tb.CheckInvariants(bs); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
	}
	if got := tb.Refused(transport.CodeBadBlocks); got != 15 {
		t.Fatalf("%d rows refused for their blocks, want 15", got)
	}
	if from, slides := tb.SlidesOf(2); from != 2 || !slices.Equal(slides[0], []int32{14}) {
		t.Fatalf("sequence 2 slides from %d: %v", from, slides)
	}
	tb.Tombstone(1, Finished)
	tb.Tombstone(2, Finished)
	if tb.BlocksUsed() != 0 {
		t.Fatalf("%d blocks used after both ended", tb.BlocksUsed())
	}
}

// TestTableSlidesStayFew: a long sequence whose sliding tables release one
// entry for each they append keeps them in place (their capacity stays
// that of the few live entries), and a row that neither releases nor
// appends allocates nothing.
func TestTableSlidesStayFew(t *testing.T) {
	now := time.Unix(100, 0)
	const bs, window = 2, 5
	tb := NewTable(1 << 12)
	tb.SetEpoch(1)
	var blocks []int32
	next := int32(0)
	table := func(pos, n int) (from int, slides []int32) {
		for len(blocks) < (pos+n+bs-1)/bs {
			blocks = append(blocks, next)
			next++
		}
		from = max(0, pos-window+1) / bs
		for g := range 3 {
			for i := from; i < len(blocks); i++ {
				slides = append(slides, 1000*int32(g+1)+int32(i)) // distinct per group and index
			}
		}
		return from, slides
	}
	from, slides := table(0, 3)
	if err := tb.Place(1, 0, true, 3, blocks, from, slides, bs, now); err != nil {
		t.Fatal(err)
	}
	for pos := 3; pos < 1000; pos++ {
		from, slides := table(pos, 1)
		if err := tb.Place(1, pos, false, 1, blocks, from, slides, bs, now); err != nil {
			t.Fatalf("position %d: %v", pos, err)
		}
	}
	if err := tb.CheckInvariants(bs); err != nil {
		t.Fatal(err)
	}
	r := tb.live[1]
	for g, live := range r.slides {
		if want := []int32{1000*int32(g+1) + int32(r.from), 1000*int32(g+1) + int32(r.from) + 1, 1000*int32(g+1) + int32(r.from) + 2}; !slices.Equal(live, want) {
			t.Fatalf("group %d holds %v, want %v", g+1, live, want)
		}
		if cap(live) > 8 {
			t.Fatalf("group %d's table has grown to a capacity of %d for %d live entries", g+1, cap(live), len(live))
		}
	}
	// Rows inside one block, releasing nothing: no allocation.
	tb = NewTable(16)
	tb.SetEpoch(1)
	if err := tb.Place(1, 0, true, 1, []int32{0}, 0, []int32{1, 2}, 64, now); err != nil {
		t.Fatal(err)
	}
	pos, blocks0, slides := 1, []int32{0}, []int32{1, 2}
	if allocs := testing.AllocsPerRun(50, func() {
		if err := tb.Place(1, pos, false, 1, blocks0, 0, slides, 64, now); err != nil {
			t.Fatal(err)
		}
		pos++
	}); allocs != 0 {
		t.Fatalf("%g allocations a row", allocs)
	}
}

// TestTableSlidesInvariants: CheckInvariants finds a sliding table whose
// width is not its sequence's, one that starts at or past the table's
// end, a slide_from without sliding tables, and a sliding block outside
// the pool.
func TestTableSlidesInvariants(t *testing.T) {
	now := time.Unix(100, 0)
	for name, corrupt := range map[string]func(r *replica){
		"a short table":          func(r *replica) { r.slides[1] = r.slides[1][:1] },
		"a long table":           func(r *replica) { r.slides[0] = append(r.slides[0], 5) },
		"from past the table":    func(r *replica) { r.from, r.slides = 3, [][]int32{{}, {}} },
		"negative from":          func(r *replica) { r.from = -1 },
		"from without tables":    func(r *replica) { r.slides = nil },
		"a block outside a pool": func(r *replica) { r.slides[0][1] = 16 },
	} {
		tb := NewTable(16)
		tb.SetEpoch(1)
		if err := tb.Place(1, 5, true, 6, []int32{0, 1, 2}, 1, []int32{3, 4, 6, 7}, 4, now); err != nil {
			t.Fatal(err)
		}
		if err := tb.CheckInvariants(4); err != nil {
			t.Fatalf("before %s: %v", name, err)
		}
		corrupt(tb.live[1])
		if err := tb.CheckInvariants(4); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
