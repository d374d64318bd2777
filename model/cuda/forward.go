package cuda

import (
	"fmt"
	"unsafe"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// Threads a block for the row-wise kernels and warps a block for the
// matrix products.
const (
	rowThreads = 256
	mmWarps    = 8
)

// Forward runs rows through the stage's layers, as model.Stage.Forward
// does: a first stage embeds the rows' tokens (in is ignored), any other
// takes the previous stage's hidden states; a last stage returns the
// logits of the rows with Logits set, any other the hidden states. The
// returned slice is the Stage's until the next call.
func (s *Stage) Forward(rows []model.Row, in []float32) ([]float32, error) {
	m := s.m
	T, err := checkBatch(m, s.First(), s.kv.Blocks, s.kv.BlockSize, rows, in)
	if err != nil || T == 0 {
		return nil, err
	}
	s.meta.fill(s.kv, rows)
	d := m.RopeDims
	if cap(s.csHost) < T*d {
		s.csHost = make([]float32, T*d)
	}
	s.csHost = s.csHost[:T*d]
	if d > 0 {
		for t, p := range s.meta.pos {
			model.RopeAngles(s.csHost[t*d:(t+1)*d], int(p), m.RopeBase, m.RopeScale, m.RopeFactors, m.RopeAttnFactor)
		}
	}
	var out []float32
	err = s.dev.Ctx.Do(func() error {
		var err error
		out, err = s.forward(T, in)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: forward of %d tokens on layers [%d, %d): %w", T, s.first, s.last, err)
	}
	return out, nil
}

// up uploads host values to p.
func up[T int32 | float32](c *Context, p Ptr, v []T) error {
	if len(v) == 0 {
		return nil
	}
	return c.Upload(p, unsafe.Pointer(&v[0]), len(v)*4)
}

func (s *Stage) forward(T int, in []float32) ([]float32, error) {
	m, c := s.m, s.dev.Ctx
	meta := &s.meta
	if err := s.grow(T, len(meta.tables)); err != nil {
		return nil, err
	}
	E := m.Embd
	for _, u := range []struct {
		p Ptr
		v []int32
	}{{s.dtok, meta.tok}, {s.dpos, meta.pos}, {s.dtbl, meta.tbl}, {s.dtables, meta.tables}, {s.dlrows, meta.logitRows}} {
		if err := up(c, u.p, u.v); err != nil {
			return nil, err
		}
	}
	if err := up(c, s.cs, s.csHost); err != nil {
		return nil, err
	}
	if !s.First() {
		if err := up(c, s.x, in); err != nil {
			return nil, err
		}
	}
	nl := len(meta.logitRows)
	if err := s.run(T, nl); err != nil {
		return nil, err
	}
	var src Ptr
	var n int
	if s.Last() {
		n, src = nl*m.Vocab, s.logits
	} else {
		n, src = T*E, s.x
	}
	if cap(s.outHost) < n {
		s.outHost = make([]float32, n)
	}
	s.outHost = s.outHost[:n]
	if n > 0 {
		if err := c.Download(unsafe.Pointer(&s.outHost[0]), src, n*4); err != nil {
			return nil, err
		}
	}
	if err := s.lastDone.Record(); err != nil {
		return nil, err
	}
	if err := s.lastDone.Wait(); err != nil { // every write of this batch has landed
		return nil, err
	}
	return s.outHost, nil
}

// attendWarps is the warps of one attend block for head width hd and the
// dynamic shared memory it takes (kernels.cu: ATT_FIXED bytes and 32 keys'
// values a warp): the most warps, up to 8, that fit the 48 KiB every device
// offers without an opt-in. It depends only on hd, so that which warp sums
// which keys is the same in every batch.
func attendWarps(hd int) (warps, shared int) {
	const fixed = (256 + 2*8 + 8*256) * 4
	warps = 8
	for warps > 1 && fixed+warps*32*hd*2 > 48<<10 {
		warps /= 2
	}
	return warps, fixed + warps*32*hd*2
}

// maxGraphTokens bounds the batches whose launches are captured into a
// CUDA graph (decode steps and small batches: where launch overhead
// dominates); a graph is kept per (tokens, logits rows).
const maxGraphTokens = 64

type graphKey struct{ tokens, logits int }

// run queues the batch's kernels: replayed from a graph captured for this
// shape when there is one (or made now), else launched one by one. A
// capture that fails turns graphs off for the stage and launches directly.
func (s *Stage) run(T, nl int) error {
	if !s.graphsOn || T > maxGraphTokens {
		return s.launch(T, nl)
	}
	key := graphKey{T, nl}
	if g, ok := s.graphs[key]; ok {
		return g.Launch()
	}
	g, err := s.dev.Ctx.Capture(func() error { return s.launch(T, nl) })
	if err != nil {
		s.graphsOn, s.graphErr = false, err
		return s.launch(T, nl)
	}
	s.graphs[key] = g
	return g.Launch()
}

// dropGraphs forgets every captured graph: the scratch they name moved.
func (s *Stage) dropGraphs() {
	for k, g := range s.graphs {
		g.Destroy()
		delete(s.graphs, k)
	}
}

// launch queues every kernel of the batch: embedding (first stage), the
// layers, and the head (last stage), reading the metadata already
// uploaded. It only launches, so that it can be captured.
func (s *Stage) launch(T, nl int) error {
	m, k := s.m, s.dev.Kernels
	E, QD, KVD, FF := m.Embd, m.QDim(), m.KVDim(), m.FF
	s.conv = convKey{}
	rowGrid := func(n int) [3]uint32 { return [3]uint32{uint32(n), 1, 1} }
	rowBlock := [3]uint32{rowThreads, 1, 1}
	flat := func(n int) ([3]uint32, [3]uint32) {
		return [3]uint32{uint32((n + rowThreads - 1) / rowThreads), 1, 1}, rowBlock
	}
	if s.First() {
		w := s.weights[m.Embed]
		name := map[ggml.Type]string{ggml.F32: "embed_f32", ggml.F16: "embed_f16", ggml.Q8_0: "embed_q8_0"}[w.typ]
		if err := k.Func(name).Launch(rowGrid(T), rowBlock, 0, s.dtok, w.p, s.x, E, m.EmbedScale); err != nil {
			return err
		}
	}
	norm := func(src, rowsSel Ptr, n int, w []float32, dst Ptr) error {
		s.conv = convKey{} // dst changes
		return k.Func("rms_norm").Launch(rowGrid(n), rowBlock, 0, src, rowsSel, s.norms[&w[0]], dst, E, m.NormEps)
	}
	for l := s.first; l < s.last; l++ {
		L := &m.LayerWeights[l]
		ll := l - s.first
		if err := norm(s.x, 0, T, L.AttnNorm, s.h); err != nil {
			return err
		}
		for _, mm := range []struct {
			w   *model.Weight
			out Ptr
		}{{L.Q, s.q}, {L.K, s.kk}, {L.V, s.vv}} {
			if err := s.matmul(s.weights[mm.w], s.h, T, mm.out, false); err != nil {
				return err
			}
		}
		if m.RopeDims > 0 && (m.NoRopeEvery == 0 || (l+1)%m.NoRopeEvery != 0) {
			neox := int32(0)
			if m.Rope == model.RopeNeoX {
				neox = 1
			}
			if err := k.Func("rope").Launch(rowGrid(T), rowBlock, 0, s.q, s.kk, s.cs, m.Heads, m.HeadsKV, m.HeadDim, m.RopeDims, QD, KVD, neox); err != nil {
				return err
			}
		}
		if err := k.Func("kv_store").Launch(rowGrid(T), rowBlock, 0, s.kk, s.vv, s.k[ll], s.v[ll], s.dtables, s.dtbl, s.dpos, m.HeadsKV, m.HeadDim, s.kv.BlockSize); err != nil {
			return err
		}
		s.conv = convKey{}
		nw, shared := attendWarps(m.HeadDim)
		if err := k.Func("attend").Launch([3]uint32{uint32(T), uint32(m.Heads), 1}, [3]uint32{uint32(32 * nw), 1, 1}, uint32(shared),
			s.q, s.k[ll], s.v[ll], s.dtables, s.dtbl, s.dpos, s.att, m.Heads, m.HeadsKV, m.HeadDim, s.kv.BlockSize, s.attnScale); err != nil {
			return err
		}
		if err := s.matmul(s.weights[L.O], s.att, T, s.x, true); err != nil { // x += O·att
			return err
		}
		if err := norm(s.x, 0, T, L.FFNNorm, s.h); err != nil {
			return err
		}
		if err := s.matmul(s.weights[L.Gate], s.h, T, s.gate, false); err != nil {
			return err
		}
		if err := s.matmul(s.weights[L.Up], s.h, T, s.up, false); err != nil {
			return err
		}
		g, b := flat(T * FF)
		s.conv = convKey{}
		if err := k.Func("swiglu").Launch(g, b, 0, s.gate, s.up, T*FF); err != nil {
			return err
		}
		if err := s.matmul(s.weights[L.Down], s.gate, T, s.x, true); err != nil { // x += Down·gate
			return err
		}
	}
	if s.Last() && nl > 0 {
		if err := norm(s.x, s.dlrows, nl, m.OutputNorm, s.logitsIn); err != nil {
			return err
		}
		if err := s.matmul(s.weights[m.Output], s.logitsIn, nl, s.logits, false); err != nil {
			return err
		}
	}
	return nil
}

// matmul launches out[r*N+o] = dot(w row o, x row r) for r < rows (+= with
// accumulate: the residual add, the same bits as adding afterwards) with
// the kernel for w's device type, converting the activations first where
// the type's dot product needs it (f16 for F16, 8-bit blocks for Q8_0).
func (s *Stage) matmul(w *devWeight, x Ptr, rows int, out Ptr, accumulate bool) error {
	acc := int32(0)
	if accumulate {
		acc = 1
	}
	k := s.dev.Kernels
	N, K := w.rows, w.cols
	rb, suffix := 1, "_1"
	if rows > 1 {
		rb, suffix = 8, "_8"
	}
	grid := [3]uint32{uint32((N + mmWarps - 1) / mmWarps), uint32((rows + rb - 1) / rb), 1}
	block := [3]uint32{mmWarps * 32, 1, 1}
	n := rows * K
	flatGrid := [3]uint32{uint32((n + rowThreads - 1) / rowThreads), 1, 1}
	switch w.typ {
	case ggml.F32:
		return k.Func("mm_f32"+suffix).Launch(grid, block, 0, w.p, x, out, N, K, rows, acc)
	case ggml.F16:
		if s.conv == (convKey{x, ggml.F16, n}) {
			return k.Func("mm_f16"+suffix).Launch(grid, block, 0, w.p, s.xh, out, N, K, rows, acc)
		}
		s.conv = convKey{x, ggml.F16, n}
		if err := k.Func("to_f16").Launch(flatGrid, [3]uint32{rowThreads, 1, 1}, 0, x, s.xh, n); err != nil {
			return err
		}
		return k.Func("mm_f16"+suffix).Launch(grid, block, 0, w.p, s.xh, out, N, K, rows, acc)
	case ggml.Q8_0:
		nb := n / 32
		if s.conv == (convKey{x, ggml.Q8_0, n}) {
			return k.Func("mm_q8_0"+suffix).Launch(grid, block, 0, w.p, s.xq, s.xd, out, N, K, rows, acc)
		}
		s.conv = convKey{x, ggml.Q8_0, n}
		if err := k.Func("quant_q8_0").Launch([3]uint32{uint32((nb + mmWarps - 1) / mmWarps), 1, 1}, block, 0, x, s.xq, s.xd, nb); err != nil {
			return err
		}
		return k.Func("mm_q8_0"+suffix).Launch(grid, block, 0, w.p, s.xq, s.xd, out, N, K, rows, acc)
	}
	return fmt.Errorf("%w: weight type %v on the device", ErrUnsupported, w.typ)
}

// convKey names the activations xh or xq/xd hold: those of x (n values)
// converted for typ. Every launch that writes an activation buffer clears
// it, so Q, K and V (and gate and up) convert their shared input once.
type convKey struct {
	x   Ptr
	typ ggml.Type
	n   int
}
