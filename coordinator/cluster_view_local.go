package coordinator

import (
	"fmt"
	"sync"
	"time"
)

// LocalNode is the NodeID and Addr of in-process shards in a ClusterView.
// ShardView has no Local field yet; IsLocal reads this marker.
const LocalNode = "in-process"

// IsLocal reports whether sv is a shard running inside the coordinator's
// process. Only those appear under strata_kv_* in the coordinator's
// /metrics: remote shards export the same names on their own --metrics.
func IsLocal(sv ShardView) bool { return sv.NodeID == LocalNode }

// LocalStage is one in-process stage as the coordinator sees it: shard.Stats
// in the coordinator's terms (the two packages never import each other, so
// cmd/coordinator converts).
type LocalStage struct {
	First, End  int // layers [First, End)
	BlocksUsed  int // distinct blocks named by the stage's live replica tables
	BlocksTotal int
	Sequences   int
	Batches     uint64        // batches the stage processed
	Busy        time.Duration // time it spent processing them
}

// LocalViewConfig describes an in-process pipeline for NewLocalView.
type LocalViewConfig struct {
	Engine   *Engine
	Stages   func() []LocalStage // a fresh snapshot per call, stage 0 first
	Device   string              // e.g. "cpu"
	CPUCores uint32              // worker threads the stages share
}

// invariantGrace is how long an idle stage's block count may differ from the
// allocator's before strata_kv_invariant_ok reports 0: the snapshots are
// taken at different moments, and the last tombstones of a drain travel in
// an empty batch after the engine already counts zero.
const invariantGrace = time.Second

// LocalView builds ClusterViews (and stage timings) of in-process shards
// from the engine's and the stages' snapshots. Safe for concurrent use.
type LocalView struct {
	cfg      LocalViewConfig
	now      func() time.Time // time.Now; tests move it
	mu       sync.Mutex
	mismatch map[int]time.Time // stage → since when its idle counts differ from the allocator's
}

// NewLocalView returns a LocalView over cfg.
func NewLocalView(cfg LocalViewConfig) *LocalView {
	return &LocalView{cfg: cfg, now: time.Now, mismatch: map[int]time.Time{}}
}

// LocalShardID names in-process stage i.
func LocalShardID(i int) string { return fmt.Sprintf("local-%d", i) }

// View returns the cluster as the in-process pipeline makes it: one shard
// per stage, placement version 1, ready until the engine drains.
//
// InvariantOK is what can be judged honestly from two snapshots: the
// allocator's own accounting (used + cached + free = total), the stage's
// blocks within its pool, and, whenever the engine is idle (nothing running,
// waiting or in flight), the stage's live sequences and blocks equal to the
// allocator's, a difference being tolerated for invariantGrace. While work
// is in flight the counts differ legitimately (a stage names a block only
// once it has computed a position in it), so they are not compared then.
func (v *LocalView) View() ClusterView {
	e := v.cfg.Engine
	st := e.Stats()
	stages := v.cfg.Stages()
	ec := e.Config()
	cv := ClusterView{
		ClusterID: LocalNode, Epoch: ec.Epoch, Placement: 1, Ready: !e.Draining(),
		KVBlocks: ec.Sched.KV.Blocks, BlockSize: ec.Sched.KV.BlockSize, LiveSequences: st.KV.Sequences,
		Shards: make([]ShardView, len(stages)), BatchFailed: map[string]uint64{},
	}
	if !cv.Ready {
		cv.NotReadyReason = "draining"
	}
	allocOK := st.KV.Used >= 0 && st.KV.Used+st.KV.Cached+st.KV.Free == st.KV.Total
	idle := st.Running == 0 && st.Waiting == 0 && st.InFlight == 0
	now := v.now()
	v.mu.Lock()
	defer v.mu.Unlock()
	for i, s := range stages {
		ok := allocOK && s.BlocksUsed >= 0 && s.BlocksUsed <= s.BlocksTotal
		if idle && (s.BlocksUsed != st.KV.Used || s.Sequences != st.KV.Sequences) {
			since, seen := v.mismatch[i]
			if !seen {
				v.mismatch[i] = now
			} else if now.Sub(since) >= invariantGrace {
				ok = false
			}
		} else {
			delete(v.mismatch, i)
		}
		cv.Shards[i] = ShardView{
			ShardID: LocalShardID(i), NodeID: LocalNode, Addr: LocalNode,
			Device: v.cfg.Device, CPUCores: v.cfg.CPUCores,
			Stage: i, First: s.First, End: s.End, Embed: i == 0, Head: i == len(stages)-1,
			State: "ready", Connected: true,
			KVUsed: uint64(s.BlocksUsed), KVTotal: uint64(s.BlocksTotal), Sequences: uint64(s.Sequences),
			InvariantOK: ok, LastHeartbeat: now,
		}
	}
	return cv
}

// StageTimings returns each stage's cumulative batches and busy time for
// strata_stage_latency_seconds.
func (v *LocalView) StageTimings() []StageTiming {
	stages := v.cfg.Stages()
	out := make([]StageTiming, len(stages))
	for i, s := range stages {
		out[i] = StageTiming{Shard: LocalShardID(i), Batches: s.Batches, Busy: s.Busy}
	}
	return out
}
