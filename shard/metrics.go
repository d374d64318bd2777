package shard

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/strata-llm/strata/transport"
)

// counters are the node's cumulative event counts that no Table keeps:
// batches, tokens, time spent on batches and batch failures. Safe for
// concurrent use.
type counters struct {
	mu      sync.Mutex
	batches uint64
	tokens  uint64
	busy    time.Duration
	failed  map[transport.Code]uint64 // batches this shard failed, by reason
	lost    uint64                    // failure reports dropped: no upstream and control outbox full
}

func (c *counters) batch(tokens int, took time.Duration) {
	c.mu.Lock()
	c.batches++
	c.tokens += uint64(tokens)
	c.busy += took
	c.mu.Unlock()
}

func (c *counters) fail(reason transport.Code) {
	c.mu.Lock()
	if c.failed == nil {
		c.failed = map[transport.Code]uint64{}
	}
	c.failed[reason]++
	c.mu.Unlock()
}

func (c *counters) lose() {
	c.mu.Lock()
	c.lost++
	c.mu.Unlock()
}

type countersSnapshot struct {
	batches, tokens, lost uint64
	busy                  time.Duration
	failed                map[transport.Code]uint64
}

func (c *counters) snapshot() countersSnapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := countersSnapshot{batches: c.batches, tokens: c.tokens, lost: c.lost, busy: c.busy, failed: make(map[transport.Code]uint64, len(c.failed))}
	for k, v := range c.failed {
		s.failed[k] = v
	}
	return s
}

// collector exports the node's metrics, read at scrape time from the real
// objects: the live Runner's replica table (under the stage lock) plus the
// counts of the runners it replaced, and the node's counters.
type collector struct {
	n       *Node
	latency *prometheus.HistogramVec

	blocksUsed, blocksTotal, sequences, invariantOK *prometheus.Desc
	tombstones, freed, unknownRows, dropped         *prometheus.Desc
	batches, tokens, failed, lost, placement, ready *prometheus.Desc
	wireRefused, early, earlyRefused                *prometheus.Desc
}

var _ prometheus.Collector = (*collector)(nil)

func newCollector(n *Node) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, append([]string{"shard"}, labels...), nil)
	}
	return &collector{
		n: n,
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "strata_stage_latency_seconds",
			Help: "Time this stage spent on a batch: tombstones, placement and compute.",
			// 100 µs to ~26 s: a decode step of a tiny model to a long prefill.
			Buckets: prometheus.ExponentialBuckets(1e-4, 2, 19),
		}, []string{"shard"}),
		blocksUsed:  d("strata_kv_blocks_used", "KV blocks referenced by live replica tables on this shard."),
		blocksTotal: d("strata_kv_blocks_total", "KV blocks in this shard's pool."),
		sequences:   d("strata_kv_sequences", "Live sequences on this shard."),
		invariantOK: d("strata_kv_invariant_ok", "1 when this shard's replica tables are consistent (see shard.Table.CheckInvariants: heartbeat replies carry no block counts to compare with yet)."),
		tombstones:  d("strata_tombstones_applied_total", "Sequences freed on this shard by a coordinator tombstone, by reason.", "reason"),
		freed:       d("strata_sequences_freed_total", "Sequences this shard freed on its own, by reason (lease, epoch, reconcile); zero in a healthy cluster.", "reason"),
		unknownRows: d("strata_unknown_sequence_rows_total", "Rows dropped because their sequence is not live here."),
		dropped:     d("strata_rows_dropped_total", "Rows dropped by this shard, by code.", "code"),
		batches:     d("strata_stage_batches_total", "Batches this stage processed."),
		tokens:      d("strata_stage_tokens_total", "Token positions this stage computed or refused."),
		failed:      d("strata_batches_failed_total", "Batches this shard failed whole, by reason.", "reason"),
		lost:        d("strata_batch_failures_unreported_total", "Batch failures that could not be reported (no upstream stream and the control outbox full)."),
		placement:   d("strata_shard_placement_version", "Placement version of the range this shard serves (0: none)."),
		ready:       d("strata_shard_ready", "1 while this shard serves a loaded range."),
		wireRefused: d("strata_wire_refused_total", "Messages this shard refused before use (out of range, over a limit, outside an enum, a recovered panic), by reason.", "reason"),
		early:       d("strata_tombstones_early", "Tombstones kept for sequences above the high-water mark (not yet created here); at most shard.MaxEarlyTombstones."),
		earlyRefused: d("strata_tombstones_refused_total",
			"Tombstones for sequences not yet created that were refused past shard.MaxEarlyTombstones (too many, or too far above the high-water mark)."),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(c, ch)
	c.latency.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.n.stats(false)
	cs := c.n.counters.snapshot()
	shard := c.n.shardLabel()
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{shard}, labels...)...)
	}
	cnt := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{shard}, labels...)...)
	}
	g(c.blocksUsed, float64(st.BlocksUsed))
	g(c.blocksTotal, float64(st.BlocksTotal))
	g(c.sequences, float64(st.Sequences))
	ok := 0.0
	if st.InvariantOK {
		ok = 1
	}
	g(c.invariantOK, ok)
	for _, r := range Reasons() {
		switch r {
		case Lease, Epoch, Reconcile:
			cnt(c.freed, st.Freed[r], r.String())
		default:
			cnt(c.tombstones, st.Freed[r], r.String())
		}
	}
	cnt(c.unknownRows, st.Refused[transport.CodeUnknownSequence])
	for code, v := range st.Refused {
		cnt(c.dropped, v, code.String())
	}
	cnt(c.batches, cs.batches)
	cnt(c.tokens, cs.tokens)
	for reason, v := range cs.failed {
		cnt(c.failed, v, reason.String())
	}
	for reason, v := range c.n.refused.Snapshot() {
		cnt(c.wireRefused, v, reason)
	}
	g(c.early, float64(st.Early))
	cnt(c.earlyRefused, st.EarlyRefused)
	cnt(c.lost, cs.lost)
	g(c.placement, float64(st.Placement))
	ready := 0.0
	if st.Ready {
		ready = 1
	}
	g(c.ready, ready)
	c.latency.Collect(ch)
}
