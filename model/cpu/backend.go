package cpu

import (
	"fmt"
	"unsafe"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

var _ model.Backend = (*Backend)(nil)

// Backend runs one stage's matrix products on a shared Pool.
type Backend struct {
	pool *Pool
	act  []byte   // activations converted to a weight's dot-product type
	qrow [][]byte // per worker: one Q8_0 row on its way to the expanded layout

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
	expand bool // activation rows in the X kernels' expanded layout
}

// NewBackend returns a Backend that runs its work on pool.
func NewBackend(pool *Pool) *Backend {
	b := &Backend{pool: pool}
	if pool != nil {
		b.qrow = make([][]byte, pool.Workers())
	}
	b.convFn = b.convertRow
	b.tileFn = b.runTile
	return b
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
	*j = matJob{w: w, x: x, rows: rows, out: out, dot: dot, ts: tilesFor(w.Type), wrow: len(w.Data) / w.Rows}
	vt := w.Type.VecDotType()
	if vt == ggml.F32 {
		j.xb = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), rows*K*4)
		j.stride = K * 4
	} else {
		rb, err := vt.RowBytes(K)
		if err != nil {
			panic(fmt.Sprintf("cpu: %s: %v", w.Name, err))
		}
		if xts := xTilesFor(w.Type); xts != nil && vt == ggml.Q8_0 {
			j.ts, j.expand = xts, true
			rb = (K/ggml.QK + 1) / 2 * xPair
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
	if !j.expand {
		convertActivation(j.w.Type, j.x[r*K:(r+1)*K], dst)
		return
	}
	nb := K / ggml.QK
	if cap(b.qrow[worker]) < nb*q80Bytes {
		b.qrow[worker] = make([]byte, nb*q80Bytes)
	}
	q := b.qrow[worker][:nb*q80Bytes]
	convertActivation(j.w.Type, j.x[r*K:(r+1)*K], q)
	expandQ8X(j.w.Type, nb, q, dst)
}

// runTile computes weight rows [tile*j.tile, …) against every activation
// row: activation rows in groups of up to maxC, and for each group the
// item's weight rows in groups of up to maxR, so the item's weights stay in
// cache while the activations stream.
func (b *Backend) runTile(_, tile int) {
	j := &b.job
	N, K := j.w.Rows, j.w.Cols
	lo, hi := tile*j.tile, min((tile+1)*j.tile, N)
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
	for c0 := 0; c0 < j.rows; c0 += ts.maxC {
		C := min(ts.maxC, j.rows-c0)
		for o := lo; o < hi; o += ts.maxR {
			R := min(ts.maxR, hi-o)
			ts.k[R-1][C-1](n, &data[o*j.wrow], j.wrow, &j.xb[c0*j.stride], j.stride, &j.out[c0*N+o], 4*N)
		}
	}
}
