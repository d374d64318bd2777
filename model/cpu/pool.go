package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Pool is a fixed set of worker goroutines that run Parallel jobs. The caller
// of Parallel works too, as worker 0.
//
// A forward pass is a long run of short jobs (a decode step of a 110M model
// is ~120 of them, tens of microseconds each), so handing a job over must
// cost far less than waking a parked goroutine. Workers therefore spin on
// the job generation for spinFor after each job (yielding their P to any
// other runnable goroutine as they go) and park only when no job came; the
// caller wakes only parked workers, and waits for the others by spinning on
// a counter.
type Pool struct {
	workers int
	mu      sync.Mutex // serialises jobs; held for a job's whole run
	closed  bool       // under mu: the helpers are gone, jobs run on the caller
	helpers []*helper
	gen     atomic.Uint64 // job generation: a change starts every helper
	pending atomic.Int32  // helpers still in the current job
	stop    chan struct{}
	exited  sync.WaitGroup

	// The current job, written under mu before gen changes.
	n     int
	chunk int
	fn    func(worker, i int)
	next  atomic.Int64
}

// helper is one worker goroutine's parking state.
type helper struct {
	parked atomic.Bool
	wake   chan struct{} // one token: the caller cleared parked
}

// spinFor is how long a worker waits for the next job before parking.
const spinFor = 100 * time.Microsecond

// NewPool starts a pool of threads workers (runtime.NumCPU() when threads <= 0).
// Close stops them.
func NewPool(threads int) *Pool {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	p := &Pool{workers: threads, stop: make(chan struct{})}
	for w := 1; w < threads; w++ {
		h := &helper{wake: make(chan struct{}, 1)}
		p.helpers = append(p.helpers, h)
		p.exited.Add(1)
		go p.worker(w, h)
	}
	return p
}

// Workers is the number of workers, the caller of Parallel included.
func (p *Pool) Workers() int { return p.workers }

// Close stops the workers and waits for them to exit, after the job in
// progress. Jobs after Close run on their caller alone (a stage may finish a
// batch while its process shuts down).
func (p *Pool) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	close(p.stop)
	p.exited.Wait()
}

func (p *Pool) worker(w int, h *helper) {
	defer p.exited.Done()
	var seen uint64
	for {
		g, ok := p.await(h, seen)
		if !ok {
			return
		}
		seen = g
		p.run(w)
		p.pending.Add(-1)
	}
}

// await returns the next job generation after seen, spinning for spinFor
// and then parking; false when the pool is closed.
func (p *Pool) await(h *helper, seen uint64) (uint64, bool) {
	start := time.Now()
	for i := 1; ; i++ {
		if g := p.gen.Load(); g != seen {
			return g, true
		}
		if i%64 == 0 {
			if time.Since(start) > spinFor {
				break
			}
			runtime.Gosched()
		}
	}
	for {
		h.parked.Store(true)
		if g := p.gen.Load(); g != seen {
			if !h.parked.CompareAndSwap(true, false) {
				<-h.wake // the caller saw us parked and sent a token: take it
			}
			return g, true
		}
		select {
		case <-h.wake:
			if g := p.gen.Load(); g != seen {
				return g, true
			}
			// A late token: the caller of the job already run here was
			// slow to look at parked and found us parked for the next
			// one. Park again.
		case <-p.stop:
			return 0, false
		}
	}
}

func (p *Pool) run(w int) {
	for {
		lo := int(p.next.Add(int64(p.chunk))) - p.chunk
		if lo >= p.n {
			return
		}
		hi := min(lo+p.chunk, p.n)
		for i := lo; i < hi; i++ {
			p.fn(w, i)
		}
	}
}

// Parallel calls fn(worker, i) for each i in [0, n), spread over the workers,
// and returns when every call has returned. Items are handed out in small
// chunks so that uneven items balance.
func (p *Pool) Parallel(n int, fn func(worker, i int)) {
	if n <= 0 {
		return
	}
	if p.workers == 1 || n == 1 {
		for i := 0; i < n; i++ {
			fn(0, i)
		}
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for i := 0; i < n; i++ {
			fn(0, i)
		}
		return
	}
	p.n, p.fn = n, fn
	p.chunk = max(1, n/(p.workers*4))
	p.next.Store(0)
	p.pending.Store(int32(len(p.helpers)))
	p.gen.Add(1)
	for _, h := range p.helpers {
		if h.parked.CompareAndSwap(true, false) {
			h.wake <- struct{}{}
		}
	}
	p.run(0)
	for i := 1; p.pending.Load() != 0; i++ {
		if i%64 == 0 {
			runtime.Gosched()
		}
	}
	p.fn = nil
}

// ReserveIOProc raises GOMAXPROCS to one more than threads compute workers
// (runtime.NumCPU() when threads <= 0), for a process that computes on a
// Pool and also serves the network. While a batch computes, the workers
// hold every P; without a spare one, the goroutines that stream the next
// batch's hidden states in and the last one's out run only at the runtime's
// 10 ms preemption ticks, which throttles gRPC's flow control so much that
// a two-stage pipeline ran one batch at a time. The spare P sleeps when the
// network is idle; the OS shares the cores when it is not.
func ReserveIOProc(threads int) {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	if runtime.GOMAXPROCS(0) < threads+1 {
		runtime.GOMAXPROCS(threads + 1)
	}
}
