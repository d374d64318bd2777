package cpu

import (
	"fmt"
	"unsafe"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

var _ model.Backend = (*Backend)(nil)

// Backend runs one stage's matrix products on a shared Pool.
type Backend struct {
	pool *Pool
	act  []byte      // activations converted to a weight's dot-product type
	qrow [][]byte    // per worker: one Q8_0 row on its way to the expanded layout
	tail [][]float32 // per worker: the outputs of a panel past the last row
	amx  [][]byte    // per worker: an AMX kernel's scratch (amxFunc), made on first use

	// packed holds the repacked copy of every matrix the panel kernels
	// read (see repack.go), made by Prepare or the first MatMul, with the
	// kernels it was made for.
	packed map[*model.Weight]packing

	// The MatMul in progress, read by convFn and tileFn; method values made
	// once so that a MatMul allocates nothing.
	job            matJob
	convFn, tileFn func(worker, i int)
}

// matJob is one MatMul's operands.
type matJob struct {
	w      *model.Weight
	x      []float32
	xb     []byte // activation rows, stride bytes apart
	stride int
	rows   int
	out    []float32
	wrow   int // bytes per weight row
	tile   int // weight rows per work item
	ts     *tileSet
	dot    VecDot
	ps     *panelSet // panel kernels over packed, activations expanded
	packed []byte
}

// NewBackend returns a Backend that runs its work on pool.
func NewBackend(pool *Pool) *Backend {
	b := &Backend{pool: pool, packed: map[*model.Weight]packing{}}
	if pool != nil {
		b.qrow = make([][]byte, pool.Workers())
		b.tail = make([][]float32, pool.Workers())
		for i := range b.tail {
			b.tail[i] = make([]float32, panelRows*max(maxPanelC, amxRows))
		}
		b.amx = make([][]byte, pool.Workers())
	}
	b.convFn = b.convertRow
	b.tileFn = b.runTile
	return b
}

// Prepare repacks w for the panel kernels when this CPU has them for its
// type, so that the first MatMul need not. The copy lives as long as the
// Backend. When w.Data is a view of a file mapping (gguf.Open), its pages
// are then released (gguf.Release), so that the process keeps one copy of
// the matrix resident, not two; the stored matrix still reads the same
// bytes, from the file, where something reads it again (embeddings of a
// model whose output matrix is its token embedding, another Backend's
// repacking).
func (b *Backend) Prepare(w *model.Weight) { b.packedFor(w) }

// packing is a matrix repacked for a set of panel kernels: their layout
// can differ by ISA (panelSet.planes), so the two stay together.
type packing struct {
	ps   *panelSet
	data []byte
}

func (b *Backend) packedFor(w *model.Weight) packing {
	ps := panelsFor(w.Type)
	if ps == nil || w.Rows == 0 || w.Cols == 0 {
		return packing{}
	}
	p, ok := b.packed[w]
	if !ok {
		p = packing{ps, ps.repack(w.Type, w.Rows, w.Cols, w.Data)}
		b.packed[w] = p
		gguf.Release(w.Data)
	}
	return p
}

// Workers implements model.Backend.
func (b *Backend) Workers() int { return b.pool.Workers() }

// Parallel implements model.Backend.
func (b *Backend) Parallel(n int, fn func(worker, i int)) { b.pool.Parallel(n, fn) }

// Weight rows per work item: a decode step (few activation rows) streams
// the weights, and small items balance the workers; a prefill reuses each
// weight row for every activation row, and larger items read the
// activations from cache fewer times.
const (
	outputTile      = 16
	outputTileBatch = 64
)

// MatMul implements model.Backend. Each activation row is converted once to
// the weight's dot-product type; then the workers share out tiles of weight
// rows, each computing its rows against every activation row with the tile
// kernels (R weight rows × C activation rows per call). Every output is one
// dot product whose order depends only on w.Cols, so neither the tiling nor
// the thread count changes a bit.
func (b *Backend) MatMul(w *model.Weight, x []float32, rows int, out []float32) {
	dot, err := VecDotFor(w.Type)
	if err != nil {
		panic(fmt.Sprintf("cpu: %s: %v", w.Name, err)) // model.Load admits only types with a VecDot
	}
	K := w.Cols
	if len(x) < rows*K || len(out) < rows*w.Rows {
		panic(fmt.Sprintf("cpu: MatMul %s: %d activations, %d outputs for %d rows of %d→%d", w.Name, len(x), len(out), rows, K, w.Rows))
	}
	if rows <= 0 || w.Rows == 0 {
		return
	}
	j := &b.job
	*j = matJob{w: w, x: x, rows: rows, out: out, dot: dot, ts: matTilesFor(w.Type), wrow: len(w.Data) / w.Rows}
	if p := b.packedFor(w); p.ps != nil {
		j.ps, j.packed, j.ts = p.ps, p.data, nil
	}
	vt := w.Type.VecDotType()
	if j.ts != nil && j.ts.f32x {
		if cap(b.act) < rows*K*4 {
			b.act = make([]byte, rows*K*4)
		}
		j.xb = b.act[:rows*K*4]
		j.stride = K * 4
		b.pool.Parallel(rows, b.convFn)
	} else if vt == ggml.F32 {
		j.xb = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), rows*K*4)
		j.stride = K * 4
	} else {
		rb, err := vt.RowBytes(K)
		if err != nil {
			panic(fmt.Sprintf("cpu: %s: %v", w.Name, err))
		}
		if j.ps != nil {
			rb = K / panelBlock(w.Type) * expandedBlockBytes(w.Type)
		}
		j.stride = rb
		if cap(b.act) < rows*rb {
			b.act = make([]byte, rows*rb)
		}
		j.xb = b.act[:rows*rb]
		b.pool.Parallel(rows, b.convFn)
	}
	j.tile = outputTile
	if rows > 4 {
		j.tile = outputTileBatch
	}
	b.pool.Parallel((w.Rows+j.tile-1)/j.tile, b.tileFn)
	*j = matJob{}
}

func (b *Backend) convertRow(worker, r int) {
	j := &b.job
	K := j.w.Cols
	dst := j.xb[r*j.stride : (r+1)*j.stride]
	if j.ts != nil && j.ts.f32x {
		if K > 0 {
			j.ts.round(K, &j.x[r*K], (*float32)(unsafe.Pointer(unsafe.SliceData(dst))))
		}
		return
	}
	if j.ps == nil {
		convertActivation(j.w.Type, j.x[r*K:(r+1)*K], dst)
		return
	}
	nb := K / panelBlock(j.w.Type)
	qb := nb * j.w.Type.VecDotType().TypeSize()
	if cap(b.qrow[worker]) < qb {
		b.qrow[worker] = make([]byte, qb)
	}
	q := b.qrow[worker][:qb]
	if isKPanel(j.w.Type) {
		quantExpandK(j.x[r*K:(r+1)*K], dst, q)
		return
	}
	convertActivation(j.w.Type, j.x[r*K:(r+1)*K], q)
	expandRow(j.w.Type, nb, q, dst)
}

// runTile computes weight rows [tile*j.tile, …) against every activation
// row: activation rows in groups of up to maxC, and for each group the
// item's weight rows in groups of up to maxR, so the item's weights stay in
// cache while the activations stream.
func (b *Backend) runTile(worker, tile int) {
	j := &b.job
	N, K := j.w.Rows, j.w.Cols
	lo, hi := tile*j.tile, min((tile+1)*j.tile, N)
	if j.ps != nil {
		b.runPanels(worker, lo, hi)
		return
	}
	data := j.w.Data
	ts := j.ts
	if ts == nil {
		for o := lo; o < hi; o++ {
			wr := data[o*j.wrow : (o+1)*j.wrow]
			for r := 0; r < j.rows; r++ {
				j.out[r*N+o] = j.dot(K, wr, j.xb[r*j.stride:(r+1)*j.stride])
			}
		}
		return
	}
	n := K / ts.unit
	_ = data[hi*j.wrow-1]
	_ = j.xb[j.rows*j.stride-1]
	_ = j.out[(j.rows-1)*N+hi-1]
	// A matrix-vector product (one activation row) runs one weight row a
	// tile: one sequential stream, which the hardware prefetcher follows
	// better than maxR interleaved ones (see prefetchTile in asmgen); the
	// set's rows kernel runs the item's rows in one call (vec), and where
	// aheadOn the one that prefetches a page ahead of the stream (aheadEnv).
	maxR := ts.maxR
	if j.rows == 1 {
		if k := ts.matVec(); k != nil {
			k(n, &data[lo*j.wrow], j.wrow, &j.xb[0], &j.out[lo], hi-lo)
			return
		}
		maxR = 1
	}
	k := &ts.k
	for c0 := 0; c0 < j.rows; c0 += ts.maxC {
		C := min(ts.maxC, j.rows-c0)
		for o := lo; o < hi; o += maxR {
			R := min(maxR, hi-o)
			k[R-1][C-1](n, &data[o*j.wrow], j.wrow, &j.xb[c0*j.stride], j.stride, &j.out[c0*N+o], 4*N)
		}
	}
}

// amxScratch returns worker's scratch for the AMX kernels on panels of subs
// 32-element sub-blocks: amxScratch(subs) bytes, 64-byte aligned,
// configured (amxConfigure).
func (b *Backend) amxScratch(worker, subs int) *byte {
	if n := amxScratch(subs); len(b.amx[worker]) < n {
		buf := make([]byte, n+63)
		off := int(-uintptr(unsafe.Pointer(&buf[0])) & 63)
		b.amx[worker] = buf[off : off+n]
		amxConfigure(b.amx[worker])
	}
	return &b.amx[worker][0]
}

// runPanels computes weight rows [lo, hi) (lo a multiple of panelRows)
// against every activation row with the panel kernels: activation rows in
// groups of up to maxPanelC, and for each group the item's panels, so the
// item's weights stay in cache while the activations stream; where the AMX
// kernel runs (amxKernel, amxFrom), every whole group of amxRows rows goes
// to it first, the rest to the VNNI kernels (the same bits). A panel that
// runs past the last row writes to the worker's tail buffer first.
func (b *Backend) runPanels(worker, lo, hi int) {
	j := &b.job
	N, nb := j.w.Rows, j.w.Cols/panelBlock(j.w.Type)
	pb := nb * panelBlockBytes(j.w.Type)
	_ = j.packed[(hi+panelRows-1)/panelRows*pb-1]
	_ = j.xb[j.rows*j.stride-1]
	_ = j.out[(j.rows-1)*N+hi-1]
	tail := b.tail[worker]
	c0 := 0
	if k := j.ps.amxKernel(); k != nil && j.rows >= j.ps.amxFrom() {
		// Every whole group of amxRows activation rows on AMX tiles: the
		// item's whole panels in one call, the last one (past the last
		// row) group by group through the tail buffer.
		scratch := b.amxScratch(worker, j.w.Cols/ggml.QK)
		full := (min(hi, N/panelRows*panelRows) - lo) / panelRows
		ng := j.rows / amxRows
		if full > 0 {
			k(full, nb, &j.packed[lo/panelRows*pb], &j.xb[0], j.stride, ng, &j.out[lo], 4*N, scratch)
		}
		if o := lo + full*panelRows; o < hi {
			for g := range ng {
				k(1, nb, &j.packed[o/panelRows*pb], &j.xb[g*amxRows*j.stride], j.stride, 1, &tail[0], 4*panelRows, scratch)
				for c := range amxRows {
					r := g*amxRows + c
					copy(j.out[r*N+o:(r+1)*N], tail[c*panelRows:c*panelRows+N-o])
				}
			}
		}
		c0 = ng * amxRows
	}
	for ; c0 < j.rows; c0 += maxPanelC {
		C := min(maxPanelC, j.rows-c0)
		k := j.ps.k[C-1]
		if j.rows == 1 && aheadOn && j.ps.ahead != nil {
			k = j.ps.ahead // a matrix-vector product's one stream (aheadEnv)
		}
		for o := lo; o < hi; o += panelRows {
			w := &j.packed[o/panelRows*pb]
			x := &j.xb[c0*j.stride]
			if o+panelRows <= N {
				k(nb, w, x, j.stride, &j.out[c0*N+o], 4*N)
				continue
			}
			k(nb, w, x, j.stride, &tail[0], 4*panelRows)
			for c := range C {
				copy(j.out[(c0+c)*N+o:(c0+c+1)*N], tail[c*panelRows:c*panelRows+N-o])
			}
		}
	}
}
