package cpu

import (
	"fmt"
	"os"
	"strings"
	"unsafe"

	"github.com/strata-llm/strata/model/ggml"
)

// cpuEnv is the environment variable that limits the kernels, for
// measuring one path on a machine that has a faster one: "avx512" runs
// what a CPU with AVX-512 and VNNI but no AMX runs (the AMX panel kernels
// are skipped), "avx2" what a CPU with AVX2, FMA and F16C but neither
// AVX-512 nor AVX-VNNI runs (amd64; the AVX-512 and VNNI kernels,
// activation quantizers and attention loops are skipped, and the AVX-VNNI
// panels), "avxvnni" what such a CPU with AVX-VNNI runs (the AVX2 kernels
// and, where this CPU has AVX-VNNI, the AVX-VNNI panels), "portable" the
// portable Go kernels; unset, empty or "auto", the fastest this CPU has. It is read once, when the process starts; another value is
// reported on standard error and ignored. Every setting gives the same
// bits, only the speed differs.
const cpuEnv = "STRATA_CPU"

func init() {
	if err := setKernels(os.Getenv(cpuEnv)); err != nil {
		fmt.Fprintf(os.Stderr, "strata: %v; running the fastest kernels\n", err)
	}
	if err := setAhead(os.Getenv(aheadEnv)); err != nil {
		fmt.Fprintf(os.Stderr, "strata: %v; prefetching as this CPU wants\n", err)
	}
}

// aheadEnv is the environment variable that says whether matrix-vector
// products (one activation row: generation) run the kernels that prefetch
// their weights a page ahead (tileSet.ahead, panelSet.ahead): "on", "off",
// or unset, empty or "auto" for this CPU's default (aheadAuto): on for
// Intel and for AMD from Zen 5, off for the others. Intel's hardware
// prefetchers stop at each 4 KiB page, so a one-row weight stream stalls
// there: on a 2-core Xeon (Emerald Rapids) the prefetching kernels ran
// generation 30–40 % faster for F16 and BF16 and about 60 % for Q4_0
// (docs/performance-history.md). On AMD's Zen 5 session 12 measured them gaining
// for F32 and F16 and losing for Q8_0 and Q4_0 within the runs' spread;
// session 19, on the same CPU family, measured one-thread generation 9–28 %
// faster with them for F32, F16, BF16, Q4_0, Q4_K_M and Q6_K, Q8_0 at
// parity, and with them every generation cell of the 14-file table beside
// llama.cpp at 1.11× or more but BF16's one-thread one
// (docs/performance-history.md, Zen 5, session 19): on from Zen 5. The AVX2 kernels have had them since session
// 22 (an Intel CPU without AVX-512 has the same prefetchers): on the same
// Zen 5 held to AVX2, one-thread generation ran 1.06–1.82× faster with
// them for every type but F32 and Q8_0 (at parity). Every setting gives
// the same bits: a prefetch changes no result.
const aheadEnv = "STRATA_PREFETCH"

// aheadOn is whether matrix-vector products run the prefetching kernels.
var aheadOn = aheadAuto()

// MatVecAhead reports whether matrix-vector products run the kernels that
// prefetch their weights a page ahead (aheadEnv), where a type has them.
func MatVecAhead() bool { return aheadOn && !portableOnly }

// setAhead applies a value of aheadEnv.
func setAhead(v string) error {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "auto":
		aheadOn = aheadAuto()
	case "on":
		aheadOn = true
	case "off":
		aheadOn = false
	default:
		return fmt.Errorf("%s=%q: want on, off or auto", aheadEnv, v)
	}
	return nil
}

// setKernels applies a value of cpuEnv.
func setKernels(v string) error {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "auto":
		avx2Only, portableOnly, noAMX, noAVXVNNI = false, false, false, false
	case "avx512":
		avx2Only, portableOnly, noAMX, noAVXVNNI = false, false, true, false
	case "avxvnni":
		avx2Only, portableOnly, noAMX, noAVXVNNI = true, false, true, false
	case "avx2":
		avx2Only, portableOnly, noAMX, noAVXVNNI = true, false, true, true
	case "portable":
		avx2Only, portableOnly, noAMX, noAVXVNNI = false, true, true, true
	default:
		return fmt.Errorf("%s=%q: want avx512, avxvnni, avx2, portable or auto", cpuEnv, v)
	}
	return nil
}

// tileFunc computes an R×C tile of dot products: out[c*os/4 + r] is the dot
// product of weight row r (at w + r*ws) with activation row c (at x + c*xs),
// for r < R and c < C; strides are in bytes. n counts elements for the float
// types and 32-element blocks for Q8_0, Q4_0, Q5_0, Q5_1 and IQ4_NL. Each
// output is reduced in exactly the order of the portable kernel of its
// type, whatever R and C.
type tileFunc func(n int, w *byte, ws int, x *byte, xs int, out *float32, os int)

// rowsFunc computes a matrix-vector product's run of rows ≥ 1 weight rows,
// the first at w and one every ws bytes (bytes), against the one activation
// row at x: out[i] is weight row i's dot product, with the bits of the 1×1
// tileFunc of its set; n as for tileFunc. One call covers a run of rows
// where the 1×1 kernel would take one call from Go a row.
type rowsFunc func(n int, w *byte, ws int, x *byte, out *float32, rows int)

// maxTile bounds the rows and columns of a tile kernel.
const maxTile = 4

// tileSet is the generated kernels of one weight type on one instruction
// set, k[R-1][C-1] for an R×C tile.
type tileSet struct {
	name       string
	unit       int // elements per unit of n
	maxR, maxC int
	k          [maxTile][maxTile]tileFunc
	// vec is the 1×1 kernel over a run of rows: matrix-vector products run
	// it (nil: k[0][0] once a row).
	vec rowsFunc
	// ahead is vec again, prefetching its weights a page ahead (two for
	// f16 and bf16): matrix-vector products run it where aheadOn (nil:
	// none).
	ahead rowsFunc
	// one is the 1×1 kernel called directly, so that its result stays on
	// the stack (a call through k cannot be proven not to keep &out); nil
	// for a set of matrix kernels only (f32x).
	one func(n int, w, x *byte) float32
	// f32x: the activation rows are float32 (4 bytes an element), each
	// value rounded to the weights' dot-product type and widened back
	// (round), not stored in that type: widening is exact, so the
	// products and sums are the portable kernel's, and the kernel
	// converts only the weights.
	f32x bool
	// round sets dst[i] to src[i] rounded to the weights' dot-product type
	// (f16 or bf16) and widened back to float32, for i < n: an f32x set's
	// activation rows (roundActivation).
	round func(n int, src, dst *float32)
}

// roundActivation sets dst[i] to src[i] rounded for the float32-activation
// kernels of t's weights (archMatTiles(t), which must exist): the rounding
// those kernels' ISA has.
func roundActivation(t ggml.Type, src, dst []float32) {
	if len(src) == 0 {
		return
	}
	archMatTiles(t).round(len(src), &src[0], &dst[:len(src)][0])
}

// matVec returns the kernel a matrix-vector product runs over its rows:
// ahead where aheadOn and the set has it, else vec (nil: none).
func (ts *tileSet) matVec() rowsFunc {
	if aheadOn && ts.ahead != nil {
		return ts.ahead
	}
	return ts.vec
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

// noAMX skips the AMX panel kernels (cpuEnv "avx512", or a lower setting).
var noAMX bool

// noAVXVNNI skips the AVX-VNNI panel kernels, which run where the AVX2
// ones would on a CPU that has AVX-VNNI (cpuEnv "avx2"; "avxvnni" keeps
// them).
var noAVXVNNI bool

// tilesFor returns the SIMD kernels for weights of type t, or nil when the
// portable kernels run (other CPUs, other types, or portableOnly set).
func tilesFor(t ggml.Type) *tileSet {
	if portableOnly {
		return nil
	}
	return archTiles(t)
}

// matTilesFor returns the kernels MatMul runs for weights of type t: those
// with float32 activations where this CPU has them, else tilesFor's.
func matTilesFor(t ggml.Type) *tileSet {
	if portableOnly {
		return nil
	}
	if ts := archMatTiles(t); ts != nil {
		return ts
	}
	return archTiles(t)
}

// panelFunc computes a panel of 16 repacked weight rows (see repack.go)
// against C activation rows in the expanded layout: out[c*os/4 + i] is the
// dot product of the panel's row i with activation row c (at x + c*xs), for
// i < 16; nb is the number of blocks (32 elements; 256 for the K-quants).
// Each output is reduced in exactly the order of the portable kernel of its
// type.
type panelFunc func(nb int, w *byte, x *byte, xs int, out *float32, os int)

// maxPanelC bounds the activation rows of one panel kernel call.
const maxPanelC = 8

// panelSet is the panel kernels of one weight type, k[C-1] for C
// activation rows.
type panelSet struct {
	name string
	k    [maxPanelC]panelFunc
	// ahead is k[0] prefetching its weights a page ahead: matrix-vector
	// products run it where aheadOn (nil: none).
	ahead panelFunc
	// amx computes panels against amxRows activation rows at a time with
	// AMX tiles, where the CPU has them (nil: none); same bits as k.
	amx amxFunc
	// amxMin is the activation rows from which a product runs amx (0:
	// amxRows). Q6_K's 16-deep tiles are slower than its VNNI kernel on
	// one group of 16 rows (BenchmarkPanel Q6_K: 159 GMAC/s against 178 on
	// the 2-core Intel Xeon with AMX) and faster from two (185).
	amxMin int
	// planes: the kernels read Q5_K's, Q5_0's and Q5_1's fifth bits in
	// planes, not masks (repack_kquant.go, repack_q5.go).
	planes bool
}

// amxFunc computes np consecutive panels of nb blocks at w against ng
// groups of amxRows activation rows in the expanded layout (x, x+xs, …):
// out[c*os/4 + 16p + i] is the dot product of panel p's row i with
// activation row c. scratch is amxScratch(nb*panelBlock(t)/32) bytes,
// 64-byte aligned, starting with the tile configurations amxConfigure
// writes. Each output is reduced in exactly the order of the panel
// kernels of its type.
type amxFunc func(np, nb int, w *byte, x *byte, xs int, ng int, out *float32, os int, scratch *byte)

// amxRows is the activation rows of one group: the rows of a tile.
const amxRows = 16

// amxScratch is the scratch bytes an amxFunc uses for panels of subs
// 32-element sub-blocks: two configurations (64 each), its counters (64),
// three tiles C (16 rows of 64 bytes) and the B tiles of a panel (16 bytes
// an element).
func amxScratch(subs int) int { return 2*64 + 64 + 3*1024 + subs*512 }

// amxConfigure writes the AMX kernels' two tile configurations (palette
// 1) to the first 128 bytes of cfg, each two sets of three tiles: TMM0 and
// TMM3 the 16×16 int32 sums (16 rows of 64 bytes), TMM1 and TMM4 16
// activation rows of a sub-block's quants, TMM2 and TMM5 a sub-block of
// 16 weight rows in rows of 64 bytes, four elements of each weight row to
// a B row. At 0, sub-blocks of 32 elements; at 64, Q6_K's groups of 16.
func amxConfigure(cfg []byte) {
	clear(cfg[:128])
	for c, depth := range []int{32, 16} {
		cf := cfg[64*c : 64*(c+1)]
		cf[0] = 1 // palette
		for t, shape := range [][2]int{{16, 64}, {16, depth}, {depth / 4, 64}, {16, 64}, {16, depth}, {depth / 4, 64}} {
			cf[16+2*t] = byte(shape[1]) // bytes per row (little-endian uint16)
			cf[48+t] = byte(shape[0])   // rows
		}
	}
}

// amxKernel returns the AMX kernel of ps when this process runs AMX
// kernels, else nil.
func (ps *panelSet) amxKernel() amxFunc {
	if !haveAMX || noAMX || ps.amx == nil {
		return nil
	}
	return ps.amx
}

// amxFrom is the activation rows from which a product runs ps's AMX
// kernel.
func (ps *panelSet) amxFrom() int { return max(ps.amxMin, amxRows) }

// panelsFor returns the kernels for repacked weights of type t, or nil when
// the weights are used as stored.
func panelsFor(t ggml.Type) *panelSet {
	if portableOnly {
		return nil
	}
	return archPanels(t)
}

// ISA names the instruction set the kernels for weights of type t use.
func ISA(t ggml.Type) string {
	if ps := panelsFor(t); ps != nil {
		if ps.amxKernel() != nil {
			return ps.name + "+AMX"
		}
		return ps.name
	}
	if ts := matTilesFor(t); ts != nil {
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

func vecDotQ50(n int, w, x []byte) float32 {
	if ts := tilesFor(ggml.Q5_0); ts != nil {
		nb := n / ggml.QK
		return ts.dot1(n, w[:nb*q50Bytes], x[:nb*q80Bytes])
	}
	return dotQ50Q80(n, w, x)
}

func vecDotQ51(n int, w, x []byte) float32 {
	if ts := tilesFor(ggml.Q5_1); ts != nil {
		nb := n / ggml.QK
		return ts.dot1(n, w[:nb*q51Bytes], x[:nb*q81Bytes])
	}
	return dotQ51Q81(n, w, x)
}

func vecDotIQ4NL(n int, w, x []byte) float32 {
	if ts := tilesFor(ggml.IQ4_NL); ts != nil {
		nb := n / ggml.QK
		return ts.dot1(n, w[:nb*iq4Bytes], x[:nb*q80Bytes])
	}
	return dotIQ4NLQ80(n, w, x)
}

func vecDotQ40(n int, w, x []byte) float32 {
	if ts := tilesFor(ggml.Q4_0); ts != nil {
		nb := n / ggml.QK
		return ts.dot1(n, w[:nb*q40Bytes], x[:nb*q80Bytes])
	}
	return dotQ40Q80(n, w, x)
}
