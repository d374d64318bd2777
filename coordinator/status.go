package coordinator

import (
	"embed"
	"net/http"
	"strings"
	"unicode"
	"unicode/utf8"
)

// statusFS holds the status page: one HTML file with its CSS and JS inline,
// no build step.
//
//go:embed status/index.html
var statusFS embed.FS

// clusterResponse is GET /v1/cluster: the cluster view with the engine's
// counts beside it. ClusterView's fields are inlined.
type clusterResponse struct {
	ClusterView
	Running  int       `json:"running"`
	Waiting  int       `json:"waiting"`
	InFlight int       `json:"batches_in_flight"`
	KV       kvSummary `json:"kv"`
}

// kvSummary is the coordinator's allocator, which picks every block ID.
type kvSummary struct {
	Total         int     `json:"blocks_total"`
	Used          int     `json:"blocks_used"`
	Cached        int     `json:"blocks_cached"`
	Free          int     `json:"blocks_free"`
	Sequences     int     `json:"sequences"`
	PrefixHitRate float64 `json:"prefix_hit_rate"`
}

// maxShardName bounds a shard's name as the coordinator keeps and shows it
// (shard.MaxNameLen, which a shard checks its --name against).
const maxShardName = 64

// shardName is a registered name as the registry keeps it: at most
// maxShardName bytes of whole runes, anything unprintable (or invalid
// UTF-8) replaced by U+FFFD, since it is shown to people as is.
func shardName(s string) string {
	var b strings.Builder
	for _, r := range s {
		if !unicode.IsPrint(r) {
			r = utf8.RuneError
		}
		if b.Len()+utf8.RuneLen(r) > maxShardName {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// clusterView returns the configured view, or an empty one.
func (s *Server) clusterView() ClusterView {
	if s.cfg.View == nil {
		return ClusterView{Shards: []ShardView{}, BatchFailed: map[string]uint64{}}
	}
	return s.cfg.View()
}

func (s *Server) handleCluster(c *call) {
	v := s.clusterView()
	if v.Shards == nil {
		v.Shards = []ShardView{} // "shards": [] rather than null
	}
	st := s.eng.Stats()
	resp := clusterResponse{
		ClusterView: v,
		Running:     st.Running, Waiting: st.Waiting, InFlight: st.InFlight,
		KV: kvSummary{Total: st.KV.Total, Used: st.KV.Used, Cached: st.KV.Cached, Free: st.KV.Free,
			Sequences: st.KV.Sequences, PrefixHitRate: st.KV.HitRate()},
	}
	c.w.Header().Set("Cache-Control", "no-store")
	s.writeJSON(c, http.StatusOK, resp)
}

func (s *Server) handleMetrics(c *call) { s.metrics.handler.ServeHTTP(c.w, c.r) }

func (s *Server) handleStatus(c *call) {
	page, err := statusFS.ReadFile("status/index.html")
	if err != nil { // embedded at build time: cannot happen
		s.writeError(c, errInternal("status page missing: %v", err))
		return
	}
	h := c.w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'")
	c.w.WriteHeader(http.StatusOK)
	if c.r.Method != http.MethodHead {
		c.w.Write(page)
	}
}
