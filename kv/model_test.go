package kv

import (
	"errors"
	"flag"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

var propOps = flag.Int("kv.ops", 20000, "operations per seed in TestAgainstModel")

// refModel is the naive reference: blocks are anonymous slots, a cached
// block is identified by the whole token prefix it ends (a string, so no
// hashing), and eviction scans for the oldest parked block.
type refModel struct {
	bs, n   int
	caching bool
	blocks  []refBlock
	tables  map[SeqID][]int
	hashed  map[SeqID]int // leading blocks committed
	tick    int
	queried uint64
	hit     uint64
}

type refBlock struct {
	ref    int
	key    string // registered prefix key; "" when not registered
	parked int    // when it was last parked in the cache
}

func newRef(n, bs int, caching bool) *refModel {
	return &refModel{bs: bs, n: n, caching: caching, blocks: make([]refBlock, n),
		tables: map[SeqID][]int{}, hashed: map[SeqID]int{}}
}

func prefixKey(tokens []int32) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteString(string(rune('a' + t)))
	}
	return b.String()
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
	fromLRU := 0
	for _, id := range matched {
		if m.blocks[id].ref == 0 {
			fromLRU++
		}
	}
	need := (max(positions, len(matched)*m.bs)+m.bs-1)/m.bs - len(matched)
	if need+reserve > m.available()-fromLRU {
		return 0, ErrOutOfBlocks
	}
	if m.caching {
		m.queried += uint64(len(prefix))
		m.hit += uint64(len(matched) * m.bs)
	}
	for _, id := range matched {
		m.blocks[id].ref++
	}
	for range need {
		matched = append(matched, m.take())
	}
	m.tables[seq] = matched
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
	if need > m.available() {
		return ErrOutOfBlocks
	}
	for range need {
		t = append(t, m.take())
	}
	m.tables[seq] = t
	return nil
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
	}
	m.hashed[seq] = max(m.hashed[seq], full)
}

func (m *refModel) end(seq SeqID) {
	t := m.tables[seq]
	for i := len(t) - 1; i >= 0; i-- {
		b := &m.blocks[t[i]]
		b.ref--
		if b.ref == 0 && b.key != "" {
			m.tick++
			b.parked = m.tick
		}
	}
	delete(m.tables, seq)
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
		t.Run("", func(t *testing.T) { runModel(t, seed, n, bs, caching, *propOps) })
	}
}

func runModel(t *testing.T, seed uint64, n, bs int, caching bool, ops int) {
	rng := rand.New(rand.NewPCG(seed, 99))
	a := newAlloc(t, n, bs, caching)
	m := newRef(n, bs, caching)
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
		switch k := rng.IntN(10); {
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
				tbl := tableOf(a, seq)
				for i := range tbl {
					if i < gc/bs {
						if want := prefixKey(prefix[:(i+1)*bs]); content[tbl[i]] != want {
							t.Fatalf("op %d: sequence %d shares block %d holding %q for prefix %q", op, seq, tbl[i], content[tbl[i]], want)
						}
					} else {
						content[tbl[i]] = ""
					}
				}
				seqs = append(seqs, live{seq, tokens})
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
				for _, id := range tableOf(a, s.seq)[oldLen:] {
					content[id] = "" // newly taken: holds nothing yet
				}
			}
		case k < 8 && len(seqs) > 0: // commit some computed prefix
			s := seqs[rng.IntN(len(seqs))]
			upto := rng.IntN(min(len(s.tokens), a.Len(s.seq)*bs) + 1)
			a.Commit(s.seq, s.tokens[:upto])
			m.commit(s.seq, s.tokens[:upto])
			tbl := tableOf(a, s.seq)
			for i := range min(upto/bs, len(tbl)) {
				key := prefixKey(s.tokens[:(i+1)*bs])
				if c := content[tbl[i]]; c != "" && c != key {
					t.Fatalf("op %d: block %d holds %q, sequence %d writes %q into it", op, tbl[i], c, s.seq, key)
				}
				content[tbl[i]] = key
			}
		case len(seqs) > 0: // end
			i := rng.IntN(len(seqs))
			a.End(seqs[i].seq)
			m.end(seqs[i].seq)
			seqs = slices.Delete(seqs, i, i+1)
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
	if st := a.Stats(); st.Used != 0 || st.Sequences != 0 || st.Used+st.Cached+st.Free != n {
		t.Fatalf("after draining: %+v", st)
	}
}
