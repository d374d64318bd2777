package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// TestAMXPanelsEqualPortable checks the AMX panel kernels (several panels
// and groups of 16 activation rows per call) against the portable kernel, bit for bit,
// with extreme quants in weights and activations, on a CPU that has AMX.
func TestAMXPanelsEqualPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, typ := range amxTypes(t) {
		ps := archPanels(typ)
		portable, err := VecDotFor(typ)
		if err != nil {
			t.Fatal(err)
		}
		k := isKPanel(typ)
		for _, nb := range []int{1, 2, 3, 24, 67} {
			if k && nb > 8 {
				continue
			}
			n := panelBlock(typ) * nb
			buf := make([]byte, amxScratch(n/32)+63)
			scratch := buf[int(-uintptr(unsafe.Pointer(&buf[0]))&63):][:amxScratch(n/32)]
			amxConfigure(scratch)
			wrow := mustRowBytes(t, typ, n)
			qrow := nb * q80Bytes
			if k {
				qrow = nb * q8KBytes
			}
			rows := []int{16, 17, 40, 64}[r.IntN(4)]
			w := make([]byte, rows*wrow)
			if k {
				w = kWeights(t, r, typ, rows, n)
			} else {
				for i := range rows {
					copy(w[i*wrow:], randRow(t, r, typ, n))
				}
			}
			packed := ps.repack(typ, rows, n, w)
			panels := (rows + panelRows - 1) / panelRows
			xb := expandedBlockBytes(typ)
			xs := nb*xb + 24 // a gap between rows, to test the stride
			ng := 1 + r.IntN(3)
			xrows := ng * amxRows
			q := make([]byte, xrows*qrow)
			x := make([]byte, xrows*xs)
			for c := range xrows {
				qc := q[c*qrow : (c+1)*qrow]
				if k {
					copy(qc, kActivations(t, r, n, r.IntN(3) == 0))
					expandRow(typ, nb, qc, x[c*xs:c*xs+nb*xb])
					continue
				}
				ConvertActivation(typ, randActVec(r, n), qc)
				if r.IntN(3) == 0 { // extreme quants (the quantizer never makes -128)
					for b := range nb {
						for i := 2; i < q80Bytes; i++ {
							qc[b*q80Bytes+i] = byte(max(int8(r.Uint32()), -127))
						}
					}
				}
				expandRow(typ, nb, qc, x[c*xs:c*xs+nb*xb])
			}
			os := panels*panelRows + 5
			out := make([]float32, xrows*os)
			ps.amx(panels, nb, &packed[0], &x[0], xs, ng, &out[0], 4*os, &scratch[0])
			for c := range xrows {
				for o := range os {
					got := out[c*os+o]
					if o >= rows {
						if o >= panels*panelRows && got != 0 {
							t.Fatalf("%s: wrote out[%d][%d] past the panels", typ, o, c)
						}
						continue // padding rows
					}
					var want float32
					withPortable(func() { want = portable(n, w[o*wrow:(o+1)*wrow], q[c*qrow:(c+1)*qrow]) })
					checkFinite(t, ps.name, want)
					if math.Float32bits(got) != math.Float32bits(want) {
						t.Fatalf("%s AMX nb=%d out[%d][%d] = %g (%08x), portable %g (%08x)",
							typ, nb, o, c, got, math.Float32bits(got), want, math.Float32bits(want))
					}
				}
			}
		}
	}
}

// amxTypes returns the weight types this CPU runs AMX kernels for, with the
// AMX kernels on for the test whatever STRATA_CPU says, and skips the test
// when there are none.
func amxTypes(t *testing.T) []ggml.Type {
	saved := noAMX
	noAMX = false
	t.Cleanup(func() { noAMX = saved })
	var types []ggml.Type
	for _, typ := range []ggml.Type{ggml.Q4_0, ggml.IQ4_NL, ggml.IQ4_XS, ggml.Q4_K, ggml.Q5_K, ggml.Q6_K} {
		if ps := archPanels(typ); ps != nil && ps.amxKernel() != nil {
			types = append(types, typ)
		}
	}
	if len(types) == 0 {
		t.Skip("no AMX kernels on this CPU")
	}
	return types
}

// TestAMXMatMulEqualsPortable: MatMul with enough activation rows for the
// AMX kernels (whole groups, a partial last panel, rows left for the VNNI
// kernels, one and two workers) gives the portable kernels' bits.
func TestAMXMatMulEqualsPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 44))
	p1, p2 := NewPool(1), NewPool(2)
	defer p1.Close()
	defer p2.Close()
	for _, typ := range amxTypes(t) {
		const N, K = 150, 512
		var data []byte
		if isKPanel(typ) {
			data = kWeights(t, r, typ, N, K)
		} else {
			wrow := mustRowBytes(t, typ, K)
			data = make([]byte, N*wrow)
			for i := range N {
				copy(data[i*wrow:], randRow(t, r, typ, K))
			}
		}
		w := &model.Weight{Name: "w", Type: typ, Rows: N, Cols: K, Data: data}
		for _, R := range []int{16, 35, 64} {
			x := randActVec(r, R*K)
			var want []float32
			withPortable(func() {
				want = make([]float32, R*N)
				NewBackend(p1).MatMul(w, x, R, want)
			})
			for _, p := range []*Pool{p1, p2} {
				got := make([]float32, R*N)
				NewBackend(p).MatMul(w, x, R, got)
				if !sameBits(got, want) {
					t.Fatalf("%s, %d rows, %d workers: MatMul differs from the portable kernels", ISA(typ), R, p.Workers())
				}
			}
		}
	}
}
