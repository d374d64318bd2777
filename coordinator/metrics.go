package coordinator

import (
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// StageTiming is one stage's cumulative compute time, for
// strata_stage_latency_seconds.
type StageTiming struct {
	Shard   string
	Batches uint64        // batches the stage processed
	Busy    time.Duration // time it spent on them
}

// tombstoneReasons are the coordinator's tombstone reasons on the wire;
// strata_tombstones_total reports each of them, zeros included, so that
// rate() works from the first scrape.
var tombstoneReasons = []string{"finished", "aborted", "timeout", "preempted", "failed"}

// metrics is the coordinator's Prometheus registry. Gauges and counters are
// read from the engine and the cluster view at scrape time (collector); the
// latency histograms are observed by the API handlers.
type metrics struct {
	reg     *prometheus.Registry
	handler http.Handler
	ttft    prometheus.Histogram
	itl     prometheus.Histogram
}

func newMetrics(eng *Engine, view func() ClusterView, stages func() []StageTiming) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "strata_time_to_first_token_seconds",
			Help: "Time from a generation request's arrival to its first token reaching the handler.",
			// 5 ms to ~164 s: a cached short prompt to a long queue wait.
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 16),
		}),
		itl: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "strata_inter_token_latency_seconds",
			Help: "Time between a request's successive tokens reaching the handler; tokens that arrive together share the gap evenly, and those that arrive with the first token have no sample.",
			// 1 ms to ~16 s: a tiny model's decode step to a stalled pipeline.
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
	}
	m.reg.MustRegister(m.ttft, m.itl, newCollector(eng, view, stages),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	return m
}

// tokenTimer observes one request's TTFT and inter-token latency. It
// belongs to the request's handler goroutine.
type tokenTimer struct {
	m       *metrics
	arrived time.Time
	last    time.Time // when the previous tokens arrived; zero before the first
}

func (m *metrics) timer(arrived time.Time) tokenTimer {
	return tokenTimer{m: m, arrived: arrived}
}

// observe records n tokens arriving now: the first token's TTFT (tokens
// delivered with it get no inter-token sample), then for later deliveries
// the gap since the previous one, split evenly over its n tokens.
func (t *tokenTimer) observe(n int) {
	if n <= 0 || t.m == nil {
		return
	}
	now := time.Now()
	if t.last.IsZero() {
		t.m.ttft.Observe(now.Sub(t.arrived).Seconds())
	} else {
		gap := now.Sub(t.last).Seconds() / float64(n)
		for range n {
			t.m.itl.Observe(gap)
		}
	}
	t.last = now
}

// collector reads the engine's and the cluster's snapshots at scrape time.
type collector struct {
	eng    *Engine
	view   func() ClusterView
	stages func() []StageTiming

	running, waiting, inFlight, preemptions, tombstones    *prometheus.Desc
	promptTokens, genTokens                                *prometheus.Desc
	allocBlocks, allocSeqs, prefixQueried, prefixHit       *prometheus.Desc
	blocksUsed, blocksTotal, sequences, invariantOK, stage *prometheus.Desc
	unacked, batchFailed, wireRefused                      *prometheus.Desc
}

var _ prometheus.Collector = (*collector)(nil)

func newCollector(eng *Engine, view func() ClusterView, stages func() []StageTiming) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &collector{
		eng: eng, view: view, stages: stages,
		running:       d("strata_requests_running", "Requests admitted by the scheduler and not yet ended."),
		waiting:       d("strata_requests_waiting", "Requests waiting for admission."),
		inFlight:      d("strata_batches_in_flight", "Micro-batches dispatched and not yet returned."),
		preemptions:   d("strata_preemptions_total", "Sequences preempted because KV blocks ran out (the request is recomputed)."),
		tombstones:    d("strata_tombstones_total", "Tombstones the coordinator emitted, one per ended sequence, by reason.", "reason"),
		promptTokens:  d("strata_prompt_tokens_total", "Prompt tokens of admitted requests."),
		genTokens:     d("strata_generation_tokens_total", "Tokens generated and delivered to requests."),
		allocBlocks:   d("strata_kv_allocator_blocks", "The coordinator's KV allocator blocks by state: used (referenced by a live sequence), cached (prefix cache, evictable), free.", "state"),
		allocSeqs:     d("strata_kv_allocator_sequences", "Live sequences in the coordinator's KV allocator."),
		prefixQueried: d("strata_prefix_cache_queries_total", "Prompt positions offered to the prefix cache."),
		prefixHit:     d("strata_prefix_cache_hits_total", "Prompt positions served from the prefix cache."),
		blocksUsed:    d("strata_kv_blocks_used", "KV blocks referenced by live replica tables on an in-process shard.", "shard"),
		blocksTotal:   d("strata_kv_blocks_total", "KV blocks in an in-process shard's pool.", "shard"),
		sequences:     d("strata_kv_sequences", "Live sequences on an in-process shard.", "shard"),
		invariantOK: d("strata_kv_invariant_ok",
			"1 while an in-process shard's KV agrees with itself and the allocator: its replica tables are consistent, the allocator's used+cached+free equals its total, the shard's blocks fit its pool, and when the engine is idle a placed shard holds exactly the allocator's live sequences and used blocks (a difference lasting over 1s).", "shard"),
		unacked: d("strata_tombstones_unacked",
			"Backstop tombstones sent on a shard's control stream and not yet acked (Cluster.UnackedTombstones); resent when the stream reconnects.", "shard"),
		batchFailed: d("strata_batch_failed_total",
			"Batches (or rows) the cluster reported failed, by reason: BatchFailed reports from shards, and pipeline_lost for in-flight batches failed by a loss (Cluster.BatchFailedByReason).", "reason"),
		wireRefused: d("strata_wire_refused_total",
			"Shard messages the coordinator refused before use (out of range, over a limit, outside an enum, from a stream that does not carry them, past the registry's limit; a recovered panic), by reason.", "reason"),
		stage: d("strata_stage_latency_seconds",
			"Time an in-process shard spent on a batch: count and sum only (remote shards export buckets on their own /metrics).", "shard"),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.running, c.waiting, c.inFlight, c.preemptions, c.tombstones, c.promptTokens, c.genTokens,
		c.allocBlocks, c.allocSeqs, c.prefixQueried, c.prefixHit,
		c.blocksUsed, c.blocksTotal, c.sequences, c.invariantOK, c.stage, c.unacked, c.batchFailed, c.wireRefused,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	cnt := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	st := c.eng.Stats()
	g(c.running, float64(st.Running))
	g(c.waiting, float64(st.Waiting))
	g(c.inFlight, float64(st.InFlight))
	cnt(c.preemptions, st.Preemptions)
	reasons := slices.Clone(tombstoneReasons)
	for r := range st.Tombstones {
		if !slices.Contains(reasons, r) {
			reasons = append(reasons, r)
		}
	}
	for _, r := range reasons {
		cnt(c.tombstones, st.Tombstones[r], r)
	}
	cnt(c.promptTokens, st.PromptTokens)
	cnt(c.genTokens, st.GeneratedTokens)
	g(c.allocBlocks, float64(st.KV.Used), "used")
	g(c.allocBlocks, float64(st.KV.Cached), "cached")
	g(c.allocBlocks, float64(st.KV.Free), "free")
	g(c.allocSeqs, float64(st.KV.Sequences))
	cnt(c.prefixQueried, st.KV.PrefixQueried)
	cnt(c.prefixHit, st.KV.PrefixHit)

	if c.view != nil {
		v := c.view()
		for r, n := range v.BatchFailed {
			cnt(c.batchFailed, n, r)
		}
		for r, n := range v.WireRefused {
			cnt(c.wireRefused, n, r)
		}
		for _, s := range v.Shards {
			g(c.unacked, float64(s.TombstonesUnacked), s.ShardID)
			if !s.Local {
				continue
			}
			g(c.blocksUsed, float64(s.KVUsed), s.ShardID)
			g(c.blocksTotal, float64(s.KVTotal), s.ShardID)
			g(c.sequences, float64(s.Sequences), s.ShardID)
			ok := 0.0
			if s.InvariantOK {
				ok = 1
			}
			g(c.invariantOK, ok, s.ShardID)
		}
	}
	if c.stages != nil {
		for _, s := range c.stages() {
			ch <- prometheus.MustNewConstHistogram(c.stage, s.Batches, s.Busy.Seconds(), nil, s.Shard)
		}
	}
}
