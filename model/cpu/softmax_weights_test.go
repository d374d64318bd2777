package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// chunkWeights is the weights pass the softmaxWeights kernels compute, one head
// in scalar Go, as the portable loops (softmaxValuesF16) order it: each
// score scaled; the running maximum M; the exponent e of each key, M-x for
// a new maximum x and x-M otherwise; its expf; the weights ms = e, vs = 1
// for a new maximum and ms = 1, vs = e otherwise; and the running sum S =
// fma(S, ms, vs), key by key (softmaxSum).
func chunkWeights(s, ms, vs []float32, M, S *float32, scale float32) {
	m, sum := *M, *S
	vs = vs[:len(s)]
	ms = ms[:len(s)]
	for k, x := range s {
		x *= scale
		if x > m {
			ms[k], vs[k] = expf(m-x), 1
			m = x
		} else {
			ms[k], vs[k] = 1, expf(x-m)
		}
		sum = softmaxSum(sum, ms[k], vs[k])
	}
	*M, *S = m, sum
}

// TestSoftmaxWeightsKernel: the weights kernels, one head and two, equal
// chunkWeights bit for bit on every chunk length, on scores with ties,
// signed zeros, infinities and NaNs, new maxima anywhere, and carried
// maxima and sums of any kind; they write nothing past n.
func TestSoftmaxWeightsKernel(t *testing.T) {
	ran := false
	if haveElementwise() {
		testSoftmaxWeightsKernel(t, softmaxWeightsx1AVX512, softmaxWeightsx2AVX512)
		ran = true
	}
	if haveElementwiseAVX2() {
		testSoftmaxWeightsKernel(t, softmaxWeightsx1AVX2, softmaxWeightsx2AVX2)
		ran = true
	}
	if !ran {
		t.Skip("no AVX-512 or AVX2")
	}
}

func testSoftmaxWeightsKernel(t *testing.T, x1, x2 func(n int, s, ms, vs, m, sum *float32, scale float32)) {
	r := rand.New(rand.NewPCG(61, 62))
	special := []float32{0, float32(math.Copysign(0, -1)), 1, -1, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 3e38, -3e38, 1e-40}
	score := func(kind int) float32 {
		switch {
		case kind == 0 && r.IntN(8) == 0:
			return special[r.IntN(len(special))]
		case kind == 1: // few distinct values: ties everywhere
			return float32(r.IntN(4) - 2)
		case kind == 2: // rising: a new maximum at every key
			return 0
		}
		return float32(r.NormFloat64() * 10)
	}
	for it := range 4000 {
		n := 1 + r.IntN(64)
		H := 1 + it%2
		kind := r.IntN(4)
		scale := []float32{1, 0.125, 1 / float32(math.Sqrt(128)), 3}[r.IntN(4)]
		var s, ms, vs [128]float32
		for i := range s {
			s[i] = score(kind)
			if kind == 2 {
				s[i] = float32(i%64) * 0.5
			}
			ms[i], vs[i] = -7, -7
		}
		var M, S [2]float32
		for h := range 2 {
			M[h] = []float32{float32(math.Inf(-1)), 0, float32(r.NormFloat64() * 10), float32(math.Inf(1)), float32(math.NaN())}[r.IntN(5)]
			S[h] = []float32{0, float32(r.ExpFloat64() * 100), float32(math.Inf(1))}[r.IntN(3)]
		}
		gotM, gotS := M, S
		if H == 2 {
			x2(n, &s[0], &ms[0], &vs[0], &gotM[0], &gotS[0], scale)
		} else {
			x1(n, &s[0], &ms[0], &vs[0], &gotM[0], &gotS[0], scale)
		}
		for h := range H {
			e, f := make([]float32, n), make([]float32, n)
			wantM, wantS := M[h], S[h]
			chunkWeights(s[64*h:64*h+n], e, f, &wantM, &wantS, scale)
			same := func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b }
			if !same(gotM[h], wantM) || !same(gotS[h], wantS) {
				t.Fatalf("it %d, n %d, head %d of %d: M %v S %v, want %v %v (scores %v, M %v S %v before)", it, n, h, H, gotM[h], gotS[h], wantM, wantS, s[64*h:64*h+n], M[h], S[h])
			}
			for k := range 64 {
				gm, gv := ms[64*h+k], vs[64*h+k]
				if k >= n {
					if gm != -7 || gv != -7 {
						t.Fatalf("it %d: head %d key %d past n %d written: %v %v", it, h, k, n, gm, gv)
					}
					continue
				}
				if !same(gm, e[k]) || !same(gv, f[k]) {
					t.Fatalf("it %d, n %d, head %d of %d, key %d (score %v, scale %v, M %v before, kind %d): weights %v %v, want %v %v; scores %v", it, n, h, H, k, s[64*h+k], scale, M[h], kind, gm, gv, e[k], f[k], s[64*h:64*h+k+1])
				}
			}
		}
		if H == 1 && (gotM[1] != M[1] && !(M[1] != M[1]) || gotS[1] != S[1]) {
			t.Fatalf("it %d: one head's kernel changed head 1's state", it)
		}
	}
}
