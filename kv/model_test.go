package kv

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

var propOps = flag.Int("kv.ops", 20000, "operations per seed in TestAgainstModel")

// refModel is the naive reference: blocks are anonymous slots, a cached
// block is identified by the whole token prefix it ends (a string, so no
// hashing), and eviction scans for the oldest parked block. A sliding table
// marks each released entry -1 on its own; the allocator's first index is
// derived from them (the leading run of released entries). A sliding
// group's cached block is keyed by its prefix and the group (slidingKey),
// and a hit is the longest matched prefix whose window every sliding group
// holds, found by trying each length from the longest down.
type refModel struct {
	bs, n   int
	caching bool
	groups  int
	window  int
	blocks  []refBlock
	tables  map[SeqID][]int
	sliding map[SeqID][][]int // groups-1 tables per sequence; -1 is released
	hashed  map[SeqID]int     // leading blocks committed
	tick    int
	queried uint64
	hit     uint64
}

type refBlock struct {
	ref    int
	key    string // registered prefix key; "" when not registered
	parked int    // when it was last parked in the cache
}

func newRef(n, bs int, caching bool, groups, window int) *refModel {
	return &refModel{bs: bs, n: n, caching: caching, groups: max(1, groups), window: window, blocks: make([]refBlock, n),
		tables: map[SeqID][]int{}, sliding: map[SeqID][][]int{}, hashed: map[SeqID]int{}}
}

func prefixKey(tokens []int32) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteString(string(rune('a' + t)))
	}
	return b.String()
}

func slidingKey(tokens []int32, g int) string { return fmt.Sprintf("%s#%d", prefixKey(tokens), g) }

// park records that block id lost its last reference now.
func (m *refModel) park(id int) {
	if b := &m.blocks[id]; b.ref == 0 && b.key != "" {
		m.tick++
		b.parked = m.tick
	}
}

func (m *refModel) find(key string) int {
	for i, b := range m.blocks {
		if b.key == key {
			return i
		}
	}
	return -1
}

func (m *refModel) available() int {
	n := 0
	for _, b := range m.blocks {
		if b.ref == 0 {
			n++
		}
	}
	return n
}

func (m *refModel) take() int {
	for i, b := range m.blocks {
		if b.ref == 0 && b.key == "" {
			m.blocks[i].ref = 1
			return i
		}
	}
	best := -1
	for i, b := range m.blocks {
		if b.ref == 0 && (best < 0 || b.parked < m.blocks[best].parked) {
			best = i
		}
	}
	m.blocks[best] = refBlock{ref: 1}
	return best
}

func (m *refModel) allocate(seq SeqID, prefix []int32, positions, reserve int) (int, error) {
	if _, ok := m.tables[seq]; ok {
		return 0, ErrSequenceExists
	}
	var matched []int
	if m.caching {
		for i := 0; (i+1)*m.bs <= len(prefix); i++ {
			id := m.find(prefixKey(prefix[:(i+1)*m.bs]))
			if id < 0 {
				break
			}
			matched = append(matched, id)
		}
	}
	// The sliding groups' blocks of the hit, [from, len(matched)) of each.
	var windows [][]int
	from := 0
	for k := len(matched); m.groups > 1 && k >= 0; k-- {
		from = max(0, k*m.bs-m.window+1) / m.bs
		windows = windows[:0]
		for g := 1; g < m.groups; g++ {
			var w []int
			for i := from; i < k; i++ {
				if id := m.find(slidingKey(prefix[:(i+1)*m.bs], g)); id >= 0 {
					w = append(w, id)
				}
			}
			windows = append(windows, w)
			if len(w) < k-from {
				break
			}
		}
		if len(windows) == m.groups-1 && len(windows[m.groups-2]) == k-from {
			matched = matched[:k]
			break
		}
	}
	fromLRU := 0
	for _, id := range slices.Concat(append(windows, matched)...) {
		if m.blocks[id].ref == 0 {
			fromLRU++
		}
	}
	need := (max(positions, len(matched)*m.bs)+m.bs-1)/m.bs - len(matched)
	if need*m.groups+reserve > m.available()-fromLRU {
		return 0, ErrOutOfBlocks
	}
	if m.caching {
		m.queried += uint64(len(prefix))
		m.hit += uint64(len(matched) * m.bs)
	}
	for _, id := range slices.Concat(append(windows, matched)...) {
		m.blocks[id].ref++
	}
	var sliding [][]int
	for g := range m.groups - 1 {
		s := slices.Repeat([]int{-1}, from)
		sliding = append(sliding, append(s, windows[g]...))
	}
	for range need {
		matched = append(matched, m.take())
	}
	for g := range sliding {
		for range need {
			sliding[g] = append(sliding[g], m.take())
		}
	}
	m.tables[seq] = matched
	m.sliding[seq] = sliding
	m.hashed[seq] = len(matched) - need
	return (len(matched) - need) * m.bs, nil
}

func (m *refModel) extend(seq SeqID, positions int) error {
	t, ok := m.tables[seq]
	if !ok {
		return ErrUnknownSequence
	}
	need := (positions+m.bs-1)/m.bs - len(t)
	if need <= 0 {
		return nil
	}
	if need*m.groups > m.available() {
		return ErrOutOfBlocks
	}
	for range need {
		t = append(t, m.take())
	}
	m.tables[seq] = t
	for g, s := range m.sliding[seq] {
		for range need {
			s = append(s, m.take())
		}
		m.sliding[seq][g] = s
	}
	return nil
}

// slide releases, in every sliding table, each entry below lo/bs that is
// still held.
func (m *refModel) slide(seq SeqID, lo int) error {
	t, ok := m.tables[seq]
	if !ok {
		return ErrUnknownSequence
	}
	for _, s := range m.sliding[seq] {
		for i := 0; i < len(t) && i < lo/m.bs; i++ {
			if s[i] >= 0 {
				m.blocks[s[i]].ref--
				m.park(s[i])
				s[i] = -1
			}
		}
	}
	return nil
}

// first is the number of leading released entries of seq's sliding tables,
// which the model requires to be the same in each.
func (m *refModel) first(seq SeqID) (int, bool) {
	first := -1
	for _, s := range m.sliding[seq] {
		n := 0
		for n < len(s) && s[n] < 0 {
			n++
		}
		if first >= 0 && n != first {
			return 0, false
		}
		first = n
	}
	return max(first, 0), true
}

func (m *refModel) commit(seq SeqID, tokens []int32) {
	if !m.caching {
		return
	}
	t := m.tables[seq]
	full := min(len(tokens)/m.bs, len(t))
	for i := m.hashed[seq]; i < full; i++ {
		key := prefixKey(tokens[:(i+1)*m.bs])
		if m.find(key) < 0 && m.blocks[t[i]].key == "" {
			m.blocks[t[i]].key = key
		}
		for g, s := range m.sliding[seq] {
			key := slidingKey(tokens[:(i+1)*m.bs], g+1)
			if s[i] >= 0 && m.find(key) < 0 && m.blocks[s[i]].key == "" {
				m.blocks[s[i]].key = key
			}
		}
	}
	m.hashed[seq] = max(m.hashed[seq], full)
}

func (m *refModel) end(seq SeqID) {
	t := m.tables[seq]
	for i := len(t) - 1; i >= 0; i-- {
		m.blocks[t[i]].ref--
		m.park(t[i])
	}
	for _, s := range m.sliding[seq] {
		for i := len(s) - 1; i >= 0; i-- {
			if s[i] >= 0 {
				m.blocks[s[i]].ref--
				m.park(s[i])
			}
		}
	}
	delete(m.tables, seq)
	delete(m.sliding, seq)
	delete(m.hashed, seq)
}

func (m *refModel) stats() Stats {
	s := Stats{Total: m.n, Sequences: len(m.tables), PrefixQueried: m.queried, PrefixHit: m.hit}
	for _, b := range m.blocks {
		switch {
		case b.ref > 0:
			s.Used++
		case b.key != "":
			s.Cached++
		default:
			s.Free++
		}
	}
	return s
}

// TestAgainstModel drives the allocator and the reference with the same
// random operations and compares every answer and the stats after each one.
// It also checks that a shared block always holds the content it was shared
// for.
func TestAgainstModel(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		caching := seed%4 != 0
		bs := 1 + int(seed%4)
		n := 4 + int(seed*3%29)
		t.Run("", func(t *testing.T) { runModel(t, seed, n, bs, caching, 1, 0, *propOps) })
	}
}

// TestAgainstModelGroups is TestAgainstModel for sliding-window models:
// several tables per sequence, Slide among the operations, and prefix
// caching on for two seeds in three (hits that must hold every sliding
// group's window).
func TestAgainstModelGroups(t *testing.T) {
	for seed := uint64(1); seed <= 9; seed++ {
		groups := []int{2, 3, 7}[seed%3]
		bs := 1 + int(seed%4)
		n := groups * (5 + int(seed*5%11))
		window := 1 + int(seed*7%(3*uint64(bs)))
		caching := seed%3 != 1
		t.Run("", func(t *testing.T) { runModel(t, seed, n, bs, caching, groups, window, *propOps) })
	}
}

// runModel drives an allocator of n blocks of bs positions, with the given
// groups and sliding window, and the reference through ops random
// operations. Slide is among them when groups > 1; with one group the
// operations are those the test has always made, seed for seed.
func runModel(t *testing.T, seed uint64, n, bs int, caching bool, groups, window, ops int) {
	rng := rand.New(rand.NewPCG(seed, 99))
	a, err := New(Config{Blocks: n, BlockSize: bs, PrefixCaching: caching, Groups: groups, Window: window})
	if err != nil {
		t.Fatal(err)
	}
	m := newRef(n, bs, caching, groups, window)
	G := m.groups
	// What each sequence's tables held when the test last saw them grow
	// (table 0 the global one): live entries never change, and nothing
	// but Slide and End releases them.
	shadow := map[SeqID][][]BlockID{}
	kinds, slid, windowHits := 10, 0, 0
	if G > 1 {
		kinds = 12
	}
	type live struct {
		seq    SeqID
		tokens []int32 // the sequence's tokens; the table covers at least these
	}
	var seqs []live
	content := make([]string, n) // the prefix key each block holds, "" if unknown
	nextSeq := SeqID(1)
	bases := [][]int32{}
	for range 4 {
		b := make([]int32, 1+rng.IntN(4*bs))
		for i := range b {
			b[i] = int32(rng.IntN(3))
		}
		bases = append(bases, b)
	}

	for op := range ops {
		switch k := rng.IntN(kinds); {
		case k < 4: // allocate a prompt built from a shared base
			tokens := slices.Clone(bases[rng.IntN(len(bases))])
			for range rng.IntN(3 * bs) {
				tokens = append(tokens, int32(rng.IntN(3)))
			}
			seq := nextSeq
			if rng.IntN(50) == 0 && len(seqs) > 0 {
				seq = seqs[0].seq // an existing one: must be refused
			} else {
				nextSeq++
			}
			prefix := tokens[:len(tokens)-rng.IntN(2)]
			positions := len(tokens) + rng.IntN(2*bs)
			reserve := rng.IntN(3)
			gc, gerr := a.Allocate(seq, prefix, positions, reserve)
			wc, werr := m.allocate(seq, prefix, positions, reserve)
			if !errors.Is(gerr, werr) || gc != wc {
				t.Fatalf("op %d: Allocate(%d, %v, %d, %d) = %d, %v; model %d, %v", op, seq, prefix, positions, reserve, gc, gerr, wc, werr)
			}
			if gerr == nil {
				for g, tbl := range tablesOf(a, seq) {
					for i, id := range tbl {
						want := prefixKey(prefix[:min(len(prefix), (i+1)*bs)])
						if g > 0 {
							want = slidingKey(prefix[:min(len(prefix), (i+1)*bs)], g)
						}
						switch {
						case id == released && (g == 0 || i >= gc/bs):
							t.Fatalf("op %d: sequence %d's table %d entry %d is released at allocation (hit of %d)", op, seq, g, i, gc)
						case id == released:
						case i < gc/bs && content[id] != want:
							t.Fatalf("op %d: sequence %d shares block %d holding %q for %q", op, seq, id, content[id], want)
						case i >= gc/bs:
							content[id] = ""
						}
					}
				}
				if a.Table(seq).First() > 0 {
					windowHits++
				}
				seqs = append(seqs, live{seq, tokens})
				shadow[seq] = tablesOf(a, seq)
			}
		case k < 6 && len(seqs) > 0: // extend, appending tokens
			i := rng.IntN(len(seqs))
			s := &seqs[i]
			old := len(s.tokens)
			for range rng.IntN(2 * bs) {
				s.tokens = append(s.tokens, int32(rng.IntN(3)))
			}
			seq, oldLen := s.seq, a.Len(s.seq)
			if rng.IntN(50) == 0 {
				seq = nextSeq + 1000 // unknown
			}
			gerr := a.Extend(seq, len(s.tokens))
			werr := m.extend(seq, len(s.tokens))
			if !errors.Is(gerr, werr) {
				t.Fatalf("op %d: Extend = %v; model %v", op, gerr, werr)
			}
			if gerr != nil { // not grown: forget the new tokens
				s.tokens = s.tokens[:old]
			} else {
				now := tablesOf(a, s.seq)
				for _, tbl := range now {
					for _, id := range tbl[oldLen:] {
						content[id] = "" // newly taken: holds nothing yet
					}
				}
				for g := range shadow[s.seq] {
					shadow[s.seq][g] = append(shadow[s.seq][g], now[g][oldLen:]...)
				}
			}
		case k < 8 && len(seqs) > 0: // commit some computed prefix
			s := seqs[rng.IntN(len(seqs))]
			upto := rng.IntN(min(len(s.tokens), a.Len(s.seq)*bs) + 1)
			a.Commit(s.seq, s.tokens[:upto])
			m.commit(s.seq, s.tokens[:upto])
			for g, tbl := range tablesOf(a, s.seq) {
				for i := range min(upto/bs, len(tbl)) {
					if tbl[i] == released {
						continue
					}
					key := prefixKey(s.tokens[:(i+1)*bs])
					if g > 0 {
						key = slidingKey(s.tokens[:(i+1)*bs], g)
					}
					if c := content[tbl[i]]; c != "" && c != key {
						t.Fatalf("op %d: block %d holds %q, sequence %d writes %q into it", op, tbl[i], c, s.seq, key)
					}
					content[tbl[i]] = key
				}
			}
		case k < 10 && len(seqs) > 0: // end
			i := rng.IntN(len(seqs))
			a.End(seqs[i].seq)
			m.end(seqs[i].seq)
			delete(shadow, seqs[i].seq)
			seqs = slices.Delete(seqs, i, i+1)
		case k >= 10 && len(seqs) > 0: // slide, sometimes backwards or past the end
			s := seqs[rng.IntN(len(seqs))]
			seq, lo := s.seq, rng.IntN((a.Len(s.seq)+2)*bs)-bs
			if rng.IntN(50) == 0 {
				seq = nextSeq + 1000 // unknown
			}
			used := a.Stats().Used
			gerr := a.Slide(seq, lo)
			werr := m.slide(seq, lo)
			if !errors.Is(gerr, werr) {
				t.Fatalf("op %d: Slide(%d, %d) = %v; model %v", op, seq, lo, gerr, werr)
			}
			if a.Stats().Used < used {
				slid++
			}
		}
		if err := a.CheckInvariants(); err != nil {
			t.Fatalf("op %d: %v", op, err)
		}
		if got, want := a.Stats(), m.stats(); got != want {
			t.Fatalf("op %d: stats %+v, model %+v", op, got, want)
		}
		for _, s := range seqs {
			if got, want := a.Len(s.seq), len(m.tables[s.seq]); got != want {
				t.Fatalf("op %d: sequence %d has %d blocks, model %d", op, s.seq, got, want)
			}
			h := a.Table(s.seq)
			if h == nil || h.Seq() != s.seq {
				t.Fatalf("op %d: sequence %d's handle is %+v", op, s.seq, h)
			}
			if got, want := h.AppendBlocks(nil, -1), tableOf(a, s.seq); !slices.Equal(got, want) {
				t.Fatalf("op %d: sequence %d's handle holds %v, AppendTable %v", op, s.seq, got, want)
			}
			first, ok := m.first(s.seq)
			if !ok {
				t.Fatalf("op %d: model's sliding tables of sequence %d disagree on their first entry: %v", op, s.seq, m.sliding[s.seq])
			}
			if h.Groups() != G || h.First() != first {
				t.Fatalf("op %d: sequence %d has %d groups, first %d; model %d, %d", op, s.seq, h.Groups(), h.First(), G, first)
			}
			for g, tbl := range tablesOf(a, s.seq) {
				want := shadow[s.seq][g]
				if g > 0 {
					want = slices.Concat(slices.Repeat([]BlockID{released}, first), want[first:])
				}
				if !slices.Equal(tbl, want) {
					t.Fatalf("op %d: sequence %d's table %d is %v, want %v", op, s.seq, g, tbl, want)
				}
			}
		}
	}
	for _, s := range seqs {
		a.End(s.seq)
	}
	if err := a.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	if caching && a.Stats().PrefixHit == 0 {
		t.Fatalf("seed %d: no prefix hits: the test does not exercise sharing", seed)
	}
	if G > 1 && slid == 0 {
		t.Fatalf("seed %d: no Slide released a block: the test does not exercise it", seed)
	}
	t.Logf("seed %d: %d blocks of %d, %d groups, window %d: %d sliding releases, %d hits past a released window, stats %+v", seed, n, bs, G, window, slid, windowHits, a.Stats())
	if G > 1 && caching && windowHits == 0 {
		t.Fatalf("seed %d: no hit started its sliding tables past a released window: the test does not exercise it", seed)
	}
	if st := a.Stats(); st.Used != 0 || st.Sequences != 0 || st.Used+st.Cached+st.Free != n {
		t.Fatalf("after draining: %+v", st)
	}
}
