package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The load of the partition tests: loadClients clients, each streaming
// greedy completions of its prompt back to back until stopped, every
// request bounded by requestBound.
const (
	loadClients   = 4
	loadMaxTokens = 200
)

var loadPrompts = []string{
	"Once upon a time",
	"One day, a little boy",
	"The cat sat",
	"Lily wanted to",
}

// baseline returns each prompt's fault-free greedy text, which every
// request of the load that completes must reproduce (recomputation after a
// loss is token-identical, DESIGN.md, Numerics).
func (c *partitionCluster) baseline(ctx context.Context) (map[string]string, error) {
	want := map[string]string{}
	for _, p := range loadPrompts {
		r := c.complete(ctx, 0, p, time.Now())
		if r.problem != "" || r.errType != "" {
			return nil, fmt.Errorf("%q: %s%s %s", p, r.problem, r.errType, r.errMsg)
		}
		want[p] = r.text
	}
	return want, nil
}

// loadResult is one request of the load, as its client saw it.
type loadResult struct {
	id         int
	prompt     string
	start, end time.Time
	first      time.Time     // first token (zero: none)
	tokens     int           // text events
	maxGap     time.Duration // largest gap between text events
	keepAlives int           // SSE comments
	text       string
	finish     string
	// An error the server sent (an OpenAI envelope, as the HTTP body or
	// as an SSE event): its status (200 for a stream event), type, code,
	// message.
	status                   int
	errType, errCode, errMsg string
	// problem says why the request is a failure of the test: it hung past
	// requestBound, broke off without an error, or completed with other
	// text than the fault-free run. Empty for text and clear errors.
	problem string
}

type load struct {
	c      *partitionCluster
	want   map[string]string
	stopCh chan struct{}
	once   sync.Once
	wg     sync.WaitGroup

	mu   sync.Mutex
	all  []loadResult
	next int
}

func (c *partitionCluster) startLoad(ctx context.Context, want map[string]string) *load {
	l := &load{c: c, want: want, stopCh: make(chan struct{})}
	for i := range loadClients {
		l.wg.Go(func() {
			p := loadPrompts[i%len(loadPrompts)]
			for {
				select {
				case <-l.stopCh:
					return
				case <-ctx.Done():
					return
				default:
				}
				l.mu.Lock()
				l.next++
				id := l.next
				l.mu.Unlock()
				r := c.complete(ctx, id, p, time.Now())
				if r.problem == "" && r.errType == "" && r.text != want[p] {
					r.problem = fmt.Sprintf("completed with text %q, the fault-free run gave %q", r.text, want[p])
				}
				l.mu.Lock()
				l.all = append(l.all, r)
				l.mu.Unlock()
			}
		})
	}
	return l
}

// stop ends the load: no client starts another request, and stop returns
// when every request in flight has ended (each within requestBound).
func (l *load) stop() {
	l.once.Do(func() { close(l.stopCh) })
	l.wg.Wait()
}

func (l *load) results() []loadResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]loadResult(nil), l.all...)
}

// waitFlowing polls until every client has completed a request.
func (l *load) waitFlowing(ctx context.Context, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		rs := l.results()
		ok := map[string]bool{}
		for _, r := range rs {
			if r.problem != "" {
				return fmt.Errorf("request %d: %s", r.id, r.problem)
			}
			if r.errType == "" {
				ok[r.prompt] = true
			}
		}
		if len(ok) == min(loadClients, len(loadPrompts)) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("load not flowing after %s: %d requests ended, prompts completed %v", bound, len(rs), ok)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollEvery):
		}
	}
}

// firstOKStartedAfter returns the end of the first request started after
// t that completed with text.
func (l *load) firstOKStartedAfter(t time.Time) (time.Time, bool) {
	var first time.Time
	for _, r := range l.results() {
		if r.start.After(t) && r.problem == "" && r.errType == "" && (first.IsZero() || r.end.Before(first)) {
			first = r.end
		}
	}
	return first, !first.IsZero()
}

func (l *load) okStartedAfter(t time.Time) bool {
	_, ok := l.firstOKStartedAfter(t)
	return ok
}

// complete streams one greedy completion of prompt and reads it to its
// end, its error or c.bound (requestBound).
func (c *partitionCluster) complete(ctx context.Context, id int, prompt string, start time.Time) (r loadResult) {
	r = loadResult{id: id, prompt: prompt, start: start}
	defer func() { r.end = time.Now() }()
	ctx, cancel := context.WithTimeout(ctx, c.bound)
	defer cancel()
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": loadMaxTokens, "temperature": 0, "stream": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.api+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		r.problem = err.Error()
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	// No client timeout: c.bound, through ctx, is the bound.
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.problem = requestProblem(ctx, c.bound, err)
		return r
	}
	defer resp.Body.Close()
	r.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			r.problem = requestProblem(ctx, c.bound, err)
			return r
		}
		if !r.envelope(b) {
			r.problem = fmt.Sprintf("status %d without an OpenAI error envelope: %q", resp.StatusCode, b)
		}
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var text strings.Builder
	var last time.Time
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case strings.HasPrefix(line, ":"):
			r.keepAlives++
		case line == "data: [DONE]":
			r.text = text.String()
			switch {
			case r.errType != "":
			case r.finish == "":
				r.problem = fmt.Sprintf("[DONE] without a finish_reason after %d tokens", r.tokens)
			}
			return r
		case strings.HasPrefix(line, "data: "):
			data := []byte(strings.TrimPrefix(line, "data: "))
			if bytes.Contains(data, []byte(`"error"`)) {
				if !r.envelope(data) {
					r.problem = fmt.Sprintf("an error event that is not an OpenAI envelope: %q", data)
					return r
				}
				continue
			}
			var ev struct {
				Choices []struct {
					Text         string  `json:"text"`
					FinishReason *string `json:"finish_reason"`
				} `json:"choices"`
			}
			if err := json.Unmarshal(data, &ev); err != nil || len(ev.Choices) != 1 {
				r.problem = fmt.Sprintf("an event that is not a completion chunk: %q", data)
				return r
			}
			now := time.Now()
			if ch := ev.Choices[0]; ch.Text != "" {
				if r.first.IsZero() {
					r.first = now
				} else {
					r.maxGap = max(r.maxGap, now.Sub(last))
				}
				last = now
				r.tokens++
				text.WriteString(ch.Text)
			}
			if fr := ev.Choices[0].FinishReason; fr != nil {
				r.finish = *fr
			}
		default:
			r.problem = fmt.Sprintf("a line that is not SSE: %q", line)
			return r
		}
	}
	r.text = text.String()
	if err := sc.Err(); err != nil {
		r.problem = requestProblem(ctx, c.bound, err)
	} else if r.errType == "" {
		r.problem = fmt.Sprintf("the stream ended without [DONE] after %d tokens", r.tokens)
	}
	return r
}

// envelope reads an OpenAI error envelope into r; false when b is not one.
func (r *loadResult) envelope(b []byte) bool {
	var e struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		return false
	}
	r.errType, r.errMsg = e.Error.Type, e.Error.Message
	if e.Error.Code != nil {
		r.errCode = *e.Error.Code
	}
	return true
}

// requestProblem names a transport error: past the bound, a hang.
func requestProblem(ctx context.Context, bound time.Duration, err error) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Sprintf("hung: still open after %s", bound)
	}
	return "broke off without an error: " + err.Error()
}
