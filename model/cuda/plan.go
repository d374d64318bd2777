package cuda

import (
	"errors"
	"fmt"
	"math"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// ErrUnsupported wraps every model or weight the CUDA backend cannot run.
var ErrUnsupported = errors.New("cuda: unsupported")

// Supported says whether layers [first, last) of m run on the CUDA
// backend: llama-style blocks (RMSNorm, separate Q/K/V, RoPE, SwiGLU),
// nothing the kernels lack.
func Supported(m *model.Model, first, last int) error {
	no := func(what string) error {
		return fmt.Errorf("%w: %s model with %s (the CUDA backend runs llama-style blocks only so far)", ErrUnsupported, m.Arch, what)
	}
	switch {
	case m.Experts > 0:
		return no("mixture-of-experts layers")
	case m.AttnSoftCap > 0 || m.LogitSoftCap > 0:
		return no("soft-capping")
	case m.PostNorms:
		return no("post-norms")
	case m.GELU:
		return no("GELU")
	case m.QueryScale > 0:
		return no("a query scale")
	case m.SlidingWindow > 0:
		return no("sliding-window layers")
	case m.HeadDim > 256:
		return no(fmt.Sprintf("head width %d > 256", m.HeadDim))
	case m.RopeDims%2 != 0 || m.RopeDims > m.HeadDim:
		return no(fmt.Sprintf("%d rotated dimensions", m.RopeDims))
	}
	for l := first; l < last; l++ {
		L := &m.LayerWeights[l]
		switch {
		case L.QKV != nil:
			return no("fused QKV")
		case L.GateUp != nil:
			return no("fused gate/up")
		case L.QBias != nil:
			return no("attention biases")
		case L.QNorm != nil:
			return no("query/key norms")
		}
	}
	return nil
}

// DeviceType is the type a weight of type t with cols columns is held in
// on the device: F32, F16 and Q8_0 as stored (F16 only with cols%8 == 0,
// for the kernels' 16-byte loads, else F32); every other type is
// dequantized at load, to F16 (2 bytes a weight), or to F32 when its
// values overflow F16 (overflow says so) or cols%8 != 0.
func DeviceType(t ggml.Type, cols int, overflow bool) ggml.Type {
	switch {
	case t == ggml.F32:
		return ggml.F32
	case t == ggml.Q8_0 && cols%32 == 0:
		return ggml.Q8_0
	case cols%8 != 0 || overflow:
		return ggml.F32
	default:
		return ggml.F16
	}
}

// fitsF16 reports whether every value of x is finite in F16.
func fitsF16(x []float32) bool {
	for _, v := range x {
		if math.Abs(float64(v)) > 65504 {
			return false
		}
	}
	return true
}

// deviceBytes is the memory a rows×cols weight takes in type t.
func deviceBytes(t ggml.Type, rows, cols int) (int64, error) {
	rb, err := t.RowBytes(cols)
	if err != nil {
		return 0, err
	}
	return int64(rb) * int64(rows), nil
}

// Memory is a stage's device memory, in bytes.
type Memory struct {
	Weights  int64 // matrices and norms of the layer range (and embeddings, head)
	PerBlock int64 // one KV block across the stage's layers (K and V, f16)
	Scratch  int64 // activations for MaxTokens tokens
}

// DefaultMargin is device memory left free beside a stage: the driver's
// context, the module and allocator slack.
const DefaultMargin = 1 << 30

// StageMemory accounts the device memory layers [first, last) of m take,
// with KV blocks of bs positions and activations for maxTokens tokens.
func StageMemory(m *model.Model, first, last, bs, maxTokens int) (Memory, error) {
	var mem Memory
	add := func(w *model.Weight) error {
		if w == nil {
			return nil
		}
		t := DeviceType(w.Type, w.Cols, false)
		n, err := deviceBytes(t, w.Rows, w.Cols)
		if err != nil {
			return fmt.Errorf("%s: %w", w.Name, err)
		}
		mem.Weights += n
		return nil
	}
	for l := first; l < last; l++ {
		L := &m.LayerWeights[l]
		for _, w := range L.Matrices() {
			if err := add(w); err != nil {
				return Memory{}, err
			}
		}
		mem.Weights += int64(len(L.AttnNorm)+len(L.FFNNorm)) * 4
	}
	if first == 0 {
		if err := add(m.Embed); err != nil {
			return Memory{}, err
		}
	}
	if last == m.Layers {
		if !(first == 0 && m.Output == m.Embed) {
			if err := add(m.Output); err != nil {
				return Memory{}, err
			}
		}
		mem.Weights += int64(m.Embd) * 4
	}
	mem.PerBlock = 2 * int64(last-first) * int64(bs) * int64(m.KVDim()) * 2
	widest := max(m.Embd, m.QDim(), m.FF, m.KVDim())
	perToken := int64(4*m.Embd+2*m.QDim()+2*m.KVDim()+2*m.FF) * 4    // x h out logitsIn, q att, k v, gate up
	perToken += int64(widest)*2 + int64(widest) + int64(widest/32)*4 // f16 / q8 activations
	perToken += int64(m.RopeDims)*4 + 4*4                            // angles, metadata
	mem.Scratch = perToken*int64(maxTokens) + int64(maxTokens)*int64(m.Vocab)*4
	return mem, nil
}

// KVBlocks is how many KV blocks fit in free bytes of device memory after
// the stage's weights and scratch and margin: what a shard can offer when
// --kv-memory does not say. It is 0 when even the weights do not fit.
func KVBlocks(mem Memory, free, margin int64) int {
	left := free - margin - mem.Weights - mem.Scratch
	if left <= 0 || mem.PerBlock <= 0 {
		return 0
	}
	return int(left / mem.PerBlock)
}
