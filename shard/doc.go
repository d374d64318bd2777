// Package shard is the node runtime of a strata shard: it holds a contiguous
// range of a model's layers and the KV cache for them, applies tombstones,
// and runs the micro-batches that flow through it.
//
// The core is two plain values with no I/O, no goroutines and no clock reads:
//
//   - Table keeps this shard's replica of each live sequence's block table,
//     the high-water mark of created sequence IDs, and the rules that make
//     resurrection impossible: a row is placed only if its position equals
//     the sequence's length, a sequence is created only on a first row whose
//     ID is above the high-water mark and not already tombstoned. Every way a
//     sequence leaves — tombstone, newer epoch, lapsed lease, reconcile —
//     goes through one function and is counted by reason.
//   - Runner runs one stage: it applies a batch's tombstones before touching
//     its rows, drops the rows it cannot place (reporting them as
//     unknown_sequence, never computing them against empty KV), runs the
//     model on the rest, and on the last stage samples each row with its
//     sequence's own sampler state.
//
// The gRPC shell around them (stage streams, control stream, heartbeats) is
// the caller; it owns the only goroutine that touches a Runner.
package shard
