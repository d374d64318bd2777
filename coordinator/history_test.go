package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// TestHistoryRingBounded: the rings keep the newest samples and events, in
// order, and never more than their capacity.
func TestHistoryRingBounded(t *testing.T) {
	h := NewHistory(5, 3)
	for i := range 12 {
		h.addSample(Sample{T: int64(i)})
		h.Record(Event{T: int64(i), Kind: "joined"})
	}
	ss, es := h.snapshot(-1)
	if len(ss) != 5 || len(es) != 3 || cap(h.samples.buf) != 5 {
		t.Fatalf("kept %d samples, %d events, want 5 and 3", len(ss), len(es))
	}
	for i, s := range ss {
		if s.T != int64(7+i) {
			t.Errorf("sample %d at %d, want %d", i, s.T, 7+i)
		}
	}
	if es[0].T != 9 || es[2].T != 11 {
		t.Errorf("events %+v, want 9..11", es)
	}
	if ss, es := h.snapshot(9); len(ss) != 2 || ss[0].T != 10 || len(es) != 2 || es[0].T != 10 {
		t.Errorf("since 9: %+v %+v, want from 10", ss, es)
	}
	if ss, _ := h.snapshot(11); ss == nil || len(ss) != 0 {
		t.Errorf("since the newest: %v, want empty and not nil", ss)
	}
	if h := NewHistory(0, 0); len(h.samples.buf) != HistorySamples || len(h.events.buf) != HistoryEvents {
		t.Errorf("default capacities %d, %d", len(h.samples.buf), len(h.events.buf))
	}
}

// TestHistorySampledEverySecond: Server.Run takes one sample a second, on
// the (fake) clock, with the engine's counts and each shard's KV, and the
// latency percentiles of the tokens of that second; it returns when its
// context ends.
func TestHistorySampledEverySecond(t *testing.T) {
	// Shard a does 4 batches of 2.5 ms a second (its counters in the view,
	// as a heartbeat or an in-process shard reports them); b reports none.
	var viewMu sync.Mutex
	var aBatches uint64
	view := func() ClusterView {
		viewMu.Lock()
		defer viewMu.Unlock()
		aBatches += 4
		return ClusterView{Shards: []ShardView{{ShardID: "b", Stage: 1, KVUsed: 5, KVTotal: 10},
			{ShardID: "a", Stage: 0, KVUsed: 7, KVTotal: 10, Batches: aBatches, BusyNs: int64(aBatches) * 2500_000},
			{ShardID: "c", Stage: -1, KVUsed: 3, KVTotal: 10, State: "lost"}}}
	}
	h := newHarness(t, harnessOpts{cfg: ServerConfig{View: view}})
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { h.srv.Run(ctx) })
		time.Sleep(1500 * time.Millisecond)
		// Three first tokens at 40 ms and one gap of 3 ms in the second second.
		for range 3 {
			h.srv.metrics.ttft.Observe(0.040)
		}
		h.srv.metrics.itl.Observe(0.003)
		time.Sleep(4 * time.Second)
		cancel()
		wg.Wait()
	})
	ss, _ := h.srv.History().snapshot(-1)
	if len(ss) != 5 {
		t.Fatalf("%d samples over 5.5 s, want 5", len(ss))
	}
	for i := 1; i < len(ss); i++ {
		if d := ss[i].T - ss[i-1].T; d != 1000 {
			t.Errorf("samples %d and %d are %d ms apart, want 1000", i-1, i, d)
		}
	}
	if ss[0].TTFTp50 != nil || ss[2].TTFTp50 != nil {
		t.Errorf("TTFT in seconds without tokens: %v %v", ss[0].TTFTp50, ss[2].TTFTp50)
	}
	p50, p99 := ss[1].TTFTp50, ss[1].TTFTp99
	if p50 == nil || p99 == nil || *p50 <= 20 || *p50 > 40 || *p99 < *p50 || *p99 > 40 {
		t.Errorf("TTFT p50 %v p99 %v, want in the 20–40 ms bucket", p50, p99)
	}
	if p := ss[1].ITLp99; p == nil || *p <= 2 || *p > 4 {
		t.Errorf("ITL p99 %v, want in the 2–4 ms bucket", p)
	}
	if got := ss[4].ShardsKV; len(got) != 2 || got[0].ShardID != "b" || got[0].Used != 5 || got[1].Stage != 0 || got[1].Total != 10 {
		t.Errorf("shards %+v", got)
	}
	if b, a := ss[4].ShardsKV[0].MSPerBatch, ss[4].ShardsKV[1].MSPerBatch; b != nil || a == nil || *a != 2.5 {
		t.Errorf("ms per batch: b %v, a %v, want none and 2.5", b, a)
	}
	if ss[4].KVTotal != 256 || ss[4].TokS != 0 {
		t.Errorf("sample %+v", ss[4])
	}
}

// TestHistoryEndpoint: GET /v1/cluster/history has the samples and events
// in its documented shape, honours since, refuses a bad since, and needs
// the API key like /v1/cluster.
func TestHistoryEndpoint(t *testing.T) {
	hist := NewHistory(0, 0)
	h := newHarness(t, harnessOpts{cfg: ServerConfig{APIKey: "sekret", History: hist}})
	p50 := 12.5
	hist.addSample(Sample{T: 1000, TokS: 3, Running: 1, TTFTp50: &p50, ShardsKV: []ShardKV{{ShardID: "a", Used: 2, Total: 8}}})
	hist.addSample(Sample{T: 2000, TokS: 4})
	hist.Record(Event{T: 1500, Kind: "lost", ShardID: "a", Message: "shard lost why=x"})

	if resp, _ := h.do("GET", "/v1/cluster/history", nil); resp.StatusCode != 401 {
		t.Errorf("without key: %d, want 401", resp.StatusCode)
	}
	key := []string{"Authorization", "Bearer sekret"}
	resp, out := h.do("GET", "/v1/cluster/history", nil, key...)
	if resp.StatusCode != 200 || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("history: %d %s", resp.StatusCode, out)
	}
	var raw map[string]any
	mustUnmarshal(t, string(out), &raw)
	if raw["interval_ms"] != 1000.0 || raw["capacity"] != float64(HistorySamples) {
		t.Errorf("header fields: %s", out)
	}
	ss := raw["samples"].([]any)
	if len(ss) != 2 {
		t.Fatalf("samples: %s", out)
	}
	s0 := ss[0].(map[string]any)
	for _, k := range []string{"t", "tok_s", "running", "waiting", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "kv_blocks_used", "kv_blocks_total", "shards"} {
		if _, ok := s0[k]; !ok {
			t.Errorf("sample lacks %q: %v", k, s0)
		}
	}
	if s0["ttft_p50_ms"] != 12.5 || s0["ttft_p99_ms"] != nil {
		t.Errorf("percentiles: %v", s0)
	}
	if !strings.Contains(string(out), `"events":[{"t":1500,"kind":"lost","shard_id":"a","message":"shard lost why=x"}]`) {
		t.Errorf("events: %s", out)
	}
	_, out = h.do("GET", "/v1/cluster/history?since=1000", nil, key...)
	if !strings.Contains(string(out), `"samples":[{"t":2000`) || !strings.Contains(string(out), `"events":[{"t":1500`) {
		t.Errorf("since=1000: %s", out)
	}
	_, out = h.do("GET", "/v1/cluster/history?since=2000", nil, key...)
	if !strings.Contains(string(out), `"samples":[],"events":[]`) {
		t.Errorf("since=2000: %s", out)
	}
	if resp, out := h.do("GET", "/v1/cluster/history?since=soon", nil, key...); resp.StatusCode != 400 || !strings.Contains(string(out), `"param":"since"`) {
		t.Errorf("bad since: %d %s", resp.StatusCode, out)
	}
}

// TestHistoryEventsFromClusterLog: the cluster's own log records become
// events — joins, the placement, a loss and the re-placement — whatever
// the log's level, and the log still gets every record.
func TestHistoryEventsFromClusterLog(t *testing.T) {
	hist := NewHistory(0, 0)
	var logged strings.Builder
	cfg := DefaultClusterConfig()
	cfg.GossipAddr, cfg.GRPCAddr, cfg.DataDir = "", "127.0.0.1:0", t.TempDir()
	cfg.MinShards, cfg.Shape = 2, testShape()
	cfg.Log = slog.New(hist.LogHandler(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn})))
	c, err := NewCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.ln.Close(); c.store.Close() })
	h := &handCluster{Cluster: c, t: t, now: time.Now(), out: map[string]*outbox{}}

	a := h.join("node-a", 1, 1<<20)
	b := h.join("node-b", 2, 1<<20)
	h.closeStream(b)

	_, es := hist.snapshot(-1)
	var got []string
	for _, e := range es {
		got = append(got, e.Kind+" "+e.ShardID)
	}
	want := []string{"joined " + a, "joined " + b, "placement ", "lost " + b, "placement "}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	if !strings.Contains(es[3].Message, "why=") || !strings.Contains(es[4].Message, "placement=2") || es[3].T == 0 {
		t.Errorf("event messages: %+v", es)
	}
	if !strings.Contains(logged.String(), "shard lost") || strings.Contains(logged.String(), "shard registered") {
		t.Errorf("the log at warn got:\n%s", logged.String())
	}
}

// TestShardNameInView: the name a shard registers is its title in
// /v1/cluster, clamped and made printable; none leaves it empty.
func TestShardNameInView(t *testing.T) {
	h := newHandCluster(t, 1)
	for i, name := range []string{"gpu-box-1", "bad\x1b[2Jname" + strings.Repeat("x", 80), ""} {
		reply := make(chan registerReply, 1)
		h.turn(evRegister{req: &pb.RegisterRequest{NodeId: fmt.Sprintf("node-%d", i), Name: name, Incarnation: 1, GrpcAddr: "127.0.0.1:1",
			ProtocolVersion: transport.ProtocolVersion, Devices: &pb.Devices{CpuCores: 2, MemoryBytes: 1 << 20, Device: "cpu"}}, reply: reply})
		if r := <-reply; r.err != nil {
			t.Fatal(r.err)
		}
	}
	names := map[string]string{}
	for _, s := range h.View().Shards {
		names[s.NodeID] = s.Name
	}
	if names["node-0"] != "gpu-box-1" || names["node-2"] != "" {
		t.Errorf("names %q", names)
	}
	if n := names["node-1"]; len(n) > maxShardName || !strings.HasPrefix(n, "bad\uFFFD[2Jname") {
		t.Errorf("clamped name %q (%d bytes)", n, len(n))
	}
}
