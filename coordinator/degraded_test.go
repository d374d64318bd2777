package coordinator

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// downPipeline is the fake pipeline as a placed DynamicPipeline whose
// readiness the test sets, the way a Cluster's Ready reports a loss.
type downPipeline struct {
	*fakePipeline
	down    atomic.Pointer[error]
	changed chan struct{} // size 1
}

var _ DynamicPipeline = (*downPipeline)(nil)

func (p *downPipeline) Ready() error {
	if e := p.down.Load(); e != nil {
		return *e
	}
	return nil
}

func (p *downPipeline) Version() uint64 { return 1 }

func (p *downPipeline) Changed() <-chan struct{} { return p.changed }

func (p *downPipeline) setDown(err error) {
	if err == nil {
		p.down.Store(nil)
	} else {
		p.down.Store(&err)
	}
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// degradedServer runs an engine and the HTTP API over a downPipeline, with
// keep-alives every 20 ms.
func degradedServer(t *testing.T, mod func(*EngineConfig)) (*downPipeline, *Engine, *httptest.Server) {
	t.Helper()
	info := testInfo(t)
	pipe := &downPipeline{fakePipeline: newFakePipeline(info.Vocab, 256), changed: make(chan struct{}, 1)}
	ec := DefaultEngineConfig()
	ec.Sched.MaxModelLen = info.Context
	ec.Tick = 5 * time.Millisecond
	if mod != nil {
		mod(&ec)
	}
	eng, err := NewEngine(ec, pipe)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { pipe.run(ctx) })
	wg.Go(func() { eng.Run(ctx) })
	srv := NewServer(ServerConfig{KeepAlive: 20 * time.Millisecond}, eng, info, pipe.Ready)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		pipe.resume()
		cancel()
		wg.Wait()
	})
	return pipe, eng, hs
}

// lostAndUnplaceable is what a Cluster's Ready says when the shards left
// after a loss cannot hold the model.
var lostAndUnplaceable = &notReadyError{
	why:   "shard node-b-2 lost: control stream closed: EOF; cannot place the model on the shards left (1): control: the shards cannot hold the model",
	kinds: []error{ErrPipelineDown, ErrNoFit},
}

// sseLine is one line of a server-sent event stream, or the end of it.
type sseLine struct {
	text string
	err  error // set on the last one: io.EOF or the read error
}

// openStream posts a streaming completion and returns the response status
// and its lines as they come.
func openStream(t *testing.T, hs *httptest.Server, body string) (int, <-chan sseLine) {
	t.Helper()
	resp, err := hs.Client().Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	lines := make(chan sseLine, 1024) // more lines than any test's stream has
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if sc.Text() != "" {
				lines <- sseLine{text: sc.Text()}
			}
		}
		lines <- sseLine{err: errors.Join(sc.Err(), errors.New("end of stream"))}
	}()
	return resp.StatusCode, lines
}

// until reads lines until one satisfies match (returned), failing at the
// end of the stream or after 10 s.
func until(t *testing.T, lines <-chan sseLine, what string, match func(string) bool) string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case l := <-lines:
			if l.err != nil {
				t.Fatalf("waiting for %s: %v", what, l.err)
			}
			if match(l.text) {
				return l.text
			}
		case <-deadline:
			t.Fatalf("no %s within 10 s", what)
		}
	}
}

// TestEngineFailsDispatchedWhenNothingCanHold: once the cluster reports that
// the shards left cannot hold the model (ErrPipelineDown with ErrNoFit),
// the requests whose work was in the pipeline end at once with a 503 that
// says why — an error event in a stream, the status of a whole response —
// while a new request is admitted and waits, with keep-alive comments
// saying what for, and runs when a pipeline is back.
func TestEngineFailsDispatchedWhenNothingCanHold(t *testing.T) {
	pipe, eng, hs := degradedServer(t, nil)
	pipe.pause() // the pipeline holds every batch: the requests are in flight
	status, streamed := openStream(t, hs, `{"prompt": "Once", "max_tokens": 50, "stream": true}`)
	if status != http.StatusOK {
		t.Fatalf("stream: %d", status)
	}
	whole := make(chan *http.Response, 1)
	go func() {
		resp, err := hs.Client().Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "Upon", "max_tokens": 50}`))
		if err != nil {
			t.Error(err)
			close(whole)
			return
		}
		whole <- resp
	}()
	deadline := time.Now().Add(10 * time.Second)
	for eng.Stats().Running < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the two requests were not dispatched: %+v", eng.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}

	pipe.setDown(lostAndUnplaceable)
	failed := time.Now()
	ev := until(t, streamed, "the stream's error event", func(s string) bool { return strings.HasPrefix(s, "data: {\"error\"") })
	var e envelope
	if err := json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &e); err != nil {
		t.Fatal(err)
	}
	if *e.Error.Code != "service_unavailable" || e.Error.Type != "server_error" || !strings.Contains(e.Error.Message, "cannot place the model") ||
		!strings.Contains(e.Error.Message, "node-b-2 lost") {
		t.Fatalf("stream ended with %+v, want service_unavailable saying which shard was lost and that the rest cannot hold the model", *e.Error)
	}
	resp := <-whole
	if resp == nil {
		t.FailNow()
	}
	body := new(strings.Builder)
	bufio.NewReader(resp.Body).WriteTo(body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body.String(), "cannot place the model") {
		t.Fatalf("whole response: %d %s, want 503 saying why", resp.StatusCode, body)
	}
	t.Logf("in-flight requests failed %v after the cluster reported it", time.Since(failed).Round(time.Millisecond))

	// A new request is admitted while the pipeline is down, and kept alive.
	status, waiting := openStream(t, hs, `{"prompt": "Once", "max_tokens": 5, "stream": true}`)
	if status != http.StatusOK {
		t.Fatalf("a new request while down: %d, want admitted (200) to wait", status)
	}
	ka := until(t, waiting, "a keep-alive comment", func(s string) bool { return strings.HasPrefix(s, ":") })
	if !strings.HasPrefix(ka, ": waiting for a pipeline: shard node-b-2 lost") {
		t.Fatalf("keep-alive %q, want \": waiting for a pipeline: <why>\"", ka)
	}
	pipe.setDown(nil)
	pipe.resume()
	until(t, waiting, "the waiting request's end", func(s string) bool {
		if strings.Contains(s, `"error"`) {
			t.Fatalf("the waiting request failed: %s", s)
		}
		return s == "data: [DONE]"
	})
	if st := eng.Stats(); st.Running != 0 || st.Waiting != 0 {
		t.Fatalf("engine after the heal: %+v", st)
	}
}

// TestWaitingForAPipelineTimesOut: a request admitted while the pipeline is
// down waits its queue timeout, then gets a 503 that says it waited for a
// pipeline, and why there is none.
func TestWaitingForAPipelineTimesOut(t *testing.T) {
	pipe, _, hs := degradedServer(t, func(ec *EngineConfig) { ec.Sched.QueueTimeout = 50 * time.Millisecond })
	pipe.setDown(lostAndUnplaceable)
	resp, err := hs.Client().Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "Once", "max_tokens": 5}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e envelope
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || *e.Error.Code != "queue_timeout" ||
		!strings.Contains(e.Error.Message, "waiting for a pipeline: shard node-b-2 lost") {
		t.Fatalf("%d %+v, want 503 queue_timeout saying it waited for a pipeline and why", resp.StatusCode, *e.Error)
	}
}

// TestStreamKeepAlive: a stream that waits — here for a pipeline that
// holds its batches — gets a keep-alive comment after each KeepAlive
// without an event, and still ends normally.
func TestStreamKeepAlive(t *testing.T) {
	pipe, _, hs := degradedServer(t, nil)
	pipe.pause()
	status, lines := openStream(t, hs, `{"prompt": "Once", "max_tokens": 5, "stream": true}`)
	if status != http.StatusOK {
		t.Fatalf("stream: %d", status)
	}
	for range 2 {
		if ka := until(t, lines, "a keep-alive comment", func(s string) bool { return strings.HasPrefix(s, ":") }); ka != ": waiting" {
			t.Fatalf("keep-alive %q, want \": waiting\"", ka)
		}
	}
	pipe.resume()
	until(t, lines, "[DONE]", func(s string) bool { return s == "data: [DONE]" })
}
