package kv

import (
	"errors"
	"fmt"
)

// Errors returned by the allocator.
var (
	// ErrOutOfBlocks means the pool cannot supply the blocks asked for. Nothing
	// was allocated.
	ErrOutOfBlocks = errors.New("kv: out of blocks")
	// ErrUnknownSequence means the sequence has no table.
	ErrUnknownSequence = errors.New("kv: unknown sequence")
	// ErrSequenceExists means Allocate was called for a sequence that already
	// has a table.
	ErrSequenceExists = errors.New("kv: sequence exists")
)

// BlockID names one block of the pool, in [0, Config.Blocks). It is int32 on
// purpose: it is what model.Row carries and what shards index their pools by.
type BlockID int32

// SeqID is a sequence ID, chosen by the scheduler (fresh and increasing for
// every admission).
type SeqID uint64

// Limits on Config, so that sizes stay in the ranges the types hold.
const (
	MaxBlocks    = 1 << 30
	MaxBlockSize = 1 << 16
)

// Config sizes the pool.
type Config struct {
	// Blocks is the number of blocks in the pool: the smallest stage's
	// capacity, since every sequence needs its blocks on every stage.
	Blocks int
	// BlockSize is the number of positions a block holds.
	BlockSize int
	// PrefixCaching turns on content-hashed reuse of committed full blocks.
	PrefixCaching bool
}

// DefaultConfig returns the configuration strata starts from.
func DefaultConfig() Config {
	return Config{
		// A placeholder big enough for the built-in demo model (64 Ki
		// positions); the coordinator replaces it with the smallest stage's
		// capacity once shards report their memory.
		Blocks: 4096,
		// 16 positions: vLLM's and the shards' default. Small enough that the
		// last, partly filled block wastes little; large enough that tables
		// stay short and attention reads contiguous runs.
		BlockSize: 16,
		// On: chat traffic repeats system prompts and conversation history,
		// and a hit skips their prefill. Sharing is safe because only blocks
		// whose K/V every stage has written are ever shared.
		PrefixCaching: true,
	}
}

// Validate reports the first field that is out of range.
func (c Config) Validate() error {
	if c.Blocks < 1 || c.Blocks > MaxBlocks {
		return fmt.Errorf("kv: Blocks must be in [1, %d], got %d", MaxBlocks, c.Blocks)
	}
	if c.BlockSize < 1 || c.BlockSize > MaxBlockSize {
		return fmt.Errorf("kv: BlockSize must be in [1, %d], got %d", MaxBlockSize, c.BlockSize)
	}
	return nil
}

// Stats is a snapshot of the pool. Used + Cached + Free == Total always.
type Stats struct {
	Total     int // blocks in the pool
	Used      int // blocks referenced by at least one live table
	Cached    int // unreferenced blocks kept for prefix reuse (evictable)
	Free      int // unreferenced blocks holding nothing of value
	Sequences int // live tables

	// PrefixQueried counts the positions offered for prefix matching by
	// Allocate; PrefixHit counts those served from the cache.
	PrefixQueried uint64
	PrefixHit     uint64
}

// HitRate is PrefixHit / PrefixQueried, or 0 before any query.
func (s Stats) HitRate() float64 {
	if s.PrefixQueried == 0 {
		return 0
	}
	return float64(s.PrefixHit) / float64(s.PrefixQueried)
}

const none = -1 // no block, in the LRU links

// Table is one live sequence's block table. Allocator.Table hands out a
// pointer to it as a handle, so that an owner touching a table on every step
// (the scheduler, once per row) need not look the sequence up each time.
//
// A handle is valid from the Allocate that creates the table until End of its
// sequence. After End the allocator recycles the Table for a later sequence,
// so the holder must drop the handle when it ends the sequence; until it is
// reused, Len and AppendBlocks on an ended Table panic. A Table is read-only
// to its holder: its methods change nothing.
type Table struct {
	seq     SeqID
	live    bool
	blocks  []BlockID
	nhashed int    // leading full blocks whose chain hash is known
	last    uint64 // chain hash of block nhashed-1 (root seed when 0)
}

// Seq is the sequence the table belongs to.
func (t *Table) Seq() SeqID { return t.seq }

// Len is the number of blocks in the table.
func (t *Table) Len() int {
	if !t.live {
		panic(fmt.Sprintf("kv: length of ended sequence %d's table", t.seq))
	}
	return len(t.blocks)
}

// AppendBlocks appends the table's first n blocks to dst and returns the
// extended slice (n < 0 means all of them): Allocator.AppendTable without the
// lookup. It panics when the table has fewer than n blocks or has ended.
func (t *Table) AppendBlocks(dst []BlockID, n int) []BlockID {
	if !t.live {
		panic(fmt.Sprintf("kv: table of ended sequence %d", t.seq))
	}
	if n < 0 {
		n = len(t.blocks)
	}
	if n > len(t.blocks) {
		panic(fmt.Sprintf("kv: sequence %d has %d blocks, %d asked for", t.seq, len(t.blocks), n))
	}
	return append(dst, t.blocks[:n]...)
}

// Allocator owns the pool. The zero value is not usable; call New.
type Allocator struct {
	cfg Config

	ref    []int32  // per block: live tables naming it
	hashed []bool   // per block: registered in index
	hash   []uint64 // per block, when hashed: its chain hash
	parent []uint64 // per block, when hashed: its parent's chain hash
	toks   []int32  // per block, when hashed: its BlockSize tokens

	free []BlockID // unreferenced, unhashed blocks (a stack)

	// LRU of unreferenced hashed blocks, oldest at head; links are block IDs.
	prev, next       []int32
	lruHead, lruTail int32
	lruLen           int

	index  map[uint64]BlockID
	tables map[SeqID]*Table
	spare  []*Table // ended tables kept for reuse, so steady state allocates nothing
	used   int

	queried, hit uint64

	mark []int32 // scratch for CheckInvariants
}

// New returns an allocator with every block free.
func New(cfg Config) (*Allocator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := cfg.Blocks
	a := &Allocator{
		cfg:     cfg,
		ref:     make([]int32, n),
		free:    make([]BlockID, n),
		tables:  make(map[SeqID]*Table),
		lruHead: none,
		lruTail: none,
		mark:    make([]int32, n),
	}
	// Pop order is 0, 1, 2, …: the stack holds the highest ID at the bottom.
	for i := range a.free {
		a.free[i] = BlockID(n - 1 - i)
	}
	if cfg.PrefixCaching {
		a.hashed = make([]bool, n)
		a.hash = make([]uint64, n)
		a.parent = make([]uint64, n)
		a.toks = make([]int32, n*cfg.BlockSize)
		a.prev = make([]int32, n)
		a.next = make([]int32, n)
		a.index = make(map[uint64]BlockID)
	}
	return a, nil
}

// BlockSize is the number of positions a block holds.
func (a *Allocator) BlockSize() int { return a.cfg.BlockSize }

// BlocksFor is the number of blocks that hold positions [0, positions).
func (a *Allocator) BlocksFor(positions int) int {
	return (positions + a.cfg.BlockSize - 1) / a.cfg.BlockSize
}

// Available is the number of blocks Allocate and Extend can hand out now:
// free blocks plus evictable cached ones.
func (a *Allocator) Available() int { return len(a.free) + a.lruLen }

// Stats returns a snapshot of the pool.
func (a *Allocator) Stats() Stats {
	return Stats{
		Total:         a.cfg.Blocks,
		Used:          a.used,
		Cached:        a.lruLen,
		Free:          len(a.free),
		Sequences:     len(a.tables),
		PrefixQueried: a.queried,
		PrefixHit:     a.hit,
	}
}

// Has reports whether seq has a table.
func (a *Allocator) Has(seq SeqID) bool {
	_, ok := a.tables[seq]
	return ok
}

// Len is the number of blocks in seq's table, or 0 when it has none.
func (a *Allocator) Len(seq SeqID) int {
	if t, ok := a.tables[seq]; ok {
		return len(t.blocks)
	}
	return 0
}

// Table returns seq's table as a handle, or nil when seq has none. See Table
// for how long the handle stays valid.
func (a *Allocator) Table(seq SeqID) *Table { return a.tables[seq] }

// AppendTable appends the first n blocks of seq's table to dst and returns
// the extended slice (n < 0 means all of them). It panics when seq has no
// table or fewer than n blocks: the caller asked for positions it never
// allocated.
func (a *Allocator) AppendTable(dst []BlockID, seq SeqID, n int) []BlockID {
	t, ok := a.tables[seq]
	if !ok {
		panic(fmt.Sprintf("kv: table of unknown sequence %d", seq))
	}
	return t.AppendBlocks(dst, n)
}

// Allocate creates seq's table covering at least positions positions.
//
// When prefix caching is on, the full blocks of prefix are looked up first;
// the leading ones already cached are shared rather than allocated, and
// cached reports how many positions they cover (a multiple of BlockSize, at
// most len(prefix)). The caller starts computing at position cached. Pass
// the tokens whose K/V a hit may replace, usually every token but the last,
// whose logits are still needed.
//
// Allocate fails with ErrOutOfBlocks, changing nothing, unless at least
// reserve blocks stay available afterwards (reserve 0 asks only for the
// blocks themselves).
func (a *Allocator) Allocate(seq SeqID, prefix []int32, positions, reserve int) (cached int, err error) {
	if _, ok := a.tables[seq]; ok {
		return 0, fmt.Errorf("%w: %d", ErrSequenceExists, seq)
	}
	if positions < 0 {
		positions = 0
	}
	bs := a.cfg.BlockSize
	// Look up: count matched blocks and how many of them sit in the LRU
	// (those stop being available once taken).
	matched, fromLRU := 0, 0
	var h uint64 = rootHash
	if a.cfg.PrefixCaching {
		for i := 0; (i+1)*bs <= len(prefix); i++ {
			blk := prefix[i*bs : (i+1)*bs]
			nh := chain(h, blk)
			id, ok := a.lookup(nh, h, blk)
			if !ok {
				break
			}
			if a.ref[id] == 0 {
				fromLRU++
			}
			matched++
			h = nh
		}
	}
	need := a.BlocksFor(max(positions, matched*bs)) - matched
	if need+reserve > a.Available()-fromLRU {
		return 0, ErrOutOfBlocks
	}

	// Mutate: nothing below can fail.
	t := a.newTable(seq)
	if a.cfg.PrefixCaching {
		a.queried += uint64(len(prefix))
		a.hit += uint64(matched * bs)
		h = rootHash
		for i := range matched {
			blk := prefix[i*bs : (i+1)*bs]
			h = chain(h, blk)
			id := a.index[h]
			if a.ref[id] == 0 {
				a.lruRemove(id)
				a.used++
			}
			a.ref[id]++
			t.blocks = append(t.blocks, id)
		}
		t.nhashed, t.last = matched, h
	}
	for range need {
		t.blocks = append(t.blocks, a.take())
	}
	a.tables[seq] = t
	return matched * bs, nil
}

// Extend grows seq's table to cover at least positions positions. It fails
// with ErrOutOfBlocks, changing nothing, when the pool is short, and with
// ErrUnknownSequence when seq has no table.
func (a *Allocator) Extend(seq SeqID, positions int) error {
	t, ok := a.tables[seq]
	if !ok {
		return fmt.Errorf("%w: %d", ErrUnknownSequence, seq)
	}
	need := a.BlocksFor(positions) - len(t.blocks)
	if need <= 0 {
		return nil
	}
	if need > a.Available() {
		return ErrOutOfBlocks
	}
	for range need {
		t.blocks = append(t.blocks, a.take())
	}
	return nil
}

// Commit records that the K/V of tokens, the first len(tokens) positions of
// seq, are written on every stage, so that the full blocks among them may be
// shared with later sequences. Commit is cheap to repeat: blocks already
// recorded are skipped. It does nothing when prefix caching is off. It panics
// when seq has no table, a broken invariant in the caller.
func (a *Allocator) Commit(seq SeqID, tokens []int32) {
	if !a.cfg.PrefixCaching {
		return
	}
	t, ok := a.tables[seq]
	if !ok {
		panic(fmt.Sprintf("kv: commit of unknown sequence %d", seq))
	}
	bs := a.cfg.BlockSize
	full := min(len(tokens)/bs, len(t.blocks))
	for i := t.nhashed; i < full; i++ {
		blk := tokens[i*bs : (i+1)*bs]
		h := chain(t.last, blk)
		id := t.blocks[i]
		if _, dup := a.index[h]; !dup && !a.hashed[id] {
			a.index[h] = id
			a.hashed[id] = true
			a.hash[id] = h
			a.parent[id] = t.last
			copy(a.toks[int(id)*bs:], blk)
		}
		t.last = h
		t.nhashed = i + 1
	}
}

// End drops seq's table: every block loses one reference, and a block whose
// last reference goes is parked in the prefix cache (when its content is
// committed) or freed. It panics when seq has no table (a double free) or a
// reference count would go negative.
func (a *Allocator) End(seq SeqID) {
	t, ok := a.tables[seq]
	if !ok {
		panic(fmt.Sprintf("kv: end of unknown sequence %d (double free?)", seq))
	}
	// Release the tail first, so that the LRU evicts a chain's leaves before
	// the prefix it shares with others.
	for i := len(t.blocks) - 1; i >= 0; i-- {
		id := t.blocks[i]
		if a.ref[id] <= 0 {
			panic(fmt.Sprintf("kv: double free of block %d by sequence %d (refcount %d)", id, seq, a.ref[id]))
		}
		a.ref[id]--
		if a.ref[id] > 0 {
			continue
		}
		a.used--
		if a.cfg.PrefixCaching && a.hashed[id] {
			a.lruPush(id)
		} else {
			a.free = append(a.free, id)
		}
	}
	delete(a.tables, seq)
	t.live = false
	t.blocks = t.blocks[:0]
	t.nhashed, t.last = 0, rootHash
	a.spare = append(a.spare, t)
}

func (a *Allocator) newTable(seq SeqID) *Table {
	var t *Table
	if n := len(a.spare); n > 0 {
		t = a.spare[n-1]
		a.spare = a.spare[:n-1]
	} else {
		t = &Table{last: rootHash}
	}
	t.seq, t.live = seq, true
	return t
}

// take hands out one block with reference count 1: a free one, else the least
// recently parked cached one. The caller has checked Available.
func (a *Allocator) take() BlockID {
	var id BlockID
	if n := len(a.free); n > 0 {
		id = a.free[n-1]
		a.free = a.free[:n-1]
	} else {
		id = BlockID(a.lruHead)
		a.lruRemove(id)
		delete(a.index, a.hash[id])
		a.hashed[id] = false
	}
	a.ref[id] = 1
	a.used++
	return id
}

// lookup finds the cached block with chain hash h, parent hash parent and
// content blk.
func (a *Allocator) lookup(h, parent uint64, blk []int32) (BlockID, bool) {
	id, ok := a.index[h]
	if !ok || a.parent[id] != parent {
		return 0, false
	}
	bs := a.cfg.BlockSize
	have := a.toks[int(id)*bs : int(id+1)*bs]
	for i, tok := range blk {
		if have[i] != tok {
			return 0, false
		}
	}
	return id, true
}

func (a *Allocator) lruPush(id BlockID) {
	i := int32(id)
	a.prev[i], a.next[i] = a.lruTail, none
	if a.lruTail == none {
		a.lruHead = i
	} else {
		a.next[a.lruTail] = i
	}
	a.lruTail = i
	a.lruLen++
}

func (a *Allocator) lruRemove(id BlockID) {
	i := int32(id)
	p, n := a.prev[i], a.next[i]
	if p == none {
		a.lruHead = n
	} else {
		a.next[p] = n
	}
	if n == none {
		a.lruTail = p
	} else {
		a.prev[n] = p
	}
	a.prev[i], a.next[i] = none, none
	a.lruLen--
}

// rootHash seeds the chain: the parent hash of a sequence's first block.
const rootHash uint64 = 0x243f6a8885a308d3

// chain hashes one block's tokens onto its parent's hash.
func chain(parent uint64, blk []int32) uint64 {
	h := parent
	for _, tok := range blk {
		h ^= uint64(uint32(tok))
		h *= 0x9e3779b97f4a7c15
		h ^= h >> 29
	}
	// splitmix64's finaliser, so that nearby inputs land far apart.
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}
