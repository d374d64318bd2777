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
	row   int    // bytes of one KV head at one position: a head's keys are row apart
	hstep int    // bytes between two KV heads' data in a block (BlockSize*row)
	k, v  []byte // [layer][block][KV head][position][HeadDim]
	score VecDot // a key's score: attnDotF16 for f16, else the type's dot
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
	row := cfg.HeadDim * cfg.Type.TypeSize()
	n := KVBytes(cfg) / 2
	dot, err := VecDotFor(cfg.Type)
	if err != nil {
		return nil, err
	}
	if cfg.Type == ggml.F16 {
		dot = attnDotF16
	}
	return &KV{
		cfg: cfg, kvDim: kvDim, row: row, hstep: cfg.BlockSize * row,
		k: make([]byte, n), v: make([]byte, n),
		score: dot,
	}, nil
}

// BlockSize implements model.KV.
func (c *KV) BlockSize() int { return c.cfg.BlockSize }

// Blocks implements model.KV.
func (c *KV) Blocks() int { return c.cfg.Blocks }

// Config returns the pool's configuration.
func (c *KV) Config() KVConfig { return c.cfg }

// offset is the byte offset of (layer, position) of KV head 0 through a
// block table; KV head h's is hstep*h further. A block holds each head's
// positions together, so that attention reads one head's keys and values
// of a block as one contiguous run.
func (c *KV) offset(layer int, blocks []int32, pos int) int {
	bs := c.cfg.BlockSize
	b := int(blocks[pos/bs])
	return (layer*c.cfg.Blocks+b)*bs*c.cfg.HeadsKV*c.row + pos%bs*c.row
}

// Store implements model.KV: it converts k and v to the storage type.
func (c *KV) Store(layer int, blocks []int32, pos int, k, v []float32) {
	off := c.offset(layer, blocks, pos)
	hd := c.cfg.HeadDim
	for h := range c.cfg.HeadsKV {
		o := off + h*c.hstep
		c.put(c.k[o:o+c.row], k[h*hd:(h+1)*hd])
		c.put(c.v[o:o+c.row], v[h*hd:(h+1)*hd])
	}
}

func (c *KV) put(dst []byte, src []float32) {
	n := c.cfg.HeadDim
	src = src[:n]
	if c.cfg.Type == ggml.F32 {
		copy(unsafe.Slice((*float32)(unsafe.Pointer(&dst[0])), n), src)
		return
	}
	f32ToF16(unsafe.Slice((*uint16)(unsafe.Pointer(&dst[0])), n), src)
}

// f32ToF16 sets dst[i] = ggml.F32ToF16(src[i]) (VCVTPS2PH where the CPU has
// it, AVX-512 or F16C: the same bits for every input).
func f32ToF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	if len(src) == 0 {
		return
	}
	if haveElementwise() {
		f32ToF16AVX512(len(src), &src[0], &dst[0])
		return
	}
	n := 0
	if haveElementwiseAVX2() && len(src) >= 8 {
		n = len(src) &^ 7
		f32ToF16AVX2(n, &src[0], &dst[0])
	}
	for i, x := range src[n:] {
		dst[n+i] = ggml.F32ToF16(x)
	}
}

// Attend implements model.KV, with the numerics of ggml's CPU flash
// attention, so that greedy output follows llama.cpp's on the same file:
//
//   - the query is converted to the storage type (f16 by default) and each
//     key j = lo..pos is scored, times scale (1/sqrt(HeadDim), or 1 where
//     the queries carry the scale): f16 keys with attnDotF16 (the order of
//     ggml_vec_dot_f16, which ggml's flash attention calls), f32 ones with
//     the type's VecDot;
//   - the softmax is online, in position order from lo: a running maximum M, a
//     running sum S = S*ms + vs (one rounding), and a value accumulator held
//     in the storage type. A score above M rescales the accumulator by
//     ms = exp(Mold - M); otherwise vs = exp(s - M). Then
//     acc = round(fma(v_j, vs, acc)) element by element;
//   - out = acc / S.
//
// Everything depends only on lo, pos, scale and the keys and values stored
// at lo..pos, never on the batch, the chunking or the thread count; keys
// before lo are not read (a sliding window's start, a function of pos).
func (c *KV) Attend(layer int, blocks []int32, lo, pos, h0, h1 int, scale float32, q, out, scratch []float32) {
	if lo < 0 || lo > pos || h0 < 0 || h0 >= h1 || h1 > c.cfg.Heads {
		panic(fmt.Sprintf("cpu: attention over positions %d..%d, heads %d..%d of %d", lo, pos, h0, h1, c.cfg.Heads))
	}
	if isa := c.attendISA(); isa != attendLoopsPath {
		c.attendSIMD(layer, blocks, lo, pos, h0, h1, scale, 0, q, out, scratch, isa == attendAVX512)
		return
	}
	c.attendPortable(layer, blocks, lo, pos, h0, h1, scale, 0, q, out, scratch)
}

// AttendSoftCap implements model.SoftCapKV: Attend with Gemma 2's attention
// logit soft-capping, each score s = capped*tanh(dot*(scale/capped)) as
// ggml's flash attention computes it (the tanh in float64, rounded). Both
// paths cap each score with the same scalar expression (capScore), so the
// SIMD one equals the portable loops bit for bit as it does without a cap.
func (c *KV) AttendSoftCap(layer int, blocks []int32, lo, pos, h0, h1 int, scale, capped float32, q, out, scratch []float32) {
	if lo < 0 || lo > pos || h0 < 0 || h0 >= h1 || h1 > c.cfg.Heads || !(capped > 0) {
		panic(fmt.Sprintf("cpu: attention over positions %d..%d, heads %d..%d of %d, capped at %g", lo, pos, h0, h1, c.cfg.Heads, capped))
	}
	if isa := c.attendISA(); isa != attendLoopsPath {
		c.attendSIMD(layer, blocks, lo, pos, h0, h1, scale, capped, q, out, scratch, isa == attendAVX512)
		return
	}
	c.attendPortable(layer, blocks, lo, pos, h0, h1, scale, capped, q, out, scratch)
}

// Attention's paths: attendSIMD with the AVX-512 kernels, attendSIMD with
// the AVX2 ones, or the portable loops.
const (
	attendLoopsPath = iota
	attendAVX512
	attendAVX2
)

// attendISA returns the path Attend takes on this CPU: the AVX2 kernels
// need a head dimension that is a multiple of 8 (their narrowest pass).
func (c *KV) attendISA() int {
	switch {
	case haveElementwise():
		return attendAVX512
	case haveElementwiseAVX2() && c.cfg.HeadDim%8 == 0:
		return attendAVX2
	}
	return attendLoopsPath
}

// attendPortable is Attend without the SIMD kernels, its scores soft-capped
// when capped > 0 (AttendSoftCap).
func (c *KV) attendPortable(layer int, blocks []int32, lo, pos, h0, h1 int, scale, capped float32, q, out, scratch []float32) {
	cfg := c.cfg
	hd := cfg.HeadDim
	bs := cfg.BlockSize
	group := cfg.Heads / cfg.HeadsKV
	esz := cfg.Type.TypeSize()
	n := pos + 1
	scores := scratch[:n-lo] // scores[j-lo] is key j's
	ts := tilesFor(cfg.Type)
	if cfg.Type == ggml.F16 {
		ts = nil // the scores take attnDotF16's order, not the matrix kernels'
	}
	for h := h0; h < h1; h++ {
		kvh := h / group
		qh := q[h*hd : (h+1)*hd]
		o := out[h*hd : (h+1)*hd]
		// The converted query lives in o until the values are summed there:
		// a stack buffer would escape through the kernel calls.
		qb := unsafe.Slice((*byte)(unsafe.Pointer(&o[0])), hd*esz)
		if cfg.Type == ggml.F32 {
			copy(unsafe.Slice((*float32)(unsafe.Pointer(&qb[0])), hd), qh)
		} else {
			f32ToF16(unsafe.Slice((*uint16)(unsafe.Pointer(&qb[0])), hd), qh)
		}
		hoff := kvh * c.hstep
		for j0 := lo; j0 < n; j0 += bs - j0%bs { // by block, the first one from lo
			m := min(bs-j0%bs, n-j0)
			off := c.offset(layer, blocks, j0) + hoff
			keys := c.k[off : off+(m-1)*c.row+hd*esz]
			sc := scores[j0-lo : j0-lo+m]
			if ts != nil {
				for r := 0; r < m; r += ts.maxR {
					R := min(ts.maxR, m-r)
					ts.k[R-1][0](hd, &keys[r*c.row], c.row, &qb[0], 0, &sc[r], 4)
				}
			} else {
				avx2 := cfg.Type == ggml.F16 && haveF16C && !portableOnly
				for r := range sc {
					if avx2 && hd%64 == 0 { // attnDotF16's order, eight lanes at a time
						sc[r] = scoreF16AVX2(hd, &keys[r*c.row], &qb[0])
						continue
					}
					if avx2 {
						sc[r] = scoreF16Rest(hd, keys[r*c.row:r*c.row+hd*esz], qb, false)
						continue
					}
					sc[r] = c.score(hd, keys[r*c.row:r*c.row+hd*esz], qb)
				}
			}
			capScores(sc, scale, capped)
		}
		if cfg.Type == ggml.F32 {
			c.softmaxValuesF32(layer, blocks, hoff, lo, scores, o)
		} else {
			c.softmaxValuesF16(layer, blocks, hoff, lo, scores, o)
		}
	}
}

// capScores sets each raw score s of sc to s*scale, or, when capped > 0,
// to capped*tanh(s*(scale/capped)).
func capScores(sc []float32, scale, capped float32) {
	if capped > 0 {
		k := scale / capped
		for r, s := range sc {
			sc[r] = capScore(s, k, capped)
		}
		return
	}
	for r := range sc {
		sc[r] *= scale
	}
}

// capScore is one raw score s soft-capped: capped*tanh(s*k) for k =
// scale/capped, the tanh in float64 and rounded, as ggml computes it.
func capScore(s, k, capped float32) float32 {
	return capped * float32(math.Tanh(float64(s*k)))
}

// softmaxValuesF16 is Attend's online softmax with an f16 accumulator (a
// stack array for head dims up to 256, the heap above), as ggml's flash
// attention accumulates values it reads in f16. scores[i] is key lo+i's.
func (c *KV) softmaxValuesF16(layer int, blocks []int32, hoff, lo int, scores, o []float32) {
	hd := len(o)
	var buf [256]uint16
	var acc []uint16
	if hd <= len(buf) {
		acc = buf[:hd]
	} else {
		acc = make([]uint16, hd)
	}
	clear(acc)
	t := f16Table
	// A CPU with F16C but no AVX-512 (attendSIMD) runs the element loops
	// eight at a time with f16AxpyAVX2 and f16RescaleAVX2: the same bits.
	simd, n8 := haveF16C && !portableOnly && hd >= 8, hd&^7
	M := float32(math.Inf(-1))
	var S float32
	for j, s := range scores {
		ms, vs := float32(1), float32(1)
		if s > M {
			ms = expf(M - s)
			M = s
			k := 0
			if simd {
				f16RescaleAVX2(n8, &acc[0], ms)
				k = n8
			}
			for i := k; i < hd; i++ {
				acc[i] = ggml.F32ToF16(float32(t[acc[i]] * ms))
			}
		} else {
			vs = expf(s - M)
		}
		off := c.offset(layer, blocks, lo+j) + hoff
		v := unsafe.Slice((*uint16)(unsafe.Pointer(&c.v[off])), hd)
		k := 0
		if simd {
			f16AxpyAVX2(n8, &acc[0], &v[0], vs)
			k = n8
		}
		for i := k; i < hd; i++ {
			acc[i] = ggml.F32ToF16(fma32(t[v[i]], vs, t[acc[i]]))
		}
		S = softmaxSum(S, ms, vs)
	}
	inv := 1 / S
	for i, a := range acc {
		o[i] = t[a] * inv
	}
}

// softmaxSum is the online softmax's running sum after one key,
// fma(S, ms, vs): S + vs, one rounding, where no new maximum rescales
// (ms = 1, most keys), without the software FMA.
func softmaxSum(S, ms, vs float32) float32 {
	if ms == 1 {
		return S + vs
	}
	return fma32(S, ms, vs)
}

// softmaxChunk is the keys whose scores and softmax weights attendSIMD
// holds at a time, in its scratch; the value kernels find the second head's
// weights softmaxChunk elements after the first's.
const softmaxChunk = 64

// The scratch model.Stage gives Attend holds attendSIMD's chunks.
var _ [model.AttendScratch - 6*softmaxChunk]struct{}

// attendSIMD is Attend with the SIMD kernels, bit for bit the portable
// loops, two heads at a time so that the value kernel has eight independent
// dependency chains (for head dims up to 64) to interleave. Per chunk of
// keys and per head: the scores (tile kernels); the weights pass
// (softmaxWeightsx2AVX512, both heads at once) scales them by 1/sqrt(HeadDim),
// finds the running maximum M and each key's exponent (M-s for a new
// maximum, s-M otherwise, rounded as the portable loop rounds them),
// exponentiates it (expSub's expf), sets the key's weights, ms = e, vs = 1
// for a new maximum and ms = 1, vs = e otherwise, and carries S =
// fma(S, ms, vs). The value kernel rescales where ms != 1 (a rescale by
// exactly 1 is the identity on every value the accumulator can hold) and
// accumulates the values of each run of keys within one block.
//
// With capped > 0 each score is soft-capped (capScore) where it would be
// scaled, as the portable loops do, and the weights pass scales by 1.
//
// Chunks start at lo, so their boundaries move with the window's start; the
// result does not depend on them, since every step above is per key in key
// order (the weights pass carries M and S from chunk to chunk, the value
// kernels fold one key at a time) and each key's score is the same
// whichever kernel scores it.
//
// The scores and weights of a chunk live in scratch when it holds
// model.AttendScratch elements (the kernels take their addresses, which
// would move arrays of this frame to the heap at every call).
//
// Without AVX-512 (avx512 false: a CPU with AVX2, FMA and F16C, hd a
// multiple of 8) the same passes run with the AVX2 kernels: the scores of
// each block's keys in one call (scoresF16AVX2; scoreF16Rest where hd is
// not a multiple of 64, the f32 tiles for an f32 cache), the weights pass
// (softmaxWeightsx2AVX2, x1) and the value kernels (softmaxF16x2AVX2 …
// softmaxF32x1AVX2).
func (c *KV) attendSIMD(layer int, blocks []int32, lo, pos, hlo, hhi int, scale, capped float32, q, out, scratch []float32, avx512 bool) {
	cfg := c.cfg
	hd := cfg.HeadDim
	bs := cfg.BlockSize
	group := cfg.Heads / cfg.HeadsKV
	esz := cfg.Type.TypeSize()
	f16 := cfg.Type == ggml.F16
	n := pos + 1
	ts := tilesFor(cfg.Type)
	var buf [512]uint16
	var acc16 []uint16
	if f16 {
		if 2*hd <= len(buf) {
			acc16 = buf[:2*hd]
		} else {
			acc16 = make([]uint16, 2*hd)
		}
	}
	if len(scratch) < 6*softmaxChunk {
		scratch = make([]float32, 6*softmaxChunk)
	}
	// sc, ms and vs hold each head's scores, then its keys' weights, for
	// one chunk: [head][key].
	chunks := func(i int) [2][]float32 {
		c := scratch[2*i*softmaxChunk : 2*(i+1)*softmaxChunk]
		return [2][]float32{c[:softmaxChunk], c[softmaxChunk:]}
	}
	sc, ms, vs := chunks(0), chunks(1), chunks(2)
	for h0 := hlo; h0 < hhi; h0 += 2 {
		H := min(2, hhi-h0)
		o := out[h0*hd : (h0+H)*hd]
		var qb [2][]byte
		var hoff [2]int
		for hh := range H {
			h := h0 + hh
			hoff[hh] = h / group * c.hstep
			if f16 {
				// The converted query lives in o until the values are
				// scaled there: a stack buffer would escape through the
				// kernel calls.
				qs := unsafe.Slice((*uint16)(unsafe.Pointer(&o[hh*hd])), hd)
				f32ToF16(qs, q[h*hd:(h+1)*hd])
				qb[hh] = unsafe.Slice((*byte)(unsafe.Pointer(&qs[0])), 2*hd)
			} else {
				qb[hh] = unsafe.Slice((*byte)(unsafe.Pointer(&q[h*hd])), 4*hd)
			}
		}
		if f16 {
			clear(acc16[:H*hd])
		} else {
			clear(o)
		}
		M := [2]float32{float32(math.Inf(-1)), float32(math.Inf(-1))}
		var S [2]float32
		for j0 := lo; j0 < n; j0 += softmaxChunk {
			m := min(softmaxChunk, n-j0)
			for hh := range H {
				s := sc[hh][:m]
				for k := 0; k < m; {
					j := j0 + k
					seg := min(m-k, bs-j%bs) // keys left in j's block
					off := c.offset(layer, blocks, j) + hoff[hh]
					_ = c.k[off+(seg-1)*c.row+hd*esz-1]
					for r := 0; r < seg; {
						// Sixteen keys at once where they lie in the block
						// and their scores fit the chunk; the ones past seg
						// are scored too (stale keys of the block) and left
						// for the next segment to overwrite.
						if avx512 && f16 && hd%64 == 0 && seg-r > 4 && (j+r)%bs+16 <= bs && k+r+16 <= softmaxChunk {
							_ = c.k[off+r*c.row+15*c.row+hd*esz-1]
							scoresF16x16AVX512(hd, &c.k[off+r*c.row], c.row, &qb[hh][0], &sc[hh][k+r])
							r += 16
							continue
						}
						if !avx512 && f16 && hd%64 == 0 { // the rest of the segment in one call
							scoresF16AVX2(hd, &c.k[off+r*c.row], c.row, &qb[hh][0], &s[k+r], seg-r)
							r = seg
							continue
						}
						if f16 { // attnDotF16's order, one key at a time
							kr := c.k[off+r*c.row : off+r*c.row+hd*esz]
							switch {
							case hd%64 != 0:
								s[k+r] = scoreF16Rest(hd, kr, qb[hh], avx512)
							case avx512:
								s[k+r] = scoreF16AVX512(hd, &kr[0], &qb[hh][0])
							default:
								s[k+r] = scoreF16AVX2(hd, &kr[0], &qb[hh][0])
							}
							r++
							continue
						}
						R := min(ts.maxR, seg-r)
						ts.k[R-1][0](hd, &c.k[off+r*c.row], c.row, &qb[hh][0], 0, &s[k+r], 4)
						r += R
					}
					k += seg
				}
			}
			sscale := scale
			if capped > 0 { // capped where the kernel would scale
				for hh := range H {
					capScores(sc[hh][:m], scale, capped)
				}
				sscale = 1
			}
			switch {
			case !avx512 && H == 2:
				softmaxWeightsx2AVX2(m, &sc[0][0], &ms[0][0], &vs[0][0], &M[0], &S[0], sscale)
			case !avx512:
				softmaxWeightsx1AVX2(m, &sc[0][0], &ms[0][0], &vs[0][0], &M[0], &S[0], sscale)
			case H == 2:
				softmaxWeightsx2AVX512(m, &sc[0][0], &ms[0][0], &vs[0][0], &M[0], &S[0], sscale)
			default:
				softmaxWeightsx1AVX512(m, &sc[0][0], &ms[0][0], &vs[0][0], &M[0], &S[0], sscale)
			}
			for k := 0; k < m; {
				j := j0 + k
				seg := min(m-k, bs-j%bs)
				off := c.offset(layer, blocks, j) + hoff[0]
				voff := hoff[H-1] - hoff[0]
				_ = c.v[off+voff+(seg-1)*c.row+hd*esz-1]
				switch {
				case !avx512 && f16 && H == 2:
					softmaxF16x2AVX2(hd, &acc16[0], &c.v[off], voff, c.row, seg, &ms[0][k], &vs[0][k])
				case !avx512 && f16:
					softmaxF16x1AVX2(hd, &acc16[0], &c.v[off], voff, c.row, seg, &ms[0][k], &vs[0][k])
				case !avx512 && H == 2:
					softmaxF32x2AVX2(hd, &o[0], &c.v[off], voff, c.row, seg, &ms[0][k], &vs[0][k])
				case !avx512:
					softmaxF32x1AVX2(hd, &o[0], &c.v[off], voff, c.row, seg, &ms[0][k], &vs[0][k])
				case f16 && H == 2:
					softmaxF16x2AVX512(hd, &acc16[0], &c.v[off], voff, c.row, seg, &ms[0][k], &vs[0][k])
				case f16:
					softmaxF16x1AVX512(hd, &acc16[0], &c.v[off], voff, c.row, seg, &ms[0][k], &vs[0][k])
				case H == 2:
					softmaxF32x2AVX512(hd, &o[0], &c.v[off], voff, c.row, seg, &ms[0][k], &vs[0][k])
				default:
					softmaxF32x1AVX512(hd, &o[0], &c.v[off], voff, c.row, seg, &ms[0][k], &vs[0][k])
				}
				k += seg
			}
		}
		for hh := range H {
			inv := 1 / S[hh]
			oh := o[hh*hd : (hh+1)*hd]
			if f16 && avx512 {
				f16ScaleAVX512(hd, &acc16[hh*hd], inv, &oh[0])
				continue
			}
			if f16 { // f16ScaleAVX512's products
				for i, a := range acc16[hh*hd : (hh+1)*hd] {
					oh[i] = f16Table[a] * inv
				}
				continue
			}
			for i := range oh {
				oh[i] *= inv
			}
		}
	}
}

// softmaxValuesF32 is Attend's online softmax with a float32 accumulator (an
// f32 cache), as ggml accumulates values it reads in f32. scores[i] is key
// lo+i's.
func (c *KV) softmaxValuesF32(layer int, blocks []int32, hoff, lo int, scores, o []float32) {
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
		off := c.offset(layer, blocks, lo+j) + hoff
		v := unsafe.Slice((*float32)(unsafe.Pointer(&c.v[off])), hd)
		for i := range o {
			o[i] = fma32(v[i], vs, o[i])
		}
		S = softmaxSum(S, ms, vs)
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
	hd := c.cfg.HeadDim
	for h := range c.cfg.HeadsKV {
		o := off + h*c.hstep
		for _, p := range []struct {
			src []byte
			dst []float32
		}{{c.k[o : o+c.row], k[h*hd : (h+1)*hd]}, {c.v[o : o+c.row], v[h*hd : (h+1)*hd]}} {
			if err := ggml.DequantizeRow(c.cfg.Type, p.src, p.dst); err != nil {
				panic(err)
			}
		}
	}
}

// scoreF16Rest is attnDotF16 through the SIMD kernels for a head dimension
// that is not a multiple of 64 (stories260K's 8, Phi-3's 96): the first
// hd&^63 elements by scoreF16AVX512 (avx512) or scoreF16AVX2, the other
// hd%64 products added in float64, in order, by scoreF16Tail. Bit for bit
// attnDotF16, without its portable loop (which the race detector made slow
// enough, on 1,800-token prompts, for the progress deadline to fail them).
func scoreF16Rest(hd int, k, q []byte, avx512 bool) float32 {
	k, q = k[:2*hd], q[:2*hd]
	np := hd &^ 63
	var sum float64
	if np > 0 {
		if avx512 {
			sum = float64(scoreF16AVX512(np, &k[0], &q[0]))
		} else {
			sum = float64(scoreF16AVX2(np, &k[0], &q[0]))
		}
	}
	return scoreF16Tail(hd-np, &k[2*np], &q[2*np], sum)
}
