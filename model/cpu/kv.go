package cpu

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

var _ model.KV = (*KV)(nil)

// DefaultBlockSize is the positions per KV block: small enough that a short
// sequence wastes little, large enough that a block table stays short.
const DefaultBlockSize = 16

// KVConfig sizes a KV pool.
type KVConfig struct {
	Layers    int       // layers of the stage
	Blocks    int       // blocks in the pool
	BlockSize int       // positions per block (DefaultBlockSize when 0)
	Heads     int       // query heads
	HeadsKV   int       // key/value heads
	HeadDim   int       // dimensions per head
	Type      ggml.Type // storage type: ggml.F16 (f16 halves the memory of f32) or ggml.F32
}

// ErrKVConfig wraps every invalid KVConfig.
var ErrKVConfig = errors.New("cpu: bad KV config")

// Validate names the first field that is out of range.
func (c KVConfig) Validate() error {
	switch {
	case c.Layers <= 0:
		return fmt.Errorf("%w: Layers must be > 0, got %d", ErrKVConfig, c.Layers)
	case c.Blocks <= 0:
		return fmt.Errorf("%w: Blocks must be > 0, got %d", ErrKVConfig, c.Blocks)
	case c.BlockSize <= 0:
		return fmt.Errorf("%w: BlockSize must be > 0, got %d", ErrKVConfig, c.BlockSize)
	case c.HeadsKV <= 0 || c.Heads <= 0 || c.Heads%c.HeadsKV != 0:
		return fmt.Errorf("%w: Heads %d must be a positive multiple of HeadsKV %d", ErrKVConfig, c.Heads, c.HeadsKV)
	case c.HeadDim <= 0 || c.HeadDim > 1024:
		return fmt.Errorf("%w: HeadDim must be in 1..1024, got %d", ErrKVConfig, c.HeadDim)
	case c.Type != ggml.F16 && c.Type != ggml.F32:
		return fmt.Errorf("%w: Type must be F16 or F32, got %v", ErrKVConfig, c.Type)
	}
	return nil
}

// KVBytes is the memory a pool of cfg takes.
func KVBytes(cfg KVConfig) int64 {
	return 2 * int64(cfg.Layers) * int64(cfg.Blocks) * int64(cfg.BlockSize) * int64(cfg.HeadsKV*cfg.HeadDim) * int64(cfg.Type.TypeSize())
}

// KV is a physical pool of key/value blocks for the layers of one stage,
// allocated at start. It stores, it does not allocate: block IDs come from
// the coordinator's allocator through the rows of each batch.
type KV struct {
	cfg   KVConfig
	kvDim int
	row   int    // bytes per position per layer (keys or values)
	k, v  []byte // [layer][block][position][kvDim]
	dot   VecDot
	scale float32
}

// NewKV allocates a pool. A zero BlockSize means DefaultBlockSize.
func NewKV(cfg KVConfig) (*KV, error) {
	if cfg.BlockSize == 0 {
		cfg.BlockSize = DefaultBlockSize
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	kvDim := cfg.HeadsKV * cfg.HeadDim
	row := kvDim * cfg.Type.TypeSize()
	n := KVBytes(cfg) / 2
	dot, err := VecDotFor(cfg.Type)
	if err != nil {
		return nil, err
	}
	return &KV{
		cfg: cfg, kvDim: kvDim, row: row,
		k: make([]byte, n), v: make([]byte, n),
		dot:   dot,
		scale: 1 / float32(math.Sqrt(float64(cfg.HeadDim))),
	}, nil
}

// BlockSize implements model.KV.
func (c *KV) BlockSize() int { return c.cfg.BlockSize }

// Blocks implements model.KV.
func (c *KV) Blocks() int { return c.cfg.Blocks }

// Config returns the pool's configuration.
func (c *KV) Config() KVConfig { return c.cfg }

// offset is the byte offset of (layer, position) through a block table.
func (c *KV) offset(layer int, blocks []int32, pos int) int {
	bs := c.cfg.BlockSize
	b := int(blocks[pos/bs])
	return ((layer*c.cfg.Blocks+b)*bs + pos%bs) * c.row
}

// Store implements model.KV: it converts k and v to the storage type.
func (c *KV) Store(layer int, blocks []int32, pos int, k, v []float32) {
	off := c.offset(layer, blocks, pos)
	c.put(c.k[off:off+c.row], k)
	c.put(c.v[off:off+c.row], v)
}

func (c *KV) put(dst []byte, src []float32) {
	src = src[:c.kvDim]
	if c.cfg.Type == ggml.F32 {
		copy(unsafe.Slice((*float32)(unsafe.Pointer(&dst[0])), c.kvDim), src)
		return
	}
	h := unsafe.Slice((*uint16)(unsafe.Pointer(&dst[0])), c.kvDim)
	for i, x := range src {
		h[i] = ggml.F32ToF16(x)
	}
}

// Attend implements model.KV, with the numerics of ggml's CPU flash
// attention, so that greedy output follows llama.cpp's on the same file:
//
//   - the query is converted to the storage type (f16 by default) and each
//     key j = 0..pos is scored with the storage type's VecDot, times
//     1/sqrt(HeadDim);
//   - the softmax is online, in position order: a running maximum M, a
//     running sum S = S*ms + vs (one rounding), and a value accumulator held
//     in the storage type. A score above M rescales the accumulator by
//     ms = exp(Mold - M); otherwise vs = exp(s - M). Then
//     acc = round(fma(v_j, vs, acc)) element by element;
//   - out = acc / S.
//
// Everything depends only on pos and the stored keys and values, never on
// the batch, the chunking or the thread count.
func (c *KV) Attend(layer int, blocks []int32, pos int, q, out, scratch []float32) {
	cfg := c.cfg
	hd := cfg.HeadDim
	bs := cfg.BlockSize
	group := cfg.Heads / cfg.HeadsKV
	esz := cfg.Type.TypeSize()
	n := pos + 1
	scores := scratch[:n]
	ts := tilesFor(cfg.Type)
	for h := 0; h < cfg.Heads; h++ {
		kvh := h / group
		qh := q[h*hd : (h+1)*hd]
		o := out[h*hd : (h+1)*hd]
		// The converted query lives in o until the values are summed there:
		// a stack buffer would escape through the kernel calls.
		qb := unsafe.Slice((*byte)(unsafe.Pointer(&o[0])), hd*esz)
		if cfg.Type == ggml.F32 {
			copy(unsafe.Slice((*float32)(unsafe.Pointer(&qb[0])), hd), qh)
		} else {
			qs := unsafe.Slice((*uint16)(unsafe.Pointer(&qb[0])), hd)
			for i, x := range qh {
				qs[i] = ggml.F32ToF16(x)
			}
		}
		hoff := kvh * hd * esz
		for j0 := 0; j0 < n; j0 += bs {
			m := min(bs, n-j0)
			off := c.offset(layer, blocks, j0) + hoff
			keys := c.k[off : off+(m-1)*c.row+hd*esz]
			sc := scores[j0 : j0+m]
			if ts != nil {
				for r := 0; r < m; r += ts.maxR {
					R := min(ts.maxR, m-r)
					ts.k[R-1][0](hd, &keys[r*c.row], c.row, &qb[0], 0, &sc[r], 4)
				}
			} else {
				for r := range sc {
					sc[r] = c.dot(hd, keys[r*c.row:r*c.row+hd*esz], qb)
				}
			}
			for r := range sc {
				sc[r] *= c.scale
			}
		}
		if cfg.Type == ggml.F32 {
			c.softmaxValuesF32(layer, blocks, hoff, scores, o)
		} else {
			c.softmaxValuesF16(layer, blocks, hoff, scores, o)
		}
	}
}

// softmaxValuesF16 is Attend's online softmax with an f16 accumulator (a
// stack array for head dims up to 256, the heap above), as ggml's flash
// attention accumulates values it reads in f16.
func (c *KV) softmaxValuesF16(layer int, blocks []int32, hoff int, scores, o []float32) {
	hd := len(o)
	var buf [256]uint16
	acc := buf[:0]
	if hd <= len(buf) {
		acc = buf[:hd]
	} else {
		acc = make([]uint16, hd)
	}
	clear(acc)
	t := f16Table
	M := float32(math.Inf(-1))
	var S float32
	for j, s := range scores {
		ms, vs := float32(1), float32(1)
		if s > M {
			ms = expf(M - s)
			M = s
			for i, a := range acc {
				acc[i] = ggml.F32ToF16(float32(t[a] * ms))
			}
		} else {
			vs = expf(s - M)
		}
		off := c.offset(layer, blocks, j) + hoff
		v := unsafe.Slice((*uint16)(unsafe.Pointer(&c.v[off])), hd)
		for i, a := range acc {
			acc[i] = ggml.F32ToF16(fma32(t[v[i]], vs, t[a]))
		}
		S = fma32(S, ms, vs)
	}
	inv := 1 / S
	for i, a := range acc {
		o[i] = t[a] * inv
	}
}

// softmaxValuesF32 is Attend's online softmax with a float32 accumulator (an
// f32 cache), as ggml accumulates values it reads in f32.
func (c *KV) softmaxValuesF32(layer int, blocks []int32, hoff int, scores, o []float32) {
	hd := len(o)
	clear(o)
	M := float32(math.Inf(-1))
	var S float32
	for j, s := range scores {
		ms, vs := float32(1), float32(1)
		if s > M {
			ms = expf(M - s)
			M = s
			for i := range o {
				o[i] = float32(o[i] * ms)
			}
		} else {
			vs = expf(s - M)
		}
		off := c.offset(layer, blocks, j) + hoff
		v := unsafe.Slice((*float32)(unsafe.Pointer(&c.v[off])), hd)
		for i := range o {
			o[i] = fma32(v[i], vs, o[i])
		}
		S = fma32(S, ms, vs)
	}
	inv := 1 / S
	for i := range o {
		o[i] *= inv
	}
}

// Read copies position pos's stored keys and values of layer into k and v as
// float32; tests use it to compare caches.
func (c *KV) Read(layer int, blocks []int32, pos int, k, v []float32) {
	off := c.offset(layer, blocks, pos)
	for _, p := range []struct {
		src []byte
		dst []float32
	}{{c.k[off : off+c.row], k}, {c.v[off : off+c.row], v}} {
		if err := ggml.DequantizeRow(c.cfg.Type, p.src, p.dst[:c.kvDim]); err != nil {
			panic(err)
		}
	}
}
