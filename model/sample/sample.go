package sample

import (
	"math"
	"math/bits"
	"slices"
)

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
	work   []float32 // processed logits, indexed by token ID
	idx    []int32   // token IDs; idx[:sorted] are the best, in order
	sorted int
	counts []int32 // history counts; all zero between calls
	heap   []int32 // scratch for selectFew
}

// firstChunk is how many candidates the lazy sort orders first. Most of an
// LLM's probability mass sits in far fewer tokens, so top-p and the draw
// usually stop inside it; each further extension doubles the sorted prefix.
const firstChunk = 64

// maxFew is the largest first selection done with a heap in one pass
// (selectFew) rather than by quickselect; it covers top-k as clients use it.
const maxFew = 1024

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
	for i, l := range logits {
		switch {
		case l != l:
			l = float32(math.Inf(-1))
		case l > math.MaxFloat32:
			l = math.MaxFloat32
		}
		w[i] = l
	}
	s.penalize(w, p, history)
	for id, b := range p.LogitBias {
		if id >= 0 && int(id) < n {
			w[id] += b
		}
	}

	best, mx := 0, w[0]
	for i := 1; i < n; i++ {
		if w[i] > mx {
			best, mx = i, w[i]
		}
	}
	s.sorted = -1 // idx not initialised for this call
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

	// Log-softmax normaliser at temperature 1, summed in token ID order.
	m := float64(mx)
	var z float64
	for _, l := range w {
		z += math.Exp(float64(l) - m)
	}
	logZ := math.Log(z)
	logprob := func(id int32) float32 { return float32(float64(w[id]) - m - logZ) }

	tok := int32(best)
	if p.Temperature > 0 {
		kept := s.truncate(w, m, z, p)
		tok = s.draw(w, m, z, kept, p.Temperature, uniform(p.Seed, position))
	}
	res := Result{Token: tok, Logprob: logprob(tok)}
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

// penalize applies the repetition, frequency and presence penalties to w for
// the tokens in history, each distinct token once.
func (s *Sampler) penalize(w []float32, p *Params, history []int32) {
	rep, freq, pres := p.RepetitionPenalty, p.FrequencyPenalty, p.PresencePenalty
	if len(history) == 0 || (rep == 1 && freq == 0 && pres == 0) {
		return
	}
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
		w[id] = l
	}
}

// truncate applies top-k, top-p and min-p and returns how many candidates
// survive: the first kept in sorted order (s.idx after ensureSorted(kept)). m
// is the largest logit and z the sum of exp(l-m) over the vocabulary.
func (s *Sampler) truncate(w []float32, m, z float64, p *Params) int {
	n := len(w)
	kept := n // candidates kept: a prefix of the sorted order
	zPool := z
	if p.TopK > 0 && p.TopK < n {
		kept = p.TopK
		s.ensureSorted(kept)
		zPool = 0
		for _, id := range s.idx[:kept] {
			zPool += math.Exp(float64(w[id]) - m)
		}
	}
	// Min-p keeps logits >= m + log(MinP): a prefix of the sorted order, so
	// counting it is enough, and intersecting it with the top-p prefix
	// below gives the set the chain order (top-p, then min-p) gives.
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
		target := float64(p.TopP) * zPool
		cum := 0.0
		i := 0
	topP:
		for i < kept {
			s.extend(i+1, kept)
			for ; i < kept && i < s.sorted; i++ {
				cum += math.Exp(float64(w[s.idx[i]]) - m)
				if cum >= target {
					i++
					break topP
				}
			}
		}
		kept = i
	}
	return kept
}

// draw picks one of the first kept candidates in sorted order at temperature
// t with u in [0, 1): the first whose running weight exceeds u times the
// kept candidates' total weight. m and z are as for truncate.
func (s *Sampler) draw(w []float32, m, z float64, kept int, t float32, u float64) int32 {
	n := len(w)
	invT := 1 / float64(t)
	weight := func(id int32) float64 { return math.Exp((float64(w[id]) - m) * invT) }
	var zT float64
	switch {
	case kept == n && t == 1:
		zT = z // the same sum, in the same order
	case kept == n && s.sorted < n:
		for i := range w { // nothing truncated: no need to sort all
			zT += weight(int32(i))
		}
	default:
		s.ensureSorted(kept)
		for _, id := range s.idx[:kept] {
			zT += weight(id)
		}
	}
	target := u * zT
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
		if cum > target {
			return id
		}
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

// extend makes at least need (and at most limit, unless need is more)
// candidates sorted, growing the sorted prefix geometrically so that a walk
// costs few selection passes.
func (s *Sampler) extend(need, limit int) {
	s.ensureSorted(max(need, min(limit, max(2*s.sorted, firstChunk))))
}

// ensureSorted makes s.idx[:k] hold the k best token IDs by (logit desc,
// ID asc), in that order, and s.idx[k:] the rest.
func (s *Sampler) ensureSorted(k int) {
	w := s.work
	if s.sorted < 0 {
		for i := range s.idx {
			s.idx[i] = int32(i)
		}
		s.sorted = 0
	}
	k = min(k, len(s.idx))
	if k <= s.sorted {
		return
	}
	if s.sorted == 0 && k <= maxFew {
		s.selectFew(k)
		s.sorted = k
		return
	}
	rest := s.idx[s.sorted:]
	selectBest(rest, k-s.sorted, w)
	sortIDs(s.idx[s.sorted:k], w)
	s.sorted = k
}

// selectFew sets s.idx to the k best token IDs in order, then the rest. It
// keeps the best k seen in a heap whose root is the worst of them, so one
// pass over the vocabulary mostly costs a comparison per token, and a second
// pass collects the rest.
func (s *Sampler) selectFew(k int) {
	w := s.work
	h := s.heap[:0]
	for i := range w {
		id := int32(i)
		switch {
		case len(h) < k:
			h = append(h, id)
			for j := len(h) - 1; j > 0; { // sift up
				parent := (j - 1) / 2
				if !better(w, h[parent], h[j]) {
					break
				}
				h[parent], h[j] = h[j], h[parent]
				j = parent
			}
		case better(w, id, h[0]):
			h[0] = id
			for j := 0; ; { // sift down
				worst, l, r := j, 2*j+1, 2*j+2
				if l < len(h) && better(w, h[worst], h[l]) {
					worst = l
				}
				if r < len(h) && better(w, h[worst], h[r]) {
					worst = r
				}
				if worst == j {
					break
				}
				h[j], h[worst] = h[worst], h[j]
				j = worst
			}
		}
	}
	kth := h[0]
	j := k
	for i := range w {
		if id := int32(i); better(w, kth, id) {
			s.idx[j] = id
			j++
		}
	}
	copy(s.idx, h)
	sortIDs(s.idx[:k], w)
	s.heap = h
}

// better reports whether token a sorts before token b: higher logit, then
// lower ID. It is a strict total order because IDs are distinct and logits
// are never NaN here.
func better(w []float32, a, b int32) bool {
	return w[a] > w[b] || (w[a] == w[b] && a < b)
}

func sortIDs(ids []int32, w []float32) {
	slices.SortFunc(ids, func(a, b int32) int {
		if better(w, a, b) {
			return -1
		}
		if better(w, b, a) {
			return 1
		}
		return 0
	})
}

// selectBest partially orders ids so that ids[:k] hold its k best (in any
// order): quickselect with a median-of-three pivot, falling back to a full
// sort of the remaining range after too many rounds, so it is O(len) on
// average and O(len log len) at worst.
func selectBest(ids []int32, k int, w []float32) {
	lo, hi := 0, len(ids)
	if k <= 0 || k >= hi {
		return
	}
	budget := 2 * bits.Len(uint(hi))
	for hi-lo > 16 {
		if budget == 0 {
			break
		}
		budget--
		mid := lo + (hi-lo)/2
		// Median of three to ids[hi-1] as the pivot.
		a, b, c := lo, mid, hi-1
		if better(w, ids[b], ids[a]) {
			a, b = b, a
		}
		if better(w, ids[c], ids[b]) {
			b, c = c, b
			if better(w, ids[b], ids[a]) {
				a, b = b, a
			}
		}
		ids[b], ids[hi-1] = ids[hi-1], ids[b]
		pv := ids[hi-1]
		i := lo
		for j := lo; j < hi-1; j++ {
			if better(w, ids[j], pv) {
				ids[i], ids[j] = ids[j], ids[i]
				i++
			}
		}
		ids[i], ids[hi-1] = ids[hi-1], ids[i]
		switch {
		case i == k || i+1 == k:
			return
		case i < k:
			lo = i + 1
		default:
			hi = i
		}
	}
	sortIDs(ids[lo:hi], w)
}
