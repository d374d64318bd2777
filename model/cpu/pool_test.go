package cpu

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPoolRunsEveryItemOnce runs jobs of random sizes back to back, with
// pauses long enough for the workers to park between some of them, from two
// callers at once, and checks that every item runs exactly once, on a
// worker in range that no other call is using at that moment.
func TestPoolRunsEveryItemOnce(t *testing.T) {
	for _, threads := range []int{1, 2, 3, 5} {
		p := NewPool(threads)
		var wg sync.WaitGroup
		for c := range 2 {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(c), uint64(threads)))
				for job := range 300 {
					n := r.IntN(50)
					counts := make([]atomic.Int32, n)
					busy := make([]atomic.Bool, threads)
					p.Parallel(n, func(w, i int) {
						if w < 0 || w >= threads {
							t.Errorf("worker %d of %d", w, threads)
							return
						}
						if busy[w].Swap(true) {
							t.Errorf("worker %d runs two items at once", w)
						}
						counts[i].Add(1)
						busy[w].Store(false)
					})
					for i := range counts {
						if got := counts[i].Load(); got != 1 {
							t.Fatalf("threads %d job %d: item %d of %d ran %d times", threads, job, i, n, got)
						}
					}
					if job%50 == 0 {
						time.Sleep(2 * spinFor) // let the workers park
					}
				}
			})
		}
		wg.Wait()
		p.Close()
	}
}

// TestPoolAfterClose checks that a job after Close (a stage finishing a
// batch while its process shuts down) runs on its caller instead of waiting
// for workers that are gone, and that Close may be called twice.
func TestPoolAfterClose(t *testing.T) {
	p := NewPool(3)
	p.Parallel(10, func(int, int) {})
	p.Close()
	var ran atomic.Int32
	done := make(chan struct{})
	go func() {
		p.Parallel(10, func(w, i int) {
			if w != 0 {
				t.Errorf("worker %d after Close", w)
			}
			ran.Add(1)
		})
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Parallel after Close did not return")
	}
	if ran.Load() != 10 {
		t.Fatalf("%d of 10 items ran", ran.Load())
	}
	p.Close()
}
