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
	act  []byte // activations converted to a weight's dot-product type
}

// NewBackend returns a Backend that runs its work on pool.
func NewBackend(pool *Pool) *Backend { return &Backend{pool: pool} }

// Workers implements model.Backend.
func (b *Backend) Workers() int { return b.pool.Workers() }

// Parallel implements model.Backend.
func (b *Backend) Parallel(n int, fn func(worker, i int)) { b.pool.Parallel(n, fn) }

// outputTile is the number of weight rows one work item computes: enough to
// amortise scheduling, few enough to balance two to sixteen workers.
const outputTile = 16

// MatMul implements model.Backend. Each activation row is converted once to
// the weight's dot-product type; then the workers share out tiles of weight
// rows, each computing its rows against every activation row.
func (b *Backend) MatMul(w *model.Weight, x []float32, rows int, out []float32) {
	dot, err := VecDotFor(w.Type)
	if err != nil {
		panic(fmt.Sprintf("cpu: %s: %v", w.Name, err)) // model.Load admits only types with a VecDot
	}
	K := w.Cols
	if len(x) < rows*K || len(out) < rows*w.Rows {
		panic(fmt.Sprintf("cpu: MatMul %s: %d activations, %d outputs for %d rows of %d→%d", w.Name, len(x), len(out), rows, K, w.Rows))
	}
	vt := w.Type.VecDotType()
	var xb []byte
	var stride int
	if vt == ggml.F32 {
		xb = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), len(x)*4)
		stride = K * 4
	} else {
		rb, err := vt.RowBytes(K)
		if err != nil {
			panic(fmt.Sprintf("cpu: %s: %v", w.Name, err))
		}
		stride = rb
		if cap(b.act) < rows*rb {
			b.act = make([]byte, rows*rb)
		}
		xb = b.act[:rows*rb]
		b.pool.Parallel(rows, func(_, r int) {
			ConvertActivation(w.Type, x[r*K:(r+1)*K], xb[r*rb:(r+1)*rb])
		})
	}
	wrow := len(w.Data) / w.Rows
	N := w.Rows
	tiles := (N + outputTile - 1) / outputTile
	b.pool.Parallel(tiles, func(_, tile int) {
		lo, hi := tile*outputTile, min((tile+1)*outputTile, N)
		for o := lo; o < hi; o++ {
			wr := w.Data[o*wrow : (o+1)*wrow]
			for r := 0; r < rows; r++ {
				out[r*N+o] = dot(K, wr, xb[r*stride:(r+1)*stride])
			}
		}
	})
}
