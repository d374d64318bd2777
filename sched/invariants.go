package sched

import "fmt"

// CheckInvariants returns an error describing the first broken invariant of
// the scheduler or its allocator, or nil. Beyond the allocator's own checks:
//
//   - the allocator's live tables are exactly the running sequences, each
//     sequence holds its own table's handle, and each table covers what was
//     dispatched;
//   - every live request is in exactly one place: the waiting list (no
//     sequence) or the running list (one live sequence);
//   - every running sequence is in exactly one of the decode queue, the
//     prefill list, or waiting for its sampled token, as its counters say;
//   - the waiting list is in Add order and its counters match;
//   - the deadline heap holds exactly the live requests with a due time;
//   - pending tombstones name distinct sequences, in-flight batches respect
//     the limit, and ended requests are only those whose Update is pending.
//
// It runs in time linear in the requests and blocks.
func (s *Scheduler) CheckInvariants() error {
	if err := s.kv.CheckInvariants(); err != nil {
		return err
	}
	runs := s.runningList()
	if len(runs) > 0 && runs[len(runs)-1] != s.runTail {
		return fmt.Errorf("sched: running list tail is not its last sequence")
	}
	if got := s.kv.Stats().Sequences; got != len(runs) || got != s.nRunning {
		return fmt.Errorf("sched: allocator has %d tables, %d sequences run, counter says %d", got, len(runs), s.nRunning)
	}
	for i, seq := range runs {
		r := seq.req
		switch {
		case i > 0 && runs[i-1].id >= seq.id:
			return fmt.Errorf("sched: running list out of order at %d: %d then %d", i, runs[i-1].id, seq.id)
		case (i == 0) != (seq.prev == nil) || (i > 0 && seq.prev != runs[i-1]):
			return fmt.Errorf("sched: running list broken at sequence %d", seq.id)
		case seq.dead:
			return fmt.Errorf("sched: dead sequence %d is running", seq.id)
		case r.state != running || r.seq != seq:
			return fmt.Errorf("sched: sequence %d runs but request %d is in state %d with sequence %p", seq.id, r.id, r.state, r.seq)
		case s.reqs[r.id] != r:
			return fmt.Errorf("sched: running request %d is not in the request map", r.id)
		case !(seq.computed <= seq.scheduled && seq.scheduled <= len(r.tokens)):
			return fmt.Errorf("sched: sequence %d: computed %d, scheduled %d, tokens %d", seq.id, seq.computed, seq.scheduled, len(r.tokens))
		case seq.table == nil || seq.table != s.kv.Table(seq.id):
			return fmt.Errorf("sched: sequence %d holds a handle that is not its block table", seq.id)
		case seq.capacity != s.kv.Len(seq.id)*s.cfg.KV.BlockSize:
			return fmt.Errorf("sched: sequence %d believes its table covers %d positions, it covers %d", seq.id, seq.capacity, s.kv.Len(seq.id)*s.cfg.KV.BlockSize)
		case !s.kv.Has(seq.id) || s.kv.Len(seq.id) < s.kv.BlocksFor(seq.scheduled):
			return fmt.Errorf("sched: sequence %d has %d blocks for %d dispatched positions", seq.id, s.kv.Len(seq.id), seq.scheduled)
		case seq.id >= s.nextSeq:
			return fmt.Errorf("sched: sequence %d not below the next ID %d", seq.id, s.nextSeq)
		}
		seq.seen = 0
	}
	for _, seq := range s.decode[s.decHead:] {
		if !seq.dead {
			seq.seen++
		}
	}
	for _, seq := range s.prefill {
		if !seq.prefill {
			return fmt.Errorf("sched: sequence %d is in the prefill list unmarked", seq.id)
		}
		if !seq.dead {
			seq.seen += 10
		}
	}
	for _, seq := range runs {
		left := len(seq.req.tokens) - seq.scheduled
		want := 0 // waiting for its token
		switch {
		case left > 0 && seq.prefill:
			want = 10
		case left == 1:
			want = 1
		case left > 1:
			return fmt.Errorf("sched: sequence %d has %d tokens to dispatch but is not in prefill", seq.id, left)
		}
		if seq.seen != want {
			return fmt.Errorf("sched: sequence %d (%d tokens left) is queued %d times in decode and %d in prefill", seq.id, left, seq.seen%10, seq.seen/10)
		}
	}

	n, tokens := 0, 0
	var last *request
	for r := s.waitHead; r != nil; r = r.next {
		switch {
		case r.prev != last:
			return fmt.Errorf("sched: waiting list broken at request %d", r.id)
		case last != nil && last.order >= r.order:
			return fmt.Errorf("sched: waiting list out of order: %d before %d", last.id, r.id)
		case r.state != waiting || r.seq != nil:
			return fmt.Errorf("sched: waiting request %d in state %d with a sequence %v", r.id, r.state, r.seq != nil)
		case s.reqs[r.id] != r:
			return fmt.Errorf("sched: waiting request %d is not in the request map", r.id)
		}
		n++
		tokens += len(r.tokens)
		last = r
		if n > len(s.reqs) {
			return fmt.Errorf("sched: waiting list has a cycle")
		}
	}
	if last != s.waitTail || n != s.nWaiting || tokens != s.waitingTokens {
		return fmt.Errorf("sched: waiting list holds %d requests, %d tokens; counters say %d, %d", n, tokens, s.nWaiting, s.waitingTokens)
	}

	nEnded, nDue := 0, 0
	for id, r := range s.reqs {
		if r.id != id {
			return fmt.Errorf("sched: request %d filed under %d", r.id, id)
		}
		if r.state == ended {
			nEnded++
			if !r.dirty || r.seq != nil || r.heapIdx >= 0 {
				return fmt.Errorf("sched: ended request %d: update pending %v, sequence %v, in heap %v", id, r.dirty, r.seq != nil, r.heapIdx >= 0)
			}
			continue
		}
		if r.hasDue() {
			nDue++
			if r.heapIdx < 0 || r.heapIdx >= len(s.deadlines) || s.deadlines[r.heapIdx] != r {
				return fmt.Errorf("sched: request %d is not in the deadline heap", id)
			}
		}
	}
	if nEnded+n+len(runs) != len(s.reqs) {
		return fmt.Errorf("sched: %d requests known, %d waiting + %d running + %d ended", len(s.reqs), n, len(runs), nEnded)
	}
	if nDue != len(s.deadlines) {
		return fmt.Errorf("sched: deadline heap holds %d requests, %d have a due time", len(s.deadlines), nDue)
	}
	for i := 1; i < len(s.deadlines); i++ {
		if s.heapLess(i, (i-1)/2) {
			return fmt.Errorf("sched: deadline heap out of order at %d", i)
		}
	}

	if len(s.inflight) > s.maxInFlight {
		return fmt.Errorf("sched: %d batches in flight, limit %d", len(s.inflight), s.maxInFlight)
	}
	for i, b := range s.inflight {
		if i > 0 && s.inflight[i-1].id >= b.id {
			return fmt.Errorf("sched: in-flight batches out of order: %d then %d", s.inflight[i-1].id, b.id)
		}
	}
	for i, t := range s.tombs {
		for _, u := range s.tombs[:i] {
			if u.Seq == t.Seq {
				return fmt.Errorf("sched: two pending tombstones for sequence %d", t.Seq)
			}
		}
	}
	return nil
}

// runningList returns the running list as a slice, for checks.
func (s *Scheduler) runningList() []*sequence {
	var l []*sequence
	for seq := s.runHead; seq != nil && len(l) <= s.nRunning; seq = seq.next {
		l = append(l, seq)
	}
	return l
}
