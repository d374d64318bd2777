package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Pool is a fixed set of worker goroutines that run Parallel jobs. The caller
// of Parallel works too, as worker 0.
type Pool struct {
	workers int
	mu      sync.Mutex // serialises jobs; held for a job's whole run
	start   []chan struct{}
	done    sync.WaitGroup
	stop    chan struct{}
	exited  sync.WaitGroup

	// The current job, written under mu before the workers are started.
	n     int
	chunk int
	fn    func(worker, i int)
	next  atomic.Int64
}

// NewPool starts a pool of threads workers (runtime.NumCPU() when threads <= 0).
// Close stops them.
func NewPool(threads int) *Pool {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	p := &Pool{workers: threads, stop: make(chan struct{})}
	for w := 1; w < threads; w++ {
		ch := make(chan struct{}, 1)
		p.start = append(p.start, ch)
		p.exited.Add(1)
		go p.worker(w, ch)
	}
	return p
}

// Workers is the number of workers, the caller of Parallel included.
func (p *Pool) Workers() int { return p.workers }

// Close stops the workers and waits for them to exit. Parallel must not be
// called after Close.
func (p *Pool) Close() {
	close(p.stop)
	p.exited.Wait()
}

func (p *Pool) worker(w int, start chan struct{}) {
	defer p.exited.Done()
	for {
		select {
		case <-p.stop:
			return
		case <-start:
			p.run(w)
			p.done.Done()
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
	p.n, p.fn = n, fn
	p.chunk = max(1, n/(p.workers*4))
	p.next.Store(0)
	helpers := min(len(p.start), n-1)
	p.done.Add(helpers)
	for _, ch := range p.start[:helpers] {
		ch <- struct{}{}
	}
	p.run(0)
	p.done.Wait()
	p.fn = nil
}
