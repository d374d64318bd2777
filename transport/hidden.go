package transport

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/strata-llm/strata/transport/pb"
)

// HiddenType is the encoding of hidden states between stages.
type HiddenType = pb.HiddenType

// Hidden-state encodings.
const (
	// F32 is little-endian float32, the default: it keeps greedy output
	// bit-identical however the model is split.
	F32 = pb.HiddenType_HIDDEN_TYPE_F32
	// BF16 is little-endian bfloat16 rounded the way ggml rounds: half the
	// bytes on the wire, opt-in, and it breaks bit-identity.
	BF16 = pb.HiddenType_HIDDEN_TYPE_BF16
)

// MaxChunkBytes is the largest HiddenChunk payload EncodeHidden produces:
// 1 MiB, a quarter of gRPC's default 4 MB message limit and a sixteenth of
// MaxMessageBytes, so a chunk plus its framing always fits. It is a
// multiple of every element size, so no element straddles two chunks.
const MaxChunkBytes = 1 << 20

// ElemSize returns the bytes per value of typ, or an error for a type this
// version does not know.
func ElemSize(typ HiddenType) (int, error) {
	switch typ {
	case F32:
		return 4, nil
	case BF16:
		return 2, nil
	}
	return 0, fmt.Errorf("transport: unknown hidden type %d", int32(typ))
}

// EncodeHidden encodes h as typ and cuts the bytes into chunks of at most
// MaxChunkBytes, each a whole number of elements. The chunks share one
// backing array that the caller owns. An empty h gives no chunks.
func EncodeHidden(h []float32, typ HiddenType) ([][]byte, error) {
	size, err := ElemSize(typ)
	if err != nil {
		return nil, err
	}
	if len(h) == 0 {
		return nil, nil
	}
	buf := make([]byte, len(h)*size)
	switch typ {
	case F32:
		for i, v := range h {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
		}
	case BF16:
		for i, v := range h {
			binary.LittleEndian.PutUint16(buf[2*i:], FloatToBF16(v))
		}
	}
	chunks := make([][]byte, 0, (len(buf)+MaxChunkBytes-1)/MaxChunkBytes)
	for len(buf) > 0 {
		n := min(len(buf), MaxChunkBytes)
		chunks = append(chunks, buf[:n:n])
		buf = buf[n:]
	}
	return chunks, nil
}

// DecodeHidden decodes chunks of typ holding exactly n values. Every chunk
// must hold a whole number of elements. Nothing is allocated before n is
// checked against the chunks' total length.
func DecodeHidden(chunks [][]byte, typ HiddenType, n int) ([]float32, error) {
	size, err := ElemSize(typ)
	if err != nil {
		return nil, err
	}
	total := 0
	for i, c := range chunks {
		if len(c)%size != 0 {
			return nil, fmt.Errorf("transport: hidden chunk %d: %d bytes is not a multiple of %d", i, len(c), size)
		}
		total += len(c)
	}
	if n < 0 || total/size != n {
		return nil, fmt.Errorf("transport: hidden state has %d bytes, want %d values of %d bytes", total, n, size)
	}
	d := hiddenDecoder{typ: typ, size: size, dst: make([]float32, n)}
	for i, c := range chunks {
		if err := d.add(c); err != nil {
			return nil, fmt.Errorf("transport: hidden chunk %d: %w", i, err)
		}
	}
	return d.dst, nil
}

// hiddenDecoder decodes chunks in order into a preallocated destination.
type hiddenDecoder struct {
	typ  HiddenType
	size int
	dst  []float32
	off  int // values decoded so far
}

// add decodes one chunk at the current offset.
func (d *hiddenDecoder) add(b []byte) error {
	if len(b)%d.size != 0 {
		return fmt.Errorf("%d bytes is not a multiple of %d", len(b), d.size)
	}
	n := len(b) / d.size
	if n > len(d.dst)-d.off {
		return fmt.Errorf("%d values overflow the declared %d (have %d)", n, len(d.dst), d.off)
	}
	out := d.dst[d.off : d.off+n]
	switch d.typ {
	case F32:
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case BF16:
		for i := range out {
			out[i] = BF16ToFloat(binary.LittleEndian.Uint16(b[2*i:]))
		}
	}
	d.off += n
	return nil
}

// FloatToBF16 rounds f to bfloat16 the way ggml does
// (ggml_compute_fp32_to_bf16): round to nearest, ties to even; NaN stays a
// quiet NaN.
func FloatToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN: keep the sign, force quiet
		return uint16(u>>16) | 64
	}
	return uint16((u + (0x7fff + (u>>16)&1)) >> 16)
}

// BF16ToFloat widens a bfloat16 to float32 exactly.
func BF16ToFloat(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}
