package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// kPanelTypes are the types with K-quant panel kernels.
var kPanelTypes = []ggml.Type{ggml.Q2_K, ggml.Q3_K, ggml.Q4_K, ggml.Q5_K, ggml.Q6_K, ggml.IQ4_XS}

// kWeights returns rows weight rows of typ with n elements: from the
// reference quantizer, or raw random bytes with sane f16 scales (every
// quant, 6-bit scale and min and int8 scale, -128 included).
func kWeights(t testing.TB, r *rand.Rand, typ ggml.Type, rows, n int) []byte {
	t.Helper()
	var w []byte
	for range rows {
		if r.IntN(2) == 0 {
			w = append(w, encode(t, typ, randBytesVec(r, n))...)
		} else {
			w = append(w, quantWeights(t, r, typ, n)...)
		}
	}
	return w
}

// kActivations returns a Q8_K row of n elements: a random row quantized, or
// (extreme) raw quants in -128..127 with their sums and a random d.
func kActivations(t testing.TB, r *rand.Rand, n int, extreme bool) []byte {
	t.Helper()
	q := make([]byte, mustRowBytes(t, ggml.Q8_K, n))
	if !extreme {
		ConvertActivation(ggml.Q4_K, randBytesVec(r, n), q)
		return q
	}
	for b := 0; b < n/ggml.QKK; b++ {
		blk := q[b*q8KBytes : (b+1)*q8KBytes]
		binary.LittleEndian.PutUint32(blk, math.Float32bits(float32(r.NormFloat64())))
		for g := range 16 {
			var sum int16
			for i := 4 + 16*g; i < 4+16*g+16; i++ {
				v := int8(r.Uint32())
				if r.IntN(4) == 0 {
					v = []int8{-128, 127, -127}[r.IntN(3)]
				}
				blk[i] = byte(v)
				sum += int16(v)
			}
			binary.LittleEndian.PutUint16(blk[4+256+2*g:], uint16(sum))
		}
	}
	return q
}

// TestKPanelsEqualPortable checks the K-quant panel kernels (VNNI and AVX2,
// every C, several super-block counts, row counts that leave a
// partial panel, extreme quants and scales) on repacked weights and
// expanded activations against the portable kernel on the stored rows, bit
// for bit.
func TestKPanelsEqualPortable(t *testing.T) {
	testKPanelsEqualPortable(t)
	avx2Only = true
	defer func() { avx2Only, noAVXVNNI = false, false }()
	testKPanelsEqualPortable(t) // IQ4_XS's AVX-VNNI kernels, where the CPU has them
	noAVXVNNI = true
	testKPanelsEqualPortable(t)
}

func testKPanelsEqualPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	for _, typ := range kPanelTypes {
		if archPanels(typ) == nil {
			t.Logf("%s (avx2Only %v, noAVXVNNI %v): no panel kernels on this CPU", typ, avx2Only, noAVXVNNI)
			continue
		}
		for _, ps := range append([]*panelSet{archPanels(typ)}, morePanels(typ)...) {
			testKPanelSet(t, r, typ, ps)
		}
	}
}

// morePanels returns the panel sets for weights of type t that this CPU
// could run besides archPanels' (avx2_amd64_test.go: Q5_K's mask
// kernels, which only CPUs with AMX pick), so that every CPU tests them.
var morePanels = func(ggml.Type) []*panelSet { return nil }

func testKPanelSet(t *testing.T, r *rand.Rand, typ ggml.Type, ps *panelSet) {
	portable, err := VecDotFor(typ)
	if err != nil {
		t.Fatal(err)
	}
	for _, nb := range []int{1, 2, 3, 8} {
		n := ggml.QKK * nb
		wrow := mustRowBytes(t, typ, n)
		qrow := nb * q8KBytes
		rows := []int{1, 15, 16, 17, 40}[r.IntN(5)]
		w := kWeights(t, r, typ, rows, n)
		packed := ps.repack(typ, rows, n, w)
		pb := nb * panelBlockBytes(typ)
		if len(packed) != (rows+panelRows-1)/panelRows*pb {
			t.Fatalf("%s: repacked %d bytes for %d rows of %d super-blocks", typ, len(packed), rows, nb)
		}
		for C := 1; C <= maxPanelC; C++ {
			xs := nb*xKBlock + 20 // a gap between rows, to test the stride
			q := make([]byte, C*qrow)
			x := make([]byte, C*xs)
			for c := range C {
				qc := q[c*qrow : (c+1)*qrow]
				copy(qc, kActivations(t, r, n, r.IntN(3) == 0))
				expandRow(typ, nb, qc, x[c*xs:c*xs+nb*xKBlock])
			}
			const os = panelRows + 3
			for p := 0; p*panelRows < rows; p++ {
				out := make([]float32, C*os)
				ps.k[C-1](nb, &packed[p*pb], &x[0], xs, &out[0], 4*os)
				for i := range min(panelRows, rows-p*panelRows) {
					o := p*panelRows + i
					for c := range C {
						got := out[c*os+i]
						var want float32
						withPortable(func() { want = portable(n, w[o*wrow:(o+1)*wrow], q[c*qrow:(c+1)*qrow]) })
						if math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("%s_%d nb=%d out[%d][%d] = %g (%08x), portable %g (%08x)",
								ps.name, C, nb, o, c, got, math.Float32bits(got), want, math.Float32bits(want))
						}
					}
				}
				for c := range C { // untouched padding
					for i := panelRows; i < os; i++ {
						if out[c*os+i] != 0 {
							t.Fatalf("%s_%d wrote out[%d][%d]", ps.name, C, i, c)
						}
					}
				}
			}
		}
	}

}

// TestKMatMulEqualsPortable: MatMul of the K-panel types' matrices (rows that
// leave a partial panel, 1 to 19 activation rows, one and two workers, the
// VNNI and the AVX2 kernels) gives the portable kernels' bits, and every
// output the bits of its one-row dot product.
func TestKMatMulEqualsPortable(t *testing.T) {
	testKMatMulEqualsPortable(t)
	avx2Only = true
	defer func() { avx2Only, noAVXVNNI = false, false }()
	testKMatMulEqualsPortable(t) // AVX-VNNI, where the CPU has it
	noAVXVNNI = true
	testKMatMulEqualsPortable(t)
}

func testKMatMulEqualsPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(63, 64))
	p1, p2 := NewPool(1), NewPool(2)
	defer p1.Close()
	defer p2.Close()
	for _, typ := range kPanelTypes {
		for _, shape := range [][2]int{{37, 512}, {64, 768}, {200, 256}} {
			N, K := shape[0], shape[1]
			w := &model.Weight{Name: "w", Type: typ, Rows: N, Cols: K, Data: kWeights(t, r, typ, N, K)}
			for _, R := range []int{1, 2, 5, 8, 9, 19} {
				t.Run(fmt.Sprintf("%s/%dx%d/%d", typ, N, K, R), func(t *testing.T) {
					x := randBytesVec(r, R*K)
					var want []float32
					withPortable(func() {
						want = make([]float32, R*N)
						NewBackend(p1).MatMul(w, x, R, want)
					})
					for _, p := range []*Pool{p1, p2} {
						got := make([]float32, R*N)
						NewBackend(p).MatMul(w, x, R, got)
						if !sameBits(got, want) {
							t.Fatalf("%s (%d workers): MatMul differs from the portable kernels", ISA(typ), p.Workers())
						}
					}
					one := make([]float32, N)
					be := NewBackend(p2)
					for i := range R {
						be.MatMul(w, x[i*K:(i+1)*K], 1, one)
						if !sameBits(one, want[i*N:(i+1)*N]) {
							t.Fatalf("row %d alone differs from row %d of %d", i, i, R)
						}
					}
				})
			}
		}
	}
}

// sameBits reports whether a and b hold the same float32 bit patterns.
func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

// TestQuantExpandKEqualsPortable checks the AVX-512 and AVX2 Q8_K
// quantizers, which write the panel kernels' expanded layout directly,
// against ConvertActivation followed by expandRowK, byte for byte: awkward
// values, magnitude ties of either sign first, all-zero super-blocks, NaNs,
// infinities, subnormals and halves that round to even.
func TestQuantExpandKEqualsPortable(t *testing.T) {
	eachElementwiseISA(t, testQuantExpandKEqualsPortable)
}

func testQuantExpandKEqualsPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(65, 66))
	for trial := range 400 {
		nb := 1 + r.IntN(4)
		x := randBytesVec(r, nb*ggml.QKK)
		for b := range nb {
			blk := x[b*ggml.QKK : (b+1)*ggml.QKK]
			switch r.IntN(8) {
			case 0: // a tie between +a and -a, either first
				i, j := r.IntN(256), r.IntN(256)
				a := float32(1e21)
				blk[i], blk[j] = a, -a
			case 1:
				clear(blk)
			case 2:
				blk[r.IntN(256)] = float32(math.NaN())
				blk[r.IntN(256)] = float32(math.Inf(1 - 2*r.IntN(2)))
			case 3: // only NaNs and zeros
				clear(blk)
				blk[r.IntN(256)] = float32(math.NaN())
			case 4: // subnormals only
				for i := range blk {
					blk[i] = math.Float32frombits(uint32(r.IntN(1 << 23)))
					if r.IntN(2) == 0 {
						blk[i] = -blk[i]
					}
				}
			case 5: // values that land on halves: k/2 times amax/127
				for i := range blk {
					blk[i] = float32(r.IntN(255)-127) / 2
				}
				blk[r.IntN(256)] = 63.5
			case 6: // the first of several equal maxima
				for k := range 3 {
					blk[r.IntN(256)] = float32(2*(k%2)-1) * 7
				}
				for i := range blk {
					blk[i] = max(min(blk[i], 7), -7)
				}
			}
		}
		got := make([]byte, nb*xKBlock)
		want := make([]byte, nb*xKBlock)
		q := make([]byte, nb*q8KBytes)
		quantExpandK(x, got, q)
		withPortable(func() { quantExpandK(x, want, q) })
		if !slices.Equal(got, want) {
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("trial %d: byte %d (super-block %d, offset %d) = %#x, portable %#x", trial, i, i/xKBlock, i%xKBlock, got[i], want[i])
				}
			}
		}
	}
}

// BenchmarkQuantExpandK measures the K-quant activation conversion of one
// 2048-wide row, SIMD and portable.
func BenchmarkQuantExpandK(b *testing.B) {
	r := rand.New(rand.NewPCG(67, 68))
	const n = 2048
	x := randVec(r, n)
	dst := make([]byte, n/ggml.QKK*xKBlock)
	q := make([]byte, n/ggml.QKK*q8KBytes)
	for _, portable := range []bool{false, true} {
		b.Run(map[bool]string{false: "simd", true: "portable"}[portable], func(b *testing.B) {
			portableOnly = portable
			defer func() { portableOnly = false }()
			for b.Loop() {
				quantExpandK(x, dst, q)
			}
			b.SetBytes(4 * n)
		})
	}
}

// BenchmarkRepackK measures repacking a 768×2048 matrix (load time).
func BenchmarkRepackK(b *testing.B) {
	r := rand.New(rand.NewPCG(69, 70))
	const rows, cols = 768, 2048
	for _, typ := range kPanelTypes {
		w := kWeights(b, r, typ, 16, cols)
		data := make([]byte, 0, rows*len(w)/16)
		for range rows / 16 {
			data = append(data, w...)
		}
		ps := panelsFor(typ)
		if ps == nil {
			continue
		}
		b.Run(typ.String(), func(b *testing.B) {
			for b.Loop() {
				ps.repack(typ, rows, cols, data)
			}
			b.SetBytes(int64(len(data)))
		})
	}
}

// BenchmarkKMatVec is BenchmarkMatVec for the K-panel types on each of their
// kernel sets: the fastest (VNNI here), the AVX2 ones, and the portable Go.
func BenchmarkKMatVec(b *testing.B) {
	r := rand.New(rand.NewPCG(71, 72))
	pool := NewPool(1)
	defer pool.Close()
	for _, typ := range kPanelTypes {
		const K = 2048
		wrow := mustRowBytes(b, typ, K)
		N := (64 << 20) / wrow / panelRows * panelRows
		data := make([]byte, N*wrow)
		row := quantWeights(b, r, typ, K)
		for o := range N {
			copy(data[o*wrow:], row)
		}
		x := randVec(r, K)
		out := make([]float32, N)
		for _, set := range []string{"best", "avx2", "portable"} {
			b.Run(typ.String()+"/"+set, func(b *testing.B) {
				avx2Only, portableOnly = set == "avx2", set == "portable"
				defer func() { avx2Only, portableOnly = false, false }()
				w := &model.Weight{Name: "w", Type: typ, Rows: N, Cols: K, Data: data}
				be := NewBackend(pool)
				be.Prepare(w)
				for b.Loop() {
					be.MatMul(w, x, 1, out)
				}
				b.SetBytes(int64(len(data)))
			})
		}
	}
}

// BenchmarkKPanelAVX2 is BenchmarkPanel for the AVX2 K-quant kernels.
func BenchmarkKPanelAVX2(b *testing.B) {
	avx2Only = true
	defer func() { avx2Only = false }()
	r := rand.New(rand.NewPCG(73, 74))
	for _, typ := range kPanelTypes {
		ps := archPanels(typ)
		if ps == nil {
			continue
		}
		const n = 2048
		nb := n / ggml.QKK
		packed := ps.repack(typ, panelRows, n, kWeights(b, r, typ, panelRows, n))
		for _, C := range []int{1, 4, 8} {
			b.Run(fmt.Sprintf("%s/%d", typ, C), func(b *testing.B) {
				x := make([]byte, C*nb*xKBlock)
				q := make([]byte, nb*q8KBytes)
				for c := range C {
					quantExpandK(randVec(r, n), x[c*nb*xKBlock:(c+1)*nb*xKBlock], q)
				}
				out := make([]float32, C*panelRows)
				for b.Loop() {
					ps.k[C-1](nb, &packed[0], &x[0], nb*xKBlock, &out[0], 4*panelRows)
				}
				b.ReportMetric(float64(panelRows*C*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s")
			})
		}
	}
}
