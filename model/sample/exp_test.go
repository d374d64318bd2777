package sample

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestExpNeg checks what fastBound assumes of each term: expNeg(x) is within
// expTermErr + 2|x| units of 2^-53, relative, of math.Exp(x) (the table
// entries each the float64 nearest 2^(j/256), the polynomial within 2 ulps,
// the one-step reduction's error growing with |x|), and 0 only where
// math.Exp is below 1e-300. It also checks that sumCollect's written-out
// copy computes the same terms.
func TestExpNeg(t *testing.T) {
	for j := range expN {
		got := math.Float64frombits(expTab[j] + uint64(j)<<(52-expBits))
		want := math.Exp2(float64(j) / expN)
		if ulps := math.Abs(got-want) / (want * 0x1p-52); ulps > 1 {
			t.Errorf("2^(%d/%d) = %v, math.Exp2 %v: %.2f ulps apart", j, expN, got, want, ulps)
		}
	}

	rng := rand.New(rand.NewPCG(31, 32))
	worst, worstX := 0.0, 0.0
	check := func(x float64) {
		got, want := expNeg(x), math.Exp(x)
		if got == 0 {
			if want >= 1e-300 {
				t.Fatalf("expNeg(%v) = 0, math.Exp %v", x, want)
			}
			return
		}
		units := math.Abs(got-want) / (want * 0x1p-53)
		if units > expTermErr+2*math.Abs(x) {
			t.Fatalf("expNeg(%v) = %v, math.Exp %v: %.1f units of 2^-53 apart, bound %.1f", x, got, want, units, expTermErr+2*math.Abs(x))
		}
		if e := units / (1 + 2*math.Abs(x)); e > worst {
			worst, worstX = e, x
		}
	}
	for range 2_000_000 {
		switch rng.IntN(4) {
		case 0: // where the probability mass is
			check(-rng.Float64() * 4)
		case 1: // the bulk of a vocabulary below the peaks
			check(-rng.Float64() * 60)
		case 2: // everywhere, down past the cut
			check(-rng.Float64() * 750)
		case 3: // differences of float32 logits, as Sample forms them
			a, b := float32(8*rng.NormFloat64()), float32(8*rng.NormFloat64())
			check(float64(min(a, b)) - float64(max(a, b)))
		}
	}
	for _, x := range []float64{0, math.Copysign(0, -1), -1e-300, -0x1p-60, -math.Ln2 / 512, -math.Ln2, -1, -expMin + 1e-9, expMin, expMin - 1e-9, -745, -746, math.Inf(-1)} {
		check(-math.Abs(x))
	}
	t.Logf("worst: %.2f units of 2^-53 per (1 + 2|x|), at x = %v", worst, worstX)

	// The written-out copies: a one-term sum is the term.
	for range 100_000 {
		l, m := float32(8*rng.NormFloat64()), 20*rng.Float64()
		if float64(l) > m {
			continue
		}
		if z, _ := sumCollect([]float32{l}, m, 0, nil); z.v != expNeg(float64(l)-m) {
			t.Fatalf("sumCollect term for %v - %v = %v, expNeg %v", l, m, z.v, expNeg(float64(l)-m))
		}
		invT := 1 / (0.1 + 2*rng.Float64())
		if z := expSum([]float32{l}, m, invT); z.v != expNeg((float64(l)-m)*invT) {
			t.Fatalf("expSum term for (%v - %v)/%v = %v, expNeg %v", l, m, 1/invT, z.v, expNeg((float64(l)-m)*invT))
		}
	}
}

// TestExpSum checks the sums against the plain loop within their bound, and
// the candidates expSumCollect gathers.
func TestExpSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	for _, n := range []int{1, 5, 1000, 151936} {
		w := randomLogits(rng, n, 0)
		if n > 1 {
			w[rng.IntN(n)] = float32(math.Inf(-1))
		}
		m := math.Inf(-1)
		for _, l := range w {
			m = max(m, float64(l))
		}
		for _, invT := range []float64{1, 1 / 0.7, 1 / 1.5} {
			got, want := expSum(w, m, invT), plainSum(w, m, invT).v
			if !(math.Abs(got.v-want) <= got.err) {
				t.Errorf("n %d, 1/t %v: sum %v, plain %v: %g apart, bound %g", n, invT, got.v, want, math.Abs(got.v-want), got.err)
			}
			t.Logf("n %d, 1/t %.2f: %.3g apart (%.3g relative), bound %.3g", n, invT, math.Abs(got.v-want), math.Abs(got.v-want)/want, got.err)
		}
		theta := float32(m - 10)
		idx := make([]int32, n)
		z, c := expSumCollect(w, m, theta, idx)
		if z != expSum(w, m, 1) {
			t.Errorf("n %d: expSumCollect sum %v, expSum %v", n, z, expSum(w, m, 1))
		}
		var want []int32
		for i, l := range w {
			if l >= theta {
				want = append(want, int32(i))
			}
		}
		if c != len(want) || collect(w, theta, make([]int32, n)) != c {
			t.Fatalf("n %d: collected %d, want %d", n, c, len(want))
		}
		for i := range want {
			if idx[i] != want[i] {
				t.Fatalf("n %d: candidate %d is %d, want %d", n, i, idx[i], want[i])
			}
		}
	}
}
