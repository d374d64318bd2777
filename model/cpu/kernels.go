package cpu

import (
	"unsafe"

	"github.com/strata-llm/strata/model/ggml"
)

// tileFunc computes an R×C tile of dot products: out[c*os/4 + r] is the dot
// product of weight row r (at w + r*ws) with activation row c (at x + c*xs),
// for r < R and c < C; strides are in bytes. n counts elements for the float
// types and 32-element blocks for Q8_0 and Q4_0. Each output is reduced in
// exactly the order of the portable kernel of its type, whatever R and C.
type tileFunc func(n int, w *byte, ws int, x *byte, xs int, out *float32, os int)

// maxTile bounds the rows and columns of a tile kernel.
const maxTile = 4

// tileSet is the generated kernels of one weight type on one instruction
// set, k[R-1][C-1] for an R×C tile.
type tileSet struct {
	name       string
	unit       int // elements per unit of n
	maxR, maxC int
	k          [maxTile][maxTile]tileFunc
	// one is the 1×1 kernel called directly, so that its result stays on
	// the stack (a call through k cannot be proven not to keep &out).
	one func(n int, w, x *byte) float32
}

// dot1 computes one dot product of n elements of rows w and x, which the
// caller has sliced to their exact row bytes.
func (ts *tileSet) dot1(n int, w, x []byte) float32 {
	if n == 0 {
		return 0
	}
	return ts.one(n/ts.unit, unsafe.SliceData(w), unsafe.SliceData(x))
}

// portableOnly forces the portable pure-Go kernels when set, so that tests
// can compare them with the SIMD kernels on the same machine. Tests set it
// only while no kernel runs.
var portableOnly bool

// tilesFor returns the SIMD kernels for weights of type t, or nil when the
// portable kernels run (other CPUs, other types, or portableOnly set).
func tilesFor(t ggml.Type) *tileSet {
	if portableOnly {
		return nil
	}
	return archTiles(t)
}

// xTilesFor returns the kernels for weights of type t that take expanded
// activation rows (see expandQ8X), or nil.
func xTilesFor(t ggml.Type) *tileSet {
	if portableOnly {
		return nil
	}
	return archXTiles(t)
}

// xPair is the bytes per pair of 32-element blocks of an expanded
// activation row: the 64 quants, 16 int32 corrections (-cw times the sum of
// each 4 quants; cw is 128 for Q8_0 weights, 8 for Q4_0) and 16 float32
// scales (block 2k's ×8, block 2k+1's ×8). The X kernels use the weights as
// VPDPBUSD's unsigned bytes (w+128, or the raw nibbles) and the activations
// as its signed ones, so the correction, computed once per activation row,
// starts each integer sum; the sums, scale products and FMAs are those of
// the other kernels, so the results are the same bits.
const xPair = 192

// expandQ8X writes the Q8_0 activation row q (nb blocks) to dst in the
// expanded layout for weights of type t.
func expandQ8X(t ggml.Type, nb int, q, dst []byte) {
	cw := uint32(0x80808080)
	if t == ggml.Q4_0 {
		cw = 0x08080808
	}
	_, _ = q[nb*q80Bytes-1], dst[(nb+1)/2*xPair-1]
	expandQ8XAVX512(nb, unsafe.SliceData(q), cw, unsafe.SliceData(dst))
}

// ISA names the instruction set the kernels for weights of type t use.
func ISA(t ggml.Type) string {
	if ts := tilesFor(t); ts != nil {
		return ts.name
	}
	return "portable"
}

// The VecDot kernels: the SIMD tile kernel when the CPU has one, else the
// portable kernel; both give the same bits.

func vecDotF32(n int, w, x []byte) float32 {
	if ts := tilesFor(ggml.F32); ts != nil {
		return ts.dot1(n, w[:4*n], x[:4*n])
	}
	return dotF32Bytes(n, w, x)
}

func vecDotF16(n int, w, x []byte) float32 {
	if ts := tilesFor(ggml.F16); ts != nil {
		return ts.dot1(n, w[:2*n], x[:2*n])
	}
	return dotF16(n, w, x)
}

func vecDotBF16(n int, w, x []byte) float32 {
	if ts := tilesFor(ggml.BF16); ts != nil {
		return ts.dot1(n, w[:2*n], x[:2*n])
	}
	return dotBF16(n, w, x)
}

func vecDotQ80(n int, w, x []byte) float32 {
	if ts := tilesFor(ggml.Q8_0); ts != nil {
		nb := n / ggml.QK
		return ts.dot1(n, w[:nb*q80Bytes], x[:nb*q80Bytes])
	}
	return dotQ80Q80(n, w, x)
}

func vecDotQ40(n int, w, x []byte) float32 {
	if ts := tilesFor(ggml.Q4_0); ts != nil {
		nb := n / ggml.QK
		return ts.dot1(n, w[:nb*q40Bytes], x[:nb*q80Bytes])
	}
	return dotQ40Q80(n, w, x)
}
