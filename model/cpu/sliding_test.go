package cpu_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

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

func testSlidingRelease(t *testing.T, m *model.Model, cuts []int, bs int) {
	groups := m.KVGroups()
	G, W := groups.Groups, m.SlidingWindow
	pool := cpu.NewPool(2)
	t.Cleanup(pool.Close)
	bounds := append(append([]int{0}, cuts...), m.Layers)
	const blocks = 256
	stages := func(grouped bool) []*model.Stage {
		var out []*model.Stage
		for i := 0; i+1 < len(bounds); i++ {
			layers := bounds[i+1] - bounds[i]
			if grouped {
				layers = groups.Slots(bounds[i], bounds[i+1])
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
	forward := func(sts []*model.Stage, rows []model.Row) []float32 {
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
