package coordinator

import (
	"sync"
	"time"
)

// LocalShard is a shard running inside the coordinator's process
// (--local-shards), as the coordinator sees it: a live snapshot of its KV
// replica read directly, not its last heartbeat (cmd/coordinator converts
// shard.Node's stats: the two packages never import each other).
type LocalShard struct {
	ShardID     string // the cluster's name for it; "" before it registered
	BlocksUsed  int    // distinct blocks named by the shard's live replica tables
	BlocksTotal int
	Sequences   int
	InvariantOK bool          // the shard's own replica-table check
	Batches     uint64        // batches the shard processed
	Busy        time.Duration // time it spent processing them
}

// LocalViewConfig describes the cluster and the shards of it that run in
// this process, for NewLocalView.
type LocalViewConfig struct {
	Engine  *Engine
	Cluster func() ClusterView  // the cluster's view (Cluster.View)
	Shards  func() []LocalShard // a fresh snapshot per call
}

// invariantGrace is how long an idle stage's block count may differ from the
// allocator's before strata_kv_invariant_ok reports 0: the snapshots are
// taken at different moments, and the last tombstones of a drain travel in
// an empty batch after the engine already counts zero.
const invariantGrace = time.Second

// LocalView builds ClusterViews (and stage timings) of a cluster some of
// whose shards run in this process: the cluster's view, with each local
// shard marked Local and its KV read from the shard itself. Safe for
// concurrent use.
type LocalView struct {
	cfg      LocalViewConfig
	now      func() time.Time // time.Now; tests move it
	mu       sync.Mutex
	mismatch map[string]time.Time // shard ID → since when its idle counts differ from the allocator's
}

// NewLocalView returns a LocalView over cfg.
func NewLocalView(cfg LocalViewConfig) *LocalView {
	return &LocalView{cfg: cfg, now: time.Now, mismatch: map[string]time.Time{}}
}

// View returns the cluster's view with the local shards' live KV.
//
// A local shard's InvariantOK is what can be judged honestly from two
// snapshots: its own replica-table check, the allocator's own accounting
// (used + cached + free = total), the shard's blocks within its pool, and,
// whenever the engine is idle (nothing running, waiting or in flight), a
// placed shard's live sequences and blocks equal to the allocator's, a
// difference being tolerated for invariantGrace. While work is in flight the
// counts differ legitimately (a stage names a block only once it has
// computed a position in it), so they are not compared then.
func (v *LocalView) View() ClusterView {
	cv := v.cfg.Cluster()
	local := map[string]LocalShard{}
	for _, s := range v.cfg.Shards() {
		if s.ShardID != "" {
			local[s.ShardID] = s
		}
	}
	st := v.cfg.Engine.Stats()
	allocOK := st.KV.Used >= 0 && st.KV.Used+st.KV.Cached+st.KV.Free == st.KV.Total
	idle := st.Running == 0 && st.Waiting == 0 && st.InFlight == 0
	now := v.now()
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := range cv.Shards {
		sv := &cv.Shards[i]
		s, ok := local[sv.ShardID]
		if !ok {
			continue
		}
		sv.Local = true
		sv.KVUsed, sv.KVTotal, sv.Sequences = uint64(s.BlocksUsed), uint64(s.BlocksTotal), uint64(s.Sequences)
		sv.Batches, sv.BusyNs = s.Batches, int64(s.Busy)
		good := s.InvariantOK && allocOK && s.BlocksUsed >= 0 && s.BlocksUsed <= s.BlocksTotal
		if idle && sv.Stage >= 0 && (s.BlocksUsed != st.KV.Used || s.Sequences != st.KV.Sequences) {
			since, seen := v.mismatch[sv.ShardID]
			if !seen {
				v.mismatch[sv.ShardID] = now
			} else if now.Sub(since) >= invariantGrace {
				good = false
			}
		} else {
			delete(v.mismatch, sv.ShardID)
		}
		sv.InvariantOK = good
	}
	for id := range v.mismatch {
		if _, ok := local[id]; !ok {
			delete(v.mismatch, id) // a shard that left
		}
	}
	return cv
}

// StageTimings returns each registered local shard's cumulative batches and
// busy time for strata_stage_latency_seconds.
func (v *LocalView) StageTimings() []StageTiming {
	var out []StageTiming
	for _, s := range v.cfg.Shards() {
		if s.ShardID != "" {
			out = append(out, StageTiming{Shard: s.ShardID, Batches: s.Batches, Busy: s.Busy})
		}
	}
	return out
}
