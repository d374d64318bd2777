package cpu_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/strata-llm/strata/kv"
	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
)

// slidingSeq is one sequence of TestSlidingReleaseIdentical: its tokens,
// how far it has run, and its grouped block tables (table 0 global, the
// others sliding, entries before from released).
type slidingSeq struct {
	seq    uint64
	tokens []int32
	chunks []int // prompt chunk lengths, then one token a step
	pos    int
	tables [][]int32 // per group; sliding entries before from are -1
	from   int
	flat   []int32 // the one table of the ungrouped reference
}

// slidingPool hands out block IDs, the most recently released first, so
// that a released block is written by another sequence at once.
type slidingPool struct{ free []int32 }

func (p *slidingPool) take(t *testing.T) int32 {
	t.Helper()
	if len(p.free) == 0 {
		t.Fatal("pool exhausted")
	}
	b := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return b
}

// TestSlidingReleaseIdentical runs two Gemma sequences side by side, in
// grouped KV (model.KVGroups) whose sliding tables release every block
// before the window as the sequences move, each released block handed at
// once to the other sequence, which overwrites it in the same batch; and
// each sequence alone in the ungrouped layout. The logits of every step are
// bit-identical: a sliding layer never reads a released block, and the
// grouped layout reads the same keys in the same order. Through one stage
// and through two and three (cuts inside the groups).
func TestSlidingReleaseIdentical(t *testing.T) {
	const bs = 4
	for _, spec := range archSpecs {
		if spec.Arch != "gemma3" && spec.Arch != "gemma2" {
			continue
		}
		spec.Type = ggml.Q8_0
		m := randomModel(t, spec)
		groups := m.KVGroups()
		if groups.Groups < 2 {
			t.Fatalf("%s: %d KV groups, want sliding ones", specName(spec), groups.Groups)
		}
		for _, cuts := range [][]int{nil, {3}, {1, 5}} {
			t.Run(fmt.Sprintf("%s/cuts=%v", specName(spec), cuts), func(t *testing.T) {
				testSlidingRelease(t, m, cuts, bs)
			})
		}
	}
}

// slidingStages builds m's stages cut at cuts, each with a pool of blocks
// blocks of bs positions, grouped (model.KVGroups) or not.
func slidingStages(t *testing.T, m *model.Model, cuts []int, blocks, bs int, grouped bool) []*model.Stage {
	t.Helper()
	pool := cpu.NewPool(2)
	t.Cleanup(pool.Close)
	bounds := append(append([]int{0}, cuts...), m.Layers)
	var out []*model.Stage
	for i := 0; i+1 < len(bounds); i++ {
		layers := bounds[i+1] - bounds[i]
		if grouped {
			layers = m.KVGroups().Slots(bounds[i], bounds[i+1])
		}
		kv, err := cpu.NewKV(cpu.KVConfig{Layers: layers, Blocks: blocks, BlockSize: bs, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: ggml.F16})
		if err != nil {
			t.Fatal(err)
		}
		st, err := model.NewStage(m, bounds[i], bounds[i+1], cpu.NewBackend(pool), kv)
		if err != nil {
			t.Fatal(err)
		}
		if grouped {
			st.GroupKV()
		}
		out = append(out, st)
	}
	return out
}

// forwardStages runs rows through the stages in order and returns the last
// one's output.
func forwardStages(t *testing.T, sts []*model.Stage, rows []model.Row) []float32 {
	t.Helper()
	var hidden []float32
	for _, st := range sts {
		out, err := st.Forward(rows, hidden)
		if err != nil {
			t.Fatal(err)
		}
		hidden = slices.Clone(out)
	}
	return hidden
}

func testSlidingRelease(t *testing.T, m *model.Model, cuts []int, bs int) {
	G, W := m.KVGroups().Groups, m.SlidingWindow
	const blocks = 256
	stages := func(grouped bool) []*model.Stage { return slidingStages(t, m, cuts, blocks, bs, grouped) }
	forward := func(sts []*model.Stage, rows []model.Row) []float32 { t.Helper(); return forwardStages(t, sts, rows) }
	grouped := stages(true)
	rng := rand.New(rand.NewPCG(7, uint64(len(cuts))))
	seqs := []*slidingSeq{
		{seq: 1, tokens: randTokens(rng, 70, m.Vocab), chunks: []int{7, 13, 3}},
		{seq: 2, tokens: randTokens(rng, 61, m.Vocab), chunks: []int{2, 9}},
	}
	p := &slidingPool{}
	for b := blocks - 1; b >= 0; b-- {
		p.free = append(p.free, int32(b))
	}
	released := 0
	var got [2][][]float32
	for step := 0; ; step++ {
		var rows []model.Row
		var live []int
		for i, s := range seqs {
			n := 1
			if step < len(s.chunks) {
				n = s.chunks[step]
			}
			if s.pos+n > len(s.tokens) {
				continue
			}
			// Release what no row from here on reads, then extend.
			lo := max(0, s.pos-W+1)
			for ; s.from < lo/bs; s.from++ {
				for g := 1; g < G; g++ {
					p.free = append(p.free, s.tables[g][s.from])
					s.tables[g][s.from] = -1
					released++
				}
			}
			if s.tables == nil {
				s.tables = make([][]int32, G)
			}
			for len(s.tables[0])*bs < s.pos+n {
				for g := range G {
					s.tables[g] = append(s.tables[g], p.take(t))
				}
			}
			r := model.Row{Seq: s.seq, Pos: s.pos, First: s.pos == 0, Tokens: s.tokens[s.pos : s.pos+n],
				Blocks: slices.Clone(s.tables[0]), Logits: true, SlideFrom: s.from}
			for g := 1; g < G; g++ {
				r.Slides = append(r.Slides, s.tables[g][s.from:]...)
			}
			rows = append(rows, r)
			live = append(live, i)
			s.pos += n
		}
		if len(rows) == 0 {
			break
		}
		out := forward(grouped, rows)
		for k, i := range live {
			got[i] = append(got[i], slices.Clone(out[k*m.Vocab:(k+1)*m.Vocab]))
		}
	}
	if released == 0 {
		t.Fatal("no block was released: the sequences never left the window")
	}
	// Each sequence alone, ungrouped, the same chunks.
	for i, s := range seqs {
		flat := stages(false)
		pos := 0
		var table []int32
		for step := 0; ; step++ {
			n := 1
			if step < len(s.chunks) {
				n = s.chunks[step]
			}
			if pos+n > len(s.tokens) {
				break
			}
			for len(table)*bs < pos+n {
				table = append(table, int32(len(table)))
			}
			out := forward(flat, []model.Row{{Seq: s.seq, Pos: pos, First: pos == 0, Tokens: s.tokens[pos : pos+n], Blocks: table, Logits: true}})
			if step >= len(got[i]) || !slices.Equal(out, got[i][step]) {
				t.Fatalf("sequence %d step %d (position %d): grouped logits with released blocks differ from the ungrouped run", s.seq, step, pos)
			}
			pos += n
		}
	}
	t.Logf("%d KV groups, window %d, %d sliding blocks released and reused", G, W, released)
}

// TestSlidingRowsChecked: a grouped stage refuses rows whose sliding tables
// are missing, of the wrong width, start after the first position the row
// reads, or name blocks outside the pool; an ungrouped one refuses rows
// that carry them.
func TestSlidingRowsChecked(t *testing.T) {
	spec := archSpecs[slices.IndexFunc(archSpecs, func(s model.RandomSpec) bool { return s.Arch == "gemma2" })]
	m := randomModel(t, spec)
	G, W := m.KVGroups().Groups, m.SlidingWindow
	const bs = 4
	newStage := func(grouped bool) *model.Stage {
		layers := m.Layers
		if grouped {
			layers = m.KVGroups().Slots(0, m.Layers)
		}
		kv, err := cpu.NewKV(cpu.KVConfig{Layers: layers, Blocks: 32, BlockSize: bs, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: ggml.F16})
		if err != nil {
			t.Fatal(err)
		}
		st, err := model.NewStage(m, 0, m.Layers, cpu.NewBackend(cpu.NewPool(1)), kv)
		if err != nil {
			t.Fatal(err)
		}
		if grouped {
			st.GroupKV()
		}
		return st
	}
	pos := W + 2*bs // reads from position 2*bs+1: block 2 on
	blocks := []int32{0, 1, 2, 3, 4, 5, 6}
	slides := func(from, groups int, fill int32) []int32 {
		var s []int32
		for range groups {
			for j := from; j < len(blocks); j++ {
				s = append(s, fill+int32(j))
			}
		}
		return s
	}
	row := func(from int, s []int32) []model.Row {
		return []model.Row{{Seq: 1, Pos: pos, Tokens: []int32{5}, Blocks: blocks, SlideFrom: from, Slides: s}}
	}
	grouped := newStage(true)
	if _, err := grouped.Forward(row(2, slides(2, G-1, 10)), nil); err != nil {
		t.Fatalf("a well-formed grouped row: %v", err)
	}
	for name, rows := range map[string][]model.Row{
		"no sliding tables":       row(0, nil),
		"one group short":         row(2, slides(2, G-2, 10)),
		"released a block read":   row(3, slides(3, G-1, 10)),
		"negative start":          row(-1, slides(0, G-1, 10)),
		"block outside the pool":  row(2, slides(2, G-1, 30)),
		"a table wider than rows": row(2, append(slides(2, G-1, 10), 1)),
	} {
		if _, err := grouped.Forward(rows, nil); err == nil {
			t.Errorf("grouped stage: %s: accepted", name)
		}
	}
	if _, err := newStage(false).Forward(row(2, slides(2, G-1, 10)), nil); err == nil {
		t.Error("ungrouped stage: a row with sliding tables accepted")
	}
}

// TestSlidingPrefixHitIdentical: prefix caching of grouped KV, through the
// coordinator's allocator (kv) and real stages. A first sequence runs a
// prompt and a generation far past the window, committing and sliding as
// the scheduler does, and ends; a second, whose prompt shares the first's
// tokens, hits the cache: its global tables and the sliding blocks of the
// window its first position reads are the first sequence's, its sliding
// entries before that window were never its own. Its logits from there on
// are bit-identical to the same tokens computed from position 0 in fresh
// ungrouped blocks. Through one, two and three stages.
func TestSlidingPrefixHitIdentical(t *testing.T) {
	const bs, blocks = 4, 256
	for _, spec := range archSpecs {
		if spec.Arch != "gemma3" && spec.Arch != "gemma2" {
			continue
		}
		spec.Type = ggml.Q8_0
		m := randomModel(t, spec)
		G, W := m.KVGroups().Groups, m.SlidingWindow
		for _, cuts := range [][]int{nil, {3}, {1, 5}} {
			t.Run(fmt.Sprintf("%s/cuts=%v", specName(spec), cuts), func(t *testing.T) {
				a, err := kv.New(kv.Config{Blocks: blocks, BlockSize: bs, Groups: G, Window: W, PrefixCaching: true})
				if err != nil {
					t.Fatal(err)
				}
				grouped := slidingStages(t, m, cuts, blocks, bs, true)
				// run computes tokens[from:] of seq in the given chunks, then
				// one token a row, as the scheduler would: extend, slide to
				// the row's window, forward, commit.
				run := func(seq kv.SeqID, tokens []int32, from int, chunks []int) [][]float32 {
					t.Helper()
					var logits [][]float32
					for pos, step := from, 0; pos < len(tokens); step++ {
						n := 1
						if step < len(chunks) {
							n = chunks[step]
						}
						n = min(n, len(tokens)-pos)
						if err := a.Extend(seq, pos+n); err != nil {
							t.Fatal(err)
						}
						if err := a.Slide(seq, max(0, pos-W+1)); err != nil {
							t.Fatal(err)
						}
						h := a.Table(seq)
						r := model.Row{Seq: uint64(seq), Pos: pos, First: pos == 0, Tokens: tokens[pos : pos+n], Logits: true, SlideFrom: h.First()}
						nblk := (pos + n + bs - 1) / bs
						for _, id := range h.AppendBlocks(nil, nblk) {
							r.Blocks = append(r.Blocks, int32(id))
						}
						for g := 1; g < G; g++ {
							for _, id := range h.AppendSliding(nil, g, nblk) {
								r.Slides = append(r.Slides, int32(id))
							}
						}
						logits = append(logits, forwardStages(t, grouped, []model.Row{r}))
						a.Commit(seq, tokens[:pos+n])
						pos += n
					}
					return logits
				}
				rng := rand.New(rand.NewPCG(11, uint64(len(cuts))))
				first := randTokens(rng, 3*W, m.Vocab)
				if _, err := a.Allocate(1, nil, 0, 0); err != nil {
					t.Fatal(err)
				}
				run(1, first, 0, []int{9, 14})
				a.End(1)
				if err := a.CheckInvariants(); err != nil {
					t.Fatal(err)
				}
				// The next turn: all of the first's tokens but the last
				// (whose K/V a last row never writes) and new ones.
				next := append(slices.Clone(first[:len(first)-1]), randTokens(rng, 12, m.Vocab)...)
				cached, err := a.Allocate(2, next[:len(next)-1], 0, 0)
				if err != nil {
					t.Fatal(err)
				}
				from := a.Table(2).First()
				if cached == 0 || from == 0 {
					t.Fatalf("hit of %d positions, sliding tables from block %d: want a hit past a released window", cached, from)
				}
				chunks := []int{5}
				got := run(2, next, cached, chunks)
				// Alone, ungrouped, in fresh blocks: the prefix in one
				// chunk, then the same rows.
				flat := slidingStages(t, m, cuts, blocks, bs, false)
				var table []int32
				for i := range (len(next) + bs - 1) / bs {
					table = append(table, int32(i))
				}
				pos := 0
				for step := -1; pos < len(next); step++ {
					n := cached
					if step >= 0 {
						n = 1
						if step < len(chunks) {
							n = chunks[step]
						}
						n = min(n, len(next)-pos)
					}
					out := forwardStages(t, flat, []model.Row{{Seq: 9, Pos: pos, First: pos == 0, Tokens: next[pos : pos+n], Blocks: table[:(pos+n+bs-1)/bs], Logits: true}})
					if step >= 0 && !slices.Equal(out, got[step]) {
						t.Fatalf("row %d (position %d): logits after a sliding prefix hit differ from a recompute", step, pos)
					}
					pos += n
				}
				t.Logf("window %d: hit %d positions, sliding tables from block %d", W, cached, from)
			})
		}
	}
}
