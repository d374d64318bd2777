package grammar

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
)

// window is how many frames from the top of a stack key the mask cache.
// Tokens whose bytes would complete all of them and go on ("uncertain"
// tokens, such as `"}]}` when the top three frames are a string, an
// object and an array) are checked against the whole stack at each step.
const window = 3

// maxCacheWords bounds one grammar's mask cache for one vocabulary, in
// 64-bit words (32 MiB); past it the cache is emptied and refills.
const maxCacheWords = 4 << 20

// wkey is the top window frames of a stack, bottom first, normalized.
type wkey struct {
	n int8
	f [window]frame
}

// maskEntry is what a window allows: the tokens allowed whatever lies
// below it (dense bits or sorted ids), and the uncertain tokens.
type maskEntry struct {
	dense []uint64
	ids   []int32
	unc   []int32
}

func (e *maskEntry) words() int { return len(e.dense) + (len(e.ids)+len(e.unc)+1)/2 }

type maskCache struct {
	mu    sync.Mutex
	m     map[wkey]*maskEntry
	words int
}

func (c *maskCache) get(k wkey) *maskEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[k]
}

func (c *maskCache) put(k wkey, e *maskEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.words+e.words() > maxCacheWords {
		clear(c.m)
		c.words = 0
	}
	if _, ok := c.m[k]; !ok {
		c.m[k] = e
		c.words += e.words()
	}
}

// cacheFor returns the grammar's mask cache for v.
func (g *Grammar) cacheFor(v *Vocab) *maskCache {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.masks == nil {
		g.masks = map[*Vocab]*maskCache{}
	}
	c := g.masks[v]
	if c == nil {
		c = &maskCache{m: map[wkey]*maskEntry{}}
		g.masks[v] = c
	}
	return c
}

// norm returns f as a cache key: a count of items or characters still
// required or allowed only matters up to the longest token, since one
// token cannot start more items or characters than it has bytes.
func (g *Grammar) norm(f frame, cap int32) frame {
	n := &g.nodes[f.node]
	if n.kind == kArray || (n.kind == kString && n.pat == nil) {
		f.a = min(f.a, cap)
		if f.b >= cap {
			f.b = -1
		}
	}
	return f
}

func (g *Grammar) key(s []frame, v *Vocab) wkey {
	var k wkey
	lo := max(0, len(s)-window)
	k.n = int8(len(s) - lo)
	for i, f := range s[lo:] {
		k.f[i] = g.norm(f, v.cap)
	}
	return k
}

// walker is the scratch space of a trie walk.
type walker struct {
	cfg     []config
	unc     []bool
	scratch []frame
	bits    []uint64
}

// walk computes what window win allows, by a depth-first walk of the
// vocabulary trie that steps the window's stacks one byte per trie edge
// and skips every subtree where none is alive.
func (g *Grammar) walk(v *Vocab, win []frame, w *walker) *maskEntry {
	if len(w.cfg) < v.maxDepth+1 {
		w.cfg = make([]config, v.maxDepth+1)
		w.unc = make([]bool, v.maxDepth+1)
	}
	nw := v.MaskWords()
	if len(w.bits) != nw {
		w.bits = make([]uint64, nw)
	}
	clear(w.bits)
	w.cfg[0].reset()
	w.cfg[0].push(win)
	w.unc[0] = false
	e := &maskEntry{}
	count := 0
	for i := int32(1); i < int32(len(v.byt)); {
		d := v.depth[i]
		cfg := &w.cfg[d]
		consumed, refeed := g.stepConfig(&w.cfg[d-1], v.byt[i], cfg, &w.scratch, maxStacks)
		alive := cfg.len() > 0
		w.unc[d] = w.unc[d-1] || consumed || refeed
		own := v.ids[v.tokStart[i]:v.tokStart[i+1]]
		switch {
		case alive || consumed:
			for _, id := range own {
				w.bits[id>>6] |= 1 << (id & 63)
			}
			count += len(own)
		case refeed || w.unc[d-1]:
			e.unc = append(e.unc, own...)
		}
		if !alive {
			if w.unc[d] {
				e.unc = append(e.unc, v.ids[v.tokStart[i+1]:v.tokStart[v.end[i]]]...)
			}
			i = v.end[i]
			continue
		}
		i++
	}
	// Keep whichever of bits and ids is smaller.
	if count*2 < nw {
		e.ids = make([]int32, 0, count)
		for wi, word := range w.bits {
			for word != 0 {
				b := bits.TrailingZeros64(word)
				e.ids = append(e.ids, int32(wi*64+b))
				word &= word - 1
			}
		}
	} else {
		e.dense = append([]uint64(nil), w.bits...)
	}
	return e
}

// ErrRejected is returned by Advance for a token the grammar does not
// allow where it comes.
var ErrRejected = errors.New("grammar: token not allowed")

// ErrDone is returned by Advance after an end-of-generation token.
var ErrDone = errors.New("grammar: document already ended")

// Matcher follows one sequence's output through a grammar. It is not safe
// for concurrent use; use one per sequence. What it allows depends only on
// the grammar, the vocabulary and the tokens advanced so far.
type Matcher struct {
	g    *Grammar
	v    *Vocab
	mc   *maskCache
	cur  config
	tmp  config
	done bool
	n    int // tokens advanced

	w       walker
	chk     [2]config
	scratch []frame
	part    []uint64 // one stack's mask, when there are several
	fit     []int32  // FitMask's tokens kept
	path    []byte   // FitMask's shortest completion
}

// NewMatcher returns a matcher at the start of a document, for tokens of
// v.
func (g *Grammar) NewMatcher(v *Vocab) *Matcher {
	m := &Matcher{g: g, v: v, mc: g.cacheFor(v)}
	m.Reset()
	return m
}

// Reset returns m to the start of a document.
func (m *Matcher) Reset() {
	m.cur.reset()
	m.cur.push([]frame{m.g.initFrame(m.g.root)})
	m.done, m.n = false, 0
}

// Clone returns an independent copy of m in the same state.
func (m *Matcher) Clone() *Matcher {
	c := &Matcher{g: m.g, v: m.v, mc: m.mc, done: m.done, n: m.n}
	c.cur.copyFrom(&m.cur)
	return c
}

// Accepting reports whether the output so far is a whole document: the
// end-of-generation tokens are allowed exactly then.
func (m *Matcher) Accepting() bool {
	if m.done {
		return false
	}
	for i := range m.cur.len() {
		if m.g.accepting(m.cur.stack(i)) {
			return true
		}
	}
	return false
}

// Done reports whether an end-of-generation token has been advanced.
func (m *Matcher) Done() bool { return m.done }

// Advance moves m past token id. A token the mask does not allow returns
// an error wrapping ErrRejected and leaves m as it was.
func (m *Matcher) Advance(id int32) error {
	if m.done {
		return ErrDone
	}
	if id < 0 || int(id) >= m.v.size {
		return fmt.Errorf("%w: token %d is outside the vocabulary of %d", ErrRejected, id, m.v.size)
	}
	if m.v.isEOG(id) {
		if !m.Accepting() {
			return fmt.Errorf("%w: end-of-generation token %d after %d tokens, before the document is whole", ErrRejected, id, m.n)
		}
		m.done = true
		m.n++
		return nil
	}
	b := m.v.bytes(id)
	if len(b) == 0 {
		return fmt.Errorf("%w: token %d has no text", ErrRejected, id)
	}
	m.tmp.copyFrom(&m.cur)
	for i, c := range b {
		m.g.stepConfig(&m.tmp, c, &m.chk[0], &m.scratch, maxStacks)
		m.tmp, m.chk[0] = m.chk[0], m.tmp
		if m.tmp.len() == 0 {
			return fmt.Errorf("%w: token %d (%q) at byte %d, after %d tokens", ErrRejected, id, b, i, m.n)
		}
	}
	m.cur, m.tmp = m.tmp, m.cur
	m.n++
	return nil
}

// Allows reports whether token id may come next.
func (m *Matcher) Allows(id int32) bool {
	if m.done || id < 0 || int(id) >= m.v.size {
		return false
	}
	if m.v.isEOG(id) {
		return m.Accepting()
	}
	b := m.v.bytes(id)
	if len(b) == 0 {
		return false
	}
	for i := range m.cur.len() {
		if m.stackAllows(m.cur.stack(i), b) {
			return true
		}
	}
	return false
}

// stackAllows reports whether stack s survives bytes b.
func (m *Matcher) stackAllows(s []frame, b []byte) bool {
	// A byte pops at most two frames (a number or literal, then the
	// container that the byte closes), so the frames below the top
	// 2·len(b)+1 are never reached: copy only those.
	if k := 2*len(b) + 1; len(s) > k {
		s = s[len(s)-k:]
	}
	a, z := &m.chk[0], &m.chk[1]
	a.reset()
	a.push(s)
	for _, c := range b {
		m.g.stepConfig(a, c, z, &m.scratch, maxStacks)
		if z.len() == 0 {
			return false
		}
		a, z = z, a
	}
	return true
}

// Mask writes the set of tokens that may come next into dst, one bit per
// token ID (bit id&63 of word id>>6), and returns it; dst is grown to
// v.MaskWords() words when short. After Done, no token is allowed.
func (m *Matcher) Mask(dst []uint64) []uint64 {
	nw := m.v.MaskWords()
	if cap(dst) < nw {
		dst = make([]uint64, nw)
	}
	dst = dst[:nw]
	clear(dst)
	if m.done {
		return dst
	}
	for i := range m.cur.len() {
		s := m.cur.stack(i)
		out := dst
		if i > 0 {
			if len(m.part) != nw {
				m.part = make([]uint64, nw)
			}
			out = m.part
			clear(out)
		}
		k := m.g.key(s, m.v)
		// A string with a bound on its characters, between characters:
		// its window is the unbounded one, less the tokens that add more
		// characters than it allows (exact: see Vocab.strChars).
		room := int32(-1)
		if top := &k.f[k.n-1]; top.st == sBody && top.b >= 0 {
			if n := &m.g.nodes[top.node]; n.kind == kString && n.pat == nil {
				room, top.b = top.b, -1
			}
		}
		e := m.mc.get(k)
		if e == nil {
			e = m.g.walk(m.v, k.f[:k.n], &m.w)
			m.mc.put(k, e)
		}
		if e.dense != nil {
			copy(out, e.dense)
		} else {
			for _, id := range e.ids {
				out[id>>6] |= 1 << (id & 63)
			}
		}
		if room >= 0 {
			for _, id := range m.v.longStr {
				if m.v.strChars[id] <= room {
					break
				}
				out[id>>6] &^= 1 << (id & 63)
			}
		}
		for _, id := range e.unc {
			if out[id>>6]&(1<<(id&63)) == 0 && m.stackAllows(s, m.v.bytes(id)) {
				out[id>>6] |= 1 << (id & 63)
			}
		}
		if i > 0 {
			for j, w := range out {
				dst[j] |= w
			}
		}
	}
	if m.Accepting() {
		for _, id := range m.v.eog {
			dst[id>>6] |= 1 << (id & 63)
		}
	}
	return dst
}

// Match reports whether doc is a whole document of the grammar.
func (g *Grammar) Match(doc []byte) bool {
	var a, z config
	var scratch []frame
	a.push([]frame{g.initFrame(g.root)})
	for _, c := range doc {
		g.stepConfig(&a, c, &z, &scratch, maxStacks)
		if z.len() == 0 {
			return false
		}
		a, z = z, a
	}
	for i := range a.len() {
		if g.accepting(a.stack(i)) {
			return true
		}
	}
	return false
}

// MatchPrefix reports whether doc is the start of some document of the
// grammar (a whole one included): what output cut at max_tokens is.
func (g *Grammar) MatchPrefix(doc []byte) bool {
	var a, z config
	var scratch []frame
	a.push([]frame{g.initFrame(g.root)})
	for _, c := range doc {
		g.stepConfig(&a, c, &z, &scratch, maxStacks)
		if z.len() == 0 {
			return false
		}
		a, z = z, a
	}
	return true
}
