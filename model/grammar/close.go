package grammar

import (
	"container/heap"
	"math"
	"unicode/utf8"
)

// Closing a document within a budget. A request's max_tokens cuts a
// constrained document wherever it falls; a user who asked for a schema
// wants a document that parses. So the matcher can say how many bytes the
// shortest completion of the output so far takes (MinClose), and how many
// it would take after a given token (CloseAfter): the last stage allows
// only tokens after which the document can still close in the tokens
// left (shard/constrain.go). A byte is at most one token (every vocabulary
// this package serves can spell each byte alone), so bytes bound tokens.
//
// The distance of a stack is the sum, over its frames, of the bytes that
// frame needs to end once the frame above it has ended: a frame below the
// top has already moved past the child it pushed (oAfter, aAfter, mAfter,
// mColon, rAfter), so its rest counts only what follows that child. Every
// node's shortest value (minLen) is a least fixed point over the graph,
// like productiveness in finish.

// inf is the distance of what cannot close (a node with no finite value);
// sums saturate at it.
const inf = math.MaxInt32 / 4

func add(a, b int) int {
	if a >= inf || b >= inf || a+b >= inf {
		return inf
	}
	return a + b
}

func mul(n, a int) int {
	if n == 0 {
		return 0
	}
	if a >= inf || n >= inf/max(a, 1) {
		return inf
	}
	return n * a
}

// closer holds a grammar's distances, computed once on first use.
type closer struct {
	minLen []int            // per node: bytes of its shortest value
	objEnd [][]int          // kObject: objEnd[b] = bytes to finish after a value, next property index b (oAfter)
	keyLen [][]int          // kObject: keyLen[j] = bytes of property j's key as written, quotes included
	depth  []int            // per trie node: bytes from its root
	tdist  []int            // per literal trie node: bytes to the nearest text's end
	pdist  map[*dfa][]int32 // per pattern: bytes from each state to an accepting one
}

func (g *Grammar) closer() *closer {
	g.closeOnce.Do(func() { g.cl = g.buildCloser() })
	return g.cl
}

func (g *Grammar) buildCloser() *closer {
	c := &closer{
		minLen: make([]int, len(g.nodes)),
		objEnd: make([][]int, len(g.nodes)),
		keyLen: make([][]int, len(g.nodes)),
		depth:  make([]int, len(g.tries)),
		tdist:  make([]int, len(g.tries)),
		pdist:  map[*dfa][]int32{},
	}
	// Trie depths (children always have larger indices than their parent,
	// as the builders append them) and distances to a text's end (so
	// computed children first).
	for t := range g.tries {
		for _, e := range g.tries[t].kids {
			c.depth[e.to] = c.depth[t] + 1
		}
	}
	for t := len(g.tries) - 1; t >= 0; t-- {
		d := inf
		if g.tries[t].term >= 0 {
			d = 0
		}
		for _, e := range g.tries[t].kids {
			d = min(d, add(c.tdist[e.to], 1))
		}
		c.tdist[t] = d
	}
	for id := range g.nodes {
		c.minLen[id] = inf
		if n := &g.nodes[id]; n.kind == kObject {
			c.objEnd[id] = make([]int, len(n.props)+1)
			c.keyLen[id] = make([]int, len(n.props))
			for j, p := range n.props {
				c.keyLen[id][j] = len(encodeJSON(nil, p.name))
			}
		}
		if p := g.nodes[id].pat; p != nil && c.pdist[p] == nil {
			c.pdist[p] = p.distances()
		}
	}
	for changed := true; changed; {
		changed = false
		for id := range g.nodes {
			if l := c.nodeLen(g, int32(id)); l < c.minLen[id] {
				c.minLen[id], changed = l, true
			}
		}
	}
	return c
}

// altLen is the shortest value of any concrete alternative of node id
// (what pushing id may push).
func (c *closer) altLen(g *Grammar, id int32) int {
	if id < 0 {
		return inf
	}
	d := inf
	for _, a := range g.nodes[id].alts {
		d = min(d, c.minLen[a])
	}
	return d
}

// nodeLen is node id's shortest value given the current minLen (one
// round of the fixed point). For an object it refreshes objEnd.
func (c *closer) nodeLen(g *Grammar, id int32) int {
	n := &g.nodes[id]
	switch n.kind {
	case kRoot:
		return add(add(c.altLen(g, n.child), len(n.pre)), len(n.suf))
	case kObject:
		c.objectEnds(g, id)
		return add(1, c.objFirst(g, id, 0))
	case kMap:
		return 2
	case kArray:
		return add(1, c.arrayRest(g, n, aFirst, n.minItems))
	case kString:
		if n.pat != nil {
			return add(2, int(c.pdist[n.pat][n.pat.start]))
		}
		return 2 + int(n.minLen)
	case kNumber, kInteger:
		return 1
	case kLiteral:
		return c.tdist[n.lit]
	case kAnyOf, kRef:
		return c.altLen(g, id)
	}
	return inf
}

// propLen is the bytes of property j of object id written whole: key,
// colon, value.
func (c *closer) propLen(g *Grammar, id, j int32) int {
	return add(c.keyLen[id][j]+1, c.altLen(g, g.nodes[id].props[j].node))
}

// objectEnds fills objEnd for object id from its last property back:
// after a value with next index b, either '}' (when no required property
// is left) or ',' and a property j in [b, the first required one].
func (c *closer) objectEnds(g *Grammar, id int32) {
	n := &g.nodes[id]
	np := int32(len(n.props))
	end := c.objEnd[id]
	end[np] = 1
	for b := np - 1; b >= 0; b-- {
		end[b] = c.objNext(g, id, b, 1)
	}
}

// objNext is the bytes to finish object id from index b: '}' when no
// required property is left, or sep bytes (a comma after a value, none
// right after '{') and a property j in [b, the first required one].
func (c *closer) objNext(g *Grammar, id, b int32, sep int) int {
	n := &g.nodes[id]
	np := int32(len(n.props))
	d := inf
	if n.firstReq[b] == np {
		d = 1
	}
	for j := b; j <= min(n.firstReq[b], np-1); j++ {
		d = min(d, add(add(sep, c.propLen(g, id, j)), c.objEnd[id][j+1]))
	}
	return d
}

// objFirst is the bytes to finish object id right after '{'.
func (c *closer) objFirst(g *Grammar, id, b int32) int {
	return c.objNext(g, id, b, 0)
}

// objComma is objFirst after a comma: a property must come.
func (c *closer) objComma(g *Grammar, id, b int32) int {
	n := &g.nodes[id]
	np := int32(len(n.props))
	d := inf
	for j := b; j <= min(n.firstReq[b], np-1); j++ {
		d = min(d, add(c.propLen(g, id, j), c.objEnd[id][j+1]))
	}
	return d
}

// arrayRest is the bytes to finish an array in position st with req items
// still required.
func (c *closer) arrayRest(g *Grammar, n *node, st uint8, req int32) int {
	item := c.altLen(g, n.child)
	k := int(req)
	switch st {
	case aFirst:
		if k == 0 {
			return 1
		}
		return add(add(mul(k, item), k-1), 1)
	case aAfter:
		return add(mul(k, add(item, 1)), 1)
	case aComma:
		k = max(k, 1)
		return add(add(mul(k, item), k-1), 1)
	}
	return inf
}

// strRest is the bytes the partial character of a string in state st
// still takes (escape or UTF-8 continuation bytes).
func strRest(st uint8) int {
	switch st {
	case sEsc, sC1, sU4:
		return 1
	case sC2, sC2E0, sC2ED, sU3:
		return 2
	case sC3, sC3F0, sC3F4, sU2, sU2D:
		return 3
	case sU1:
		return 4
	}
	return 0
}

// rest is the bytes frame f needs to end, the frames above it ended.
func (c *closer) rest(g *Grammar, f *frame) int {
	n := &g.nodes[f.node]
	switch n.kind {
	case kRoot:
		switch f.st {
		case rPrefix:
			return add(add(len(n.pre)-int(f.a), c.altLen(g, n.child)), len(n.suf))
		case rBefore:
			return add(c.altLen(g, n.child), len(n.suf))
		case rAfter:
			return len(n.suf)
		case rSuffix:
			return len(n.suf) - int(f.a)
		case rSep:
			return add(add(len(n.sep)-int(f.a)+len(n.pre), c.altLen(g, n.child)), len(n.suf))
		}
		return 0
	case kObject:
		switch f.st {
		case oOpen:
			return c.minLen[f.node]
		case oFirst:
			return c.objFirst(g, f.node, f.b)
		case oComma:
			return c.objComma(g, f.node, f.b)
		case oAfter:
			return c.objEnd[f.node][f.b]
		case oColon:
			return add(add(1, c.altLen(g, n.props[f.b].node)), c.objEnd[f.node][f.b+1])
		case oValue:
			return add(c.altLen(g, n.props[f.b].node), c.objEnd[f.node][f.b+1])
		case oKey:
			// The keys below this trie node that may still come.
			np := int32(len(n.props))
			hi := min(n.firstReq[f.b], np-1)
			d := inf
			for _, j := range g.tries[f.a].idx {
				if j < f.b || j > hi {
					continue
				}
				key := c.keyLen[f.node][j] - c.depth[f.a]
				d = min(d, add(add(key+1, c.altLen(g, n.props[j].node)), c.objEnd[f.node][j+1]))
			}
			return d
		}
	case kMap:
		v := c.altLen(g, n.child)
		switch f.st {
		case mOpen:
			return 2
		case mFirst, mAfter:
			return 1
		case mColon:
			return add(add(1, v), 1)
		case mValue:
			return add(v, 1)
		case mComma:
			return add(add(3, v), 1)
		}
	case kArray:
		if f.st == aOpen {
			return c.minLen[f.node]
		}
		return c.arrayRest(g, n, f.st, f.a)
	case kString:
		if n.pat != nil {
			return c.patternRest(n.pat, f)
		}
		if f.st == sOpen {
			return c.minLen[f.node]
		}
		return add(add(strRest(f.st), int(f.a)), 1)
	case kNumber, kInteger:
		switch f.st {
		case nZero, nInt, nFrac, nExp:
			return 0
		}
		return 1
	case kLiteral:
		return c.tdist[f.a]
	}
	return inf
}

// patternRest is rest for a string with a pattern: the partial character
// (escape or UTF-8) narrows the code points it can still become, and the
// nearest state one of them leads to decides.
func (c *closer) patternRest(d *dfa, f *frame) int {
	pd := c.pdist[d]
	near := func(lo, hi rune) int { // the nearest state a rune in [lo, hi] leads to
		best := inf
		for _, t := range d.trans[f.c] {
			a, b := max(lo, t.lo), min(hi, t.hi)
			if a > b || (a >= 0xD800 && b <= 0xDFFF) {
				continue
			}
			best = min(best, int(pd[t.to]))
		}
		return best
	}
	var k int       // bytes of the character still to come
	var lo, hi rune // the code points it can still be
	switch f.st {
	case sOpen:
		return add(2, int(pd[d.start]))
	case sBody:
		return add(int(pd[f.c]), 1)
	case sEsc:
		best := add(5, near(0, 0xFFFF)) // \uXXXX
		for _, e := range escRunes {
			if s := d.next(f.c, e.r); s >= 0 {
				best = min(best, add(1, int(pd[s])))
			}
		}
		return add(best, 1)
	case sU1, sU2, sU3, sU4:
		k = 4 - int(f.st-sU1)
		lo = rune(f.a) << (4 * k)
		hi = lo | (1<<(4*k) - 1)
	default:
		k = strRest(f.st)
		lo = rune(f.a) << (6 * k)
		hi = lo | (1<<(6*k) - 1)
		switch f.st {
		case sC2E0:
			lo, hi = 0x800, 0xFFF
		case sC3F0:
			lo, hi = 0x10000, 0x3FFFF
		case sC2ED:
			hi = min(hi, 0xD7FF)
		case sC3F4:
			hi = min(hi, 0x10FFFF)
		}
	}
	return add(add(k, near(lo, hi)), 1)
}

// stackClose is the bytes stack s needs to become a whole document.
func (c *closer) stackClose(g *Grammar, s []frame) int {
	d := 0
	for i := range s {
		d = add(d, c.rest(g, &s[i]))
	}
	return d
}

func (c *closer) configClose(g *Grammar, cf *config) int {
	d := inf
	for i := range cf.len() {
		d = min(d, c.stackClose(g, cf.stack(i)))
	}
	return d
}

// MinLen returns the number of bytes in the grammar's shortest document.
func (g *Grammar) MinLen() int {
	return g.closer().minLen[g.root]
}

// MinClose returns the number of bytes in the shortest text that would
// make the output so far a whole document: 0 when it is one (or has
// ended). Since every byte can be a token of its own, a document with
// MinClose() <= n can always be finished in n tokens.
func (m *Matcher) MinClose() int {
	if m.done {
		return 0
	}
	return m.g.closer().configClose(m.g, &m.cur)
}

// CloseAfter returns MinClose as it would be after token id, and false
// when the grammar does not allow id. It leaves m as it was.
func (m *Matcher) CloseAfter(id int32) (int, bool) {
	if m.done || id < 0 || int(id) >= m.v.size {
		return 0, false
	}
	if m.v.isEOG(id) {
		return 0, m.Accepting()
	}
	b := m.v.bytes(id)
	if len(b) == 0 {
		return 0, false
	}
	a, z := &m.chk[0], &m.chk[1]
	a.copyFrom(&m.cur)
	for _, ch := range b {
		m.g.stepConfig(a, ch, z, &m.scratch, maxStacks)
		a, z = z, a
		if a.len() == 0 {
			return 0, false
		}
	}
	return m.g.closer().configClose(m.g, a), true
}

// FitMask cuts mask (as Mask returned it) to tokens after which the
// document can still close within left-1 bytes, so that it closes within
// left tokens counting the next: those of cands (the tokens the caller
// would rather draw: the likeliest) that fit, and every token that spells
// a prefix of a shortest completion (which always fit: with MinClose() <=
// left, at least one does, as long as the vocabulary spells each byte).
// It returns the tokens kept. Its cost is a CloseAfter per candidate and
// a short search for the completion: cheap enough to run on the steps
// where a draw does not fit, not a check of every allowed token.
func (m *Matcher) FitMask(mask []uint64, left int, cands []int32) int {
	fits := func(id int32) bool {
		if id < 0 || int(id) >= m.v.size || mask[id>>6]&(1<<(id&63)) == 0 {
			return false
		}
		d, ok := m.CloseAfter(id)
		return ok && d <= left-1
	}
	keep := m.fit[:0]
	for _, id := range cands {
		if fits(id) {
			keep = append(keep, id)
		}
	}
	if m.Accepting() {
		for _, id := range m.v.eog {
			if fits(id) {
				keep = append(keep, id)
			}
		}
	}
	// The tokens along a shortest completion: walk the vocabulary's trie
	// (preorder; node i's children lie in (i, end[i])) down its bytes.
	v := m.v
	at := int32(0)
	for _, c := range m.shortest(v.maxDepth) {
		next := int32(-1)
		for k := at + 1; k < v.end[at]; k = v.end[k] {
			if v.byt[k] == c {
				next = k
				break
			}
		}
		if next < 0 {
			break
		}
		at = next
		for _, id := range v.ids[v.tokStart[at]:v.tokStart[at+1]] {
			if fits(id) {
				keep = append(keep, id)
			}
		}
	}
	m.fit = keep
	clear(mask)
	n := 0
	for _, id := range keep {
		if w, b := id>>6, uint64(1)<<(id&63); mask[w]&b == 0 {
			mask[w] |= b
			n++
		}
	}
	return n
}

// shortest returns the first n bytes (or fewer) of a shortest completion
// of the output so far, byte by byte: each the first, printable ASCII and
// newline before the rest, that brings MinClose down by one.
func (m *Matcher) shortest(n int) []byte {
	cl := m.g.closer()
	a, z := &m.chk[0], &m.chk[1]
	a.copyFrom(&m.cur)
	d := cl.configClose(m.g, a)
	out := m.path[:0]
	for len(out) < n && d > 0 && d < inf {
		found := false
		for _, c := range byteOrder {
			m.g.stepConfig(a, c, z, &m.scratch, maxStacks)
			if z.len() > 0 && cl.configClose(m.g, z) == d-1 {
				a, z = z, a
				out = append(out, c)
				d--
				found = true
				break
			}
		}
		if !found {
			break
		}
	}
	m.path = out
	return out
}

// byteOrder is the order shortest tries bytes in.
var byteOrder = func() (o [256]byte) {
	i := 0
	o[i] = '\n'
	i++
	for c := 0x20; c < 0x7F; c++ {
		o[i] = byte(c)
		i++
	}
	for c := range 256 {
		if c != '\n' && (c < 0x20 || c >= 0x7F) {
			o[i] = byte(c)
			i++
		}
	}
	return o
}()

// distances returns, per state of d, the bytes of the shortest string
// body (as JSON writes it) that takes the state to an accepting one:
// Dijkstra over the transitions, each weighing the shortest encoding of
// any character in its range.
func (d *dfa) distances() []int32 {
	n := len(d.trans)
	dist := make([]int32, n)
	for i := range dist {
		dist[i] = inf
	}
	// Reverse edges.
	type redge struct {
		from int32
		w    int32
	}
	rev := make([][]redge, n)
	for s, ts := range d.trans {
		for _, t := range ts {
			if w := runeRangeCost(t.lo, t.hi); w < inf {
				rev[t.to] = append(rev[t.to], redge{int32(s), int32(w)})
			}
		}
	}
	h := &distHeap{}
	for s, acc := range d.accept {
		if acc {
			dist[s] = 0
			heap.Push(h, distItem{int32(s), 0})
		}
	}
	for h.Len() > 0 {
		it := heap.Pop(h).(distItem)
		if it.d > dist[it.s] {
			continue
		}
		for _, e := range rev[it.s] {
			if nd := it.d + e.w; nd < dist[e.from] {
				dist[e.from] = nd
				heap.Push(h, distItem{e.from, nd})
			}
		}
	}
	return dist
}

type distItem struct {
	s, d int32
}

type distHeap []distItem

func (h distHeap) Len() int           { return len(h) }
func (h distHeap) Less(i, j int) bool { return h[i].d < h[j].d }
func (h distHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *distHeap) Push(x any)        { *h = append(*h, x.(distItem)) }
func (h *distHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// runeCost is the bytes JSON needs for r inside a string: two for the
// one-letter escapes, six for \u escapes of other control characters, its
// UTF-8 length otherwise.
func runeCost(r rune) int {
	switch {
	case r == '"' || r == '\\' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20:
		return 6
	case r >= 0xD800 && r <= 0xDFFF:
		return inf
	}
	return utf8.RuneLen(r)
}

// runeRangeCost is the least runeCost in [lo, hi]: the cost is smallest
// at the low end of each UTF-8 length class, so those points (and their
// neighbours, past '"' and '\\') are enough.
func runeRangeCost(lo, hi rune) int {
	best := inf
	for _, r := range [...]rune{lo, lo + 1, lo + 2, 0x20, 0x23, 0x5D, 0x80, 0x800, 0xE000, 0x10000} {
		if r >= lo && r <= hi {
			best = min(best, runeCost(r))
		}
	}
	return best
}
