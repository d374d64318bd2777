package deploy

import (
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
