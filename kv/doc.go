// Package kv is the coordinator's KV block allocator: the one place in a
// strata cluster that decides which cache block holds which positions of which
// sequence. Shards only store blocks; every block ID a batch row names was
// picked here.
//
// # Contract
//
// The pool has a fixed number of blocks of Config.BlockSize positions each,
// sized by the caller to the smallest stage's capacity. Each live sequence has
// a block table: block i holds positions [i*BlockSize, (i+1)*BlockSize).
//
//   - Allocate creates a sequence's table and Extend grows it. Both are all or
//     nothing: they check capacity first and return ErrOutOfBlocks without
//     changing anything when the pool is short.
//   - End is the only door through which blocks leave a table. It drops one
//     reference from every block of the sequence; a block whose last reference
//     goes is parked in the prefix cache when its content is known, and put on
//     the free list otherwise. Ending an unknown sequence, or a reference count
//     going below zero, is a broken invariant and panics with the block and
//     sequence IDs.
//   - Table returns a handle on a live sequence's table, for an owner that
//     reads it on every step (Len, AppendBlocks) without the lookup by
//     sequence ID. The handle is valid until End of that sequence; the
//     allocator then recycles it, so the owner drops it at End.
//   - Prefix caching: Commit tells the allocator which leading tokens of a
//     sequence now have their K/V written on every stage. Each full block among
//     them is content-hashed together with its parent's hash and indexed. A
//     later Allocate whose prefix matches reuses those blocks (reference counts
//     are explicit) instead of computing them again. Cached blocks nobody
//     references are kept in least-recently-parked order and evicted when space
//     is needed. Only committed blocks are shared, so a block is never reused
//     before its content exists everywhere. A match compares the tokens and the
//     parent hash, so a wrong reuse needs a 64-bit collision of the chain hash.
//
// The allocator is a plain data structure: it runs no goroutines, reads no
// clock, does no I/O and keeps no package state. It is not safe for
// concurrent use; its owner (the scheduler, inside the coordinator's loop)
// serialises calls. Slices passed in are not retained; slices returned belong
// to the caller.
//
// CheckInvariants verifies that every block is in exactly one of the used,
// cached and free sets, that reference counts equal the number of live tables
// naming each block, and that the free list, the LRU and the hash index agree.
// It costs O(blocks + table entries) and allocates nothing, cheap enough to
// run after every event in tests and periodically in production.
package kv
