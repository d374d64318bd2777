package coordinator

import (
	"context"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// HistorySamples is how many one-second samples a History keeps: 15
// minutes, what the status page charts. Each sample is about 100 bytes
// plus 40 per shard, so the ring stays under a megabyte for a cluster of
// 16 shards.
const HistorySamples = 900

// HistoryEvents is how many cluster events a History keeps: far more than
// 15 minutes of a healthy cluster's joins, losses and placements, and a
// bound when a flapping shard logs one every few seconds.
const HistoryEvents = 256

// historyShards bounds the per-shard KV entries of one sample: as many as
// the registry holds, a second fence in case it grows.
const historyShards = 256

// Sample is one second of the coordinator as GET /v1/cluster/history
// reports it. Latencies are percentiles of the requests' tokens observed in
// that second (interpolated in the Prometheus histograms' buckets), null
// when none arrived.
type Sample struct {
	T        int64     `json:"t"` // Unix milliseconds
	TokS     float64   `json:"tok_s"`
	Running  int       `json:"running"`
	Waiting  int       `json:"waiting"`
	TTFTp50  *float64  `json:"ttft_p50_ms"`
	TTFTp99  *float64  `json:"ttft_p99_ms"`
	ITLp50   *float64  `json:"itl_p50_ms"`
	ITLp99   *float64  `json:"itl_p99_ms"`
	KVUsed   int       `json:"kv_blocks_used"` // the coordinator's allocator
	KVTotal  int       `json:"kv_blocks_total"`
	ShardsKV []ShardKV `json:"shards"`
}

// ShardKV is one shard's KV use in a Sample, as its heartbeat reported it;
// lost shards have none.
type ShardKV struct {
	ShardID string `json:"shard_id"`
	Stage   int    `json:"stage"` // -1: spare
	Used    uint64 `json:"used"`
	Total   uint64 `json:"total"`
	// MSPerBatch is the shard's compute time per batch in that second, from
	// the view's Batches and BusyNs (a remote shard's as of its latest
	// heartbeat, so it lags by up to one); null in seconds without batches.
	MSPerBatch *float64 `json:"ms_per_batch"`
}

// Event is a cluster event on the status page's timeline: the cluster's
// lifecycle log records (a shard registered, lost or expired, a placement,
// the pipeline ready or paused, a load failure) and a drain.
type Event struct {
	T       int64  `json:"t"` // Unix milliseconds
	Kind    string `json:"kind"`
	ShardID string `json:"shard_id,omitempty"`
	Message string `json:"message"`
}

// historyKinds maps the cluster's log messages to event kinds: the
// timeline shows the events the log has, by the log's own records.
var historyKinds = map[string]string{
	"shard registered":     "joined",
	"shard lost":           "lost",
	"shard expired":        "expired",
	"shard failed to load": "failed",
	"placement":            "placement",
	"pipeline ready":       "ready",
	"pipeline paused":      "paused",
}

// History is the bounded memory behind GET /v1/cluster/history: a ring of
// one-second samples and a ring of recent events. It is safe for
// concurrent use; Server.Run fills the samples, the cluster's logger
// (through LogHandler) and Record the events.
type History struct {
	mu      sync.Mutex
	samples ring[Sample]
	events  ring[Event]
}

// NewHistory returns a History that keeps the last samples samples and
// events events (HistorySamples and HistoryEvents when <= 0).
func NewHistory(samples, events int) *History {
	if samples <= 0 {
		samples = HistorySamples
	}
	if events <= 0 {
		events = HistoryEvents
	}
	return &History{samples: newRing[Sample](samples), events: newRing[Event](events)}
}

// Record adds an event.
func (h *History) Record(e Event) {
	h.mu.Lock()
	h.events.push(e)
	h.mu.Unlock()
}

func (h *History) addSample(s Sample) {
	h.mu.Lock()
	h.samples.push(s)
	h.mu.Unlock()
}

// historyResponse is GET /v1/cluster/history.
type historyResponse struct {
	IntervalMS int64    `json:"interval_ms"`
	Capacity   int      `json:"capacity"`
	Samples    []Sample `json:"samples"`
	Events     []Event  `json:"events"`
}

// snapshot returns the samples and events after since (Unix ms), oldest
// first; the slices are the caller's.
func (h *History) snapshot(since int64) ([]Sample, []Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ss := h.samples.after(func(s Sample) bool { return s.T > since })
	es := h.events.after(func(e Event) bool { return e.T > since })
	return ss, es
}

// ring is a fixed-capacity FIFO that overwrites its oldest element.
type ring[T any] struct {
	buf   []T
	start int // index of the oldest element
	n     int
}

func newRing[T any](capacity int) ring[T] { return ring[T]{buf: make([]T, capacity)} }

func (r *ring[T]) push(v T) {
	if r.n < len(r.buf) {
		r.buf[(r.start+r.n)%len(r.buf)] = v
		r.n++
		return
	}
	r.buf[r.start] = v
	r.start = (r.start + 1) % len(r.buf)
}

// after returns, oldest first, the elements from the first one keep accepts
// (elements are in time order, so a suffix).
func (r *ring[T]) after(keep func(T) bool) []T {
	out := []T{}
	for i := range r.n {
		v := r.buf[(r.start+i)%len(r.buf)]
		if len(out) > 0 || keep(v) {
			out = append(out, v)
		}
	}
	return out
}

// LogHandler returns a slog.Handler that passes every record to next and
// records the cluster's lifecycle records (component "cluster", the
// messages of historyKinds) as events, whatever next's level.
func (h *History) LogHandler(next slog.Handler) slog.Handler {
	return &eventHandler{h: h, next: next}
}

type eventHandler struct {
	h       *History
	next    slog.Handler
	cluster bool        // component=cluster among the attrs
	attrs   []slog.Attr // from WithAttrs, for shard_id
}

func (e *eventHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return (e.cluster && l >= slog.LevelInfo) || e.next.Enabled(ctx, l)
}

func (e *eventHandler) Handle(ctx context.Context, r slog.Record) error {
	if kind, ok := historyKinds[r.Message]; ok && e.cluster {
		ev := Event{T: r.Time.UnixMilli(), Kind: kind}
		var b strings.Builder
		b.WriteString(r.Message)
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "shard_id" {
				ev.ShardID = a.Value.String()
				return true
			}
			b.WriteString(" " + a.Key + "=" + a.Value.String())
			return true
		})
		ev.Message = b.String()
		if r.Time.IsZero() {
			ev.T = time.Now().UnixMilli()
		}
		e.h.Record(ev)
	}
	if e.next.Enabled(ctx, r.Level) {
		return e.next.Handle(ctx, r)
	}
	return nil
}

func (e *eventHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *e
	c.next = e.next.WithAttrs(as)
	for _, a := range as {
		if a.Key == "component" {
			c.cluster = a.Value.String() == "cluster"
		}
	}
	return &c
}

func (e *eventHandler) WithGroup(name string) slog.Handler {
	c := *e
	c.next = e.next.WithGroup(name)
	c.cluster = false // grouped records are none of ours
	return &c
}

// histSnap is a histogram's cumulative bucket counts at one sample.
type histSnap struct {
	bounds []float64 // upper bounds, seconds, ascending, without +Inf
	counts []uint64  // cumulative
	total  uint64
}

func readHist(h prometheus.Histogram) histSnap {
	var m dto.Metric
	if err := h.Write(&m); err != nil { // cannot fail for a plain histogram
		return histSnap{}
	}
	hs := histSnap{total: m.GetHistogram().GetSampleCount()}
	for _, b := range m.GetHistogram().GetBucket() {
		if math.IsInf(b.GetUpperBound(), 1) {
			continue
		}
		hs.bounds = append(hs.bounds, b.GetUpperBound())
		hs.counts = append(hs.counts, b.GetCumulativeCount())
	}
	return hs
}

// quantileMS returns the q-quantile, in milliseconds, of the observations
// between prev and cur, interpolated linearly inside its bucket; nil when
// there were none. A quantile past the last bucket reports its bound.
func quantileMS(prev, cur histSnap, q float64) *float64 {
	n := cur.total - prev.total
	if n == 0 || len(cur.bounds) == 0 {
		return nil
	}
	rank := q * float64(n)
	lower, below := 0.0, uint64(0)
	v := cur.bounds[len(cur.bounds)-1]
	for i, ub := range cur.bounds {
		c := cur.counts[i]
		if i < len(prev.counts) {
			c -= prev.counts[i]
		}
		if float64(c) >= rank && c > below {
			v = lower + (ub-lower)*(rank-float64(below))/float64(c-below)
			break
		}
		lower, below = ub, c
	}
	ms := v * 1000
	return &ms
}

// sampler turns the engine's counters and the metrics' histograms into
// one-second samples; it belongs to Server.Run.
type sampler struct {
	s         *Server
	prevAt    time.Time
	prevTok   uint64
	ttft, itl histSnap
	stages    map[string]StageTiming // the previous sample's, by shard ID
}

func (sp *sampler) sample(now time.Time) Sample {
	s := sp.s
	st := s.eng.Stats()
	ttft, itl := readHist(s.metrics.ttft), readHist(s.metrics.itl)
	out := Sample{T: now.UnixMilli(), Running: st.Running, Waiting: st.Waiting, KVUsed: st.KV.Used, KVTotal: st.KV.Total}
	if !sp.prevAt.IsZero() {
		if dt := now.Sub(sp.prevAt).Seconds(); dt > 0 && st.GeneratedTokens >= sp.prevTok {
			out.TokS = float64(st.GeneratedTokens-sp.prevTok) / dt
		}
		out.TTFTp50, out.TTFTp99 = quantileMS(sp.ttft, ttft, 0.5), quantileMS(sp.ttft, ttft, 0.99)
		out.ITLp50, out.ITLp99 = quantileMS(sp.itl, itl, 0.5), quantileMS(sp.itl, itl, 0.99)
	}
	sp.prevAt, sp.prevTok, sp.ttft, sp.itl = now, st.GeneratedTokens, ttft, itl
	stages := map[string]StageTiming{}
	if s.cfg.View != nil {
		for _, sh := range s.cfg.View().Shards {
			if len(out.ShardsKV) == historyShards {
				break
			}
			if sh.State == "lost" { // its KV is its last report, not now's
				continue
			}
			k := ShardKV{ShardID: sh.ShardID, Stage: sh.Stage, Used: sh.KVUsed, Total: sh.KVTotal}
			cur := StageTiming{Shard: sh.ShardID, Batches: sh.Batches, Busy: time.Duration(sh.BusyNs)}
			stages[sh.ShardID] = cur
			prev, had := sp.stages[sh.ShardID]
			if had && cur.Batches > prev.Batches && cur.Busy >= prev.Busy {
				ms := float64(cur.Busy-prev.Busy) / float64(time.Millisecond) / float64(cur.Batches-prev.Batches)
				k.MSPerBatch = &ms
			}
			out.ShardsKV = append(out.ShardsKV, k)
		}
	}
	sp.stages = stages
	return out
}

// Run samples the engine and the cluster into the server's History once a
// second until ctx ends. It is the server's only goroutine; the caller
// waits for it.
func (s *Server) Run(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	sp := &sampler{s: s}
	sp.sample(time.Now()) // the baseline for the first second's rates
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			s.hist.addSample(sp.sample(now))
		}
	}
}

// History returns the server's history (ServerConfig.History, or its own).
func (s *Server) History() *History { return s.hist }

// handleHistory is GET /v1/cluster/history[?since=UNIX_MS]: the samples
// and events after since (all that are kept without it).
func (s *Server) handleHistory(c *call) {
	since := int64(math.MinInt64)
	if v := c.r.URL.Query().Get("since"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			s.writeError(c, invalid("since", "since must be Unix milliseconds, got %q", v))
			return
		}
		since = n
	}
	ss, es := s.hist.snapshot(since)
	c.w.Header().Set("Cache-Control", "no-store")
	s.writeJSON(c, http.StatusOK, historyResponse{IntervalMS: 1000, Capacity: len(s.hist.samples.buf), Samples: ss, Events: es})
}
