package model

import (
	"errors"
	"fmt"
	"math"

	"github.com/strata-llm/strata/model/ggml"
)

// Row is one sequence's part of a batch: Tokens at positions Pos, Pos+1, ….
type Row struct {
	Seq    uint64  // sequence ID (the coordinator's)
	Pos    int     // position of Tokens[0] in the sequence
	First  bool    // the sequence's first chunk (Pos == 0)
	Tokens []int32 // token IDs; at least one
	Blocks []int32 // block table covering positions [0, Pos+len(Tokens))
	Logits bool    // on the last stage: return logits for the row's last token

	// The sliding groups' block tables (KVGroups), on a stage that groups
	// its KV (Stage.GroupKV): entries [SlideFrom, len(Blocks)) of each
	// sliding group's table, group g's at Slides[(g-1)*w:g*w] for w =
	// len(Blocks)-SlideFrom. Entries before SlideFrom have been released:
	// no position the row reads in a sliding layer lies in them.
	SlideFrom int
	Slides    []int32
}

// Backend computes the heavy products of a forward pass.
type Backend interface {
	// MatMul sets out[r*w.Rows+o] to the dot product of weight row o with
	// activation row x[r*w.Cols:(r+1)*w.Cols], for r < rows. Each output's
	// reduction order depends only on w.Cols.
	MatMul(w *Weight, x []float32, rows int, out []float32)
	// Parallel calls fn(worker, i) for every i in [0, n) on the backend's
	// workers and returns when all calls have returned. worker is in
	// [0, Workers()) and no two concurrent calls share one.
	Parallel(n int, fn func(worker, i int))
	// Workers is the number of workers Parallel uses.
	Workers() int
	// SwiGLU sets gate[i] = silu(gate[i]) * up[i] = gate[i] / (1 +
	// e^-gate[i]) * up[i] for i < len(gate). The result depends only on
	// gate[i] and up[i].
	SwiGLU(gate, up []float32)
}

// KV stores keys and values for the layers of one stage, in blocks of
// BlockSize positions addressed by the block IDs rows carry.
type KV interface {
	// BlockSize is the number of positions in a block.
	BlockSize() int
	// Blocks is the number of blocks in the pool; valid IDs are [0, Blocks()).
	Blocks() int
	// Store writes position pos's keys and values (KVDim each) for the
	// stage-local layer, in the block that blocks names for pos.
	Store(layer int, blocks []int32, pos int, k, v []float32)
	// Attend writes to out (Heads*HeadDim) causal attention of q (Heads*HeadDim)
	// over positions lo..pos of the stage-local layer (0 <= lo <= pos), each
	// score scaled by scale, for query heads h0..h1-1 (0 <= h0 < h1 <=
	// Heads; out's other heads are not written). A head's result depends
	// only on its query, lo, pos, scale and the keys and values stored at
	// lo..pos: not on which other heads the call computes. scratch has at
	// least pos+1-lo elements; with AttendScratch or more too, Attend need
	// not allocate. It may be called concurrently for different outputs, or
	// for different heads of one output.
	Attend(layer int, blocks []int32, lo, pos, h0, h1 int, scale float32, q, out, scratch []float32)
}

// AttendScratch is the least scratch a KV's Attend is given: the SIMD
// attention keeps a chunk's scores and weights there.
const AttendScratch = 512

// SoftCapKV is a KV that also attends with soft-capped scores, for models
// with Config.AttnSoftCap (Gemma 2).
type SoftCapKV interface {
	KV
	// AttendSoftCap is Attend with each scaled score s replaced by
	// capped*tanh(s/capped) before the softmax, the division done as a
	// multiplication by scale/capped (ggml's flash attention).
	AttendSoftCap(layer int, blocks []int32, lo, pos, h0, h1 int, scale, capped float32, q, out, scratch []float32)
}

// ErrBadBatch wraps every error about a batch's shape or contents.
var ErrBadBatch = errors.New("model: bad batch")

// Stage runs layers [First, Last) of a model.
type Stage struct {
	m           *Model
	first, last int
	be          Backend
	kv          KV
	capKV       SoftCapKV // kv, when the model soft-caps attention scores
	hasQKV      bool      // a layer of the stage fuses Q, K and V
	swaRope     bool      // sliding layers rotate with their own base and scale
	attnScale   float32   // Attend's score scale

	// Scratch, grown to the largest batch seen; reused across calls.
	x, h, q, k, v, att, gate, up, out, logitsIn, logits []float32
	qkv, gateUp                                         []float32 // fused products, split per token
	ropeCS                                              []float32 // per token: cos, sin of each rotated pair
	ropeCSSWA                                           []float32 // the same for sliding layers, when their RoPE differs
	pos                                                 []int     // position of each token
	rowOf                                               []int     // row of each token
	attnScratch                                         [][]float32
	moe                                                 moeScratch // moe.go

	// The batch and layer in progress, read by the per-token steps below;
	// their method values are made once in NewStage so that a forward pass
	// allocates nothing.
	rows   []Row
	L      *Layer
	ll     int // stage-local layer
	slot   int // its slot in the KV pool: ll, or its place in its group (GroupKV)
	group  int // its KV group: 0, or its sliding group (GroupKV)
	rope   bool
	window int // positions the layer attends to (0: all)

	// kvGroups is the model's KV groups once GroupKV has switched the
	// stage to them (Groups 0 before: every layer in Blocks at slot ll),
	// and each stage layer's slot and group, worked out there once.
	kvGroups          KVGroups
	kvSlot, kvGroupOf []int
	headGroups        int       // attention items per token (attention)
	softCapLogits     []float32 // the logits the softCap step caps
	norm              []float32 // weights of the norm in progress
	steps             struct {
		embed, rope, norm, postNorm, qkv, attend, swiGLU, softCap func(worker, t int)
		route, gather, expertGLU, sharedGLU, combine              func(worker, i int) // moe.go
	}
}

// NewStage prepares layers [first, last) of m on be with kv.
func NewStage(m *Model, first, last int, be Backend, kv KV) (*Stage, error) {
	if first < 0 || last > m.Layers || first >= last {
		return nil, fmt.Errorf("model: layer range [%d, %d) is not inside [0, %d)", first, last, m.Layers)
	}
	s := &Stage{m: m, first: first, last: last, be: be, kv: kv, attnScratch: make([][]float32, be.Workers())}
	if m.AttnSoftCap > 0 {
		ck, ok := kv.(SoftCapKV)
		if !ok {
			return nil, fmt.Errorf("model: %s soft-caps attention scores, which the KV store %T cannot", m.Arch, kv)
		}
		s.capKV = ck
	}
	s.steps.embed = s.embedToken
	s.steps.rope = s.ropeToken
	s.steps.norm = s.normToken
	s.steps.postNorm = s.postNormToken
	s.steps.softCap = s.softCapToken
	s.steps.qkv = s.qkvToken
	s.steps.attend = s.attendItem
	s.steps.swiGLU = s.swiGLUToken
	s.steps.route, s.steps.gather, s.steps.expertGLU, s.steps.sharedGLU, s.steps.combine = s.routeToken, s.gatherRow, s.expertGLURow, s.sharedGLUToken, s.combineToken
	for _, L := range m.LayerWeights[first:last] {
		s.hasQKV = s.hasQKV || L.QKV != nil
	}
	for l := first; l < last; l++ {
		s.swaRope = s.swaRope || m.Window(l) > 0
	}
	s.attnScale = 1 / float32(math.Sqrt(float64(m.HeadDim)))
	if m.QueryScale > 0 { // the queries carry the scale
		s.attnScale = 1
	}
	if p, ok := be.(Preparer); ok {
		for i := range m.LayerWeights[first:last] {
			for _, w := range m.LayerWeights[first+i].Matrices() {
				p.Prepare(w)
			}
		}
		if last == m.Layers {
			p.Prepare(m.Output)
		}
	}
	return s, nil
}

// GroupKV switches the stage to grouped KV (KVGroups): layer l keeps its
// keys and values at slot KVGroups().Slot(first, l) of its group's block
// table, and the KV store must have been built with that many layer slots
// (KVGroups().Slots(first, last)) instead of one per layer. Rows then carry
// their sliding groups' tables (Row.Slides) when the model has any. Call
// it before the first Forward.
func (s *Stage) GroupKV() {
	s.kvGroups = s.m.KVGroups()
	s.kvSlot, s.kvGroupOf = make([]int, s.last-s.first), make([]int, s.last-s.first)
	for l := s.first; l < s.last; l++ {
		s.kvSlot[l-s.first], s.kvGroupOf[l-s.first] = s.kvGroups.Slot(s.first, l), s.kvGroups.Group(l)
	}
}

// table is the block table layer s.ll reads and writes for row r, and the
// position its first entry stands for: a sliding group's table starts at
// r.SlideFrom, so its positions are shifted by SlideFrom blocks (the
// keys' order, all Attend depends on, is the same).
func (s *Stage) table(r *Row) ([]int32, int) {
	if s.group == 0 {
		return r.Blocks, 0
	}
	w := len(r.Blocks) - r.SlideFrom
	return r.Slides[(s.group-1)*w : s.group*w], r.SlideFrom * s.kv.BlockSize()
}

// Preparer is a Backend that converts weights to a layout of its own
// (repacking them for its kernels) once, before the first forward pass.
type Preparer interface {
	Prepare(w *Weight)
}

// First reports whether the stage embeds tokens (it starts at layer 0).
func (s *Stage) First() bool { return s.first == 0 }

// Last reports whether the stage ends the model (applies the head).
func (s *Stage) Last() bool { return s.last == s.m.Layers }

// Model returns the model the stage runs.
func (s *Stage) Model() *Model { return s.m }

// Tokens is the number of token positions in rows.
func Tokens(rows []Row) int {
	n := 0
	for i := range rows {
		n += len(rows[i].Tokens)
	}
	return n
}

// Forward runs rows through the stage's layers. A first stage embeds the
// rows' tokens and ignores in; any other takes in, the previous stage's hidden
// states (Tokens(rows)×Embd). A last stage returns logits (Vocab each) for the
// rows with Logits set, in row order; any other returns hidden states. The
// returned slice belongs to the Stage and is valid until the next call.
//
// Forward writes each token's keys and values into kv before any token of the
// batch attends, so a row may attend to keys written by an earlier row of the
// same sequence in the same batch.
func (s *Stage) Forward(rows []Row, in []float32) ([]float32, error) {
	m := s.m
	E := m.Embd
	T, err := s.check(rows, in)
	if err != nil {
		return nil, err
	}
	if T == 0 {
		return nil, nil
	}
	s.grow(T)
	x := s.x[:T*E]
	t := 0
	for r := range rows {
		for j := range rows[r].Tokens {
			s.pos[t] = rows[r].Pos + j
			s.rowOf[t] = r
			t++
		}
	}
	s.rows = rows
	defer func() { s.rows, s.L, s.norm = nil, nil, nil }()
	if m.RopeDims > 0 {
		s.be.Parallel(T, s.steps.rope) // once per token for all layers
	}
	if s.First() {
		s.be.Parallel(T, s.steps.embed)
	} else {
		copy(x, in)
	}
	for l := s.first; l < s.last; l++ {
		s.layer(l, rows, T)
	}
	if !s.Last() {
		return x, nil
	}
	return s.head(rows, T), nil
}

func (s *Stage) embedToken(_, t int) {
	E := s.m.Embd
	r := &s.rows[s.rowOf[t]]
	x := s.x[t*E : (t+1)*E]
	dequantizeRow(s.m.Embed, int(r.Tokens[s.pos[t]-r.Pos]), x)
	if sc := s.m.EmbedScale; sc > 0 {
		for i := range x {
			x[i] *= sc
		}
	}
}

func (s *Stage) ropeToken(_, t int) {
	m := s.m
	d := m.RopeDims
	RopeAngles(s.ropeCS[t*d:(t+1)*d], s.pos[t], m.RopeBase, m.RopeScale, m.RopeFactors, m.RopeAttnFactor)
	if s.swaRope {
		RopeAngles(s.ropeCSSWA[t*d:(t+1)*d], s.pos[t], m.RopeBaseSWA, m.RopeScaleSWA, m.RopeFactors, m.RopeAttnFactor)
	}
}

func (s *Stage) normToken(_, t int) {
	E := s.m.Embd
	rmsNorm(s.h[t*E:(t+1)*E], s.x[t*E:(t+1)*E], s.norm, s.m.NormEps)
}

// postNormToken normalises a token's layer output in s.out in place.
func (s *Stage) postNormToken(_, t int) {
	E := s.m.Embd
	o := s.out[t*E : (t+1)*E]
	rmsNorm(o, o, s.norm, s.m.NormEps)
}

func (s *Stage) qkvToken(_, t int) {
	m, L := s.m, s.L
	QD, KVD := m.QDim(), m.KVDim()
	qt, kt, vt := s.q[t*QD:(t+1)*QD], s.k[t*KVD:(t+1)*KVD], s.v[t*KVD:(t+1)*KVD]
	if L.QKV != nil {
		W := QD + 2*KVD
		fused := s.qkv[t*W : (t+1)*W]
		copy(qt, fused[:QD])
		copy(kt, fused[QD:QD+KVD])
		copy(vt, fused[QD+KVD:])
	}
	if L.QBias != nil {
		addTo(qt, L.QBias)
		addTo(kt, L.KBias)
		addTo(vt, L.VBias)
	}
	if L.QNorm != nil {
		hd := m.HeadDim
		for h := 0; h < m.Heads; h++ {
			rmsNorm(qt[h*hd:(h+1)*hd], qt[h*hd:(h+1)*hd], L.QNorm, m.NormEps)
		}
		for h := 0; h < m.HeadsKV; h++ {
			rmsNorm(kt[h*hd:(h+1)*hd], kt[h*hd:(h+1)*hd], L.KNorm, m.NormEps)
		}
	}
	if s.rope {
		cs := s.ropeCS
		if s.window > 0 {
			cs = s.ropeCSSWA
		}
		cs = cs[t*m.RopeDims : (t+1)*m.RopeDims]
		ropeRotate(qt, m.Heads, m.HeadDim, cs, m.Rope)
		ropeRotate(kt, m.HeadsKV, m.HeadDim, cs, m.Rope)
	}
	if sc := m.QueryScale; sc > 0 {
		for i := range qt {
			qt[i] *= sc
		}
	}
}

// attention runs the attention of the batch's T tokens over the workers.
// A token is one item when the batch has enough of them to share out, or
// one worker does it all; with fewer (a decode step has one per sequence)
// each token's heads are cut into groups of whole head pairs, items of
// their own, so that a decode's attention, which grows with its context,
// runs on every worker. A head's result does not depend on its group
// (KV.Attend).
func (s *Stage) attention(T int) {
	w := s.be.Workers()
	s.headGroups = 1
	if w > 1 && T < 4*w {
		s.headGroups = min((s.m.Heads+1)/2, (4*w+T-1)/T)
	}
	s.be.Parallel(T*s.headGroups, s.steps.attend)
}

// attendItem is item i of attention: token i/headGroups, its head pairs
// of group i%headGroups.
func (s *Stage) attendItem(w, i int) {
	QD, pairs := s.m.QDim(), (s.m.Heads+1)/2
	t, g := i/s.headGroups, i%s.headGroups
	h0, h1 := 2*(g*pairs/s.headGroups), min(s.m.Heads, 2*((g+1)*pairs/s.headGroups))
	pos, lo := s.pos[t], 0
	if s.window > 0 {
		lo = max(0, pos-s.window+1)
	}
	n := max(pos+1-lo, AttendScratch)
	if cap(s.attnScratch[w]) < n {
		s.attnScratch[w] = make([]float32, n+n/2)
	}
	blocks, shift := s.table(&s.rows[s.rowOf[t]])
	lo, pos = lo-shift, pos-shift
	q, out := s.q[t*QD:(t+1)*QD], s.att[t*QD:(t+1)*QD]
	if s.capKV != nil {
		s.capKV.AttendSoftCap(s.slot, blocks, lo, pos, h0, h1, s.attnScale, s.m.AttnSoftCap, q, out, s.attnScratch[w][:n])
		return
	}
	s.kv.Attend(s.slot, blocks, lo, pos, h0, h1, s.attnScale, q, out, s.attnScratch[w][:n])
}

func (s *Stage) swiGLUToken(_, t int) {
	FF := s.m.FF
	gate, up := s.gate[t*FF:(t+1)*FF], s.up[t*FF:(t+1)*FF]
	if s.L.GateUp != nil {
		fused := s.gateUp[t*2*FF : (t+1)*2*FF]
		copy(gate, fused[:FF])
		copy(up, fused[FF:])
	}
	if s.m.GELU {
		geglu(gate, up)
		return
	}
	s.be.SwiGLU(gate, up)
}

// check validates a batch and returns its token count.
func (s *Stage) check(rows []Row, in []float32) (int, error) {
	m := s.m
	bs := s.kv.BlockSize()
	T := 0
	for i := range rows {
		r := &rows[i]
		if len(r.Tokens) == 0 {
			return 0, fmt.Errorf("%w: row %d (sequence %d) has no tokens", ErrBadBatch, i, r.Seq)
		}
		if r.Pos < 0 || r.First != (r.Pos == 0) {
			return 0, fmt.Errorf("%w: row %d (sequence %d) has position %d with first=%v", ErrBadBatch, i, r.Seq, r.Pos, r.First)
		}
		end := r.Pos + len(r.Tokens)
		if end > len(r.Blocks)*bs {
			return 0, fmt.Errorf("%w: row %d (sequence %d) reaches position %d but its %d blocks hold %d", ErrBadBatch, i, r.Seq, end-1, len(r.Blocks), len(r.Blocks)*bs)
		}
		for j, b := range r.Blocks[:(end+bs-1)/bs] {
			if b < 0 || int(b) >= s.kv.Blocks() {
				return 0, fmt.Errorf("%w: row %d (sequence %d) block %d is %d, pool has %d", ErrBadBatch, i, r.Seq, j, b, s.kv.Blocks())
			}
		}
		if err := s.checkSlides(r, end); err != nil {
			return 0, fmt.Errorf("%w: row %d (sequence %d) %v", ErrBadBatch, i, r.Seq, err)
		}
		if s.First() {
			for _, tok := range r.Tokens {
				if tok < 0 || int(tok) >= m.Vocab {
					return 0, fmt.Errorf("%w: row %d (sequence %d) token %d outside vocabulary of %d", ErrBadBatch, i, r.Seq, tok, m.Vocab)
				}
			}
		}
		T += len(r.Tokens)
	}
	if !s.First() && len(in) != T*m.Embd {
		return 0, fmt.Errorf("%w: %d hidden values for %d tokens of width %d", ErrBadBatch, len(in), T, m.Embd)
	}
	return T, nil
}

// checkSlides validates r's sliding tables: none unless the stage groups
// its KV and the model has sliding groups; else one per sliding group,
// covering the blocks from SlideFrom to those the row reaches (end), with
// SlideFrom no later than the block of the first position the row reads
// in a sliding layer.
func (s *Stage) checkSlides(r *Row, end int) error {
	groups := max(1, s.kvGroups.Groups)
	if groups == 1 {
		if len(r.Slides) > 0 || r.SlideFrom != 0 {
			return fmt.Errorf("carries sliding tables, and the stage has none")
		}
		return nil
	}
	bs := s.kv.BlockSize()
	lo := max(0, r.Pos-s.m.SlidingWindow+1)
	if r.SlideFrom < 0 || r.SlideFrom > lo/bs {
		return fmt.Errorf("slides from block %d, and reads position %d", r.SlideFrom, lo)
	}
	w := len(r.Blocks) - r.SlideFrom
	if len(r.Slides) != (groups-1)*w {
		return fmt.Errorf("has %d sliding entries, %d groups of %d expected", len(r.Slides), groups-1, w)
	}
	need := (end+bs-1)/bs - r.SlideFrom
	for g := range groups - 1 {
		for j, b := range r.Slides[g*w : g*w+need] {
			if b < 0 || int(b) >= s.kv.Blocks() {
				return fmt.Errorf("sliding group %d block %d is %d, pool has %d", g+1, r.SlideFrom+j, b, s.kv.Blocks())
			}
		}
	}
	return nil
}

func (s *Stage) grow(T int) {
	m := s.m
	E, KVD, QD := m.Embd, m.KVDim(), m.QDim()
	g := func(b *[]float32, n int) {
		if cap(*b) < n {
			*b = make([]float32, n)
		}
		*b = (*b)[:n]
	}
	g(&s.x, T*E)
	g(&s.h, T*E)
	g(&s.q, T*QD)
	g(&s.k, T*KVD)
	g(&s.v, T*KVD)
	g(&s.att, T*QD)
	if m.Experts == 0 { // MoE layers use s.moe's
		g(&s.gate, T*m.FF)
		g(&s.up, T*m.FF)
	}
	g(&s.out, T*E)
	g(&s.ropeCS, T*m.RopeDims)
	if s.swaRope {
		g(&s.ropeCSSWA, T*m.RopeDims)
	}
	if s.hasQKV {
		g(&s.qkv, T*(QD+2*KVD))
	}
	if m.FusedGateUp {
		g(&s.gateUp, T*2*m.FF)
	}
	s.growMoE(T)
	if cap(s.pos) < T {
		s.pos = make([]int, T)
		s.rowOf = make([]int, T)
	}
	s.pos, s.rowOf = s.pos[:T], s.rowOf[:T]
}

// layer runs transformer block l over the batch's T tokens in s.x.
func (s *Stage) layer(l int, rows []Row, T int) {
	m := s.m
	L := &m.LayerWeights[l]
	E, KVD, QD, FF := m.Embd, m.KVDim(), m.QDim(), m.FF
	x, h := s.x[:T*E], s.h[:T*E]
	q, k, v := s.q[:T*QD], s.k[:T*KVD], s.v[:T*KVD]
	s.L, s.ll = L, l-s.first
	s.slot, s.group = s.ll, 0
	if s.kvGroups.Groups > 1 {
		s.slot, s.group = s.kvSlot[s.ll], s.kvGroupOf[s.ll]
	}
	s.rope = m.NoRopeEvery == 0 || (l+1)%m.NoRopeEvery != 0
	s.window = m.Window(l)

	s.norm = L.AttnNorm
	s.be.Parallel(T, s.steps.norm)
	if L.QKV != nil { // one product streams the fused weights once; qkvToken splits it
		s.be.MatMul(L.QKV, h, T, s.qkv[:T*(QD+2*KVD)])
	} else {
		s.be.MatMul(L.Q, h, T, q)
		s.be.MatMul(L.K, h, T, k)
		s.be.MatMul(L.V, h, T, v)
	}
	s.be.Parallel(T, s.steps.qkv)
	for t := 0; t < T; t++ {
		blocks, shift := s.table(&rows[s.rowOf[t]])
		s.kv.Store(s.slot, blocks, s.pos[t]-shift, k[t*KVD:(t+1)*KVD], v[t*KVD:(t+1)*KVD])
	}
	att := s.att[:T*QD]
	s.attention(T)
	out := s.out[:T*E]
	s.be.MatMul(L.O, att, T, out)
	if L.PostAttnNorm != nil {
		s.norm = L.PostAttnNorm
		s.be.Parallel(T, s.steps.postNorm)
	}
	addTo(x, out)

	s.norm = L.FFNNorm
	s.be.Parallel(T, s.steps.norm)
	switch {
	case L.Router != nil:
		s.moeFFN(T)
	case L.GateUp != nil: // one product; swiGLUToken splits it
		s.be.MatMul(L.GateUp, h, T, s.gateUp[:T*2*FF])
		s.be.Parallel(T, s.steps.swiGLU)
		s.be.MatMul(L.Down, s.gate[:T*FF], T, out)
	default:
		gate, up := s.gate[:T*FF], s.up[:T*FF]
		s.be.MatMul(L.Gate, h, T, gate)
		s.be.MatMul(L.Up, h, T, up)
		s.be.Parallel(T, s.steps.swiGLU)
		s.be.MatMul(L.Down, gate, T, out)
	}
	if L.PostFFNNorm != nil {
		s.norm = L.PostFFNNorm
		s.be.Parallel(T, s.steps.postNorm)
	}
	addTo(x, out)
}

// head applies the final norm and the output head to the last token of each
// row that asks for logits.
func (s *Stage) head(rows []Row, T int) []float32 {
	m := s.m
	E := m.Embd
	n := 0
	for i := range rows {
		if rows[i].Logits {
			n++
		}
	}
	if n == 0 {
		return s.logits[:0]
	}
	if cap(s.logitsIn) < n*E {
		s.logitsIn = make([]float32, n*E)
	}
	if cap(s.logits) < n*m.Vocab {
		s.logits = make([]float32, n*m.Vocab)
	}
	in, logits := s.logitsIn[:n*E], s.logits[:n*m.Vocab]
	t, j := 0, 0
	for i := range rows {
		t += len(rows[i].Tokens)
		if rows[i].Logits {
			rmsNorm(in[j*E:(j+1)*E], s.x[(t-1)*E:t*E], m.OutputNorm, m.NormEps)
			j++
		}
	}
	s.be.MatMul(m.Output, in, n, logits)
	if m.LogitSoftCap > 0 {
		s.softCapLogits = logits
		s.be.Parallel((len(logits)+softCapChunk-1)/softCapChunk, s.steps.softCap)
		s.softCapLogits = nil
	}
	return logits
}

// softCapChunk is the logits one softCap step caps.
const softCapChunk = 4096

func (s *Stage) softCapToken(_, i int) {
	x := s.softCapLogits[i*softCapChunk : min((i+1)*softCapChunk, len(s.softCapLogits))]
	softCap(x, s.m.LogitSoftCap)
}

// rmsNorm sets dst = x / sqrt(mean(x²) + eps) * w, computing as ggml's
// rms_norm does: squares rounded to float32 and summed in float64, the mean
// rounded to float32 before eps is added in float32, then 1/sqrtf.
func rmsNorm(dst, x, w []float32, eps float32) {
	var sum float64
	for _, v := range x {
		sum += float64(v * v)
	}
	mean := float32(sum / float64(len(x)))
	scale := 1 / float32(math.Sqrt(float64(mean+eps)))
	for i, v := range x {
		dst[i] = (v * scale) * w[i]
	}
}

func addTo(dst, src []float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] += src[i]
	}
}

// RoPE as ggml's rope computes it: theta advanced by repeated multiplication
// in float32, divided by the pair's frequency factor when the model has
// them, positions divided by the linear scale, cosine and sine the C
// library's (cosf, sinf: glibc's, bit for bit) multiplied by the attention
// factor. Forward computes each token's angles once
// (RopeAngles) for every layer and for q and k; ropeRotate applies them.

// RopeAngles sets cache[i], cache[i+1] to the cosine and sine of pair i/2's
// angle at position pos, for the len(cache) rotated dimensions. factors is
// nil or holds len(cache)/2 divisors; mscale multiplies both. The GPU
// backend rotates by the same angles (model/cuda).
func RopeAngles(cache []float32, pos int, base, scale float32, factors []float32, mscale float32) {
	dims := len(cache)
	thetaScale := float32(math.Pow(float64(base), float64(-2/float32(dims))))
	freqScale := 1 / scale
	theta := float32(pos)
	for i := 0; i < dims; i += 2 {
		th := theta
		if factors != nil {
			th /= factors[i/2]
		}
		th *= freqScale
		cache[i] = cosf(th) * mscale
		cache[i+1] = sinf(th) * mscale
		theta *= thetaScale
	}
}

// ropeRotate rotates the first len(cache) dimensions of each of n heads of
// width hd by the angles in cache (see RopeAngles). Each pair is
// (fma(x0, c, -(x1*s)), fma(x0, s, x1*c)): ggml writes x0*c - x1*s and
// x0*s + x1*c, and GCC contracts the first product of each into an FMA
// (checked bit for bit against llama.cpp's ROPE output).
func ropeRotate(x []float32, n, hd int, cache []float32, style RopeStyle) {
	dims := len(cache)
	for h := 0; h < n; h++ {
		v := x[h*hd : (h+1)*hd]
		for i := 0; i < dims; i += 2 {
			c, s := cache[i], cache[i+1]
			a, b := i, i+1
			if style == RopeNeoX {
				a, b = i/2, i/2+dims/2
			}
			x0, x1 := v[a], v[b]
			v[a] = ggml.FMA32(x0, c, -(x1 * s))
			v[b] = ggml.FMA32(x0, s, x1*c)
		}
	}
}

// Range returns the stage's layers [first, last).
func (s *Stage) Range() (first, last int) { return s.first, s.last }
