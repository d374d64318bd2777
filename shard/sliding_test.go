package shard

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// slideCoord is the coordinator's side of sliding-window KV for these
// tests: one pool of block IDs, a global table and groups-1 sliding tables
// per sequence, the sliding entries released as the window moves and
// their IDs reused at once (the last freed first).
type slideCoord struct {
	bs, window, groups int
	free               []int32
	seqs               map[uint64]*slideSeq
}

type slideSeq struct {
	pos    int
	blocks []int32
	from   int
	slides [][]int32 // per sliding group: entries [from, len(blocks))
}

func newSlideCoord(bs, window, groups, pool int) *slideCoord {
	c := &slideCoord{bs: bs, window: window, groups: groups, seqs: map[uint64]*slideSeq{}}
	for b := pool - 1; b >= 0; b-- {
		c.free = append(c.free, int32(b))
	}
	return c
}

func (c *slideCoord) alloc(t *testing.T) int32 {
	t.Helper()
	if len(c.free) == 0 {
		t.Fatal("the test's pool ran out")
	}
	b := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	return b
}

// row returns seq's next row of tokens, after releasing the sliding
// entries before the window of its first position and allocating the
// blocks its positions need.
func (c *slideCoord) row(t *testing.T, seq uint64, tokens []int32) *pb.Row {
	s := c.seqs[seq]
	first := s == nil
	if first {
		s = &slideSeq{slides: make([][]int32, c.groups-1)}
		c.seqs[seq] = s
	}
	from := max(0, s.pos-c.window+1) / c.bs
	for g := range s.slides {
		c.free = append(c.free, s.slides[g][:from-s.from]...)
		s.slides[g] = slices.Clone(s.slides[g][from-s.from:])
	}
	s.from = from
	for len(s.blocks) < (s.pos+len(tokens)+c.bs-1)/c.bs {
		s.blocks = append(s.blocks, c.alloc(t))
		for g := range s.slides {
			s.slides[g] = append(s.slides[g], c.alloc(t))
		}
	}
	r := &pb.Row{Seq: seq, Pos: int32(s.pos), First: first, Tokens: tokens, Blocks: slices.Clone(s.blocks), SlideFrom: int32(from)}
	for _, g := range s.slides {
		r.Slides = append(r.Slides, g...)
	}
	s.pos += len(tokens)
	return r
}

// used is the blocks the coordinator holds: every live entry of every
// table.
func (c *slideCoord) used() int {
	n := 0
	for _, s := range c.seqs {
		n += len(s.blocks)
		for _, g := range s.slides {
			n += len(g)
		}
	}
	return n
}

// slidingModel is a twelve-layer random-weight Gemma 3: two global layers
// and ten sliding ones over 8 positions, so six KV groups.
func slidingModel(tb testing.TB) *model.Model {
	tb.Helper()
	f, err := model.RandomFile(model.RandomSpec{Arch: "gemma3", Layers: 12, Embd: 32, Heads: 4, HeadsKV: 2, FF: 64, Vocab: 300, Context: 256, Type: ggml.F32, Seed: 23})
	if err != nil {
		tb.Fatal(err)
	}
	m, err := model.Load(f)
	if err != nil {
		tb.Fatal(err)
	}
	return m
}

// slidingRunner is a runner over all of m's layers on a grouped pool of 16
// blocks (what buildPlacement makes of a model with sliding layers),
// computing on one thread.
func slidingRunner(tb testing.TB, m *model.Model) *Runner {
	tb.Helper()
	pool := cpu.NewPool(1)
	tb.Cleanup(pool.Close)
	kv, err := cpu.NewKV(cpu.KVConfig{Layers: m.KVGroups().Slots(0, m.Layers), Blocks: 16, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: ggml.F32})
	if err != nil {
		tb.Fatal(err)
	}
	st, err := model.NewStage(m, 0, m.Layers, cpu.NewBackend(pool), kv)
	if err != nil {
		tb.Fatal(err)
	}
	st.GroupKV()
	return NewRunner(st, 16, kv.BlockSize())
}

// TestShardSlidingKV: a shard assigned a range of a model with sliding
// layers builds a grouped KV pool of the range's largest group's slots per
// block (which --kv-memory counts), checks batches for the model's groups
// and window, keeps and checks the sliding tables in its replica table,
// forwards them, and computes what a stage keeping every layer in table 0
// computes, bit for bit, though the coordinator releases sliding blocks
// and reuses them at once.
func TestShardSlidingKV(t *testing.T) {
	m := slidingModel(t)
	const first, end, bs, blocks, epoch = 0, 6, 4, 96, 100
	kg := m.KVGroups()
	if kg.Groups < 3 || kg.Slots(first, end) >= end-first || m.SlidingWindow <= 0 {
		t.Fatalf("the test model has %d groups, %d slots for layers [%d, %d), window %d", kg.Groups, kg.Slots(first, end), first, end, m.SlidingWindow)
	}
	pool := cpu.NewPool(1)
	t.Cleanup(pool.Close)

	// The reference: layers [first, end) with every layer in table 0.
	refKV, err := cpu.NewKV(cpu.KVConfig{Layers: end - first, Blocks: blocks, BlockSize: bs, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: ggml.F32})
	if err != nil {
		t.Fatal(err)
	}
	refStage, err := model.NewStage(m, first, end, cpu.NewBackend(pool), refKV)
	if err != nil {
		t.Fatal(err)
	}
	ref := NewRunner(refStage, blocks, bs)
	n := testNode(ref, epoch)
	n.pool = pool

	a := &pb.Assign{PlacementVersion: 1, FirstLayer: first, EndLayer: end, Embed: true, NextAddr: "127.0.0.1:1", KvBlocks: blocks, BlockSize: bs,
		KvType: pb.KVType_KV_TYPE_F32, HiddenType: pb.HiddenType_HIDDEN_TYPE_F32, MaxBatchTokens: 512}
	grouped := cpu.KVBytes(cpu.KVConfig{Layers: kg.Slots(first, end), Blocks: blocks, BlockSize: bs, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: ggml.F32})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	n.cfg.KVMemory = grouped - 1
	if _, err := n.buildPlacement(ctx, &loadedModel{m: m}, a); err == nil || !strings.Contains(err.Error(), "--kv-memory") {
		t.Fatalf("a pool over --kv-memory by one byte: %v", err)
	}
	n.cfg.KVMemory = grouped
	p, err := n.buildPlacement(ctx, &loadedModel{m: m}, a)
	if err != nil {
		t.Fatalf("a grouped pool within --kv-memory: %v", err)
	}
	defer p.link.close()
	defer p.runner.Close()
	if p.limits.Groups != kg.Groups || p.limits.Window != m.SlidingWindow {
		t.Fatalf("batch limits for %d groups, window %d; want %d, %d", p.limits.Groups, p.limits.Window, kg.Groups, m.SlidingWindow)
	}
	p.runner.SetEpoch(epoch)
	n.mu.Lock()
	n.p = p
	n.mu.Unlock()

	c := newSlideCoord(bs, m.SlidingWindow, kg.Groups, blocks)
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := func(k int) []int32 {
		out := make([]int32, k)
		for i := range out {
			out[i] = int32(rng.IntN(m.Vocab))
		}
		return out
	}
	now := time.Unix(100, 0)
	id := uint64(0)
	// step runs one batch of rows on the grouped stage and, without their
	// sliding tables, on the reference, and compares.
	step := func(rows ...*pb.Row) *processed {
		t.Helper()
		id++
		h := &pb.BatchHeader{Epoch: epoch, PlacementVersion: 1, BatchId: id, Rows: rows}
		out, err := n.process(&transport.Batch{Header: h}, now)
		if err != nil {
			t.Fatalf("batch %d: %v", id, err)
		}
		rb := &Batch{Epoch: epoch, ID: id}
		for _, r := range rows {
			rb.Rows = append(rb.Rows, Row{Seq: r.Seq, Pos: int(r.Pos), First: r.First, Tokens: r.Tokens, Blocks: r.Blocks})
		}
		want, err := ref.Process(rb, now)
		if err != nil {
			t.Fatalf("batch %d on the reference: %v", id, err)
		}
		if len(want.Dropped) > 0 || len(out.msg.header.GetDropped()) > 0 {
			t.Fatalf("batch %d: dropped %v here, %v on the reference", id, out.msg.header.GetDropped(), want.Dropped)
		}
		if !slices.Equal(out.msg.hidden, want.Hidden) {
			t.Fatalf("batch %d: hidden states differ from the reference's", id)
		}
		for i, r := range out.msg.header.GetRows() {
			if r.GetSlideFrom() != rows[i].SlideFrom || !slices.Equal(r.GetSlides(), rows[i].Slides) {
				t.Fatalf("batch %d: row %d forwarded with slides from %d: %v, got from %d: %v", id, i, r.GetSlideFrom(), r.GetSlides(), rows[i].SlideFrom, rows[i].Slides)
			}
		}
		if err := p.runner.CheckInvariants(); err != nil {
			t.Fatalf("batch %d: %v", id, err)
		}
		if got, want := p.runner.Table().BlocksUsed(), c.used(); got != want {
			t.Fatalf("batch %d: the replica table holds %d blocks, the coordinator %d", id, got, want)
		}
		return out
	}
	// Two sequences: chunked prompts, then decodes well past the window.
	step(c.row(t, 1, tokens(7)), c.row(t, 2, tokens(3)))
	step(c.row(t, 1, tokens(5)), c.row(t, 2, tokens(9)))
	for range 30 {
		step(c.row(t, 1, tokens(1)), c.row(t, 2, tokens(1)))
	}
	if from := c.seqs[1].from; from < 4 {
		t.Fatalf("the window moved only to block %d", from)
	}

	// A row that brings a released entry back is dropped (the coordinator
	// then ends its sequence), its replica unchanged: the shard never
	// reads a block another sequence may own now.
	s := c.seqs[1]
	back := &pb.Row{Seq: 1, Pos: int32(s.pos), Tokens: tokens(1), Blocks: slices.Clone(s.blocks), SlideFrom: int32(s.from - 1)}
	for _, g := range s.slides {
		back.Slides = append(back.Slides, 0) // the released entry, whatever it held
		back.Slides = append(back.Slides, g...)
	}
	id++
	out, err := n.process(&transport.Batch{Header: &pb.BatchHeader{Epoch: epoch, PlacementVersion: 1, BatchId: id, Rows: []*pb.Row{back}}}, now)
	if err != nil {
		t.Fatal(err)
	}
	if d := out.msg.header.GetDropped(); len(d) != 1 || d[0].GetSeq() != 1 || d[0].GetReason() != transport.CodeBadBlocks.String() {
		t.Fatalf("a released entry brought back: dropped %v", d)
	}
	// A row whose sliding tables skip a block it reads is refused whole.
	s = c.seqs[2]
	ahead := &pb.Row{Seq: 2, Pos: int32(s.pos), Tokens: tokens(1), Blocks: slices.Clone(s.blocks), SlideFrom: int32(s.from + 1)}
	for _, g := range s.slides {
		ahead.Slides = append(ahead.Slides, g[1:]...)
	}
	id++
	_, err = n.process(&transport.Batch{Header: &pb.BatchHeader{Epoch: epoch, PlacementVersion: 1, BatchId: id, Rows: []*pb.Row{ahead}}}, now)
	if se, ok := errors.AsType[*stageError](err); !ok || se.code != transport.CodeBadBlocks {
		t.Fatalf("a row releasing a block it reads: %v", err)
	}
	for seq, s := range c.seqs {
		from, slides := p.runner.Table().SlidesOf(seq)
		if from != s.from || !slices.EqualFunc(slides, s.slides, slices.Equal) {
			t.Fatalf("after the refusals, sequence %d slides from %d: %v, want %d: %v", seq, from, slides, s.from, s.slides)
		}
	}
}
