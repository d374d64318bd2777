package coordinator

import (
	"fmt"
	"time"

	"github.com/strata-llm/strata/control"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/membership"
	"github.com/strata-llm/strata/transport/pb"
)

// Losses and placement, on the cluster's loop: the core (control.Core)
// decides when a shard is lost (its control stream is the truth,
// membership a hint) and where the layers go then; this file turns
// membership events into its events and carries out its actions.

// memberKinds maps membership's event kinds to the core's.
var memberKinds = map[membership.EventKind]control.MemberKind{
	membership.EventJoin:   control.MemberAlive,
	membership.EventUpdate: control.MemberAlive,
	membership.EventDead:   control.MemberDead,
	membership.EventLeave:  control.MemberLeft,
}

// member hands a shard's membership event to the core, which takes a death
// or leave as the shard's loss only when its control stream is down or has
// gone silent (control.Core.Member).
func (c *Cluster) member(e membership.Event, now time.Time) {
	if e.Member.MetaErr != nil || e.Member.Meta.Role != membership.RoleShard {
		return
	}
	kind, ok := memberKinds[e.Kind]
	if !ok || (kind != control.MemberDead && kind != control.MemberLeft) {
		c.log.Debug("member", "event", e.Kind.String(), "node", e.Member.Name)
		return
	}
	c.apply(c.core.Member(e.Member.Meta.NodeID, e.Member.Meta.Incarnation, kind, now), "member", e.Member.Name, "addr", e.Member.Addr)
}

// apply carries out the core's actions, in order. attrs are added to the
// log lines of the event's actions. ActOpenLink is reconcile's (it needs
// the loop's context; only Tick asks for a link).
func (c *Cluster) apply(acts []control.Action, attrs ...any) {
	for _, a := range acts {
		p := (*Placement)(a.Placement)
		switch a.Kind {
		case control.ActPause:
			if l := c.pipe.pause(a.Reason, c.ledger); l != nil {
				l.cancel()
				c.log.Warn("pipeline paused", "why", a.Reason)
			}
			if c.opening != nil {
				c.opening.cancel()
				c.opening = nil
			}
		case control.ActActivate:
			if err := c.store.SavePlacement(p); err != nil {
				c.log.Warn("persist placement", "placement", p.Version, "err", err)
			}
			c.switching = c.active != nil
			c.active = p
			c.pipe.setPlacement(p)
			var ranges []string
			for _, st := range p.Stages {
				ranges = append(ranges, fmt.Sprintf("%s[%d,%d)", st.ShardID, st.First, st.End))
			}
			c.log.Info("placement", "placement", p.Version, "stages", len(p.Stages), "kv_blocks", p.Blocks, "layers", ranges)
		case control.ActAssign:
			if s := c.shards[a.Shard]; s != nil {
				s.ctl.push(&pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_Assign{Assign: p.Assign(a.Stage, c.cfg.Shape)}})
			}
		case control.ActSpare:
			if s := c.shards[a.Shard]; s != nil {
				s.ctl.push(&pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_Assign{Assign: &pb.Assign{PlacementVersion: p.Version, ModelSha256: p.Model}}})
			}
		case control.ActResume:
			l := c.opening
			c.opening = nil
			if l == nil || !c.pipe.resume(l) {
				// The core and the pipeline disagree on the placement: a bug.
				c.log.Error("pipeline not resumed: no link of the placement", "placement", p.Version)
				if l != nil {
					l.cancel()
				}
				continue
			}
			// An empty batch of the new version through every stage: a
			// shard that loaded it while serving the old one (shard
			// Node.promote) switches to it now, freeing the old version's
			// KV, not at the first request.
			if c.switching {
				c.switching = false
				if err := c.pipe.Dispatch(&transport.MicroBatch{Epoch: c.start.Epoch}); err != nil {
					c.log.Warn("switch batch", "placement", p.Version, "err", err)
				}
			}
			c.log.Info("pipeline ready", "placement", p.Version, "stages", len(p.Stages), "kv_blocks", p.Blocks)
			c.readyOnce.Do(func() { close(c.firstReady) })
		case control.ActLost:
			c.log.Warn("shard lost", append([]any{"shard_id", a.Shard, "why", a.Reason}, attrs...)...)
		case control.ActCut:
			if s := c.shards[a.Shard]; s != nil && s.ctl != nil {
				s.ctl.close()
				s.ctl = nil
			}
		case control.ActOverruled:
			c.log.Warn("membership reports a shard gone whose control stream is alive; ignored",
				append([]any{"shard_id", a.Shard, "event", a.Reason}, attrs...)...)
		case control.ActLoaded:
			c.log.Info("shard ready", "shard_id", a.Shard, "placement", p.Version)
		case control.ActLoadFailed:
			c.log.Error("shard failed to load", "shard_id", a.Shard, "placement", p.Version, "err", a.Reason)
		case control.ActReplan:
			// Its Assigns follow; the active placement serves until the
			// core switches (ActActivate).
			c.replans++
			c.log.Info("re-placing make-before-break: a placement over the shards now would be markedly faster",
				"placement", c.active.Version, "next", p.Version, "why", a.Reason)
		case control.ActAbandon:
			c.log.Warn("make-before-break placement abandoned", "placement", p.Version, "why", a.Reason)
		case control.ActWarn:
			c.log.Warn("make-before-break re-plan skipped", "placement", c.active.Version, "why", a.Reason)
		case control.ActOpenLink:
			// reconcile's
		}
	}
}
