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

// Attend implements model.KV. For each head, the query is converted to the
// storage type (as ggml converts it for its f16 dot product), scored against
// keys 0..pos in position order, softmaxed in float32 with the maximum
// subtracted, and the values are summed in position order. The order depends
// only on pos, never on the batch.
func (c *KV) Attend(layer int, blocks []int32, pos int, q, out, scratch []float32) {
	cfg := c.cfg
	hd := cfg.HeadDim
	group := cfg.Heads / cfg.HeadsKV
	esz := cfg.Type.TypeSize()
	var qbuf [1024 * 4]byte
	qb := qbuf[:hd*esz]
	scores := scratch[:pos+1]
	for h := 0; h < cfg.Heads; h++ {
		kvh := h / group
		qh := q[h*hd : (h+1)*hd]
		if cfg.Type == ggml.F32 {
			copy(unsafe.Slice((*float32)(unsafe.Pointer(&qb[0])), hd), qh)
		} else {
			qs := unsafe.Slice((*uint16)(unsafe.Pointer(&qb[0])), hd)
			for i, x := range qh {
				qs[i] = ggml.F32ToF16(x)
			}
		}
		hoff := kvh * hd * esz
		maxs := float32(math.Inf(-1))
		for j := 0; j <= pos; j++ {
			off := c.offset(layer, blocks, j) + hoff
			s := c.dot(hd, c.k[off:off+hd*esz], qb) * c.scale
			scores[j] = s
			maxs = max(maxs, s)
		}
		var sum float32
		for j, s := range scores {
			e := float32(math.Exp(float64(s - maxs)))
			scores[j] = e
			sum += e
		}
		o := out[h*hd : (h+1)*hd]
		clear(o)
		for j, e := range scores {
			off := c.offset(layer, blocks, j) + hoff
			c.axpy(o, e, c.v[off:off+hd*esz])
		}
		inv := 1 / sum
		for i := range o {
			o[i] *= inv
		}
	}
}

// axpy adds a times the stored vector src to o.
func (c *KV) axpy(o []float32, a float32, src []byte) {
	n := len(o)
	if c.cfg.Type == ggml.F32 {
		s := unsafe.Slice((*float32)(unsafe.Pointer(&src[0])), n)
		for i := range o {
			o[i] += a * s[i]
		}
		return
	}
	s := unsafe.Slice((*uint16)(unsafe.Pointer(&src[0])), n)
	for i := range o {
		o[i] += a * ggml.F16ToF32(s[i])
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
