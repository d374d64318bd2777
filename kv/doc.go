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
// A sliding-window model (Gemma 2 and 3) has Config.Groups > 1: its layers
// are cut into groups, and each sequence has one table per group, all of one
// length and all drawn from the one pool (docs/sliding-window-kv.md). Table 0
// is the global group's; the others are sliding groups', whose layers read
// only a window of recent positions, so their leading entries can be given
// back as the window moves. With one group (every other model) there is one
// table and nothing below differs from it.
//
//   - Allocate creates a sequence's tables and Extend grows them. Both are all
//     or nothing: they check capacity first and return ErrOutOfBlocks without
//     changing anything when the pool is short.
//   - Slide gives back the sliding tables' entries below a sequence's window:
//     the caller passes the lowest position any later row reads in a sliding
//     layer. It never touches the global table, and the window only moves
//     forward.
//   - End is the only other door through which blocks leave a table. It drops
//     one reference from every live entry of the sequence's tables; a block
//     whose last reference goes is parked in the prefix cache when its content
//     is known, and put on the free list otherwise. Ending an unknown sequence,
//     or a reference count going below zero, is a broken invariant and panics
//     with the block and sequence IDs.
//   - Table returns a handle on a live sequence's tables, for an owner that
//     reads them on every step (Len, AppendBlocks, First, AppendSliding)
//     without the lookup by sequence ID. The handle is valid until End of
//     that sequence; the allocator then recycles it, so the owner drops it at
//     End.
//   - Prefix caching: Commit tells the allocator which leading tokens of a
//     sequence now have their K/V written on every stage. Each full block among
//     them is content-hashed together with its parent's hash and indexed. A
//     later Allocate whose prefix matches reuses those blocks (reference counts
//     are explicit) instead of computing them again. Cached blocks nobody
//     references are kept in least-recently-parked order and evicted when space
//     is needed. Only committed blocks are shared, so a block is never reused
//     before its content exists everywhere. A match compares the tokens and the
//     parent hash, so a wrong reuse needs a 64-bit collision of the chain hash.
//     With groups each sliding table's committed blocks are indexed too, under
//     the chain hash mixed with the group, and a hit stands only as far as
//     every sliding group still holds the window the hit's first computed
//     position reads (Config.Window); blocks Slide gives back stay cached until
//     evicted, so a sequence's released window can serve a later prefix.
//
// The allocator is a plain data structure: it runs no goroutines, reads no
// clock, does no I/O and keeps no package state. It is not safe for
// concurrent use; its owner (the scheduler, inside the coordinator's loop)
// serialises calls. Slices passed in are not retained; slices returned belong
// to the caller.
//
// CheckInvariants verifies that every block is in exactly one of the used,
// cached and free sets, that reference counts equal the number of live table
// entries naming each block, that a sequence's tables have one length, and
// that the free list, the LRU and the hash index agree.
// It costs O(blocks + table entries) and allocates nothing, cheap enough to
// run after every event in tests and periodically in production.
package kv
