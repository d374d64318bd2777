package sample

import (
	"math"
	"math/bits"
	"slices"
)

// The lazy sort. Tokens are ordered by (logit descending, ID ascending), a
// strict total order, so every prefix of it is one set whatever the sort.
//
// s.idx[:s.ncand] are the candidates: the tokens at or above a floor, that
// is, those with a logit above floorV and those with logit floorV and an ID
// at most floorID. Every candidate sorts before every other token, so the
// k best tokens are the k best candidates while k <= ncand. Sample sets
// them up from a threshold on the logits (floorID the largest ID), or
// selectTop as the best k of the vocabulary; widen extends them to all.
// s.idx[:s.sorted] are the best candidates, in order.

// extend makes at least need (and at most limit, unless need is more)
// candidates sorted, growing the sorted prefix geometrically so that a walk
// costs few selection passes.
func (s *Sampler) extend(need, limit int) {
	s.ensureSorted(max(need, min(limit, max(2*s.sorted, firstChunk))))
}

// ensureSorted makes s.idx[:k] hold the k best token IDs, in order, and
// s.idx[k:ncand] the other candidates. sorted < 0 means nothing is set up
// for this call: no candidates yet.
func (s *Sampler) ensureSorted(k int) {
	w := s.work
	if s.sorted < 0 {
		s.sorted, s.ncand = 0, 0
		s.floorV, s.floorID = float32(math.Inf(1)), -1 // above every logit
	}
	k = min(k, len(s.idx))
	if k <= s.sorted {
		return
	}
	if s.sorted == 0 && k > s.ncand && k <= maxFew {
		s.selectTop(k)
		return
	}
	if k > s.ncand {
		s.widen()
	}
	if s.sorted == 0 && k <= maxFew {
		s.selectFew(k)
	} else {
		selectBest(s.idx[s.sorted:s.ncand], k-s.sorted, w)
		sortIDs(s.idx[s.sorted:k], w)
	}
	s.sorted = k
}

// holdsAtLeast reports whether the candidates include every token whose
// logit is at least thr.
func (s *Sampler) holdsAtLeast(thr float64) bool {
	f := float64(s.floorV)
	return s.sorted >= 0 && (f < thr || f == thr && s.floorID == math.MaxInt32)
}

// widen makes every token a candidate, appending those below the floor in
// ID order.
func (s *Sampler) widen() {
	j := s.ncand
	fv, fid := s.floorV, s.floorID
	for i, l := range s.work {
		if l < fv || l == fv && int32(i) > fid {
			s.idx[j] = int32(i)
			j++
		}
	}
	s.ncand = j
	s.floorV, s.floorID = float32(math.Inf(-1)), math.MaxInt32
}

// selectTop makes the k best tokens of the vocabulary the candidates, in
// order, in one pass over the logits: a heap whose root is the worst of the
// best k so far, which a token later in ID order beats only with a higher
// logit, so most tokens cost one comparison with a value in a register.
func (s *Sampler) selectTop(k int) {
	w := s.work
	h := s.heap[:0]
	for i := range k {
		h = append(h, int32(i))
		siftUp(h, w)
	}
	rootV := w[h[0]]
	for i := k; i < len(w); i++ {
		if w[i] <= rootV {
			continue
		}
		h[0] = int32(i)
		siftDown(h, w)
		rootV = w[h[0]]
	}
	copy(s.idx, h)
	sortIDs(s.idx[:k], w)
	kth := s.idx[k-1]
	s.sorted, s.ncand = k, k
	s.floorV, s.floorID = w[kth], kth
	s.heap = h
}

// selectFew sets s.idx[:k] to the k best candidates in order, then the other
// candidates, for k <= ncand: the heap of selectTop over the candidates, then
// a pass that moves the rest behind the k.
func (s *Sampler) selectFew(k int) {
	w := s.work
	c := s.idx[:s.ncand]
	h := s.heap[:0]
	for _, id := range c {
		switch {
		case len(h) < k:
			h = append(h, id)
			siftUp(h, w)
		case better(w, id, h[0]):
			h[0] = id
			siftDown(h, w)
		}
	}
	kth := h[0]
	j := 0
	for _, id := range c {
		if better(w, kth, id) {
			c[j] = id
			j++
		}
	}
	copy(c[k:], c[:j])
	copy(c, h)
	sortIDs(c[:k], w)
	s.heap = h
}

// siftUp restores the heap (worst at the root) after h's last was added.
func siftUp(h []int32, w []float32) {
	for j := len(h) - 1; j > 0; {
		parent := (j - 1) / 2
		if !better(w, h[parent], h[j]) {
			break
		}
		h[parent], h[j] = h[j], h[parent]
		j = parent
	}
}

// siftDown restores the heap (worst at the root) after h[0] was replaced.
func siftDown(h []int32, w []float32) {
	for j := 0; ; {
		worst, l, r := j, 2*j+1, 2*j+2
		if l < len(h) && better(w, h[worst], h[l]) {
			worst = l
		}
		if r < len(h) && better(w, h[worst], h[r]) {
			worst = r
		}
		if worst == j {
			return
		}
		h[j], h[worst] = h[worst], h[j]
		j = worst
	}
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
