package sample

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// refSample is Sample written the plain way, as the package doc defines it:
// process the logits, sort the whole vocabulary, take the softmax over all
// of it with math.Exp, filter, and draw with the same uniform. The sums are
// taken in the orders the doc's definition fixes (the vocabulary in ID
// order; the kept candidates in sorted order), since a different order can
// round differently.
func refSample(logits []float32, p *Params, history []int32, position int) Result {
	n := len(logits)
	w := make([]float32, n)
	for i, l := range logits {
		switch {
		case l != l:
			l = float32(math.Inf(-1))
		case l > math.MaxFloat32:
			l = math.MaxFloat32
		}
		w[i] = l
	}
	if len(history) > 0 && (p.RepetitionPenalty != 1 || p.FrequencyPenalty != 0 || p.PresencePenalty != 0) {
		counts := map[int32]int{}
		for _, id := range history {
			if id >= 0 && int(id) < n {
				counts[id]++
			}
		}
		for id, c := range counts {
			l := w[id]
			if p.RepetitionPenalty != 1 {
				if l > 0 {
					l /= p.RepetitionPenalty
				} else {
					l *= p.RepetitionPenalty
				}
			}
			l -= float32(c)*p.FrequencyPenalty + p.PresencePenalty
			w[id] = min(l, math.MaxFloat32)
		}
	}
	for id, b := range p.LogitBias {
		if id >= 0 && int(id) < n {
			w[id] += b
		}
	}

	// Sort by (logit descending, ID ascending) as one integer key: the
	// float32's bits made to order as integers, inverted, then the ID.
	keys := make([]uint64, n)
	for i, l := range w {
		b := math.Float32bits(l)
		if b>>31 == 1 {
			b = ^b
		} else {
			b |= 1 << 31
		}
		keys[i] = uint64(^b)<<32 | uint64(i)
	}
	slices.Sort(keys)
	order := make([]int32, n)
	for i, k := range keys {
		order[i] = int32(uint32(k))
	}
	if math.IsInf(float64(w[order[0]]), -1) {
		res := Result{Token: 0, Logprob: float32(math.Inf(-1))}
		for i := range min(p.TopLogprobs, n) {
			res.Top = append(res.Top, TokenLogprob{Token: int32(i), Logprob: res.Logprob})
		}
		return res
	}
	m := float64(w[order[0]])
	var z float64
	for _, l := range w {
		z += math.Exp(float64(l) - m)
	}
	logZ := math.Log(z)
	logprob := func(id int32) float32 { return float32(float64(w[id]) - m - logZ) }

	tok := order[0]
	if p.Temperature > 0 {
		kept, pool := n, z
		if p.TopK > 0 && p.TopK < n {
			kept, pool = p.TopK, 0
			for _, id := range order[:kept] {
				pool += math.Exp(float64(w[id]) - m)
			}
		}
		if p.MinP > 0 {
			thr := m + math.Log(float64(p.MinP))
			c := 0
			for _, l := range w {
				if float64(l) >= thr {
					c++
				}
			}
			kept = min(kept, c)
		}
		if p.TopP < 1 {
			target, cum := float64(p.TopP)*pool, 0.0
			for i, id := range order[:kept] {
				cum += math.Exp(float64(w[id]) - m)
				if cum >= target {
					kept = i + 1
					break
				}
			}
		}
		invT := 1 / float64(p.Temperature)
		weight := func(id int32) float64 { return math.Exp((float64(w[id]) - m) * invT) }
		var zT float64
		switch {
		case kept == n && p.Temperature == 1:
			zT = z
		case kept == n && p.TopP == 1: // nothing was truncated: the vocabulary in ID order
			for i := range w {
				zT += weight(int32(i))
			}
		default:
			for _, id := range order[:kept] {
				zT += weight(id)
			}
		}
		tok = refDraw(order[:kept], weight, uniform(p.Seed, position)*zT)
	}
	res := Result{Token: tok, Logprob: logprob(tok)}
	if p.NoLogprob && p.TopLogprobs == 0 {
		res.Logprob = float32(math.NaN())
	}
	for _, id := range order[:min(p.TopLogprobs, n)] {
		res.Top = append(res.Top, TokenLogprob{Token: id, Logprob: logprob(id)})
	}
	return res
}

// refDraw returns the first of kept at which the running weight exceeds
// target, or, if rounding never lets it, the last with any weight.
func refDraw(kept []int32, weight func(int32) float64, target float64) int32 {
	cum, last := 0.0, int32(-1)
	for _, id := range kept {
		wt := weight(id)
		if wt > 0 {
			last = id
		}
		cum += wt
		if cum > target {
			return id
		}
	}
	return last
}

// randomLogits returns one of several shapes of row, chosen by kind.
func randomLogits(rng *rand.Rand, n, kind int) []float32 {
	l := make([]float32, n)
	switch kind {
	case 0: // a real model's: normal bulk, a few peaks
		for i := range l {
			l[i] = float32(3 * rng.NormFloat64())
		}
		for range 1 + rng.IntN(10) {
			l[rng.IntN(n)] = float32(8 + 16*rng.Float64())
		}
	case 1: // flat: the nucleus is much of the vocabulary
		for i := range l {
			l[i] = float32(rng.NormFloat64())
		}
	case 2: // few values: ties everywhere, at every boundary
		v := 1 + rng.IntN(6)
		for i := range l {
			l[i] = float32(rng.IntN(v))
		}
	case 3: // -Inf, NaN and +Inf among ordinary logits
		for i := range l {
			switch r := rng.IntN(10); {
			case r < 3:
				l[i] = float32(math.Inf(-1))
			case r == 3:
				l[i] = float32(math.NaN())
			case r == 4 && rng.IntN(20) == 0:
				l[i] = float32(math.Inf(1))
			default:
				l[i] = float32(4 * rng.NormFloat64())
			}
		}
	case 4: // one token far above the rest
		for i := range l {
			l[i] = float32(rng.NormFloat64())
		}
		l[rng.IntN(n)] = 40 + 20*float32(rng.Float64())
	case 5: // almost all impossible
		for i := range l {
			l[i] = float32(math.Inf(-1))
		}
		for range rng.IntN(3) {
			l[rng.IntN(n)] = float32(rng.NormFloat64())
		}
	}
	return l
}

// randomParams returns valid Params for a vocabulary of n, often with
// several filters, penalties and bias at once.
func randomParams(rng *rand.Rand, n int) *Params {
	pick := func(vs ...float32) float32 { return vs[rng.IntN(len(vs))] }
	p := DefaultParams()
	p.Temperature = pick(0, 0.25, 0.8, 1, 1, 1.7)
	p.TopK = []int{0, 0, 1, 2, 40, n, n + 5}[rng.IntN(7)]
	p.TopP = pick(1, 1, 0.1, 0.5, 0.9, 0.95, 0.999)
	p.MinP = pick(0, 0, 0.001, 0.05, 0.3, 1)
	if rng.IntN(3) == 0 {
		p.RepetitionPenalty = pick(1.1, 0.8, 2)
		p.FrequencyPenalty = pick(0, 0.5, -0.3)
		p.PresencePenalty = pick(0, 0.25, -1)
	}
	if rng.IntN(3) == 0 {
		p.LogitBias = map[int32]float32{}
		for range 1 + rng.IntN(4) {
			p.LogitBias[int32(rng.IntN(n))] = pick(-100, -5, 0, 3, 100)
		}
	}
	p.TopLogprobs = []int{0, 0, 1, 5, 20}[rng.IntN(5)]
	p.NoLogprob = rng.IntN(2) == 0
	p.Seed = rng.Uint64()
	return &p
}

// logprobClose reports whether a Sample logprob matches the reference's.
// They differ only through the vocabulary sum (expSum against math.Exp),
// which moves log z by a few units of 2^-53: the float32 results are equal
// but where the exact value lies that close to a rounding boundary.
func logprobClose(got, want float32) bool {
	if got == want || math.IsNaN(float64(got)) && math.IsNaN(float64(want)) {
		return true
	}
	ulp := math.Nextafter32(want, 0) - want
	return math.Abs(float64(got-want)) <= math.Abs(float64(ulp))+1e-13
}

func checkAgainstReference(t *testing.T, s *Sampler, logits []float32, p *Params, history []int32, pos int) {
	t.Helper()
	got := s.Sample(logits, p, history, pos)
	want := refSample(logits, p, history, pos)
	desc := func() string {
		return fmt.Sprintf("n %d, params %+v, history %v, position %d", len(logits), *p, history, pos)
	}
	if got.Token != want.Token {
		t.Fatalf("token %d, reference %d; %s", got.Token, want.Token, desc())
	}
	if !logprobClose(got.Logprob, want.Logprob) {
		t.Fatalf("logprob %v, reference %v; %s", got.Logprob, want.Logprob, desc())
	}
	if len(got.Top) != len(want.Top) {
		t.Fatalf("%d top logprobs, reference %d; %s", len(got.Top), len(want.Top), desc())
	}
	for i := range got.Top {
		g, w := got.Top[i], want.Top[i]
		if g.Token != w.Token || !logprobClose(g.Logprob, w.Logprob) {
			t.Fatalf("top[%d] = %+v, reference %+v; %s", i, g, w, desc())
		}
	}
}

// TestSampleMatchesReference compares Sample with refSample on many seeded
// random rows and settings: ties, -Inf, NaN and +Inf logits, penalties and
// bias, every filter, greedy and drawn, small vocabularies and Qwen's. The
// token must be the same every time, and the logprobs equal but for the last
// bit.
func TestSampleMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, 26))
	var s Sampler // one sampler throughout: scratch reuse must not leak
	trials := 3000
	if testing.Short() {
		trials = 300
	}
	for range trials {
		n := []int{1, 2, 3, 7, 64, 65, 300, 2000}[rng.IntN(8)]
		logits := randomLogits(rng, n, rng.IntN(6))
		history := make([]int32, rng.IntN(8))
		for i := range history {
			history[i] = int32(rng.IntN(n+2) - 1) // some out of range
		}
		for range 4 {
			checkAgainstReference(t, &s, logits, randomParams(rng, n), history, rng.IntN(1<<20))
		}
	}
}

// TestSampleMatchesReferenceQwen does the same at Qwen2.5/3's vocabulary
// size, where the candidates are a small part of the vocabulary.
func TestSampleMatchesReferenceQwen(t *testing.T) {
	const n = 151936
	rng := rand.New(rand.NewPCG(27, 28))
	var s Sampler
	rows := 6
	if testing.Short() {
		rows = 2
	}
	for r := range rows {
		logits := randomLogits(rng, n, []int{0, 0, 1, 2, 3, 4}[r%6])
		history := []int32{int32(rng.IntN(n)), int32(rng.IntN(n)), int32(rng.IntN(n))}
		for range 5 {
			checkAgainstReference(t, &s, logits, randomParams(rng, n), history, rng.IntN(1<<20))
		}
		// The benchmark's settings, which the fast paths are built for.
		for _, mod := range []func(*Params){
			nil,
			func(p *Params) { p.TopLogprobs = 5 },
			func(p *Params) { p.Temperature = 0.8; p.TopP = 0.95 },
			func(p *Params) { p.Temperature = 0.8; p.TopK = 40 },
			func(p *Params) {
				p.Temperature = 0.8
				p.TopK = 40
				p.TopP = 0.95
				p.MinP = 0.05
				p.RepetitionPenalty = 1.1
			},
			func(p *Params) { p.Temperature = 1 },
			func(p *Params) { p.Temperature = 0.7; p.NoLogprob = true },
		} {
			checkAgainstReference(t, &s, logits, params(mod), history, rng.IntN(1<<20))
		}
	}
}

// TestBoundSettles checks the decisions that rest on the vocabulary sum
// (top-p's target without top-k, the draw's total at temperature 1 without
// truncation) against the plain sum: with the bound made so loose that
// nearly every step falls inside it, each must still come out as with the
// plain sum itself, so a step inside the bound must be settled by the plain
// sum, neither taken nor skipped on the fast value. Real bounds are some
// 1e-11 of the sum wide, too narrow for random rows to land in.
func TestBoundSettles(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 30))
	for trial := range 2000 {
		n := 1 + rng.IntN(12)
		logits := randomLogits(rng, n, 2) // ties: running sums meet targets exactly
		if trial%2 == 0 {
			logits = randomLogits(rng, n, 0)
		}
		var s Sampler
		if math.IsInf(float64(s.Sample(logits, params(nil), nil, 0).Logprob), -1) {
			continue
		}
		loose := bounded{v: s.z.v, err: s.z.v * rng.Float64()}
		plain := plainSum(s.work, s.m, 1)
		p := params(func(p *Params) { p.Temperature = 1; p.TopP = []float32{0.25, 0.5, 0.75, 0.9, 1}[rng.IntN(5)] })

		s.z, s.sorted = plain, -1
		want := s.truncate(p)
		s.z, s.sorted = loose, -1
		if got := s.truncate(p); got != want {
			t.Fatalf("logits %v, top-p %v: kept %d with a loose bound, %d with the plain sum", logits, p.TopP, got, want)
		}

		// u at, just below and just above the running sums' fractions.
		u := float64(rng.IntN(n+1)) / float64(n)
		u = []float64{u, math.Nextafter(u, 0), math.Nextafter(u, 1)}[rng.IntN(3)]
		u = min(u, math.Nextafter(1, 0))
		s.z, s.sorted = plain, -1
		wantTok := s.draw(n, 1, u)
		s.z, s.sorted = loose, -1
		if got := s.draw(n, 1, u); got != wantTok {
			t.Fatalf("logits %v, u %v: drew %d with a loose bound, %d with the plain sum", logits, u, got, wantTok)
		}
	}
}
