package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/strata-llm/strata/transport"
)

// blockPipeline is the fake pipeline seen as one local shard that keeps
// block tables the way a shard's replica does: each row names its
// sequence's whole table, each tombstone drops one. It feeds a LocalView, so
// /metrics and /v1/cluster report what the fake holds.
type blockPipeline struct {
	*fakePipeline
	mu      sync.Mutex
	tables  map[uint64][]int32
	batches uint64
}

func (p *blockPipeline) Dispatch(b *transport.MicroBatch) error {
	p.mu.Lock()
	for _, t := range b.Tombstones {
		delete(p.tables, t.Seq)
	}
	for _, r := range b.Rows {
		p.tables[r.Seq] = r.Blocks
	}
	if b.ID != 0 {
		p.batches++
	}
	p.mu.Unlock()
	return p.fakePipeline.Dispatch(b)
}

func (p *blockPipeline) shards() []LocalShard {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[int32]bool{}
	for _, t := range p.tables {
		for _, b := range t {
			seen[b] = true
		}
	}
	return []LocalShard{{ShardID: "local-0", BlocksUsed: len(seen), BlocksTotal: p.blocks, Sequences: len(p.tables),
		InvariantOK: true, Batches: p.batches, Busy: time.Duration(p.batches) * time.Millisecond}}
}

// clusterView returns the view a Cluster would publish of the fake: one
// connected, ready shard holding layers [0, 2), its KV as of no heartbeat.
func clusterView(eng *Engine) func() ClusterView {
	return func() ClusterView {
		ec := eng.Config()
		return ClusterView{
			ClusterID: "test", Epoch: ec.Epoch, Placement: 1, Ready: true,
			KVBlocks: ec.Sched.KV.Blocks, BlockSize: ec.Sched.KV.BlockSize, LiveSequences: eng.Stats().KV.Sequences,
			Shards: []ShardView{{
				ShardID: "local-0", NodeID: "node-0", Addr: "127.0.0.1:7071", Device: "cpu", CPUCores: 2,
				Stage: 0, First: 0, End: 2, Embed: true, Head: true, State: "ready", Connected: true,
			}},
			BatchFailed: map[string]uint64{},
		}
	}
}

// newViewHarness is newHarness with a LocalView over a blockPipeline.
func newViewHarness(t *testing.T, cfg ServerConfig) (*harness, *blockPipeline, *LocalView) {
	t.Helper()
	info := testInfo(t)
	pipe := &blockPipeline{fakePipeline: newFakePipeline(info.Vocab, 256), tables: map[uint64][]int32{}}
	ec := DefaultEngineConfig()
	ec.Sched.MaxModelLen = info.Context
	ec.Tick = 5 * time.Millisecond
	ec.Epoch = 42
	eng, err := NewEngine(ec, pipe)
	if err != nil {
		t.Fatal(err)
	}
	lv := NewLocalView(LocalViewConfig{Engine: eng, Cluster: clusterView(eng), Shards: pipe.shards})
	cfg.View, cfg.StageTimings = lv.View, lv.StageTimings
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { pipe.run(ctx) })
	wg.Go(func() { eng.Run(ctx) })
	srv := NewServer(cfg, eng, info, nil)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		pipe.resume()
		cancel()
		wg.Wait()
	})
	return &harness{t: t, srv: srv, http: hs, eng: eng, pipe: pipe.fakePipeline, info: info, stop: cancel}, pipe, lv
}

// scrape returns /metrics parsed.
func scrape(t *testing.T, h *harness) map[string]*dto.MetricFamily {
	t.Helper()
	resp, body := h.do("GET", "/metrics", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %s", resp.StatusCode, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return fams
}

// metricValue returns the value of name's sample whose labels include
// labels (name=value pairs); ok is false when there is none.
func metricValue(fams map[string]*dto.MetricFamily, name string, labels ...string) (v float64, ok bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func mustMetric(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	v, ok := metricValue(fams, name, labels...)
	if !ok {
		t.Fatalf("/metrics has no %s%v", name, labels)
	}
	return v
}

func TestMetricsAfterRequests(t *testing.T) {
	h, pipe, _ := newViewHarness(t, ServerConfig{})
	// A slow pipeline first: while a request decodes, the shard holds its
	// blocks and the engine counts it running.
	pipe.setDelay(10 * time.Millisecond)
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.post("/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 30})
	}()
	waitFor(t, func() bool { return pipe.shards()[0].BlocksUsed > 0 })
	fams := scrape(t, h)
	if v := mustMetric(t, fams, "strata_kv_blocks_used", "shard", "local-0"); v < 1 {
		t.Errorf("mid-request strata_kv_blocks_used = %v, want >= 1", v)
	}
	if v := mustMetric(t, fams, "strata_requests_running"); v != 1 {
		t.Errorf("mid-request strata_requests_running = %v, want 1", v)
	}
	<-done
	pipe.setDelay(0)

	var completion, prompt int
	for _, stream := range []bool{false, true} {
		body := map[string]any{"prompt": "Once upon a time", "max_tokens": 6, "stream": stream}
		if stream {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		resp, out := h.post("/v1/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("stream %v: %d %s", stream, resp.StatusCode, out)
		}
		var u struct {
			Usage *usage `json:"usage"`
		}
		if stream {
			for _, ev := range sseEvents(t, out) {
				if ev != "[DONE]" && strings.Contains(ev, `"usage":{`) {
					mustUnmarshal(t, ev, &u)
				}
			}
		} else {
			mustUnmarshal(t, string(out), &u)
		}
		if u.Usage == nil || u.Usage.CompletionTokens < 2 {
			t.Fatalf("stream %v: usage %+v in %s", stream, u.Usage, out)
		}
		completion += u.Usage.CompletionTokens
		prompt += u.Usage.PromptTokens
	}
	h.waitIdle()
	waitFor(t, func() bool { return pipe.shards()[0].Sequences == 0 })

	fams = scrape(t, h)
	st := h.eng.Stats()
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"strata_requests_running", nil, 0},
		{"strata_requests_waiting", nil, 0},
		{"strata_batches_in_flight", nil, 0},
		{"strata_preemptions_total", nil, 0},
		{"strata_tombstones_total", []string{"reason", "finished"}, 3},
		{"strata_tombstones_total", []string{"reason", "aborted"}, 0},
		{"strata_generation_tokens_total", nil, float64(st.GeneratedTokens)},
		{"strata_prompt_tokens_total", nil, float64(st.PromptTokens)},
		{"strata_kv_blocks_used", []string{"shard", "local-0"}, 0},
		{"strata_kv_blocks_total", []string{"shard", "local-0"}, 256},
		{"strata_kv_sequences", []string{"shard", "local-0"}, 0},
		{"strata_kv_invariant_ok", []string{"shard", "local-0"}, 1},
		{"strata_kv_allocator_blocks", []string{"state", "used"}, 0},
		{"strata_kv_allocator_sequences", nil, 0},
		{"strata_time_to_first_token_seconds", nil, 3}, // histogram: its count
		{"strata_stage_latency_seconds", []string{"shard", "local-0"}, float64(pipe.shards()[0].Batches)},
	} {
		if got := mustMetric(t, fams, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// The two measured requests' tokens are in the counter. Every token
	// after a request's first delivery has an inter-token sample (tokens
	// delivered with the first have none).
	if gen := mustMetric(t, fams, "strata_generation_tokens_total"); gen < float64(completion) {
		t.Errorf("strata_generation_tokens_total = %v, want >= %d", gen, completion)
	}
	if p := mustMetric(t, fams, "strata_prompt_tokens_total"); p < float64(prompt) {
		t.Errorf("strata_prompt_tokens_total = %v, want >= %d", p, prompt)
	}
	if itl := mustMetric(t, fams, "strata_inter_token_latency_seconds"); itl < 1 || itl > float64(st.GeneratedTokens)-3 {
		t.Errorf("strata_inter_token_latency_seconds count = %v, want 1..%d (generated %d minus 3 first tokens)", itl, st.GeneratedTokens-3, st.GeneratedTokens)
	}
	if pipe.shards()[0].Batches == 0 {
		t.Error("no batch counted")
	}
	if _, ok := fams["go_goroutines"]; !ok {
		t.Error("no Go runtime metrics")
	}
}

// TestMetricsInvariant: an idle engine whose stage still holds a sequence
// (a leaked tombstone) reports strata_kv_invariant_ok 0 once the mismatch
// outlasts the grace, and 1 again when it clears.
func TestMetricsInvariant(t *testing.T) {
	h, pipe, lv := newViewHarness(t, ServerConfig{})
	now := time.Now()
	lv.now = func() time.Time { return now }
	pipe.mu.Lock()
	pipe.tables[99] = []int32{1, 2}
	pipe.mu.Unlock()
	ok := func() float64 { return mustMetric(t, scrape(t, h), "strata_kv_invariant_ok", "shard", "local-0") }
	if v := ok(); v != 1 {
		t.Fatalf("within grace: invariant_ok %v, want 1", v)
	}
	now = now.Add(invariantGrace)
	if v := ok(); v != 0 {
		t.Fatalf("after grace: invariant_ok %v, want 0", v)
	}
	v := lv.View()
	if v.Shards[0].InvariantOK || v.Shards[0].KVUsed != 2 || v.Shards[0].Sequences != 1 {
		t.Errorf("view shard %+v", v.Shards[0])
	}
	pipe.mu.Lock()
	delete(pipe.tables, 99)
	pipe.mu.Unlock()
	if v := ok(); v != 1 {
		t.Fatalf("cleared: invariant_ok %v, want 1", v)
	}
}

func mustUnmarshal(t *testing.T, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatalf("decode %s: %v", s, err)
	}
}
