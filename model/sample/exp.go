package sample

import (
	"math"
	"math/big"
)

// The sum of exp(logit - max) over the vocabulary is the one pass that
// costs: math.Exp is a call of about 10 ns of dependent arithmetic, and a
// vocabulary has up to 152,000 tokens. expNeg is an inlined exp for the
// non-positive arguments that sum needs, within a few ulps of math.Exp. What
// decides a token (top-p's target, the draw's total) must still equal what
// the plain math.Exp sum gives, so that sum is carried as a bound: the fast
// value and an error bound on its distance from the plain sum. A decision the
// bound cannot settle (a running sum within the bound of its target) computes
// the plain sum; everything else is decided exactly without it.

const (
	expBits  = 8
	expN     = 1 << expBits    // table entries: 2^(j/expN)
	expScale = expN / math.Ln2 // x*expScale is x in units of ln2/expN
	expMagic = 0x1.8p52        // adding it rounds to an integer in the low bits
	// expLn2 is ln2/expN. Reducing x by k*expLn2 in one step rather than
	// two (as FreeBSD's exp does) leaves r off by up to |x|*2^-52, so a
	// term's relative error grows by 2|x| units of 2^-53: at most 0.75 per
	// term on average over any sum, since x*e^x >= -1/e (see fastBound).
	expLn2 = math.Ln2 / expN
	// expMin is where expNeg stops: e^-700 < 2^-1009, which a sum holding
	// e^0 = 1 cannot see, and 2^k stays a normal float64 above it.
	expMin = -700
)

// expTab[j] is 2^(j/expN) as float64 bits, less j<<(52-expBits), so that
// adding k<<(52-expBits) for k = e*expN + j yields 2^(e + j/expN).
var expTab = func() (t [expN]uint64) {
	// 2^(1/expN) by expBits square roots of 2 at 160 bits, then its powers:
	// each entry is the float64 nearest 2^(j/expN), whatever the machine.
	const prec = 160
	r := new(big.Float).SetPrec(prec).SetInt64(2)
	for range expBits {
		r.Sqrt(r)
	}
	p := new(big.Float).SetPrec(prec).SetInt64(1)
	for j := range t {
		f, _ := p.Float64()
		t[j] = math.Float64bits(f) - uint64(j)<<(52-expBits)
		p.Mul(p, r)
	}
	return t
}()

// expNeg returns e^x for x <= 0 (and 0 below expMin, -Inf included): 2^k
// from the table times a degree-4 polynomial for e^r, |r| <= ln2/512. Its
// error is within 2 ulps plus the reduction's |x|*2^-52 (TestExpNeg).
// sumCollect has the same code written out. The float64 conversions keep
// the compiler from fusing a multiply and an add, so the result does not
// depend on GOAMD64.
func expNeg(x float64) float64 {
	if !(x >= expMin) {
		return 0
	}
	kf := float64(x*expScale) + expMagic
	ki := math.Float64bits(kf) // k in the low bits, two's complement
	kf -= expMagic
	r := x - float64(kf*expLn2)
	// e^r - 1 = r(1 + r/2) + r^3(1/6 + r/24), in two halves (Estrin's
	// scheme): the loops are bound by latency.
	q := float64(float64(float64(r*0.5)+1)*r) + float64(float64(float64(r*(1.0/24))+1.0/6)*float64(float64(r*r)*r))
	s := math.Float64frombits(expTab[ki%expN] + ki<<(52-expBits))
	return s + float64(s*q)
}

// bounded is a sum of exponentials known to lie within err of the sum the
// plain loop gives (math.Exp of each term, added in token ID order). err is
// 0 once the plain sum itself is known.
type bounded struct {
	v, err float64
}

// expTermErr bounds how far expNeg(x) is from math.Exp(x), in units of
// 2^-53 relative, apart from the reduction's 2|x| (see expLn2). TestExpNeg
// checks it: the two are measured under 4 units apart, each being within
// about 1 ulp of e^x; the rest is margin.
const expTermErr = 32

// fastBound is the bound for v, a sum of n expNeg terms each at most 1,
// added in any order, against the plain loop over the same n arguments.
// Each sum of non-negative terms is within (n-1)*2^-53 of its exact value
// (Higham, "Accuracy and Stability of Numerical Algorithms", 4.2); the
// terms differ by at most expTermErr units each plus the reduction's 2|x|
// units, which sum to at most 0.75n units of e^x; v >= 1 holds the largest
// term; and expNeg drops terms below e^expMin < 1e-300. The factor 2 leaves
// room for rounding v ± err.
func fastBound(v float64, n int) bounded {
	rel := (3*float64(n) + expTermErr) * 0x1p-53
	return bounded{v: v, err: 2*rel*v + float64(n)*1e-300}
}

// scaled returns c times the least and the greatest value the plain sum can
// have, rounded as the plain code rounds c*sum: for c >= 0, c*plain lies in
// [lo, hi], and lo == hi == c*plain when err is 0.
func (b bounded) scaled(c float64) (lo, hi float64) {
	return c * (b.v - b.err), c * (b.v + b.err)
}

// expSum returns the sum of e^((w[i]-m)*invT) over w, with its bound. m is
// the largest of w, so every term is at most 1.
func expSum(w []float32, m, invT float64) bounded {
	if invT == 1 {
		z, _ := sumCollect(w, m, 0, nil)
		return z
	}
	// sumCollect's loop with the temperature, written out again: the
	// multiply costs the loop at temperature 1 some 5%.
	var z float64
	for _, l := range w {
		x := (float64(l) - m) * invT
		if !(x >= expMin) {
			continue
		}
		kf := float64(x*expScale) + expMagic
		ki := math.Float64bits(kf)
		kf -= expMagic
		r := x - float64(kf*expLn2)
		q := float64(float64(float64(r*0.5)+1)*r) + float64(float64(float64(r*(1.0/24))+1.0/6)*float64(float64(r*r)*r))
		s := math.Float64frombits(expTab[ki%expN] + ki<<(52-expBits))
		z += s + float64(s*q)
	}
	return fastBound(z, len(w))
}

// expSumCollect is expSum at temperature 1 that also writes to idx, in ID
// order, the IDs i with w[i] >= theta, and returns how many it wrote.
func expSumCollect(w []float32, m float64, theta float32, idx []int32) (bounded, int) {
	return sumCollect(w, m, theta, idx[:len(w)])
}

// sumCollect is expSum at temperature 1, and expSumCollect when idx is not
// nil, with expNeg written out in the loop (the compiler does not inline
// it; TestExpNeg checks the copies agree). The loop runs at about 3 ns a
// term on a Zen 4. When changing it, read its code (go tool objdump): a
// float32-to-float64 conversion (CVTSS2SD) into a register other than its
// source keeps that register's old upper half, the previous term's result,
// and so chains every term to the one before, three times slower.
func sumCollect(w []float32, m float64, theta float32, idx []int32) (bounded, int) {
	var z float64
	j := 0
	for i, l := range w {
		if idx != nil {
			idx[j] = int32(i)
			if l >= theta {
				j++
			}
		}
		x := float64(l) - m
		if !(x >= expMin) {
			continue
		}
		kf := float64(x*expScale) + expMagic
		ki := math.Float64bits(kf)
		kf -= expMagic
		r := x - float64(kf*expLn2)
		q := float64(float64(float64(r*0.5)+1)*r) + float64(float64(float64(r*(1.0/24))+1.0/6)*float64(float64(r*r)*r))
		s := math.Float64frombits(expTab[ki%expN] + ki<<(52-expBits))
		z += s + float64(s*q)
	}
	return fastBound(z, len(w)), j
}

// collect writes to idx, in ID order, the IDs i with w[i] >= theta and
// returns how many it wrote.
func collect(w []float32, theta float32, idx []int32) int {
	idx = idx[:len(w)]
	j := 0
	for i, l := range w {
		idx[j] = int32(i)
		if l >= theta {
			j++
		}
	}
	return j
}

// plainSum is the plain loop: math.Exp of each term in token ID order, the
// sum every decision is defined by.
func plainSum(w []float32, m, invT float64) bounded {
	var z float64
	for _, l := range w {
		z += math.Exp((float64(l) - m) * invT)
	}
	return bounded{v: z}
}
