package sample

import "math"

// Params are one request's sampling settings. The zero value is not "off" for
// TopP and RepetitionPenalty; start from DefaultParams.
type Params struct {
	// Temperature divides the logits before the draw; 0 means greedy.
	Temperature float32
	// TopK keeps the TopK most likely tokens; 0 (or >= vocabulary) is off.
	TopK int
	// TopP keeps the smallest prefix of the sorted tokens whose probability
	// sums to at least TopP; 1 is off.
	TopP float32
	// MinP keeps tokens whose probability is at least MinP times the largest;
	// 0 is off.
	MinP float32
	// RepetitionPenalty divides positive and multiplies negative logits of
	// tokens in history; 1 is off.
	RepetitionPenalty float32
	// FrequencyPenalty is subtracted once per occurrence in history; 0 is off.
	FrequencyPenalty float32
	// PresencePenalty is subtracted once for any occurrence in history; 0 is off.
	PresencePenalty float32
	// LogitBias is added to the logits of the tokens it names.
	LogitBias map[int32]float32
	// Seed keys the counter-based random draw together with the position.
	Seed uint64
	// TopLogprobs is how many most likely tokens Result.Top reports; 0 is none.
	TopLogprobs int
	// NoLogprob says the caller will not read Result.Logprob. With
	// TopLogprobs 0, Sample then leaves it NaN and skips the sum of
	// exponentials over the vocabulary that only it needs: greedy sampling
	// then takes no exp at all, and top-k or min-p only over the tokens they
	// keep. The zero value computes Logprob.
	NoLogprob bool

	// Constraint is the request's response format (OpenAI's
	// response_format object, compact JSON, at most MaxConstraint bytes)
	// when decoding is constrained to it; nil means free text. Sample
	// ignores it: the last stage compiles it (model/grammar) and masks the
	// logits before calling Sample, so that every filter, the draw and the
	// logprobs see the masked logits.
	Constraint []byte
	// OutputStart is the position of the request's first generated token
	// (the original prompt's length): a constrained sequence's automaton
	// reads the tokens from there on, including those a recomputed
	// sequence re-reads as prefill.
	OutputStart int
	// Output holds a recomputed constrained sequence's generated tokens
	// that precede its first row (positions [OutputStart, first row's Pos),
	// skipped by a prefix-cache hit), so that the automaton reads them
	// although the stage computes nothing for them.
	Output []int32
	// OutputEnd is the position after the last token the request may
	// generate (OutputStart + max_tokens); 0 means no bound. A
	// constrained sequence's last stage then allows only tokens after which
	// the document can still close before it, so that max_tokens cuts no
	// document short.
	OutputEnd int
}

// DefaultParams returns greedy sampling with every filter and penalty off.
func DefaultParams() Params {
	return Params{TopP: 1, RepetitionPenalty: 1}
}

// TokenLogprob is a token and its log-probability.
type TokenLogprob struct {
	Token   int32
	Logprob float32
}

// Result is the sampled token, its log-probability and the alternatives asked
// for. Logprobs are of the logits after penalties and bias, before
// truncation and temperature (see the package doc).
type Result struct {
	Token   int32
	Logprob float32
	// Top holds the Params.TopLogprobs most likely tokens, most likely first,
	// ties by lower ID; nil when none were asked for. The caller owns it.
	Top []TokenLogprob
}

// Sampler holds scratch buffers for Sample. It keeps no per-sequence state.
// It is not safe for concurrent use; the zero value is ready to use.
type Sampler struct {
	work []float32 // processed logits, indexed by token ID
	// idx[:ncand] are the candidates, of which idx[:sorted] are the best,
	// in order; sorted < 0: not set up this call (see select.go).
	idx     []int32
	sorted  int
	ncand   int
	floorV  float32 // the candidates are the tokens at or above the floor
	floorID int32
	counts  []int32 // history counts; all zero between calls
	heap    []int32 // scratch for selectTop and selectFew

	m float64 // the largest processed logit, this call
	// z is the sum of exp(w - m) over the vocabulary, this call, once
	// haveZ; z.err > 0 while it is expSum's value rather than plainSum's.
	z     bounded
	haveZ bool
}

// firstChunk is how many candidates the lazy sort orders first. Most of an
// LLM's probability mass sits in far fewer tokens, so top-p and the draw
// usually stop inside it; each further extension doubles the sorted prefix.
const firstChunk = 64

// maxFew is the largest first selection done with a heap in one pass
// (selectFew) rather than by quickselect; it covers top-k as clients use it.
const maxFew = 1024

// spanDefault is how far below the largest logit the candidates reach when
// no filter bounds them: a token there weighs under e^-16 (1e-7) of the
// largest, so the draw and the top logprobs almost never look further.
const spanDefault = 16

// Sample picks one token from logits (one per vocabulary entry) with p, as
// the package doc describes. position is the index of the token being
// sampled in its sequence and, with p.Seed, fixes the random draw.
func (s *Sampler) Sample(logits []float32, p *Params, history []int32, position int) Result {
	n := len(logits)
	if n == 0 {
		panic("sample: empty logits")
	}
	s.grow(n)
	w := s.work[:n]
	best := load(w, logits)
	if was := w[best]; s.process(w, p, history) {
		best = argmaxAfter(w, best, was, p, history)
	}
	mx := w[best]
	s.sorted = -1 // idx not set up for this call
	s.haveZ = false
	if math.IsInf(float64(mx), -1) {
		res := Result{Token: 0, Logprob: float32(math.Inf(-1))}
		if p.TopLogprobs > 0 {
			res.Top = make([]TokenLogprob, min(p.TopLogprobs, n))
			for i := range res.Top {
				res.Top[i] = TokenLogprob{Token: int32(i), Logprob: res.Logprob}
			}
		}
		return res
	}
	m := float64(mx)
	s.m = m

	// One pass over the vocabulary sums the exponentials, when anything
	// needs them, and collects the candidates the filters and the draw can
	// reach. Top-k alone skips both: selectTop finds its candidates.
	topK := p.TopK > 0 && p.TopK < n
	needLogprob := !p.NoLogprob || p.TopLogprobs > 0
	needZ := needLogprob || p.Temperature > 0 && !topK && (p.TopP < 1 || p.Temperature == 1 && p.MinP == 0)
	if p.Temperature > 0 && (needZ || !topK || p.MinP > 0) || p.TopLogprobs > 0 {
		theta := float32(m - span(p, n))
		if needZ {
			s.z, s.ncand = expSumCollect(w, m, theta, s.idx)
			s.haveZ = true
		} else {
			s.ncand = collect(w, theta, s.idx)
		}
		s.sorted, s.floorV, s.floorID = 0, theta, math.MaxInt32
	}

	tok := int32(best)
	if p.Temperature > 0 {
		kept := s.truncate(p)
		tok = s.draw(kept, p.Temperature, uniform(p.Seed, position))
	}
	res := Result{Token: tok, Logprob: float32(math.NaN())}
	if !needLogprob {
		return res
	}
	logZ := math.Log(s.vocabZ().v)
	logprob := func(id int32) float32 { return float32(float64(w[id]) - m - logZ) }
	res.Logprob = logprob(tok)
	if p.TopLogprobs > 0 {
		k := min(p.TopLogprobs, n)
		s.ensureSorted(k)
		res.Top = make([]TokenLogprob, k)
		for i, id := range s.idx[:k] {
			res.Top[i] = TokenLogprob{Token: id, Logprob: logprob(id)}
		}
	}
	return res
}

// span is how far below the largest logit a token can be and still matter
// for p: top-p keeps nothing below log((1-TopP)/n), since everything below
// weighs less than the 1-TopP the nucleus may leave out (the largest weighs
// 1); min-p keeps nothing below log(MinP). Tokens further down are only
// looked at when a walk runs past the candidates (ensureSorted widens them).
func span(p *Params, n int) float64 {
	t := spanDefault * max(1, float64(p.Temperature)) // the draw, at temperature t
	if p.Temperature == 0 {
		return t // greedy: the filters do not apply
	}
	if p.TopP < 1 {
		t = math.Log(float64(n)/(1-float64(p.TopP))) + 1
	}
	if p.MinP > 0 {
		t = min(t, 1-math.Log(float64(p.MinP)))
	}
	return t
}

// vocabZ returns the sum of exp(w - m) over the vocabulary, as a bound,
// computing it the fast way if this call has not.
func (s *Sampler) vocabZ() bounded {
	if !s.haveZ {
		s.z = expSum(s.work, s.m, 1)
		s.haveZ = true
	}
	return s.z
}

// plainZ replaces the vocabulary sum by the plain loop's, for a decision
// the bound could not settle.
func (s *Sampler) plainZ() bounded {
	s.z = plainSum(s.work, s.m, 1)
	s.haveZ = true
	return s.z
}

// load copies logits into w, NaN as -Inf and +Inf as the largest float32,
// and returns the index of the largest (the lowest index among equals). It
// keeps four running maxima so that the loop carries no dependency.
func load(w, logits []float32) int {
	n := len(logits)
	w = w[:n]
	ninf := float32(math.Inf(-1))
	m0, m1, m2, m3 := ninf, ninf, ninf, ninf
	i0, i1, i2, i3 := 0, 0, 0, 0
	i := 0
	for ; i+4 <= n; i += 4 {
		l := logits[i : i+4 : i+4]
		a, b, c, d := l[0], l[1], l[2], l[3]
		if !(a <= math.MaxFloat32 && b <= math.MaxFloat32 && c <= math.MaxFloat32 && d <= math.MaxFloat32) {
			a, b, c, d = clean(a), clean(b), clean(c), clean(d)
		}
		o := w[i : i+4 : i+4]
		o[0], o[1], o[2], o[3] = a, b, c, d
		if a > m0 {
			m0, i0 = a, i
		}
		if b > m1 {
			m1, i1 = b, i+1
		}
		if c > m2 {
			m2, i2 = c, i+2
		}
		if d > m3 {
			m3, i3 = d, i+3
		}
	}
	for ; i < n; i++ {
		a := clean(logits[i])
		w[i] = a
		if a > m0 {
			m0, i0 = a, i
		}
	}
	// Each lane holds its first maximum; the lowest index wins among equals.
	best, mx := i0, m0
	for _, c := range [...]struct {
		m float32
		i int
	}{{m1, i1}, {m2, i2}, {m3, i3}} {
		if c.m > mx || c.m == mx && c.i < best {
			best, mx = c.i, c.m
		}
	}
	if math.IsInf(float64(mx), -1) {
		return 0
	}
	return best
}

// clean maps NaN to -Inf and +Inf to the largest float32.
func clean(l float32) float32 {
	switch {
	case l != l:
		return float32(math.Inf(-1))
	case l > math.MaxFloat32:
		return math.MaxFloat32
	}
	return l
}

// grow sizes the scratch buffers for a vocabulary of n.
func (s *Sampler) grow(n int) {
	if cap(s.work) < n {
		s.work = make([]float32, n)
		s.idx = make([]int32, n)
		s.counts = make([]int32, n)
		s.heap = make([]int32, 0, min(n, maxFew))
	}
	s.work = s.work[:n]
	s.idx = s.idx[:n]
	s.counts = s.counts[:n]
}

// process applies the penalties and then LogitBias to w, and reports
// whether it changed anything. A penalty that takes a logit past the largest
// float32 leaves it there, as a +Inf logit is; a bias cannot (|bias| <=
// MaxBias is far below the largest float32's ulp).
func (s *Sampler) process(w []float32, p *Params, history []int32) bool {
	changed := s.penalize(w, p, history)
	for id, b := range p.LogitBias {
		if id >= 0 && int(id) < len(w) {
			w[id] += b
			changed = true
		}
	}
	return changed
}

// penalizing reports whether penalize changes anything.
func penalizing(p *Params, history []int32) bool {
	return len(history) > 0 && (p.RepetitionPenalty != 1 || p.FrequencyPenalty != 0 || p.PresencePenalty != 0)
}

// penalize applies the repetition, frequency and presence penalties to w for
// the tokens in history, each distinct token once, and reports whether it
// applied any.
func (s *Sampler) penalize(w []float32, p *Params, history []int32) bool {
	if !penalizing(p, history) {
		return false
	}
	rep, freq, pres := p.RepetitionPenalty, p.FrequencyPenalty, p.PresencePenalty
	n := int32(len(w))
	for _, id := range history {
		if id >= 0 && id < n {
			s.counts[id]++
		}
	}
	for _, id := range history {
		if id < 0 || id >= n || s.counts[id] == 0 {
			continue
		}
		c := s.counts[id]
		s.counts[id] = 0 // once per distinct token; leaves counts zeroed
		l := w[id]
		if rep != 1 {
			if l > 0 {
				l /= rep
			} else {
				l *= rep
			}
		}
		l -= float32(c)*freq + pres
		w[id] = min(l, math.MaxFloat32)
	}
	return true
}

// argmaxAfter returns the best token of w after process changed it; best
// was the best before, with logit was. Only the tokens process touched can
// have overtaken it, unless it was itself pushed down: then any token can.
func argmaxAfter(w []float32, best int, was float32, p *Params, history []int32) int {
	if w[best] < was {
		return argmax(w)
	}
	b := int32(best)
	if penalizing(p, history) {
		for _, id := range history {
			if id >= 0 && int(id) < len(w) && better(w, id, b) {
				b = id
			}
		}
	}
	for id := range p.LogitBias {
		if id >= 0 && int(id) < len(w) && better(w, id, b) {
			b = id
		}
	}
	return int(b)
}

// argmax returns the index of the largest of w, the lowest among equals.
func argmax(w []float32) int {
	best, mx := 0, w[0]
	for i, l := range w {
		if l > mx {
			best, mx = i, l
		}
	}
	return best
}

// truncate applies top-k, top-p and min-p and returns how many candidates
// survive: the first kept in sorted order (s.idx after ensureSorted(kept)).
func (s *Sampler) truncate(p *Params) int {
	w := s.work
	m := s.m
	n := len(w)
	kept := n // candidates kept: a prefix of the sorted order
	var pool bounded
	topK := p.TopK > 0 && p.TopK < n
	if topK {
		kept = p.TopK
		s.ensureSorted(kept)
		for _, id := range s.idx[:kept] {
			pool.v += math.Exp(float64(w[id]) - m)
		}
	}
	// Min-p keeps logits >= m + log(MinP): a prefix of the sorted order, so
	// counting it is enough, and intersecting it with the top-p prefix
	// below gives the set the chain order (top-p, then min-p) gives.
	if p.MinP > 0 {
		kept = min(kept, s.countAtLeast(m+math.Log(float64(p.MinP))))
	}
	if p.TopP < 1 {
		if !topK {
			pool = s.vocabZ()
		}
		// The plain code stops at the first cum >= TopP*pool. cum below lo
		// is below that target and cum at or above hi is not; between
		// them, only the plain sum can tell.
		c := float64(p.TopP)
		lo, hi := pool.scaled(c)
		cum := 0.0
		i := 0
	topP:
		for i < kept {
			s.extend(i+1, kept)
			for ; i < kept && i < s.sorted; i++ {
				cum += math.Exp(float64(w[s.idx[i]]) - m)
				if cum < lo {
					continue
				}
				if cum < hi {
					lo, hi = s.plainZ().scaled(c)
					if cum < lo {
						continue
					}
				}
				i++
				break topP
			}
		}
		kept = i
	}
	return kept
}

// countAtLeast returns how many tokens have a logit >= thr, looking only at
// the candidates when they hold every such token.
func (s *Sampler) countAtLeast(thr float64) int {
	c := 0
	if s.holdsAtLeast(thr) {
		for _, id := range s.idx[:s.ncand] {
			if float64(s.work[id]) >= thr {
				c++
			}
		}
		return c
	}
	for _, l := range s.work {
		if float64(l) >= thr {
			c++
		}
	}
	return c
}

// draw picks one of the first kept candidates in sorted order at temperature
// t with u in [0, 1): the first whose running weight exceeds u times the
// kept candidates' total weight.
func (s *Sampler) draw(kept int, t float32, u float64) int32 {
	w := s.work
	m := s.m
	n := len(w)
	invT := 1 / float64(t)
	weight := func(id int32) float64 { return math.Exp((float64(w[id]) - m) * invT) }
	// The total, summed in the order the plain code sums it; a sum over the
	// whole vocabulary comes as a bound (see truncate).
	var zT bounded
	plain := func() bounded { return plainSum(w, m, invT) }
	switch {
	case kept == n && t == 1:
		zT, plain = s.vocabZ(), s.plainZ
	case kept == n && s.sorted < n:
		zT = expSum(w, m, invT) // nothing truncated: no need to sort all
	default:
		s.ensureSorted(kept)
		for _, id := range s.idx[:kept] {
			zT.v += weight(id)
		}
	}
	lo, hi := zT.scaled(u)
	cum := 0.0
	last := int32(-1)
	for i := 0; i < kept; i++ {
		if i >= s.sorted {
			s.extend(i+1, kept)
		}
		id := s.idx[i]
		wt := weight(id)
		if wt > 0 {
			last = id
		}
		cum += wt
		if cum <= lo {
			continue
		}
		if cum <= hi {
			lo, hi = plain().scaled(u)
			if cum <= lo {
				continue
			}
		}
		return id
	}
	// Rounding left the running sum at or below target: take the least
	// likely kept token that has any weight.
	return last
}

// uniform returns a uniform float64 in [0, 1) from (seed, position): the
// SplitMix64 finaliser applied to the seed, then to that mixed with the
// position, keeping the top 53 bits.
func uniform(seed uint64, position int) float64 {
	z := mix64(seed + 0x9e3779b97f4a7c15)
	z = mix64(z ^ (uint64(position)+1)*0xd1b54a32d192ed03)
	return float64(z>>11) * 0x1p-53
}

func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
