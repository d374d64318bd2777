package coordinator

import (
	"fmt"
	"slices"
	"time"

	"github.com/strata-llm/strata/transport/membership"
	"github.com/strata-llm/strata/transport/pb"
)

// Losses and placement, on the cluster's loop: when a shard is lost (its
// control stream is the truth, membership a hint), and where the layers go
// then. --min-shards gates only the first formation; after it a loss
// re-places at once onto whatever can hold the model.

// member handles a membership event. Membership is a hint, the control
// stream is the truth: a shard's gossip death or leave is its loss only
// when its control stream is down or has gone silent (nothing from it for
// LossConfirm). A live, answering stream outweighs gossip — which anyone
// who can gossip may forge: a member claiming a healthy shard's node ID
// and then leaving takes nothing away.
func (c *Cluster) member(e membership.Event, now time.Time) {
	if e.Member.MetaErr != nil || e.Member.Meta.Role != membership.RoleShard {
		return
	}
	if e.Kind != membership.EventDead && e.Kind != membership.EventLeave {
		c.log.Debug("member", "event", e.Kind.String(), "node", e.Member.Name)
		return
	}
	for _, s := range c.shards {
		if s.rec.NodeID != e.Member.Meta.NodeID || s.rec.Incarnation != e.Member.Meta.Incarnation {
			continue
		}
		if s.connected() && c.answering(s, now) {
			c.overruled++
			c.log.Warn("membership reports a shard gone whose control stream is alive; ignored",
				"shard_id", s.rec.ShardID, "event", e.Kind.String(), "member", e.Member.Name, "addr", e.Member.Addr)
			continue
		}
		if s.connected() {
			// Silent and declared gone: cut the stream, so that if the
			// shard is alive after all, its return is a rejoin.
			s.ctl.close()
			s.ctl = nil
		}
		c.lose(s, "membership: "+e.Kind.String(), now)
	}
}

// answering reports whether s's control stream has shown life within
// LossConfirm: a heartbeat, or its opening.
func (c *Cluster) answering(s *shardState, now time.Time) bool {
	last := s.hbAt
	if s.ctlAt.After(last) {
		last = s.ctlAt
	}
	return now.Sub(last) < c.cfg.LossConfirm
}

// lose declares s lost: it leaves placement until its control stream
// opens again (or it registers again), and a placement holding it is
// broken: the pipeline pauses (its in-flight batches fail, their requests
// are requeued) and reconcile re-places at once.
func (c *Cluster) lose(s *shardState, why string, now time.Time) {
	if s.lost {
		return
	}
	s.lost = true
	c.log.Warn("shard lost", "shard_id", s.rec.ShardID, "why", why)
	if c.active.stageOf(s.rec.ShardID) >= 0 {
		c.lastLoss = fmt.Sprintf("shard %s lost: %s", s.rec.ShardID, why)
		c.pauseFor(c.lastLoss, now)
	}
}

// broken reports whether p names a shard that is gone.
func (c *Cluster) broken(p *Placement) bool {
	for _, st := range p.Stages {
		s := c.shards[st.ShardID]
		if s == nil || s.lost || s.failed != "" {
			return true
		}
	}
	return false
}

// place makes a new placement: the restored one when all its shards came
// back after a coordinator restart, else a fresh plan over the candidates.
// The first formation waits for MinShards of them; after it, a loss is
// re-placed onto whatever is left (degraded is better than down), and only
// when that cannot hold the model does Ready say so (ErrNoFit), for the
// engine to fail what it had dispatched.
func (c *Cluster) place(now time.Time) {
	cands := c.candidates()
	var p *Placement
	if c.restored != nil {
		p = c.restore(cands)
		if p == nil && now.Sub(c.started) < c.cfg.LossConfirm {
			c.setNotReady(fmt.Sprintf("waiting for the shards of placement %d to return", c.restored.Version), now)
			return
		}
		c.restored = nil
	}
	if p == nil {
		if c.active == nil && len(cands) < c.cfg.MinShards {
			c.setNotReady(fmt.Sprintf("waiting for shards (%d of --min-shards %d connected)", len(cands), c.cfg.MinShards), now)
			return
		}
		caps := make([]Capacity, len(cands))
		for i, s := range cands {
			kvm := int64(s.rec.KVMemory)
			if c.cfg.KVMemory > 0 && (kvm == 0 || kvm > c.cfg.KVMemory) {
				kvm = c.cfg.KVMemory
			}
			caps[i] = Capacity{ShardID: s.rec.ShardID, NodeID: s.rec.NodeID, Incarnation: s.rec.Incarnation,
				Addr: s.rec.GRPCAddr, Memory: int64(s.rec.MemoryBytes), KVMemory: kvm, Speed: s.speed}
		}
		mix := c.cfg.PlacementMix
		if mix == "" {
			mix = MixBalanced
		}
		var err error
		if p, err = PlanFor(c.cfg.Shape, caps, mix, c.nextVersion, c.start.Epoch); err != nil {
			why := fmt.Sprintf("cannot place the model on %d shards: %v", len(cands), err)
			if c.lastLoss != "" {
				why = fmt.Sprintf("%s; cannot place the model on the shards left (%d): %v", c.lastLoss, len(cands), err)
			}
			c.cannotPlace = c.active != nil
			c.setNotReady(why, now)
			return
		}
	}
	p.Version, p.Epoch = c.nextVersion, c.start.Epoch
	c.activate(p, now)
}

// restore returns the restored placement under a new version if every one
// of its stages' nodes is back and connected: the same process, or a new
// incarnation of the same node ID (a restarted shard, whose weight cache
// holds that range). After a coordinator restart no shard keeps KV of the
// old epoch, so a new incarnation is as good as the old one.
func (c *Cluster) restore(cands []*shardState) *Placement {
	p := *c.restored
	p.Stages = slices.Clone(p.Stages)
	used := map[string]bool{}
	for i, st := range p.Stages {
		j := slices.IndexFunc(cands, func(s *shardState) bool {
			return !used[s.rec.ShardID] && s.rec.NodeID == st.NodeID && s.rec.Incarnation == st.Incarnation
		})
		if j < 0 {
			j = slices.IndexFunc(cands, func(s *shardState) bool { return !used[s.rec.ShardID] && s.rec.NodeID == st.NodeID })
		}
		if j < 0 {
			return nil
		}
		s := cands[j]
		used[s.rec.ShardID] = true
		p.Stages[i].ShardID, p.Stages[i].Incarnation, p.Stages[i].Addr = s.rec.ShardID, s.rec.Incarnation, s.rec.GRPCAddr
	}
	return &p
}

// activate makes p the placement: persisted, the pipeline switched (paused
// until every stage is READY), Assigns sent, and shards that held a range
// and have none now made spares.
func (c *Cluster) activate(p *Placement, now time.Time) {
	c.pauseFor(fmt.Sprintf("placement %d: loading", p.Version), now)
	if err := c.store.SavePlacement(p); err != nil {
		c.log.Warn("persist placement", "placement", p.Version, "err", err)
	}
	c.nextVersion = p.Version + 1
	c.active = p
	c.linkDown, c.linkRetryAt = time.Time{}, time.Time{} // a new placement: new links
	c.lastLoss, c.cannotPlace = "", false
	c.pipe.setPlacement(p)
	for i, st := range p.Stages {
		s := c.shards[st.ShardID]
		s.assigned = true
		s.ctl.push(&pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_Assign{Assign: p.Assign(i, c.cfg.Shape)}})
	}
	for _, s := range c.shards {
		if s.assigned && p.stageOf(s.rec.ShardID) < 0 && s.connected() {
			s.assigned = false
			s.ctl.push(&pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_Assign{Assign: &pb.Assign{PlacementVersion: p.Version, ModelSha256: p.Model}}})
		}
	}
	var ranges []string
	for _, st := range p.Stages {
		ranges = append(ranges, fmt.Sprintf("%s[%d,%d)", st.ShardID, st.First, st.End))
	}
	c.log.Info("placement", "placement", p.Version, "stages", len(p.Stages), "kv_blocks", p.Blocks, "layers", ranges)
}
