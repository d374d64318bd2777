package kv

import "fmt"

// CheckInvariants returns an error describing the first broken invariant, or
// nil. It checks that:
//
//   - each live table belongs to the sequence it is filed under, and no
//     recycled table is live or holds entries;
//   - a sequence has Groups tables; each sliding one is as long as the global
//     one, its first live entry is within that length, and its entries before
//     it are marked released (with one group, first is 0);
//   - each block's reference count equals the number of live entries naming
//     it (the global table's, and the sliding tables' from first on), and no
//     sequence names a block twice, in one table or across its tables;
//   - Used equals the number of blocks with references, and every block is in
//     exactly one of the used set, the LRU and the free list;
//   - the free list holds no block twice and no cached block; the LRU's links
//     are consistent and hold only unreferenced committed blocks;
//   - the hash index and the blocks' recorded hashes agree, and a hashed
//     block named by a live table holds that table's group.
//
// It runs in O(blocks + table entries) and allocates nothing.
func (a *Allocator) CheckInvariants() error {
	n := a.cfg.Blocks
	mark := a.mark
	clear(mark)

	// References from live tables.
	groups := a.cfg.groups()
	for seq, t := range a.tables {
		if t.seq != seq || !t.live {
			return fmt.Errorf("kv: sequence %d's table belongs to sequence %d (live %v)", seq, t.seq, t.live)
		}
		if t.nhashed > len(t.blocks) {
			return fmt.Errorf("kv: sequence %d: %d hashed blocks but table has %d", seq, t.nhashed, len(t.blocks))
		}
		if t.Groups() != groups {
			return fmt.Errorf("kv: sequence %d has %d tables, want %d", seq, t.Groups(), groups)
		}
		if t.first < 0 || t.first > len(t.blocks) || (groups == 1 && t.first != 0) {
			return fmt.Errorf("kv: sequence %d: first live sliding entry is %d, table has %d (groups %d)", seq, t.first, len(t.blocks), groups)
		}
		for g, s := range t.sliding {
			if len(s) != len(t.blocks) {
				return fmt.Errorf("kv: sequence %d: sliding table %d has %d entries, global table %d", seq, g+1, len(s), len(t.blocks))
			}
			for i, id := range s[:t.first] {
				if id != released {
					return fmt.Errorf("kv: sequence %d: sliding table %d entry %d is block %d, below first %d", seq, g+1, i, id, t.first)
				}
			}
		}
		for g := range groups {
			for i, id := range t.liveEntries(g) {
				if id < 0 || int(id) >= n {
					return fmt.Errorf("kv: sequence %d: table %d block %d is %d, outside the pool of %d", seq, g, i, id, n)
				}
				if a.cfg.PrefixCaching && a.hashed[id] && int(a.group[id]) != g {
					return fmt.Errorf("kv: sequence %d: table %d names block %d, cached as group %d's", seq, g, id, a.group[id])
				}
				mark[id]++
			}
		}
		// No block twice in one sequence: a second pass finds it counted.
		for g := range groups {
			for _, id := range t.liveEntries(g) {
				if mark[id] < 0 {
					return fmt.Errorf("kv: sequence %d names block %d twice", seq, id)
				}
				mark[id] = -mark[id]
			}
		}
		for g := range groups {
			for _, id := range t.liveEntries(g) {
				mark[id] = -mark[id]
			}
		}
	}
	for _, t := range a.spare {
		if t.live {
			return fmt.Errorf("kv: recycled table of sequence %d is still live", t.seq)
		}
		if len(t.blocks) != 0 || t.first != 0 {
			return fmt.Errorf("kv: recycled table of sequence %d keeps %d blocks, first %d", t.seq, len(t.blocks), t.first)
		}
		for g, s := range t.sliding {
			if len(s) != 0 {
				return fmt.Errorf("kv: recycled table of sequence %d keeps %d entries in sliding table %d", t.seq, len(s), g+1)
			}
		}
	}
	used := 0
	for id := range n {
		if mark[id] != a.ref[id] {
			return fmt.Errorf("kv: block %d has refcount %d but %d live table entries name it", id, a.ref[id], mark[id])
		}
		if a.ref[id] > 0 {
			used++
		}
	}
	if used != a.used {
		return fmt.Errorf("kv: used is %d but %d blocks are referenced", a.used, used)
	}

	// Free list and LRU: mark visited blocks with -1.
	clear(mark)
	for _, id := range a.free {
		if id < 0 || int(id) >= n {
			return fmt.Errorf("kv: free list holds %d, outside the pool of %d", id, n)
		}
		if mark[id] != 0 {
			return fmt.Errorf("kv: block %d is on the free list twice", id)
		}
		mark[id] = -1
		if a.ref[id] != 0 {
			return fmt.Errorf("kv: free block %d has refcount %d", id, a.ref[id])
		}
		if a.cfg.PrefixCaching && a.hashed[id] {
			return fmt.Errorf("kv: free block %d is in the prefix index", id)
		}
	}
	lru := 0
	if a.cfg.PrefixCaching {
		prev := int32(none)
		for i := a.lruHead; i != none; i = a.next[i] {
			if i < 0 || int(i) >= n {
				return fmt.Errorf("kv: LRU link %d outside the pool of %d", i, n)
			}
			if mark[i] != 0 {
				return fmt.Errorf("kv: block %d is in the LRU twice or also free", i)
			}
			mark[i] = -1
			if a.prev[i] != prev {
				return fmt.Errorf("kv: LRU block %d links back to %d, want %d", i, a.prev[i], prev)
			}
			if a.ref[i] != 0 || !a.hashed[i] {
				return fmt.Errorf("kv: LRU block %d has refcount %d, hashed %v", i, a.ref[i], a.hashed[i])
			}
			prev = i
			lru++
			if lru > n {
				return fmt.Errorf("kv: LRU has a cycle")
			}
		}
		if prev != a.lruTail {
			return fmt.Errorf("kv: LRU tail is %d, list ends at %d", a.lruTail, prev)
		}
		hashed := 0
		for id := range n {
			if a.hashed[id] {
				hashed++
				if got, ok := a.index[a.hash[id]]; !ok || got != BlockID(id) {
					return fmt.Errorf("kv: block %d has hash %#x but the index maps it to %d (present %v)", id, a.hash[id], got, ok)
				}
			}
		}
		if hashed != len(a.index) {
			return fmt.Errorf("kv: %d blocks are hashed but the index has %d entries", hashed, len(a.index))
		}
	}
	if lru != a.lruLen {
		return fmt.Errorf("kv: LRU length is %d but the list holds %d", a.lruLen, lru)
	}
	if a.used+lru+len(a.free) != n {
		return fmt.Errorf("kv: used %d + cached %d + free %d != total %d", a.used, lru, len(a.free), n)
	}
	return nil
}
