package deploy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestWatcherSeesDoubleOwners checks the partition tests' double-owner
// checks on made-up samples, so that a check that cannot fail does not pass
// for one that held: overlapping stages in one view, and two shards that
// both claim overlapping layers of one placement version.
func TestWatcherSeesDoubleOwners(t *testing.T) {
	now := time.Unix(1, 0)
	stage := func(id string, i, first, end int) clusterShard {
		return clusterShard{ShardID: id, Stage: i, First: first, End: end, State: "ready", Connected: true}
	}
	views := []struct {
		name  string
		v     clusterView
		viols int
	}{
		{"disjoint", clusterView{Placement: 1, Ready: true, Shards: []clusterShard{stage("a", 0, 0, 3), stage("b", 1, 3, 5), {ShardID: "c", Stage: -1}}}, 0},
		{"overlap", clusterView{Placement: 2, Ready: true, Shards: []clusterShard{stage("a", 0, 0, 3), stage("b", 1, 2, 5)}}, 1},
		{"empty range", clusterView{Placement: 3, Ready: true, Shards: []clusterShard{stage("a", 0, 0, 5), stage("b", 1, 5, 5)}}, 1},
	}
	for _, tc := range views {
		w := &watcher{victim: "a", ranges: map[uint64]map[string][2]int{}}
		w.viewSample(tc.v, now)
		if got := len(w.violations()); got != tc.viols {
			t.Errorf("%s: %d violations %q, want %d", tc.name, got, w.violations(), tc.viols)
		}
	}

	// Version 1: a [0,3), b [3,5); version 2: c [0,3), b [3,5).
	w := &watcher{victim: "a", ranges: map[uint64]map[string][2]int{}}
	w.viewSample(clusterView{Placement: 1, Ready: true, Shards: []clusterShard{stage("a", 0, 0, 3), stage("b", 1, 3, 5)}}, now)
	w.viewSample(clusterView{Placement: 2, Ready: true, Shards: []clusterShard{stage("c", 0, 0, 3), stage("b", 1, 3, 5)}}, now)
	// A cut shard still ready for the old version beside the new one's
	// owner of its layers: two versions, one owner each.
	w.claims(map[uint64][]string{1: {"a"}, 2: {"c", "b"}}, now)
	if v := w.violations(); len(v) != 0 {
		t.Errorf("one owner per version: violations %q", v)
	}
	// Both a and c ready for version 2 with layers [0,3): a double owner.
	w.ranges[2]["a"] = [2]int{0, 3}
	w.claims(map[uint64][]string{2: {"a", "c"}}, now)
	if v := w.violations(); len(v) != 1 {
		t.Errorf("a and c both own [0,3) of version 2: violations %q, want 1", v)
	}
}

// TestParseSample reads the lines of the Prometheus text format the
// watcher needs.
func TestParseSample(t *testing.T) {
	for _, tc := range []struct {
		line   string
		name   string
		labels map[string]string
		value  float64
		ok     bool
	}{
		{`strata_kv_blocks_used{shard="x-1"} 12`, "strata_kv_blocks_used", map[string]string{"shard": "x-1"}, 12, true},
		{`strata_sequences_freed_total{shard="x",reason="lease"} 4`, "strata_sequences_freed_total", map[string]string{"shard": "x", "reason": "lease"}, 4, true},
		{`go_goroutines 31`, "go_goroutines", map[string]string{}, 31, true},
		{`strata_kv_blocks_used{shard="x"}`, "", nil, 0, false},
		{`garbage`, "", nil, 0, false},
	} {
		name, labels, value, ok := parseSample(tc.line)
		if ok != tc.ok || (ok && (name != tc.name || value != tc.value || len(labels) != len(tc.labels))) {
			t.Errorf("parseSample(%q) = %q %v %v %v, want %q %v %v %v", tc.line, name, labels, value, ok, tc.name, tc.labels, tc.value, tc.ok)
			continue
		}
		for k, v := range tc.labels {
			if labels[k] != v {
				t.Errorf("parseSample(%q): label %s = %q, want %q", tc.line, k, labels[k], v)
			}
		}
	}
}

// TestLoadClientJudgesEnds checks how the partition tests' client judges
// the end of a request, against a fake server: text, a clear error (an
// OpenAI envelope as the body or as an SSE event) and every way of ending
// that fails the test — a hang past the bound, a stream that breaks off,
// [DONE] without a finish, an error that is not an envelope.
func TestLoadClientJudgesEnds(t *testing.T) {
	chunk := func(text string, finish string) string {
		fr := "null"
		if finish != "" {
			fr = `"` + finish + `"`
		}
		return fmt.Sprintf(`data: {"choices":[{"text":%q,"finish_reason":%s}]}`+"\n\n", text, fr)
	}
	envelope := `{"error":{"message":"shard lost","type":"server_error","param":null,"code":"service_unavailable"}}`
	for _, tc := range []struct {
		name    string
		handle  func(w http.ResponseWriter, r *http.Request)
		text    string // want, for a completion
		errCode string // want, for a clear error
		problem string // want, a substring, for a failure
	}{
		{name: "text", text: "Once more", handle: func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, ": waiting\n\n"+chunk("Once", "")+chunk(" more", "")+chunk("", "length")+"data: [DONE]\n\n")
		}},
		{name: "error event", errCode: "service_unavailable", handle: func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, chunk("Once", "")+"data: "+envelope+"\n\ndata: [DONE]\n\n")
		}},
		{name: "error status", errCode: "service_unavailable", handle: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, envelope)
		}},
		{name: "status without envelope", problem: "without an OpenAI error envelope", handle: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, "bad gateway")
		}},
		{name: "error event without envelope", problem: "not an OpenAI envelope", handle: func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, `data: {"error":"boom"}`+"\n\n")
		}},
		{name: "broken off", problem: "without [DONE]", handle: func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, chunk("Once", ""))
		}},
		{name: "done without finish", problem: "without a finish_reason", handle: func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, chunk("Once", "")+"data: [DONE]\n\n")
		}},
		{name: "hang", problem: "hung", handle: func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, chunk("Once", ""))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(tc.handle))
			defer srv.Close()
			c := &partitionCluster{api: srv.URL, http: srv.Client(), bound: 300 * time.Millisecond}
			r := c.complete(context.Background(), 1, "Once upon a time", time.Now())
			switch {
			case tc.problem != "":
				if !strings.Contains(r.problem, tc.problem) {
					t.Errorf("problem %q, want one with %q (result %+v)", r.problem, tc.problem, r)
				}
			case r.problem != "":
				t.Errorf("problem %q, want none", r.problem)
			case tc.errCode != "":
				if r.errCode != tc.errCode || r.errType != "server_error" || r.errMsg != "shard lost" {
					t.Errorf("error %q %q %q, want server_error %q \"shard lost\"", r.errType, r.errCode, r.errMsg, tc.errCode)
				}
			default:
				if r.text != tc.text || r.errType != "" || r.tokens != 2 || r.keepAlives != 1 {
					t.Errorf("text %q (%d tokens, %d keep-alives, error %q), want %q in 2 tokens after 1 keep-alive",
						r.text, r.tokens, r.keepAlives, r.errType, tc.text)
				}
			}
		})
	}
}
