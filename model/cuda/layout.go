package cuda

import (
	"fmt"
	"math"

	"github.com/strata-llm/strata/model"
)

// KVLayout is the device KV pool's shape: per layer, K and V each hold
// [block][KV head][position in block][HeadDim] f16 values — the CPU
// backend's layout (model/cpu KV), so the same block IDs name the same
// positions on either device.
type KVLayout struct {
	Layers, Blocks, BlockSize, HeadsKV, HeadDim int
}

// LayerElems is the f16 values of one layer's K (or V).
func (l KVLayout) LayerElems() int64 {
	return int64(l.Blocks) * int64(l.BlockSize) * int64(l.HeadsKV) * int64(l.HeadDim)
}

// Bytes is the whole pool's memory: K and V of every layer.
func (l KVLayout) Bytes() int64 { return 2 * int64(l.Layers) * l.LayerElems() * 2 }

// Validate checks the layout's fields (the kernels' offsets are 64-bit; the
// block IDs of the tables are int32).
func (l KVLayout) Validate() error {
	switch {
	case l.Layers <= 0 || l.Blocks <= 0 || l.BlockSize <= 0 || l.HeadsKV <= 0 || l.HeadDim <= 0:
		return fmt.Errorf("cuda: KV layout needs positive sizes, got %+v", l)
	case int64(l.Blocks) > math.MaxInt32:
		return fmt.Errorf("cuda: KV pool of %d blocks, more than the tables' int32 block IDs", l.Blocks)
	}
	return nil
}

// Slot is the offset, in f16 values within a layer, of KV head 0 at
// position pos of a sequence with block table blocks: what kernels.cu's
// kv_store and attend compute on the device.
func (l KVLayout) Slot(blocks []int32, pos int) int64 {
	b := int64(blocks[pos/l.BlockSize])
	return (b*int64(l.HeadsKV)*int64(l.BlockSize) + int64(pos%l.BlockSize)) * int64(l.HeadDim)
}

// batchMeta is the host side of one batch for the kernels: per token its
// ID, position and the offset of its row's block table in tables
// (each row's table once, covering the row's positions); per logits row
// the index of its last token.
type batchMeta struct {
	tok, pos, tbl []int32
	tables        []int32
	logitRows     []int32
}

// checkBatch validates rows against the stage (model.Stage's rules, the
// same messages) and returns the token count.
func checkBatch(m *model.Model, first bool, blocks, bs int, rows []model.Row, in []float32) (int, error) {
	T := 0
	for i := range rows {
		r := &rows[i]
		if len(r.Tokens) == 0 {
			return 0, fmt.Errorf("%w: row %d (sequence %d) has no tokens", model.ErrBadBatch, i, r.Seq)
		}
		if r.Pos < 0 || r.First != (r.Pos == 0) {
			return 0, fmt.Errorf("%w: row %d (sequence %d) has position %d with first=%v", model.ErrBadBatch, i, r.Seq, r.Pos, r.First)
		}
		end := r.Pos + len(r.Tokens)
		if end > len(r.Blocks)*bs {
			return 0, fmt.Errorf("%w: row %d (sequence %d) reaches position %d but its %d blocks hold %d", model.ErrBadBatch, i, r.Seq, end-1, len(r.Blocks), len(r.Blocks)*bs)
		}
		for j, b := range r.Blocks[:(end+bs-1)/bs] {
			if b < 0 || int(b) >= blocks {
				return 0, fmt.Errorf("%w: row %d (sequence %d) block %d is %d, pool has %d", model.ErrBadBatch, i, r.Seq, j, b, blocks)
			}
		}
		if first {
			for _, tok := range r.Tokens {
				if tok < 0 || int(tok) >= m.Vocab {
					return 0, fmt.Errorf("%w: row %d (sequence %d) token %d outside vocabulary of %d", model.ErrBadBatch, i, r.Seq, tok, m.Vocab)
				}
			}
		}
		T += len(r.Tokens)
	}
	if !first && len(in) != T*m.Embd {
		return 0, fmt.Errorf("%w: %d hidden values for %d tokens of width %d", model.ErrBadBatch, len(in), T, m.Embd)
	}
	return T, nil
}

// fill sets meta for a checked batch.
func (meta *batchMeta) fill(l KVLayout, rows []model.Row) {
	meta.tok, meta.pos, meta.tbl = meta.tok[:0], meta.pos[:0], meta.tbl[:0]
	meta.tables, meta.logitRows = meta.tables[:0], meta.logitRows[:0]
	t := 0
	for i := range rows {
		r := &rows[i]
		end := r.Pos + len(r.Tokens)
		off := int32(len(meta.tables))
		meta.tables = append(meta.tables, r.Blocks[:(end+l.BlockSize-1)/l.BlockSize]...)
		for j, tok := range r.Tokens {
			p := r.Pos + j
			meta.tok = append(meta.tok, tok)
			meta.pos = append(meta.pos, int32(p))
			meta.tbl = append(meta.tbl, off)
		}
		t += len(r.Tokens)
		if r.Logits {
			meta.logitRows = append(meta.logitRows, int32(t-1))
		}
	}
}
