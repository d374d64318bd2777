package kv

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func newGroups(t *testing.T, blocks, bs, groups int) *Allocator {
	t.Helper()
	a, err := New(Config{Blocks: blocks, BlockSize: bs, Groups: groups, Window: 2 * bs})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// tablesOf returns seq's tables, the global one first, each sliding one
// with its released entries as released so that index i is block i.
func tablesOf(a *Allocator, seq SeqID) [][]BlockID {
	h := a.Table(seq)
	tbls := [][]BlockID{h.AppendBlocks(nil, -1)}
	for g := 1; g < h.Groups(); g++ {
		s := slices.Repeat([]BlockID{released}, h.First())
		tbls = append(tbls, h.AppendSliding(s, g, h.Len()))
	}
	return tbls
}

func panics(f func()) (msg string) {
	defer func() { msg = fmt.Sprint(recover()) }()
	f()
	return ""
}

func TestConfigValidateGroups(t *testing.T) {
	for _, cfg := range []Config{
		{Blocks: 8, BlockSize: 4, Groups: 0},
		{Blocks: 8, BlockSize: 4, Groups: 1, PrefixCaching: true},
		{Blocks: 8, BlockSize: 4, Groups: 2, Window: 1},
		{Blocks: 8, BlockSize: 4, Groups: 2, Window: 5, PrefixCaching: true},
		{Blocks: 8, BlockSize: 4, Groups: MaxGroups, Window: MaxWindow},
	} {
		if err := cfg.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", cfg, err)
		}
	}
	for _, tc := range []struct {
		cfg    Config
		fields []string
	}{
		{Config{Blocks: 8, BlockSize: 4, Groups: -1}, []string{"Groups", "-1"}},
		{Config{Blocks: 8, BlockSize: 4, Groups: MaxGroups + 1}, []string{"Groups", "65"}},
		{Config{Blocks: 8, BlockSize: 4, Groups: 2}, []string{"Window", "0"}},
		{Config{Blocks: 8, BlockSize: 4, Groups: 2, Window: MaxWindow + 1}, []string{"Window", "1073741825"}},
	} {
		err := tc.cfg.Validate()
		for _, f := range tc.fields {
			if err == nil || !strings.Contains(err.Error(), f) {
				t.Errorf("Validate(%+v) = %v, want an error naming %s", tc.cfg, err, f)
			}
		}
		if _, err := New(tc.cfg); err == nil {
			t.Errorf("New(%+v) succeeded", tc.cfg)
		}
	}
}

// Each of a sequence's tables takes its own blocks, so Allocate needs
// Groups times as many, plus the reserve.
func TestGroupsAllocate(t *testing.T) {
	a := newGroups(t, 20, 4, 3)
	if _, err := a.Allocate(1, nil, 5, 0); err != nil { // 2 blocks a table
		t.Fatal(err)
	}
	check(t, a)
	h := a.Table(1)
	if h.Groups() != 3 || h.Len() != 2 || h.First() != 0 {
		t.Fatalf("table: groups %d, len %d, first %d; want 3, 2, 0", h.Groups(), h.Len(), h.First())
	}
	tbls := tablesOf(a, 1)
	all := slices.Concat(tbls...)
	slices.Sort(all)
	if got, want := all, []BlockID{0, 1, 2, 3, 4, 5}; !cmp.Equal(got, want) {
		t.Fatalf("tables %v hold %v, want %v", tbls, got, want)
	}
	if got, want := a.Stats(), (Stats{Total: 20, Used: 6, Free: 14, Sequences: 1}); got != want {
		t.Fatalf("stats = %+v, want %+v", got, want)
	}
	// A prefix is not looked up: caching is off with groups.
	if c, err := a.Allocate(2, toks(8, 0), 8, 0); err != nil || c != 0 {
		t.Fatalf("Allocate with a prefix = %d, %v", c, err)
	}
	before := a.Stats()
	if before.PrefixQueried != 0 || before.Used != 12 {
		t.Fatalf("stats = %+v, want 12 used and no prefix queried", before)
	}
	// 8 available: 3 blocks a table (9) is too many, and so are 2 a table
	// (6) with 3 in reserve.
	if _, err := a.Allocate(3, nil, 9, 0); !errors.Is(err, ErrOutOfBlocks) {
		t.Fatalf("Allocate of 3x3 blocks = %v, want ErrOutOfBlocks", err)
	}
	if _, err := a.Allocate(3, nil, 8, 3); !errors.Is(err, ErrOutOfBlocks) {
		t.Fatalf("Allocate of 3x2 blocks with 3 in reserve = %v, want ErrOutOfBlocks", err)
	}
	check(t, a)
	if got := a.Stats(); got != before || a.Has(3) {
		t.Fatalf("stats after shortfalls = %+v, want %+v and no table", got, before)
	}
	if _, err := a.Allocate(3, nil, 8, 2); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	if st := a.Stats(); st.Used != 18 || st.Free != 2 {
		t.Fatalf("stats = %+v, want 18 used, 2 free", st)
	}
	for seq := SeqID(1); seq <= 3; seq++ {
		a.End(seq)
		check(t, a)
	}
	if got, want := a.Stats(), (Stats{Total: 20, Free: 20}); got != want {
		t.Fatalf("stats after draining = %+v, want %+v", got, want)
	}
}

// Groups 0 and 1 are the one-table allocator: Slide does nothing, and there
// is no sliding table.
func TestOneGroup(t *testing.T) {
	for _, groups := range []int{0, 1} {
		a := newGroups(t, 8, 4, groups)
		if _, err := a.Allocate(1, nil, 12, 0); err != nil {
			t.Fatal(err)
		}
		tbl, st := tableOf(a, 1), a.Stats()
		if err := a.Slide(1, 100); err != nil {
			t.Fatalf("Groups %d: Slide = %v", groups, err)
		}
		check(t, a)
		h := a.Table(1)
		if h.Groups() != 1 || h.First() != 0 || !cmp.Equal(tableOf(a, 1), tbl) || a.Stats() != st {
			t.Fatalf("Groups %d: after Slide: groups %d, first %d, table %v (was %v), stats %+v (were %+v)",
				groups, h.Groups(), h.First(), tableOf(a, 1), tbl, a.Stats(), st)
		}
		if msg := panics(func() { h.AppendSliding(nil, 1, 0) }); !strings.Contains(msg, "1 groups, sliding table 1 asked for") {
			t.Fatalf("Groups %d: AppendSliding panicked with %q", groups, msg)
		}
		if err := a.Slide(2, 0); !errors.Is(err, ErrUnknownSequence) {
			t.Fatalf("Groups %d: Slide of an unknown sequence = %v, want ErrUnknownSequence", groups, err)
		}
	}
}

// Extend grows every table or none.
func TestGroupsExtend(t *testing.T) {
	a := newGroups(t, 12, 4, 3)
	for seq := SeqID(1); seq <= 2; seq++ {
		if _, err := a.Allocate(seq, nil, 4, 0); err != nil { // 1 block a table
			t.Fatal(err)
		}
	}
	before, st := tablesOf(a, 1), a.Stats()
	// 6 available: 3 more blocks a table (9) is too many.
	if err := a.Extend(1, 16); !errors.Is(err, ErrOutOfBlocks) {
		t.Fatalf("Extend by 3x3 blocks = %v, want ErrOutOfBlocks", err)
	}
	check(t, a)
	if got := tablesOf(a, 1); !cmp.Equal(got, before) || a.Stats() != st {
		t.Fatalf("after a refused Extend: tables %v (were %v), stats %+v (were %+v)", got, before, a.Stats(), st)
	}
	if err := a.Extend(1, 12); err != nil { // 2 more a table: exactly what is left
		t.Fatal(err)
	}
	check(t, a)
	after := tablesOf(a, 1)
	for g, tbl := range after {
		if len(tbl) != 3 || !cmp.Equal(tbl[:1], before[g]) {
			t.Fatalf("table %d after Extend is %v, want 3 blocks starting with %v", g, tbl, before[g])
		}
	}
	if st := a.Stats(); st.Used != 12 || st.Free != 0 {
		t.Fatalf("stats = %+v, want the pool used up", st)
	}
	// Covered already: nothing to take.
	for _, p := range []int{12, 9, 0} {
		if err := a.Extend(1, p); err != nil {
			t.Fatalf("Extend(1, %d) = %v", p, err)
		}
	}
	if got := tablesOf(a, 1); !cmp.Equal(got, after) {
		t.Fatalf("tables after a covered Extend = %v, want %v", got, after)
	}
	check(t, a)
}

// Slide releases exactly the sliding entries below lo/BlockSize, in every
// sliding table and in no other sequence, keeps the global table whole, and
// only moves forward.
func TestSlide(t *testing.T) {
	const bs, n = 4, 10
	a := newGroups(t, 40, bs, 3)
	if _, err := a.Allocate(1, nil, n*bs, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(2, nil, 2*bs, 0); err != nil {
		t.Fatal(err)
	}
	orig, other := tablesOf(a, 1), tablesOf(a, 2)
	h := a.Table(1)
	for _, step := range []struct {
		lo, first int
	}{
		{0, 0},
		{bs - 1, 0}, // position 3 is in block 0
		{-5, 0},
		{bs, 1},
		{3*bs - 1, 2}, // the row reading position 11 still needs block 2
		{3 * bs, 3},
		{bs + 1, 3}, // backwards: nothing
		{3 * bs, 3},
		{n*bs - 1, n - 1},
		{n * bs, n},
		{1000, n}, // past the end
	} {
		if err := a.Slide(1, step.lo); err != nil {
			t.Fatalf("Slide(1, %d) = %v", step.lo, err)
		}
		check(t, a)
		if h.First() != step.first {
			t.Fatalf("Slide(1, %d): first %d, want %d", step.lo, h.First(), step.first)
		}
		tbls := tablesOf(a, 1)
		if !cmp.Equal(tbls[0], orig[0]) {
			t.Fatalf("Slide(1, %d) changed the global table: %v, was %v", step.lo, tbls[0], orig[0])
		}
		for g := 1; g < 3; g++ {
			for i, id := range orig[g] {
				if i < step.first {
					if tbls[g][i] != released || a.ref[id] != 0 {
						t.Fatalf("Slide(1, %d): table %d entry %d is %d, block %d has refcount %d; want released and free",
							step.lo, g, i, tbls[g][i], id, a.ref[id])
					}
				} else if tbls[g][i] != id || a.ref[id] != 1 {
					t.Fatalf("Slide(1, %d): table %d entry %d is %d (refcount %d), want block %d kept",
						step.lo, g, i, tbls[g][i], a.ref[tbls[g][i]], id)
				}
			}
		}
		if got := tablesOf(a, 2); !cmp.Equal(got, other) {
			t.Fatalf("Slide(1, %d) changed sequence 2's tables: %v, were %v", step.lo, got, other)
		}
		if got, want := a.Stats().Used, n+2*(n-step.first)+6; got != want {
			t.Fatalf("Slide(1, %d): %d used, want %d", step.lo, got, want)
		}
	}
	// Growing after a slide past the end: the new entries are live.
	if err := a.Extend(1, (n+2)*bs); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	if h.Len() != n+2 || h.First() != n || len(h.AppendSliding(nil, 1, n+2)) != 2 {
		t.Fatalf("after Extend: len %d, first %d, %v live in table 1", h.Len(), h.First(), h.AppendSliding(nil, 1, n+2))
	}
	if got, want := a.Stats().Used, (n+2)+2*2+6; got != want {
		t.Fatalf("after Extend: %d used, want %d", got, want)
	}
	if err := a.Slide(3, 0); !errors.Is(err, ErrUnknownSequence) {
		t.Fatalf("Slide of an unknown sequence = %v, want ErrUnknownSequence", err)
	}
	a.End(1)
	check(t, a)
	a.End(2)
	check(t, a)
	if got, want := a.Stats(), (Stats{Total: 40, Free: 40}); got != want {
		t.Fatalf("stats after draining = %+v, want %+v", got, want)
	}
}

// End after Slide releases the live entries only: the blocks Slide gave back
// may already belong to another sequence.
func TestEndAfterSlide(t *testing.T) {
	a := newGroups(t, 14, 2, 3)
	if _, err := a.Allocate(1, nil, 8, 0); err != nil { // 4 blocks a table
		t.Fatal(err)
	}
	if err := a.Slide(1, 4); err != nil { // 2 a sliding table released
		t.Fatal(err)
	}
	// The 4 released and the 2 never used: exactly enough for sequence 2.
	if _, err := a.Allocate(2, nil, 4, 0); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	if st := a.Stats(); st.Free != 0 {
		t.Fatalf("stats = %+v, want the pool used up", st)
	}
	two := tablesOf(a, 2)
	a.End(1)
	check(t, a)
	if got := tablesOf(a, 2); !cmp.Equal(got, two) {
		t.Fatalf("sequence 2's tables after End(1): %v, were %v", got, two)
	}
	for _, id := range slices.Concat(two...) {
		if a.ref[id] != 1 {
			t.Fatalf("block %d of sequence 2 has refcount %d after End(1)", id, a.ref[id])
		}
	}
	if got, want := a.Stats(), (Stats{Total: 14, Used: 6, Free: 8, Sequences: 1}); got != want {
		t.Fatalf("stats after End(1) = %+v, want %+v", got, want)
	}
	a.End(2)
	check(t, a)
	if got, want := a.Stats(), (Stats{Total: 14, Free: 14}); got != want {
		t.Fatalf("stats after draining = %+v, want %+v", got, want)
	}
}

// An ended table is recycled with its sliding tables emptied and its first
// entry back at 0, and a steady state with groups allocates nothing.
func TestGroupsRecycle(t *testing.T) {
	a := newGroups(t, 64, 4, 3)
	if _, err := a.Allocate(1, nil, 20, 0); err != nil {
		t.Fatal(err)
	}
	h := a.Table(1)
	if err := a.Slide(1, 12); err != nil {
		t.Fatal(err)
	}
	a.End(1)
	check(t, a)
	if _, err := a.Allocate(2, nil, 8, 0); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	if h2 := a.Table(2); h2 != h {
		t.Fatalf("sequence 2 got a new Table, want sequence 1's recycled")
	}
	if h.Seq() != 2 || h.Groups() != 3 || h.Len() != 2 || h.First() != 0 {
		t.Fatalf("recycled table: seq %d, groups %d, len %d, first %d; want 2, 3, 2, 0", h.Seq(), h.Groups(), h.Len(), h.First())
	}
	for g, tbl := range tablesOf(a, 2) {
		if len(tbl) != 2 || slices.Contains(tbl, released) {
			t.Fatalf("recycled table %d is %v, want 2 live blocks", g, tbl)
		}
	}
	a.End(2)

	seq := SeqID(10)
	allocs := testing.AllocsPerRun(100, func() {
		seq++
		if _, err := a.Allocate(seq, nil, 20, 0); err != nil {
			t.Fatal(err)
		}
		for p := 24; p <= 60; p += 12 {
			if err := a.Extend(seq, p); err != nil {
				t.Fatal(err)
			}
			if err := a.Slide(seq, p-16); err != nil {
				t.Fatal(err)
			}
		}
		a.End(seq)
	})
	if allocs != 0 {
		t.Fatalf("a sequence's life allocates %v times, want 0", allocs)
	}
	check(t, a)
}

func TestAppendSliding(t *testing.T) {
	a := newGroups(t, 32, 4, 3)
	if _, err := a.Allocate(1, nil, 16, 0); err != nil { // 4 blocks a table
		t.Fatal(err)
	}
	h := a.Table(1)
	s1 := h.AppendSliding(nil, 1, 4)
	s2 := h.AppendSliding(nil, 2, 4)
	if len(s1) != 4 || len(s2) != 4 || slices.Equal(s1, s2) {
		t.Fatalf("sliding tables %v and %v, want 4 blocks each, different", s1, s2)
	}
	if got, want := h.AppendSliding([]BlockID{99}, 1, 2), append([]BlockID{99}, s1[:2]...); !cmp.Equal(got, want) {
		t.Fatalf("AppendSliding(dst, 1, 2) = %v, want %v", got, want)
	}
	if err := a.Slide(1, 9); err != nil { // first 2
		t.Fatal(err)
	}
	if got := h.AppendSliding(nil, 2, 2); len(got) != 0 {
		t.Fatalf("AppendSliding(nil, 2, First) = %v, want nothing", got)
	}
	if got, want := h.AppendSliding(nil, 2, 3), s2[2:3]; !cmp.Equal(got, want) {
		t.Fatalf("AppendSliding(nil, 2, 3) = %v, want %v", got, want)
	}
	if got, want := h.AppendSliding(nil, 1, 4), s1[2:]; !cmp.Equal(got, want) {
		t.Fatalf("AppendSliding(nil, 1, 4) = %v, want %v", got, want)
	}
	for _, tc := range []struct {
		g, n int
		want string
	}{
		{0, 3, "3 groups, sliding table 0 asked for"},
		{3, 3, "3 groups, sliding table 3 asked for"},
		{1, 5, "live entries [2, 4), 5 asked for"},
		{1, 1, "live entries [2, 4), 1 asked for"},
		{2, -1, "live entries [2, 4), -1 asked for"},
	} {
		if msg := panics(func() { h.AppendSliding(nil, tc.g, tc.n) }); !strings.Contains(msg, tc.want) {
			t.Errorf("AppendSliding(nil, %d, %d) panicked with %q, want %q", tc.g, tc.n, msg, tc.want)
		}
	}
	a.End(1)
	if msg := panics(func() { h.AppendSliding(nil, 1, 2) }); !strings.Contains(msg, "ended sequence 1") {
		t.Fatalf("AppendSliding of an ended table panicked with %q", msg)
	}
	if msg := panics(func() { h.First() }); !strings.Contains(msg, "ended sequence 1") {
		t.Fatalf("First of an ended table panicked with %q", msg)
	}
}

// CheckInvariants catches the corruptions of groups that no operation makes.
func TestCheckInvariantsGroups(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		corrupt    func(tb *Table)
	}{
		{"short sliding table", "sliding table 2 has 2 entries, global table 3", func(tb *Table) { tb.sliding[1] = tb.sliding[1][:2] }},
		{"first past the end", "first live sliding entry is 4, table has 3", func(tb *Table) { tb.first = 4 }},
		{"first lowered", "table 1 block 0 is -1", func(tb *Table) { tb.first = 0 }},
		{"first raised", "below first 2", func(tb *Table) { tb.first = 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newGroups(t, 16, 4, 3)
			if _, err := a.Allocate(1, nil, 12, 0); err != nil {
				t.Fatal(err)
			}
			if err := a.Slide(1, 4); err != nil {
				t.Fatal(err)
			}
			check(t, a)
			tc.corrupt(a.Table(1))
			if err := a.CheckInvariants(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CheckInvariants = %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func newCachingGroups(t *testing.T, blocks, bs, groups, window int) *Allocator {
	t.Helper()
	a, err := New(Config{Blocks: blocks, BlockSize: bs, Groups: groups, Window: window, PrefixCaching: true})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A chat's next turn: the previous turn's sequence committed its tokens
// and slid its window as it went; its released sliding blocks stayed
// cached. The next turn hits the whole prefix, shares the global blocks
// and the sliding blocks of the window its first computed position reads,
// and starts its sliding tables released before that window.
func TestSlidingPrefixHit(t *testing.T) {
	const bs, groups, window = 4, 3, 6
	a := newCachingGroups(t, 64, bs, groups, window)
	turn := toks(22, 0)
	if _, err := a.Allocate(1, nil, len(turn), 0); err != nil {
		t.Fatal(err)
	}
	a.Commit(1, turn)
	old := tablesOf(a, 1)
	// The last row, at position 21, reads from 16 on: blocks 0..3 go.
	if err := a.Slide(1, len(turn)-window); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	if a.Table(1).First() != 4 || a.Stats().Cached != 2*4 {
		t.Fatalf("first %d, stats %+v: want first 4 and the 8 released sliding blocks cached", a.Table(1).First(), a.Stats())
	}
	a.End(1)
	check(t, a)

	next := append(slices.Clone(turn), 100, 101, 102)
	cached, err := a.Allocate(2, next[:len(next)-1], len(next), 0)
	if err != nil || cached != 20 {
		t.Fatalf("Allocate = %d, %v; want a hit of 20 positions (5 blocks)", cached, err)
	}
	check(t, a)
	// Position 20 reads from 15 on: block 3 on, in every sliding group.
	h := a.Table(2)
	if h.First() != 3 || h.Len() != 7 {
		t.Fatalf("first %d, len %d; want 3, 7", h.First(), h.Len())
	}
	for g, tbl := range tablesOf(a, 2) {
		from := 0
		if g > 0 {
			from = 3
		}
		if !slices.Equal(tbl[from:5], old[g][from:5]) {
			t.Fatalf("table %d is %v, want the previous turn's %v in blocks [%d, 5)", g, tbl, old[g], from)
		}
		if g > 0 && !slices.Equal(tbl[:3], []BlockID{released, released, released}) {
			t.Fatalf("sliding table %d is %v, want its first 3 entries released", g, tbl)
		}
	}
	if st := a.Stats(); st.PrefixHit != 20 || st.Used != 5+2*2+3*2 {
		t.Fatalf("stats = %+v, want 20 positions hit and 15 blocks used", st)
	}
	// A different tail shares the prefix as far as the windows allow.
	other := append(toks(13, 0), 7, 7, 7, 7, 7)
	if cached, err := a.Allocate(3, other, len(other)+1, 0); err != nil || cached != 12 {
		t.Fatalf("Allocate of a shorter shared prefix = %d, %v; want 12", cached, err)
	}
	check(t, a)
	if h := a.Table(3); h.First() != 1 { // position 12 reads from 7 on
		t.Fatalf("first %d, want 1", h.First())
	}
}

// A window given back before its blocks were committed cannot serve a hit:
// the hit falls back to the longest prefix whose window is cached in every
// sliding group, and to none when there is none.
func TestSlidingPrefixMissesReleasedWindow(t *testing.T) {
	const bs, groups, window = 4, 3, 6
	a := newCachingGroups(t, 64, bs, groups, window)
	turn := toks(24, 0)
	if _, err := a.Allocate(1, nil, len(turn), 0); err != nil {
		t.Fatal(err)
	}
	a.Commit(1, turn[:12]) // blocks 0..2 committed
	if err := a.Slide(1, 16); err != nil {
		t.Fatal(err) // blocks 0..3 released: 3 unhashed, freed
	}
	a.Commit(1, turn) // blocks 3..5: the global ones, and the sliding ones still held
	check(t, a)
	a.End(1)
	// Position 24 reads from 19 on: blocks 4 and 5, cached.
	if cached, err := a.Allocate(2, turn, 30, 0); err != nil || cached != 24 {
		t.Fatalf("Allocate = %d, %v; want 24 (window blocks 4, 5 cached)", cached, err)
	}
	a.End(2)
	// A prefix of 20 positions reads from 15 on: block 3, whose sliding
	// blocks were never committed, nor are 16's (from 11: blocks 2, 3).
	// 12 reads from 7 on: blocks 1, 2, committed before the slide.
	if cached, err := a.Allocate(3, turn[:20], 30, 0); err != nil || cached != 12 {
		t.Fatalf("Allocate = %d, %v; want 12", cached, err)
	}
	check(t, a)
	a.End(3)
	// Filling all but one block of the pool evicts all but one cached
	// block: the 7 blocks of that hit are not all there.
	if _, err := a.Allocate(4, nil, 21*bs, 0); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	a.End(4)
	if cached, err := a.Allocate(5, turn[:13], 20, 0); err != nil || cached == 12 {
		t.Fatalf("Allocate after eviction = %d, %v; want less than 12", cached, err)
	}
	check(t, a)
}

// A cached block holds one group's layers: a lookup under another group
// misses even with the right key, parent and tokens, and CheckInvariants
// refuses a live table naming a block cached as another group's.
func TestCachedBlockKeepsItsGroup(t *testing.T) {
	const bs = 4
	a := newCachingGroups(t, 32, bs, 3, 6)
	tokens := toks(8, 0)
	if _, err := a.Allocate(1, nil, len(tokens), 0); err != nil {
		t.Fatal(err)
	}
	a.Commit(1, tokens)
	check(t, a)
	h := chain(rootHash, tokens[:bs])
	for g := range 3 {
		id, ok := a.lookup(groupKey(h, g), rootHash, g, tokens[:bs])
		if !ok || id != tablesOf(a, 1)[g][0] {
			t.Fatalf("group %d's block 0: lookup = %d, %v; table holds %d", g, id, ok, tablesOf(a, 1)[g][0])
		}
		if _, ok := a.lookup(groupKey(h, g), rootHash, (g+1)%3, tokens[:bs]); ok {
			t.Fatalf("group %d's block 0 found as group %d's", g, (g+1)%3)
		}
	}
	a.group[tablesOf(a, 1)[2][1]] = 1
	if err := a.CheckInvariants(); err == nil || !strings.Contains(err.Error(), "cached as group 1's") {
		t.Fatalf("CheckInvariants with a block of group 2 cached as group 1's = %v", err)
	}
}
