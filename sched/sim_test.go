package sched

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/strata-llm/strata/kv"
)

var (
	simEvents = flag.Int("sim.events", 100_000, "random events per TestSimulation run (split over P = 1..4)")
	simSeed   = flag.Uint64("sim.seed", 1, "TestSimulation's seed; a failure prints the seed and P that reproduce it")
)

// TestSimulation drives a scheduler with random events — arrivals, client
// aborts and stop strings, time passing deadlines, batch results late and out
// of order, lost results, lost rows and failed batches, all under block
// pressure — against a fake pipeline that checks what every shard would:
// tombstones before rows, no row for a dead sequence, positions in order, no
// write into a block another live sequence holds. After every event it checks
// the scheduler's and allocator's invariants; at the end it drains and checks
// that every request ended exactly once, every dispatched sequence got exactly
// one tombstone and no block is used.
//
//	go test ./sched -run Simulation -sim.events=5000000 -sim.seed=7
func TestSimulation(t *testing.T) {
	for p := 1; p <= 4; p++ {
		seed := *simSeed*16 + uint64(p)
		t.Run(fmt.Sprintf("P=%d", p), func(t *testing.T) {
			newSim(t, seed, p).run(*simEvents / 4)
		})
	}
}

type simBatch struct {
	b      Batch
	lostAt bool // the result will never come (the scheduler must reclaim it)
}

type simReq struct {
	max    int
	got    int
	ended  bool
	reason Reason
}

type replica struct {
	length int
	blocks []kv.BlockID
	// With KV groups: the sliding tables, entries before from released
	// (the shards' view of what the sequence still holds).
	from   int
	slides [][]kv.BlockID
}

type sim struct {
	t      *testing.T
	seed   uint64
	rng    *rand.Rand
	s      *Scheduler
	cfg    Config
	now    time.Time
	events int

	pipe     []simBatch // dispatched, not yet answered
	reqs     map[RequestID]*simReq
	nextID   RequestID
	bases    [][]int32
	live     []RequestID // requests not yet seen ending (may include ended ones briefly)
	adding   bool
	tombs    map[SeqID]Reason
	created  map[SeqID]bool
	replicas map[SeqID]*replica // the shards' view (all stages see the same stream)
	highSeq  SeqID
	holders  map[kv.BlockID]int // live replicas naming each block
	stats    struct{ batches, rows, preempted, refused, ignoredLate, resets int }
}

func newSim(t *testing.T, seed uint64, p int) *sim {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	cfg := DefaultConfig()
	cfg.Stages = p
	cfg.KV.BlockSize = 1 << rng.IntN(5) // 1..16
	cfg.KV.Blocks = (100 + rng.IntN(300)) / cfg.KV.BlockSize
	cfg.KV.PrefixCaching = rng.IntN(3) != 0
	cfg.MaxBatchTokens = 4 + rng.IntN(60)
	cfg.MaxBatchRows = 1 + rng.IntN(16)
	cfg.MaxModelLen = 64 + rng.IntN(64)
	cfg.MaxWaiting = 4 + rng.IntN(30)
	cfg.MaxWaitingTokens = 200 + rng.IntN(800)
	cfg.QueueTimeout = time.Duration(5+rng.IntN(20)) * time.Second
	cfg.RequestTimeout = time.Duration(20+rng.IntN(60)) * time.Second
	cfg.ReclaimTimeout = time.Duration(2+rng.IntN(5)) * time.Second
	cfg.MaxRetries = rng.IntN(3)
	cfg.WatermarkBlocks = rng.IntN(3)
	cfg.FirstSeq = SeqID(1 + rng.IntN(1000))
	if rng.IntN(2) == 0 { // sliding KV groups
		cfg.KV.Groups, cfg.KV.Window = 2+rng.IntN(3), 1+rng.IntN(40)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := &sim{
		t: t, seed: seed, rng: rng, s: s, cfg: cfg,
		now:      time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC),
		reqs:     map[RequestID]*simReq{},
		nextID:   1,
		adding:   true,
		tombs:    map[SeqID]Reason{},
		created:  map[SeqID]bool{},
		replicas: map[SeqID]*replica{},
		holders:  map[kv.BlockID]int{},
	}
	for range 3 {
		b := make([]int32, 1+rng.IntN(40))
		for i := range b {
			b[i] = 1 + int32(rng.IntN(5))
		}
		m.bases = append(m.bases, b)
	}
	t.Logf("seed %d: %+v", seed, cfg)
	return m
}

func (m *sim) fatalf(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("seed %d, event %d: %s", m.seed, m.events, fmt.Sprintf(format, args...))
}

func (m *sim) run(events int) {
	for m.events = 0; m.events < events; m.events++ {
		m.event()
		m.check()
	}
	// Drain: no new requests; keep stepping and answering until nothing is
	// left. Lost results and failures still happen.
	m.adding = false
	m.s.SetPaused(false)
	for i := 0; m.s.Pending() || len(m.pipe) > 0; i++ {
		if i > 1_000_000 {
			m.fatalf("not drained: %+v", m.s.Stats())
		}
		m.event()
		m.check()
		m.events++
	}
	for id, r := range m.reqs {
		if !r.ended {
			m.fatalf("request %d never ended", id)
		}
	}
	for seq := range m.created {
		if _, ok := m.tombs[seq]; !ok {
			m.fatalf("sequence %d was dispatched but never tombstoned", seq)
		}
	}
	st := m.s.Stats()
	if st.KV.Used != 0 || st.KV.Sequences != 0 || st.Running != 0 || st.Waiting != 0 || st.InFlight != 0 || len(m.replicas) != 0 {
		m.fatalf("after draining: %+v, %d replicas", st, len(m.replicas))
	}
	if st.Added != st.Ended || int(st.Added) != len(m.reqs) {
		m.fatalf("added %d, ended %d, sim saw %d", st.Added, st.Ended, len(m.reqs))
	}
	m.t.Logf("%d events: %d requests (%d refused), %d batches, %d rows, %d resets; stats %+v; kv groups %d, window %d, hit rate %.2f",
		m.events, len(m.reqs), m.stats.refused, m.stats.batches, m.stats.rows, m.stats.resets, st, m.cfg.KV.Groups, m.cfg.KV.Window, st.KV.HitRate())
}

func (m *sim) event() {
	switch k := m.rng.IntN(100); {
	case k < 12 && m.adding:
		m.arrive()
	case k < 15 && len(m.live) > 0:
		i := m.rng.IntN(len(m.live))
		reason := []Reason{Aborted, Aborted, Stop, Timeout, Failed}[m.rng.IntN(5)]
		if err := m.s.Abort(m.live[i], reason); err != nil {
			m.fatalf("Abort: %v", err)
		}
	case k < 16:
		if err := m.s.Abort(RequestID(m.rng.IntN(int(m.nextID)+5)), Aborted); err != nil {
			m.fatalf("Abort of any ID: %v", err)
		}
	case k < 17 && m.rng.IntN(4) == 0: // a new placement: the old pipeline and its batches are gone
		kc := m.cfg.KV
		kc.Blocks = (100 + m.rng.IntN(300)) / kc.BlockSize
		stages := 1 + m.rng.IntN(4)
		if err := m.s.Reset(kc, stages); err != nil {
			m.fatalf("Reset: %v", err)
		}
		m.cfg.KV, m.cfg.Stages = kc, stages
		m.pipe = m.pipe[:0]
		m.stats.resets++
	case k < 18 && m.adding:
		m.s.SetPaused(m.rng.IntN(3) == 0)
	case k < 30:
		m.now = m.now.Add(time.Duration(m.rng.IntN(600)) * time.Millisecond)
	case k < 60 && len(m.pipe) > 0:
		m.answer()
	default:
		m.output(m.s.Step(m.now))
	}
}

func (m *sim) arrive() {
	id := m.nextID
	m.nextID++
	var prompt []int32
	if m.rng.IntN(2) == 0 {
		prompt = append(prompt, m.bases[m.rng.IntN(len(m.bases))]...)
	}
	for range 1 + m.rng.IntN(30) {
		prompt = append(prompt, 1+int32(m.rng.IntN(50)))
	}
	req := Request{
		ID:        id,
		Prompt:    prompt,
		MaxTokens: 1 + m.rng.IntN(60),
		Stop:      []int32{0},
		Arrival:   m.now,
	}
	if m.rng.IntN(4) == 0 {
		req.Deadline = m.now.Add(time.Duration(m.rng.IntN(10_000)) * time.Millisecond)
	}
	if m.rng.IntN(8) == 0 {
		req.MaxTokens = 200 // some will never fit
	}
	err := m.s.Add(req)
	var le *LimitError
	switch {
	case err == nil:
		m.reqs[id] = &simReq{max: req.MaxTokens}
		m.live = append(m.live, id)
	case errors.As(err, &le) && (errors.Is(err, ErrQueueFull) || errors.Is(err, ErrNeverFits)):
		m.stats.refused++
		if errors.Is(err, ErrNeverFits) && len(prompt)+req.MaxTokens <= m.cfg.MaxModelLen &&
			len(prompt)+req.MaxTokens-1 <= m.s.kvPositions() && len(prompt) <= m.cfg.MaxWaitingTokens {
			m.fatalf("request refused as never fitting: %v", err)
		}
	default:
		m.fatalf("Add: %v", err)
	}
}

// answer plays the last stage for one dispatched batch: mostly the oldest
// (pipelines deliver in order), sometimes any (late and out of order).
func (m *sim) answer() {
	i := 0
	if m.rng.IntN(4) == 0 {
		i = m.rng.IntN(len(m.pipe))
	}
	sb := m.pipe[i]
	m.pipe = append(m.pipe[:i], m.pipe[i+1:]...)
	if sb.lostAt {
		return // the result never comes
	}
	switch k := m.rng.IntN(100); {
	case k < 1: // a hop lost the whole batch and says so
		m.s.BatchFailed(Failure{Batch: sb.b.ID, Reason: "sim"})
		return
	case k < 2 && len(sb.b.Rows) > 0: // a hop dropped some rows; the rest comes back
		var seqs []SeqID
		for _, row := range sb.b.Rows {
			if m.rng.IntN(2) == 0 {
				seqs = append(seqs, row.Seq)
			}
		}
		m.s.BatchFailed(Failure{Batch: sb.b.ID, Seqs: seqs, Reason: "sim"})
	case k < 8: // arrives after a delay: put it back at the end
		m.pipe = append(m.pipe, sb)
		return
	}
	var res Result
	res.Batch = sb.b.ID
	for _, row := range sb.b.Rows {
		if !row.Sample || m.rng.IntN(500) == 0 { // a sample lost on the way
			continue
		}
		tok := 1 + int32(m.rng.IntN(50))
		if m.rng.IntN(25) == 0 {
			tok = 0 // the stop token
		}
		res.Samples = append(res.Samples, Sample{Seq: row.Seq, Token: tok})
	}
	if m.rng.IntN(10) == 0 { // out of row order
		m.rng.Shuffle(len(res.Samples), func(i, j int) { res.Samples[i], res.Samples[j] = res.Samples[j], res.Samples[i] })
	}
	m.s.Complete(res, m.now)
}

// output plays the shards: tombstones first, then each batch's rows.
func (m *sim) output(out Output) {
	for _, tb := range out.Tombstones {
		if prev, ok := m.tombs[tb.Seq]; ok {
			m.fatalf("sequence %d tombstoned twice (%v, then %v)", tb.Seq, prev, tb.Reason)
		}
		if tb.Reason == Preempted {
			m.stats.preempted++
		}
		m.tombs[tb.Seq] = tb.Reason
		if rp := m.replicas[tb.Seq]; rp != nil {
			for _, id := range rp.blocks {
				m.holders[id]--
			}
			for _, sl := range rp.slides {
				for _, id := range sl[rp.from:] {
					m.holders[id]--
				}
			}
			delete(m.replicas, tb.Seq)
		}
	}
	bs := m.cfg.KV.BlockSize
	for _, b := range out.Batches {
		if len(b.Rows) == 0 || len(b.Rows) > m.cfg.MaxBatchRows {
			m.fatalf("batch %d has %d rows", b.ID, len(b.Rows))
		}
		ntok := 0
		seen := map[SeqID]bool{}
		for _, row := range b.Rows {
			ntok += len(row.Tokens)
			if seen[row.Seq] {
				m.fatalf("batch %d has two rows for sequence %d", b.ID, row.Seq)
			}
			seen[row.Seq] = true
			if _, dead := m.tombs[row.Seq]; dead {
				m.fatalf("batch %d has a row for tombstoned sequence %d", b.ID, row.Seq)
			}
			rp := m.replicas[row.Seq]
			if row.First {
				if rp != nil || row.Seq <= m.highSeq {
					m.fatalf("batch %d creates sequence %d at or below the high-water mark %d", b.ID, row.Seq, m.highSeq)
				}
				if row.Pos%bs != 0 {
					m.fatalf("sequence %d starts at %d, not a block boundary", row.Seq, row.Pos)
				}
				rp = &replica{length: row.Pos}
				m.replicas[row.Seq] = rp
				m.created[row.Seq] = true
				m.highSeq = row.Seq
			}
			if rp == nil {
				m.fatalf("batch %d: row for unknown sequence %d", b.ID, row.Seq)
			}
			if row.Pos != rp.length {
				m.fatalf("batch %d: sequence %d row at %d, length %d", b.ID, row.Seq, row.Pos, rp.length)
			}
			end := row.Pos + len(row.Tokens)
			if len(row.Tokens) == 0 || len(row.Blocks) != (end+bs-1)/bs {
				m.fatalf("sequence %d: %d tokens at %d with %d blocks", row.Seq, len(row.Tokens), row.Pos, len(row.Blocks))
			}
			for i, id := range rp.blocks {
				if row.Blocks[i] != id {
					m.fatalf("sequence %d: block %d changed from %d to %d", row.Seq, i, id, row.Blocks[i])
				}
			}
			// The blocks written must be held by no other live sequence
			// (shared prefix blocks are full and never written again).
			for i := row.Pos / bs; i < len(row.Blocks); i++ {
				id := row.Blocks[i]
				others := m.holders[id]
				if i < len(rp.blocks) {
					others-- // its own
				}
				if others != 0 {
					m.fatalf("sequence %d writes block %d held by %d other live sequences", row.Seq, id, others)
				}
			}
			if m.cfg.KV.Groups > 1 {
				m.slides(rp, row)
			}
			for _, id := range row.Blocks[len(rp.blocks):] {
				m.holders[id]++
			}
			rp.blocks = append(rp.blocks, row.Blocks[len(rp.blocks):]...)
			rp.length = end
		}
		if ntok > m.cfg.MaxBatchTokens {
			m.fatalf("batch %d has %d tokens, budget %d", b.ID, ntok, m.cfg.MaxBatchTokens)
		}
		m.stats.batches++
		m.stats.rows += len(b.Rows)
		m.pipe = append(m.pipe, simBatch{b: b, lostAt: m.rng.IntN(300) == 0})
	}
	for _, u := range out.Updates {
		r := m.reqs[u.Request]
		if r == nil || r.ended {
			m.fatalf("update for unknown or ended request %d: %+v", u.Request, u)
		}
		r.got += len(u.Tokens)
		if r.got > r.max {
			m.fatalf("request %d got %d tokens, max %d", u.Request, r.got, r.max)
		}
		if u.Done {
			r.ended, r.reason = true, u.Reason
			if u.Reason == Length && r.got != r.max {
				m.fatalf("request %d ended by length with %d of %d tokens", u.Request, r.got, r.max)
			}
		}
	}
	if len(out.Updates) > 0 {
		live := m.live[:0]
		for _, id := range m.live {
			if !m.reqs[id].ended {
				live = append(live, id)
			}
		}
		m.live = live
	}
}

// slides checks a row's sliding tables against the shards' view rp (before
// the row's global blocks are appended to it): they start no later than the
// first position the row reads, never start earlier than before, keep the
// entries they held, and the blocks the row writes are held by no other
// live sequence. Entries from the replica's from to the row's SlideFrom
// were released: their holders lose them.
func (m *sim) slides(rp *replica, row Row) {
	bs, groups := m.cfg.KV.BlockSize, m.cfg.KV.Groups
	w := len(row.Blocks) - row.SlideFrom
	if w < 0 || len(row.Slides) != (groups-1)*w {
		m.fatalf("sequence %d: %d sliding entries from %d for %d blocks", row.Seq, len(row.Slides), row.SlideFrom, len(row.Blocks))
	}
	if lo := max(0, row.Pos-m.cfg.KV.Window+1); row.SlideFrom*bs > lo {
		m.fatalf("sequence %d: row at %d reads from %d, its sliding tables start at block %d", row.Seq, row.Pos, lo, row.SlideFrom)
	}
	if rp.slides == nil {
		rp.slides = make([][]kv.BlockID, groups-1)
		rp.from = row.SlideFrom
		for g := range rp.slides {
			rp.slides[g] = slices.Repeat([]kv.BlockID{-1}, row.SlideFrom)
		}
	}
	if row.SlideFrom < rp.from {
		m.fatalf("sequence %d: sliding tables back from block %d to %d", row.Seq, rp.from, row.SlideFrom)
	}
	for g, sl := range rp.slides {
		now := row.Slides[g*w : (g+1)*w]
		for i := rp.from; i < len(sl); i++ {
			switch {
			case i < row.SlideFrom:
				m.holders[sl[i]]--
				sl[i] = -1
			case now[i-row.SlideFrom] != sl[i]:
				m.fatalf("sequence %d: sliding table %d block %d changed from %d to %d", row.Seq, g+1, i, sl[i], now[i-row.SlideFrom])
			}
		}
		for i := max(len(sl), row.SlideFrom); i < len(row.Blocks); i++ {
			sl = append(sl, now[i-row.SlideFrom])
			m.holders[sl[i]]++
		}
		for i := max(row.SlideFrom, row.Pos/bs); i < len(row.Blocks); i++ {
			if m.holders[sl[i]] != 1 {
				m.fatalf("sequence %d writes sliding block %d (table %d entry %d) held by %d other live sequences", row.Seq, sl[i], g+1, i, m.holders[sl[i]]-1)
			}
		}
		rp.slides[g] = sl
	}
	rp.from = max(rp.from, row.SlideFrom)
}

func (m *sim) check() {
	m.t.Helper()
	if err := m.s.CheckInvariants(); err != nil {
		m.fatalf("%v", err)
	}
	// Blocks used == the blocks of live sequences (counted once when shared).
	st := m.s.kv.Stats()
	sum := 0
	for _, seq := range m.s.runningList() {
		t := m.s.kv.Table(seq.id)
		sum += t.Len() + (t.Groups()-1)*(t.Len()-t.First())
	}
	if !m.cfg.KV.PrefixCaching && st.Used != sum {
		m.fatalf("blocks used %d, live sequences hold %d", st.Used, sum)
	}
	if st.Used > sum || (sum > 0 && st.Used == 0) {
		m.fatalf("blocks used %d, live sequences hold %d", st.Used, sum)
	}
}
