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
	// MaxGroups bounds Config.Groups: far above any model's (Gemma 3 needs
	// 7, Gemma 2 needs 2), and small enough that a sequence's groups times
	// its blocks stays far inside an int.
	MaxGroups = 64
	// MaxWindow bounds Config.Window, so that positions stay far inside an
	// int32 (a row's position is one).
	MaxWindow = 1 << 30
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
	// Groups is the number of block tables each sequence has: one per layer
	// group of a sliding-window model (docs/sliding-window-kv.md). Table 0
	// is the global group, read by every later position; tables 1 to
	// Groups-1 are sliding groups, whose entries below the window Slide
	// gives back. 0 and 1 both mean one table, the global one.
	Groups int
	// Window is the sliding layers' window in positions, required with
	// Groups > 1: a row at position p reads positions from p-Window+1 on
	// in a sliding layer. A prefix-cache hit stands only when every
	// sliding table still holds the window its first computed position
	// reads, and the entries before that window start released.
	Window int
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
		// One table: every model but Gemma's has global layers only. The
		// coordinator sets it from the model's layer groups.
		Groups: 0,
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
	if c.Groups < 0 || c.Groups > MaxGroups {
		return fmt.Errorf("kv: Groups must be in [0, %d], got %d", MaxGroups, c.Groups)
	}
	if c.Groups > 1 && (c.Window < 1 || c.Window > MaxWindow) {
		return fmt.Errorf("kv: Window must be in [1, %d] when Groups > 1 (the sliding layers' window), got %d with Groups %d", MaxWindow, c.Window, c.Groups)
	}
	return nil
}

// groups is the number of tables each sequence has, at least 1.
func (c Config) groups() int { return max(1, c.Groups) }

// Stats is a snapshot of the pool. Used + Cached + Free == Total always.
type Stats struct {
	Total     int // blocks in the pool
	Used      int // blocks referenced by at least one live table entry
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

// released marks a sliding table's entry whose block Slide gave back: every
// entry below Table.first, so that a stray read of one names no block.
const released BlockID = -1

// Table is one live sequence's block tables. Allocator.Table hands out a
// pointer to it as a handle, so that an owner touching a table on every step
// (the scheduler, once per row) need not look the sequence up each time.
//
// A sequence has Groups tables, all of the same length: block i of each holds
// positions [i*BlockSize, (i+1)*BlockSize) of that group's layers. Table 0,
// the global one, is what Len and AppendBlocks read. The sliding tables
// (1 to Groups-1) lose their leading entries as Slide moves the window: only
// entries from First on still name blocks.
//
// A handle is valid from the Allocate that creates the table until End of its
// sequence. After End the allocator recycles the Table for a later sequence,
// so the holder must drop the handle when it ends the sequence; until it is
// reused, Len, First, AppendBlocks and AppendSliding on an ended Table panic.
// A Table is read-only to its holder: its methods change nothing.
type Table struct {
	seq    SeqID
	live   bool
	blocks []BlockID // the global table (group 0)
	// sliding holds the tables of groups 1 to Groups-1 (sliding[g-1] is
	// group g's), each as long as blocks; nil with one group. Recycled with
	// the Table, capacity and all.
	sliding [][]BlockID
	first   int    // entries of the sliding tables below it are released
	nhashed int    // leading full blocks whose chain hash is known
	last    uint64 // chain hash of block nhashed-1 (root seed when 0)
}

// Seq is the sequence the table belongs to.
func (t *Table) Seq() SeqID { return t.seq }

// Groups is the number of tables the sequence has, at least 1: the global
// one and Groups-1 sliding ones.
func (t *Table) Groups() int { return 1 + len(t.sliding) }

// Len is the number of blocks in the global table. Every sliding table is as
// long, counting the entries Slide released.
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

// First is the index of the first live entry of the sliding tables: those
// before it were released by Slide. It is 0 before any Slide and always 0
// with one group.
func (t *Table) First() int {
	if !t.live {
		panic(fmt.Sprintf("kv: first entry of ended sequence %d's table", t.seq))
	}
	return t.first
}

// AppendSliding appends entries [First(), n) of sliding table g to dst and
// returns the extended slice: the live blocks that cover positions up to
// n*BlockSize, the leading released ones left out. It panics when the table
// has ended, g is not in [1, Groups()), or n is not in [First(), Len()]:
// the caller asked for a table or positions it does not have.
func (t *Table) AppendSliding(dst []BlockID, g, n int) []BlockID {
	if !t.live {
		panic(fmt.Sprintf("kv: table of ended sequence %d", t.seq))
	}
	if g < 1 || g > len(t.sliding) {
		panic(fmt.Sprintf("kv: sequence %d has %d groups, sliding table %d asked for", t.seq, t.Groups(), g))
	}
	s := t.sliding[g-1]
	if n < t.first || n > len(s) {
		panic(fmt.Sprintf("kv: sequence %d's sliding table %d has live entries [%d, %d), %d asked for", t.seq, g, t.first, len(s), n))
	}
	return append(dst, s[t.first:n]...)
}

// liveEntries returns group g's live entries: the whole global table for g
// 0, a sliding table's entries from first on otherwise.
func (t *Table) liveEntries(g int) []BlockID {
	if g == 0 {
		return t.blocks
	}
	return t.sliding[g-1][t.first:]
}

// Allocator owns the pool. The zero value is not usable; call New.
type Allocator struct {
	cfg Config

	ref    []int32  // per block: live tables naming it
	hashed []bool   // per block: registered in index
	hash   []uint64 // per block, when hashed: its key in index (groupKey)
	parent []uint64 // per block, when hashed: its parent's chain hash
	group  []uint8  // per block, when hashed: the group whose layers it holds
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

	chains []uint64 // scratch for Allocate: the matched blocks' chain hashes
	mark   []int32  // scratch for CheckInvariants
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
		a.group = make([]uint8, n)
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

// Len is the number of blocks in seq's global table (each of its tables has
// as many entries), or 0 when it has none.
func (a *Allocator) Len(seq SeqID) int {
	if t, ok := a.tables[seq]; ok {
		return len(t.blocks)
	}
	return 0
}

// Table returns seq's table as a handle, or nil when seq has none. See Table
// for how long the handle stays valid.
func (a *Allocator) Table(seq SeqID) *Table { return a.tables[seq] }

// AppendTable appends the first n blocks of seq's global table to dst and
// returns the extended slice (n < 0 means all of them). It panics when seq
// has no table or fewer than n blocks: the caller asked for positions it
// never allocated.
func (a *Allocator) AppendTable(dst []BlockID, seq SeqID, n int) []BlockID {
	t, ok := a.tables[seq]
	if !ok {
		panic(fmt.Sprintf("kv: table of unknown sequence %d", seq))
	}
	return t.AppendBlocks(dst, n)
}

// Allocate creates seq's tables, each covering at least positions positions.
//
// When prefix caching is on, the full blocks of prefix are looked up first;
// the leading ones already cached are shared rather than allocated, and
// cached reports how many positions they cover (a multiple of BlockSize, at
// most len(prefix)). The caller starts computing at position cached. Pass
// the tokens whose K/V a hit may replace, usually every token but the last,
// whose logits are still needed.
//
// With several groups a hit must hold, besides the global blocks of the
// prefix, every sliding group's blocks of the window that position cached
// reads (from cached-Window+1 on); the longest matched prefix whose window
// is cached in every group is the hit. The new sliding tables' entries
// before that window are released, as Slide would have left them.
//
// Allocate fails with ErrOutOfBlocks, changing nothing, unless at least
// reserve blocks stay available afterwards (reserve 0 asks only for the
// blocks themselves). With several groups every table takes its own blocks,
// so a sequence needs Groups times as many.
func (a *Allocator) Allocate(seq SeqID, prefix []int32, positions, reserve int) (cached int, err error) {
	if _, ok := a.tables[seq]; ok {
		return 0, fmt.Errorf("%w: %d", ErrSequenceExists, seq)
	}
	if positions < 0 {
		positions = 0
	}
	bs, groups := a.cfg.BlockSize, a.cfg.groups()
	// Look up: the global chain first, then the windows it ends on.
	matched, from := 0, 0
	chains := a.chains[:0]
	if a.cfg.PrefixCaching {
		h := rootHash
		for i := 0; (i+1)*bs <= len(prefix); i++ {
			blk := prefix[i*bs : (i+1)*bs]
			nh := chain(h, blk)
			if _, ok := a.lookup(nh, h, 0, blk); !ok {
				break
			}
			chains = append(chains, nh)
			matched++
			h = nh
		}
		a.chains = chains
		if groups > 1 {
			// Walk down from the end: a block missing in some sliding group
			// caps the hit below it, whose window starts earlier.
			for i := matched - 1; i >= a.windowStart(matched); i-- {
				if !a.slidingCached(prefix, chains, i) {
					matched = i
				}
			}
			from = a.windowStart(matched)
		}
	}
	// Cached blocks nobody holds stop being available once taken.
	fromLRU := 0
	for i := range matched {
		if a.ref[a.index[chains[i]]] == 0 {
			fromLRU++
		}
		for g := 1; g < groups && i >= from; g++ {
			if a.ref[a.index[groupKey(chains[i], g)]] == 0 {
				fromLRU++
			}
		}
	}
	need := a.BlocksFor(max(positions, matched*bs)) - matched
	if need*groups+reserve > a.Available()-fromLRU {
		return 0, ErrOutOfBlocks
	}

	// Mutate: nothing below can fail.
	t := a.newTable(seq)
	if a.cfg.PrefixCaching {
		a.queried += uint64(len(prefix))
		a.hit += uint64(matched * bs)
		for i := range matched {
			t.blocks = append(t.blocks, a.share(chains[i]))
			for g := 1; g < groups; g++ {
				id := released
				if i >= from {
					id = a.share(groupKey(chains[i], g))
				}
				t.sliding[g-1] = append(t.sliding[g-1], id)
			}
		}
		t.first = from
		t.nhashed, t.last = matched, rootHash
		if matched > 0 {
			t.last = chains[matched-1]
		}
	}
	a.grow(t, need)
	a.tables[seq] = t
	return matched * bs, nil
}

// windowStart is the first block a sequence that starts computing after its
// first m blocks reads in a sliding layer: the one holding position
// m*BlockSize-Window+1.
func (a *Allocator) windowStart(m int) int {
	return max(0, m*a.cfg.BlockSize-a.cfg.Window+1) / a.cfg.BlockSize
}

// slidingCached reports whether every sliding group has block i of prefix
// cached; chains holds the chain hashes of the prefix's blocks up to i.
func (a *Allocator) slidingCached(prefix []int32, chains []uint64, i int) bool {
	bs := a.cfg.BlockSize
	parent := rootHash
	if i > 0 {
		parent = chains[i-1]
	}
	for g := 1; g < a.cfg.groups(); g++ {
		if _, ok := a.lookup(groupKey(chains[i], g), parent, g, prefix[i*bs:(i+1)*bs]); !ok {
			return false
		}
	}
	return true
}

// share takes one more reference to the cached block indexed under key.
func (a *Allocator) share(key uint64) BlockID {
	id := a.index[key]
	if a.ref[id] == 0 {
		a.lruRemove(id)
		a.used++
	}
	a.ref[id]++
	return id
}

// Extend grows each of seq's tables to cover at least positions positions:
// the sliding ones too, since a sliding layer writes every position even if
// it reads only a window. It fails with ErrOutOfBlocks, changing nothing,
// when the pool is short, and with ErrUnknownSequence when seq has no table.
func (a *Allocator) Extend(seq SeqID, positions int) error {
	t, ok := a.tables[seq]
	if !ok {
		return fmt.Errorf("%w: %d", ErrUnknownSequence, seq)
	}
	need := a.BlocksFor(positions) - len(t.blocks)
	if need <= 0 {
		return nil
	}
	if need*a.cfg.groups() > a.Available() {
		return ErrOutOfBlocks
	}
	a.grow(t, need)
	return nil
}

// grow appends need fresh blocks to each of t's tables, keeping them one
// length. The caller has checked that need times Groups blocks are available.
func (a *Allocator) grow(t *Table, need int) {
	for range need {
		t.blocks = append(t.blocks, a.take())
	}
	for g := range t.sliding {
		for range need {
			t.sliding[g] = append(t.sliding[g], a.take())
		}
	}
}

// Slide gives back the blocks of seq's sliding tables that no later row
// reads. lo is the lowest position any later row of seq reads in a sliding
// layer (the row's first position minus the window), so in every sliding
// table the entries below lo/BlockSize are released and the one holding lo
// is kept. The global table is never touched: global layers read every
// position. The window only moves forward: a lo below an earlier one
// releases nothing. A lo past the tables' end releases all their entries;
// those Extend appends later are live.
//
// A released block goes back to the pool: parked in the prefix cache when
// its content is committed (a later sequence whose prefix ends near it may
// hit it), freed otherwise. The shards need not hear of it: a block reaches
// a stage only in a batch dispatched after the release, and a stage runs
// batches in order (docs/sliding-window-kv.md).
//
// Slide fails with ErrUnknownSequence when seq has no table. With one group
// it does nothing.
func (a *Allocator) Slide(seq SeqID, lo int) error {
	t, ok := a.tables[seq]
	if !ok {
		return fmt.Errorf("%w: %d", ErrUnknownSequence, seq)
	}
	if len(t.sliding) == 0 {
		return nil
	}
	to := min(lo/a.cfg.BlockSize, len(t.blocks))
	if to <= t.first {
		return nil
	}
	for _, s := range t.sliding {
		for i := t.first; i < to; i++ {
			a.release(s[i], seq)
			s[i] = released
		}
	}
	t.first = to
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
		a.register(t.blocks[i], h, t.last, 0, blk)
		// A sliding entry Slide released is gone: its block may already
		// hold another sequence's positions.
		for g, sl := range t.sliding {
			if i >= t.first {
				a.register(sl[i], groupKey(h, g+1), t.last, g+1, blk)
			}
		}
		t.last = h
		t.nhashed = i + 1
	}
}

// register indexes block id under key, as group g's block of the tokens
// blk whose parent chain hash is parent, unless the key is indexed already
// or the block is.
func (a *Allocator) register(id BlockID, key, parent uint64, g int, blk []int32) {
	if _, dup := a.index[key]; dup || a.hashed[id] {
		return
	}
	a.index[key] = id
	a.hashed[id] = true
	a.hash[id] = key
	a.parent[id] = parent
	a.group[id] = uint8(g)
	copy(a.toks[int(id)*a.cfg.BlockSize:], blk)
}

// End drops seq's tables: every live entry's block loses one reference, and
// a block whose last reference goes is parked in the prefix cache (when its
// content is committed) or freed. Sliding entries Slide already released are
// not touched again. End panics when seq has no table (a double free) or a
// reference count would go negative.
func (a *Allocator) End(seq SeqID) {
	t, ok := a.tables[seq]
	if !ok {
		panic(fmt.Sprintf("kv: end of unknown sequence %d (double free?)", seq))
	}
	// Release the tail first, so that the LRU evicts a chain's leaves before
	// the prefix it shares with others.
	for i := len(t.blocks) - 1; i >= 0; i-- {
		a.release(t.blocks[i], seq)
	}
	for g, s := range t.sliding {
		for i := len(s) - 1; i >= t.first; i-- {
			a.release(s[i], seq)
		}
		t.sliding[g] = s[:0]
	}
	delete(a.tables, seq)
	t.live = false
	t.blocks = t.blocks[:0]
	t.first = 0
	t.nhashed, t.last = 0, rootHash
	a.spare = append(a.spare, t)
}

// release drops one reference to id, held by a table of seq. A block whose
// last reference goes is parked in the prefix cache (when its content is
// committed) or freed. It panics, naming both, when the count would go
// negative.
func (a *Allocator) release(id BlockID, seq SeqID) {
	if a.ref[id] <= 0 {
		panic(fmt.Sprintf("kv: double free of block %d by sequence %d (refcount %d)", id, seq, a.ref[id]))
	}
	a.ref[id]--
	if a.ref[id] > 0 {
		return
	}
	a.used--
	if a.cfg.PrefixCaching && a.hashed[id] {
		a.lruPush(id)
	} else {
		a.free = append(a.free, id)
	}
}

// newTable returns an empty Table for seq: a recycled one when there is one,
// whose slices keep their capacity so that a steady state allocates nothing.
func (a *Allocator) newTable(seq SeqID) *Table {
	var t *Table
	if n := len(a.spare); n > 0 {
		t = a.spare[n-1]
		a.spare = a.spare[:n-1]
	} else {
		t = &Table{last: rootHash}
		if g := a.cfg.groups(); g > 1 {
			t.sliding = make([][]BlockID, g-1)
		}
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

// lookup finds group g's cached block indexed under key, with parent hash
// parent and content blk.
func (a *Allocator) lookup(key, parent uint64, g int, blk []int32) (BlockID, bool) {
	id, ok := a.index[key]
	if !ok || a.parent[id] != parent || int(a.group[id]) != g {
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

// groupKey is the index key of group g's block whose chain hash is h: the
// chain hash itself for the global group, mixed with g for a sliding one
// (the same tokens, other layers' K/V).
func groupKey(h uint64, g int) uint64 {
	if g == 0 {
		return h
	}
	return mix(h ^ uint64(g)*0x9e3779b97f4a7c15)
}

// chain hashes one block's tokens onto its parent's hash.
func chain(parent uint64, blk []int32) uint64 {
	h := parent
	for _, tok := range blk {
		h ^= uint64(uint32(tok))
		h *= 0x9e3779b97f4a7c15
		h ^= h >> 29
	}
	return mix(h)
}

// mix is splitmix64's finaliser, so that nearby inputs land far apart.
func mix(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}
