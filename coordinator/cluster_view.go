package coordinator

import (
	"maps"
	"math"
	"slices"
	"time"
)

// ClusterView is a snapshot of the cluster for /v1/cluster, /readyz and
// metrics. It is the caller's: nothing in it is shared.
type ClusterView struct {
	ClusterID string `json:"cluster_id"`
	Epoch     uint64 `json:"epoch"`
	// Placement is the active placement version (0: none yet);
	// PlacementMix the load mix its stage times were predicted for.
	Placement    uint64 `json:"placement_version"`
	PlacementMix string `json:"placement_mix,omitempty"`
	Ready        bool   `json:"ready"`
	// NotReadyReason and NotReadySince say why and since when no pipeline
	// is dispatching (zero when Ready).
	NotReadyReason string    `json:"not_ready_reason,omitempty"`
	NotReadySince  time.Time `json:"not_ready_since,omitzero"`
	// CannotPlace is set while, after a loss, the shards left cannot hold
	// the model: requests dispatched before it were failed, new ones wait.
	CannotPlace bool `json:"cannot_place,omitempty"`
	// MembershipOverruled counts gossip deaths and leaves of shards whose
	// control stream was alive and answering: ignored (DESIGN.md,
	// Membership and placement). Forged or partitioned gossip shows here.
	MembershipOverruled uint64 `json:"membership_overruled"`
	// Replans counts the make-before-break re-placements started (a
	// markedly faster placement over the shards became possible).
	Replans uint64 `json:"replans"`
	// ReplanSkipped says why the latest markedly faster placement was not
	// loaded make-before-break: a shard serving a range cannot hold its new
	// one beside it (empty when none was skipped since the active
	// placement was made).
	ReplanSkipped string `json:"replan_skipped,omitempty"`
	KVBlocks      int    `json:"kv_blocks"`
	BlockSize     int    `json:"block_size"`
	// LiveSequences are the sequences the coordinator believes live on the
	// shards (created by dispatched first rows, not yet tombstoned).
	LiveSequences int         `json:"live_sequences"`
	Shards        []ShardView `json:"shards"`
	// BatchFailed counts failed batches by reason (BatchFailed reports,
	// and pipeline_lost for in-flight batches failed by a loss).
	BatchFailed map[string]uint64 `json:"batch_failed"`
	// WireRefused counts the shards' messages refused before use, by
	// reason (a transport.Code name): strata_wire_refused_total.
	WireRefused map[string]uint64 `json:"wire_refused"`
}

// ShardView is one shard in a ClusterView.
type ShardView struct {
	ShardID string `json:"shard_id"`
	// Name is what people call the shard (shard join --name, default the
	// host name and a short ID; local-N for --local-shards); empty for a
	// shard that registered none.
	Name        string `json:"name"`
	NodeID      string `json:"node_id"`
	Incarnation uint64 `json:"incarnation"`
	Addr        string `json:"addr"`
	Device      string `json:"device"`
	CPUCores    uint32 `json:"cpu_cores"`
	MemoryBytes uint64 `json:"memory_bytes"`
	// Stage is the shard's index in the active placement, -1 for a spare;
	// layers [First, End).
	Stage     int    `json:"stage"`
	First     int    `json:"first_layer"`
	End       int    `json:"end_layer"`
	Embed     bool   `json:"embed"`
	Head      bool   `json:"head"`
	State     string `json:"state"` // idle, loading, ready, failed, lost, disconnected
	Connected bool   `json:"connected"`
	// Local marks a shard running inside the coordinator's process
	// (--local-shards). Only those appear under strata_kv_* in the
	// coordinator's /metrics: remote shards export the same names on their
	// own --metrics.
	Local bool `json:"local"`
	// KVSlots is the layer slots each KV block takes on this stage: its
	// layers, or fewer when the model's sliding layers group their KV
	// (the stage holds its largest group's; docs/sliding-window-kv.md).
	KVSlots int `json:"kv_layer_slots,omitempty"`
	// KV as the shard's last heartbeat reported it (a local shard's is read
	// directly, see LocalView).
	KVUsed        uint64    `json:"kv_blocks_used"`
	KVTotal       uint64    `json:"kv_blocks_total"`
	Sequences     uint64    `json:"sequences"`
	InvariantOK   bool      `json:"invariant_ok"`
	LastHeartbeat time.Time `json:"last_heartbeat,omitzero"`
	// TombstonesUnacked are backstop tombstones awaiting the shard's ack;
	// BackstopDropped the backstop messages dropped past maxUnacked.
	TombstonesUnacked int    `json:"tombstones_unacked"`
	BackstopDropped   uint64 `json:"backstop_dropped"`
	// Calibration is the shard's measured time per layer on the served
	// model (nil: none; placement counted its memory only), and
	// PredictedStageNs the time placement predicted for its stage's batch
	// of the placement's mix (PlacementMix).
	Calibration      *Speed `json:"calibration,omitempty"`
	PredictedStageNs int64  `json:"predicted_stage_ns,omitempty"`
	// Batches and BusyNs are the batches the shard has processed and the
	// time it spent on them, over its life (its last heartbeat's counters;
	// a local shard's read directly): their rates are the stage's measured
	// time per batch, beside PredictedStageNs.
	Batches uint64 `json:"batches"`
	BusyNs  int64  `json:"busy_ns"`
}

// View returns the latest snapshot, published by the loop after every
// event.
func (c *Cluster) View() ClusterView {
	v := *c.view.Load()
	v.Shards = slices.Clone(v.Shards)
	v.BatchFailed = maps.Clone(v.BatchFailed)
	v.WireRefused = maps.Clone(v.WireRefused)
	return v
}

// UnackedTombstones returns the backstop tombstones awaiting ack, by shard
// ID (strata_tombstones_unacked{shard}).
func (c *Cluster) UnackedTombstones() map[string]int {
	out := map[string]int{}
	for _, s := range c.view.Load().Shards {
		out[s.ShardID] = s.TombstonesUnacked
	}
	return out
}

// BatchFailedByReason returns failed batches by reason
// (strata_batch_failed_total{reason}).
func (c *Cluster) BatchFailedByReason() map[string]uint64 { return c.pipe.failedByReason() }

// liveSequences returns how many sequences the ledger holds live.
func (c *Cluster) liveSequences() int {
	if c.ledger == nil {
		return 0
	}
	return len(c.ledger.running(nil))
}

// publish stores a fresh snapshot; called by the loop only.
func (c *Cluster) publish() {
	v := &ClusterView{
		ClusterID: c.start.ClusterID, Epoch: c.start.Epoch, Ready: c.pipe.ready(),
		LiveSequences: c.liveSequences(), BatchFailed: c.pipe.failedByReason(), WireRefused: c.refused.Snapshot(),
		MembershipOverruled: c.core.Overruled(), Replans: c.replans, ReplanSkipped: c.core.ReplanSkipped(),
	}
	if !v.Ready {
		v.NotReadySince, v.NotReadyReason, v.CannotPlace = c.core.NotReady()
		if v.NotReadySince.IsZero() {
			v.NotReadySince = time.Now()
		}
		if v.NotReadyReason == "" {
			v.NotReadyReason = "pipeline not ready"
		}
	}
	if p := c.active; p != nil {
		v.Placement, v.KVBlocks, v.BlockSize, v.PlacementMix = p.Version, p.Blocks, p.BlockSize, p.Mix
	}
	for _, s := range c.shards {
		sv := ShardView{
			ShardID: s.rec.ShardID, Name: s.rec.Name, NodeID: s.rec.NodeID, Incarnation: s.rec.Incarnation, Addr: s.rec.GRPCAddr,
			Device: s.rec.Device, CPUCores: s.rec.CPUCores, MemoryBytes: s.rec.MemoryBytes,
			Stage: c.active.stageOf(s.rec.ShardID), Connected: s.connected(),
			TombstonesUnacked: s.unackedCount(), BackstopDropped: s.dropped, LastHeartbeat: s.hbAt,
		}
		if sv.Stage >= 0 {
			st := c.active.Stages[sv.Stage]
			sv.First, sv.End, sv.Embed, sv.Head = st.First, st.End, st.Embed, st.Head
			sv.PredictedStageNs = st.PredictedNs
			sv.KVSlots = c.cfg.Shape.KVSlots(st.First, st.End)
		}
		sv.Calibration = s.speed
		cs, _ := c.core.Shard(s.rec.ShardID) // the core's view: lost, failed, READY
		if hb := s.hb; hb != nil {
			sv.KVUsed, sv.KVTotal, sv.Sequences = hb.GetKv().GetBlocksUsed(), hb.GetKv().GetBlocksTotal(), hb.GetKv().GetSequences()
			sv.InvariantOK = hb.GetInvariantOk()
			sv.Batches, sv.BusyNs = hb.GetCounters().GetBatches(), int64(min(hb.GetCounters().GetBusyNs(), math.MaxInt64))
		}
		switch {
		case cs.Lost:
			sv.State = "lost"
		case cs.Failed != "":
			sv.State = "failed"
		case !s.connected():
			sv.State = "disconnected"
		case sv.Stage < 0:
			sv.State = "idle"
		case cs.Ready == c.active.Version:
			sv.State = "ready"
		default:
			sv.State = "loading"
		}
		v.Shards = append(v.Shards, sv)
	}
	slices.SortFunc(v.Shards, func(a, b ShardView) int { return cmpString(a.ShardID, b.ShardID) })
	c.view.Store(v)
	// The engine re-reads readiness only when told: tell it when what it
	// would make of it changed (also when PlacementWait ran out, which
	// only the clock moves).
	if r := readinessOf(c.PlacementVersion(), c.Ready()); r != c.told {
		c.told = r
		c.pipe.notify()
	}
}
