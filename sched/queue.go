package sched

import "time"

// enqueue puts r in the waiting list at its place by Add order: behind older
// requests, ahead of newer ones. A requeued request is older than every
// request never admitted (admission is FCFS), so it lands at the head.
func (s *Scheduler) enqueue(r *request) {
	r.state = waiting
	var at *request // insert before at; nil: at the tail
	if s.waitTail != nil && s.waitTail.order > r.order {
		// Requeued: older than the tail, so near the head.
		at = s.waitHead
		for at.order < r.order {
			at = at.next
		}
	}
	r.next = at
	if at == nil {
		r.prev = s.waitTail
		s.waitTail = r
	} else {
		r.prev = at.prev
		at.prev = r
	}
	if r.prev == nil {
		s.waitHead = r
	} else {
		r.prev.next = r
	}
	s.nWaiting++
	s.waitingTokens += len(r.tokens)
}

// unlink removes r from the waiting list.
func (s *Scheduler) unlink(r *request) {
	if r.prev == nil {
		s.waitHead = r.next
	} else {
		r.prev.next = r.next
	}
	if r.next == nil {
		s.waitTail = r.prev
	} else {
		r.next.prev = r.prev
	}
	r.prev, r.next = nil, nil
	s.nWaiting--
	s.waitingTokens -= len(r.tokens)
}

// due is when r times out: its deadline, or its queue timeout while it has
// never been admitted, whichever comes first.
func (r *request) due() time.Time {
	switch {
	case r.hasQueueDue && r.hasDeadline:
		if r.queueDue.Before(r.deadline) {
			return r.queueDue
		}
		return r.deadline
	case r.hasQueueDue:
		return r.queueDue
	default:
		return r.deadline
	}
}

func (r *request) hasDue() bool { return r.hasQueueDue || r.hasDeadline }

// heapUpdate puts r in the deadline heap at its place, removing it when it
// has no due time.
func (s *Scheduler) heapUpdate(r *request) {
	if !r.hasDue() {
		s.heapRemove(r)
		return
	}
	if r.heapIdx < 0 {
		r.heapIdx = len(s.deadlines)
		s.deadlines = append(s.deadlines, r)
	}
	s.heapUp(r.heapIdx)
	s.heapDown(r.heapIdx)
}

func (s *Scheduler) heapRemove(r *request) {
	i := r.heapIdx
	if i < 0 {
		return
	}
	last := len(s.deadlines) - 1
	s.heapSwap(i, last)
	s.deadlines[last] = nil
	s.deadlines = s.deadlines[:last]
	r.heapIdx = -1
	if i < last {
		s.heapUp(i)
		s.heapDown(i)
	}
}

func (s *Scheduler) heapLess(i, j int) bool {
	return s.deadlines[i].due().Before(s.deadlines[j].due())
}

func (s *Scheduler) heapSwap(i, j int) {
	h := s.deadlines
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx = i
	h[j].heapIdx = j
}

func (s *Scheduler) heapUp(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.heapLess(i, p) {
			return
		}
		s.heapSwap(i, p)
		i = p
	}
}

func (s *Scheduler) heapDown(i int) {
	n := len(s.deadlines)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if c+1 < n && s.heapLess(c+1, c) {
			c++
		}
		if !s.heapLess(c, i) {
			return
		}
		s.heapSwap(i, c)
		i = c
	}
}
