// Package shard is the node runtime of a strata shard: it holds a contiguous
// range of a model's layers and the KV cache for them, applies tombstones,
// and runs the micro-batches that flow through it.
//
// The core is two plain values with no I/O, no goroutines and no clock reads:
//
//   - Table keeps this shard's replica of each live sequence's block table
//     (and, for a model with sliding layers, its sliding tables, which only
//     release entries at their front and append at their back), the
//     high-water mark of created sequence IDs, and the rules that make
//     resurrection impossible: a row is placed only if its position equals
//     the sequence's length, a sequence is created only on a first row whose
//     ID is above the high-water mark and not already tombstoned. Every way a
//     sequence leaves — tombstone, refused row, newer epoch, lapsed lease,
//     reconcile, the end of its placement — goes through one function
//     (Table.free), which is counted by reason and tells the Runner, so
//     that the sequence's sampler state leaves with its blocks.
//   - Runner runs one stage: it applies a batch's tombstones before touching
//     its rows, drops the rows it cannot place (reporting them as
//     unknown_sequence, never computing them against empty KV), runs the
//     model on the rest, and on the last stage samples each row with its
//     sequence's own sampler state. It owns its sequences' state behind its
//     own lock, which it does not hold across the forward pass.
//
// Node is the gRPC shell around them (`shard join`; docs/cluster.md is the
// protocol): New(cfg) opens the data dir (node identity in bbolt) and binds
// the stage endpoint and /metrics; Run(ctx) joins the gossip cluster,
// registers, keeps the control stream (heartbeats, leases, acked backstop
// tombstones, Assign), serves Stage.Stream and returns after every goroutine
// it started has exited. Node.mu guards the node's state (the current
// placement, the epoch, the counts of retired runners), never a forward
// pass: the stage stream computes outside it, so heartbeats, lease checks,
// backstop tombstones and metrics scrapes never wait for compute; nothing
// sends on a channel or the network while holding it. Each downstream link (next stage or Coordinator.Results) has
// one sender goroutine behind a bounded queue; a full queue fails the batch
// upstream. Package transport converts every wire message and checks it
// before the node uses it (transport.BatchFromWire against the placement's
// limits and the epoch the control stream set); a refused batch is failed
// whole with the refusal's code and counted (strata_wire_refused_total).
package shard
