package coordinator

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/strata-llm/strata/model/sample"
)

// Token is one generated token with what the client may ask to see of it.
type Token struct {
	ID      int32
	Logprob float32
	Top     []sample.TokenLogprob // the alternatives asked for; nil when none
}

// FinishReason says why a request ended.
type FinishReason string

// Finish reasons; Stop and Length are OpenAI's finish_reason values.
const (
	FinishStop    FinishReason = "stop"
	FinishLength  FinishReason = "length"
	FinishAborted FinishReason = "aborted"
	FinishTimeout FinishReason = "timeout"
	FinishFailed  FinishReason = "failed"
)

// ErrSlowReader ends a request whose client did not keep up with its tokens.
var ErrSlowReader = errors.New("coordinator: client too slow to read its tokens")

// Stream is one request's token sink. The coordinator's loop appends to it
// under a mutex and notifies without blocking; the HTTP handler reads it. A
// reader that lets more than its bound of tokens pile up is aborted rather
// than let the loop wait.
type Stream struct {
	ID string // the request ID, also returned as X-Request-ID

	mu      sync.Mutex
	tokens  []Token
	done    bool
	reason  FinishReason
	err     error
	limit   int
	notify  chan struct{} // size 1: a pending wake-up is enough
	abort   func()        // tells the loop the client is gone
	stop    func()        // tells the loop a stop string matched
	aborted bool

	// Set by the loop, read after done: timings for metrics.
	Submitted time.Time
}

func newStream(id string, limit int) *Stream {
	return &Stream{ID: id, limit: limit, notify: make(chan struct{}, 1)}
}

// push appends tokens; it reports false when the reader has fallen more than
// limit tokens behind (the caller aborts the request).
func (s *Stream) push(toks []Token) bool {
	s.mu.Lock()
	s.tokens = append(s.tokens, toks...)
	ok := len(s.tokens) <= s.limit
	s.mu.Unlock()
	s.wake()
	return ok
}

// finish marks the stream done; later pushes and finishes are ignored.
func (s *Stream) finish(r FinishReason, err error) {
	s.mu.Lock()
	if !s.done {
		s.done, s.reason, s.err = true, r, err
	}
	s.mu.Unlock()
	s.wake()
}

func (s *Stream) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Next waits for tokens or the end. It returns the tokens since the previous
// call; when done is true the request has ended with reason (and err for
// failures) and no more tokens follow. If ctx ends first, Next aborts the
// request and returns ctx's error with done false: done tells the request's
// own failure (done true) from the caller's context (done false).
func (s *Stream) Next(ctx context.Context) (toks []Token, done bool, reason FinishReason, err error) {
	toks, done, reason, err, _ = s.next(ctx, nil)
	return toks, done, reason, err
}

// next is Next that also returns, with waited true and nothing else, when
// idle fires before any token or the end (a nil idle never fires).
func (s *Stream) next(ctx context.Context, idle <-chan time.Time) (toks []Token, done bool, reason FinishReason, err error, waited bool) {
	for {
		s.mu.Lock()
		toks, s.tokens = s.tokens, nil
		done, reason, err = s.done, s.reason, s.err
		s.mu.Unlock()
		if len(toks) > 0 || done {
			return toks, done, reason, err, false
		}
		select {
		case <-s.notify:
		case <-idle:
			return nil, false, "", nil, true
		case <-ctx.Done():
			s.Abort()
			return nil, false, "", ctx.Err(), false
		}
	}
}

// Stop ends the request as finished with reason stop: the handler matched a
// stop string. Like Abort, it frees the request's KV at once.
func (s *Stream) Stop() {
	s.mu.Lock()
	f := s.stop
	first := !s.aborted && !s.done
	s.aborted = true
	s.mu.Unlock()
	if first && f != nil {
		f()
	}
}

// Abort tells the coordinator the client is gone (or a stop string matched):
// the request ends at once and its KV is freed everywhere. Safe to call more
// than once and after the end.
func (s *Stream) Abort() {
	s.mu.Lock()
	a := s.abort
	first := !s.aborted && !s.done
	s.aborted = true
	s.mu.Unlock()
	if first && a != nil {
		a()
	}
}
