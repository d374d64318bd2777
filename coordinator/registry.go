package coordinator

import (
	"errors"
	"time"
)

// The shard registry (Cluster.shards, persisted in the store) holds what
// Register calls brought, and anyone who reaches the gRPC port can call
// Register: it is bounded in count (maxShards), its strings are bounded by
// transport.CheckRegister, and entries of shards that are gone expire.

// maxShards bounds the registry. A placement uses at most one shard per
// layer (a few dozen to ~128 for the models this project serves), plus
// spares; 256 leaves room for a cluster twice the size of any placement
// while keeping /v1/cluster, the store and the loop's scans small (a
// record is under 2 KiB: 256 of them are under 0.5 MiB). A Register
// beyond it, after expiring what can be, is refused: counted as
// strata_wire_refused_total{reason="registry_full"}, and answered
// ResourceExhausted.
const maxShards = 256

// registerGrace is how long a shard registered without ever sending a
// heartbeat is kept. A shard opens its control stream right after Register
// and sends a heartbeat first thing (milliseconds, a few backoff rounds at
// worst), so 30 s is generous; a Register never followed by one (a junk or
// a crashed caller) frees its place after it.
const registerGrace = 30 * time.Second

// shardExpiry is how long a shard that sent heartbeats is kept after its
// control stream closed and its heartbeats stopped, unless the active
// placement names it: long enough for /v1/cluster to show a lost shard
// for a while, and for a shard behind a partition to come back without
// registering again.
const shardExpiry = 10 * time.Minute

// errRegistryFull refuses a Register beyond maxShards.
var errRegistryFull = errors.New("coordinator: shard registry full")

// expireShards forgets the shards that are gone: without a control
// stream, not in the active placement, and silent for registerGrace since
// they registered (never a heartbeat: a shard sends one as it opens its
// stream) or shardExpiry since their last heartbeat.
func (c *Cluster) expireShards(now time.Time) {
	for id, s := range c.shards {
		if s.connected() || c.active.stageOf(id) >= 0 {
			continue
		}
		since, keep := s.rec.Registered, c.cfg.RegisterGrace
		if keep <= 0 {
			keep = registerGrace
		}
		if !s.hbAt.IsZero() {
			since, keep = s.hbAt, shardExpiry
		}
		if now.Sub(since) < keep {
			continue
		}
		c.core.Forget(id, "", now) // disconnected and unplaced: no action
		delete(c.shards, id)
		if err := c.store.DeleteShard(s.rec.NodeID, id); err != nil {
			c.log.Warn("forget expired shard", "shard_id", id, "err", err)
		}
		c.log.Info("shard expired", "shard_id", id, "silent_for", now.Sub(since).Round(time.Second))
	}
}
