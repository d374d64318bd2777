package grammar

import (
	"errors"
	"fmt"
	"regexp/syntax"
	"slices"
	"sort"
	"unicode"
)

// maxPatternStates bounds the deterministic automaton a pattern becomes.
const maxPatternStates = 512

// dfa is a pattern's deterministic automaton over Unicode code points.
// Every state can reach an accepting one (dead states are removed), so a
// string that keeps a live state can always be completed.
type dfa struct {
	trans  [][]rtrans // per state, sorted by lo, disjoint; only to live states
	accept []bool
	start  int32
}

type rtrans struct {
	lo, hi rune
	to     int32
}

// next returns the state after rune r, or -1.
func (d *dfa) next(s int32, r rune) int32 {
	ts := d.trans[s]
	i := sort.Search(len(ts), func(i int) bool { return ts[i].hi >= r })
	if i < len(ts) && ts[i].lo <= r {
		return ts[i].to
	}
	return -1
}

// liveIn reports whether some rune in [lo, hi], surrogates excluded, leads
// from s to a live state.
func (d *dfa) liveIn(s int32, lo, hi rune) bool {
	if lo >= 0xD800 && hi <= 0xDFFF {
		return false
	}
	for _, t := range d.trans[s] {
		if t.hi < lo || t.lo > hi {
			continue
		}
		// Overlap [max(lo, t.lo), min(hi, t.hi)]; it is all surrogates only
		// when it lies inside D800-DFFF.
		a, b := max(lo, t.lo), min(hi, t.hi)
		if a >= 0xD800 && b <= 0xDFFF {
			continue
		}
		return true
	}
	return false
}

// escRunes are the characters the one-letter escapes stand for.
var escRunes = [...]struct {
	c byte
	r rune
}{{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', '\b'}, {'f', '\f'}, {'n', '\n'}, {'r', '\r'}, {'t', '\t'}}

func escRune(c byte) (rune, bool) {
	for _, e := range escRunes {
		if e.c == c {
			return e.r, true
		}
	}
	return 0, false
}

// stepPattern is stepString for a string with a pattern: every character,
// decoded from UTF-8 or from an escape, moves the pattern's automaton, and
// a partial character is allowed only if some completion of it does.
// f.a holds the partial character's bits, f.c the automaton's state.
func stepPattern(d *dfa, f *frame, c byte) int {
	switch f.st {
	case sOpen:
		if c == '"' {
			f.st, f.c = sBody, d.start
			return actStay
		}
	case sBody:
		switch {
		case c == '"':
			if d.accept[f.c] {
				return actPop
			}
		case c < 0x20:
		case c == '\\':
			for _, e := range escRunes {
				if d.next(f.c, e.r) >= 0 {
					f.st = sEsc
					return actStay
				}
			}
			if d.liveIn(f.c, 0, 0xFFFF) {
				f.st = sEsc
				return actStay
			}
		case c < 0x80:
			if s := d.next(f.c, rune(c)); s >= 0 {
				f.c = s
				return actStay
			}
		default:
			st := utf8Lead(c)
			var lo, hi rune
			var bits int32
			switch st {
			case 0:
				return actDead
			case sC1:
				bits = int32(c & 0x1F)
				lo, hi = rune(bits)<<6, rune(bits)<<6|0x3F
			case sC2E0:
				lo, hi = 0x800, 0xFFF
			case sC2, sC2ED:
				bits = int32(c & 0x0F)
				lo, hi = rune(bits)<<12, rune(bits)<<12|0xFFF
			case sC3F0:
				lo, hi = 0x10000, 0x3FFFF
			case sC3, sC3F4:
				bits = int32(c & 0x07)
				lo, hi = rune(bits)<<18, min(rune(bits)<<18|0x3FFFF, unicode.MaxRune)
			}
			if d.liveIn(f.c, lo, hi) {
				f.st, f.a = st, bits
				return actStay
			}
		}
	case sEsc:
		if r, ok := escRune(c); ok {
			if s := d.next(f.c, r); s >= 0 {
				f.st, f.c = sBody, s
				return actStay
			}
			return actDead
		}
		if c == 'u' && d.liveIn(f.c, 0, 0xFFFF) {
			f.st, f.a = sU1, 0
			return actStay
		}
	case sU1, sU2, sU3, sU4:
		if !isHex(c) {
			return actDead
		}
		v := f.a<<4 | hexVal(c)
		left := 3 - int(f.st-sU1) // hex digits after this one
		if left == 0 {
			if v >= 0xD800 && v <= 0xDFFF {
				return actDead
			}
			if s := d.next(f.c, rune(v)); s >= 0 {
				f.st, f.c = sBody, s
				return actStay
			}
			return actDead
		}
		lo := rune(v) << (4 * left)
		if d.liveIn(f.c, lo, lo|(1<<(4*left)-1)) {
			f.st, f.a = f.st+1, v
			return actStay
		}
	default:
		st, ok := utf8Cont(f.st, c)
		if !ok {
			return actDead
		}
		v := f.a<<6 | int32(c&0x3F)
		if st == sBody {
			if s := d.next(f.c, rune(v)); s >= 0 {
				f.st, f.c = sBody, s
				return actStay
			}
			return actDead
		}
		left := 1 // continuation bytes after this one
		if st == sC2 {
			left = 2
		}
		lo := rune(v) << (6 * left)
		if d.liveIn(f.c, lo, min(lo|(1<<(6*left)-1), unicode.MaxRune)) {
			f.st, f.a = st, v
			return actStay
		}
	}
	return actDead
}

// errPattern explains why a pattern is refused.
type errPattern struct{ msg string }

func (e *errPattern) Error() string { return e.msg }

// compilePattern turns an ECMA-262-style pattern, read with Go's RE2
// syntax, into a DFA. The pattern is not anchored (JSON Schema semantics):
// it must match somewhere in the string, unless ^ and $ anchor it.
func compilePattern(pat string) (*dfa, error) {
	re, err := syntax.Parse(pat, syntax.Perl)
	if err != nil {
		var se *syntax.Error
		if errors.As(err, &se) {
			return nil, &errPattern{fmt.Sprintf("pattern %q: %s %q (lookaround, backreferences and possessive forms are not supported)", pat, se.Code, se.Expr)}
		}
		return nil, &errPattern{fmt.Sprintf("pattern %q: %v", pat, err)}
	}
	re = re.Simplify()
	var b nfaBuilder
	// .* before and after: the pattern may match anywhere.
	anyStar := &syntax.Regexp{Op: syntax.OpStar, Sub: []*syntax.Regexp{{Op: syntax.OpAnyChar}}}
	whole := &syntax.Regexp{Op: syntax.OpConcat, Sub: []*syntax.Regexp{anyStar, re, anyStar}}
	start, err := b.build(whole, b.add(nfaState{op: nMatch}))
	if err != nil {
		return nil, &errPattern{fmt.Sprintf("pattern %q: %v", pat, err)}
	}
	d, err := b.determinize(start)
	if err != nil {
		return nil, &errPattern{fmt.Sprintf("pattern %q: %v", pat, err)}
	}
	if d == nil {
		return nil, &errPattern{fmt.Sprintf("pattern %q matches no string", pat)}
	}
	return d, nil
}

// NFA states.
const (
	nRunes = iota // ranges → out
	nSplit        // ε → out, ε → out2
	nEps          // ε → out
	nBegin        // at the start of the text → out
	nEnd          // at the end of the text → out
	nMatch
)

type nfaState struct {
	op     int
	ranges []rune // pairs lo, hi
	out    int32
	out2   int32
}

type nfaBuilder struct {
	states []nfaState
}

func (b *nfaBuilder) add(s nfaState) int32 {
	b.states = append(b.states, s)
	return int32(len(b.states) - 1)
}

// maxNFAStates bounds the NFA a pattern may expand to (x{1000} repeats).
const maxNFAStates = 1 << 14

// build returns the entry state of re, followed by next.
func (b *nfaBuilder) build(re *syntax.Regexp, next int32) (int32, error) {
	if len(b.states) > maxNFAStates {
		return 0, errors.New("too large")
	}
	switch re.Op {
	case syntax.OpNoMatch:
		return b.add(nfaState{op: nRunes, out: next}), nil // no ranges: matches nothing
	case syntax.OpEmptyMatch:
		return next, nil
	case syntax.OpLiteral:
		for i := len(re.Rune) - 1; i >= 0; i-- {
			r := re.Rune[i]
			rs := []rune{r, r}
			if re.Flags&syntax.FoldCase != 0 {
				rs = foldRanges(r)
			}
			next = b.add(nfaState{op: nRunes, ranges: rs, out: next})
		}
		return next, nil
	case syntax.OpCharClass:
		return b.add(nfaState{op: nRunes, ranges: slices.Clone(re.Rune), out: next}), nil
	case syntax.OpAnyCharNotNL:
		// ECMA-262's '.' excludes every line terminator.
		return b.add(nfaState{op: nRunes, ranges: []rune{0, '\n' - 1, '\n' + 1, '\r' - 1, '\r' + 1, 0x2027, 0x202A, unicode.MaxRune}, out: next}), nil
	case syntax.OpAnyChar:
		return b.add(nfaState{op: nRunes, ranges: []rune{0, unicode.MaxRune}, out: next}), nil
	case syntax.OpBeginText:
		return b.add(nfaState{op: nBegin, out: next}), nil
	case syntax.OpEndText:
		return b.add(nfaState{op: nEnd, out: next}), nil
	case syntax.OpBeginLine, syntax.OpEndLine:
		return 0, errors.New("multi-line anchors are not supported")
	case syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return 0, errors.New(`\b and \B are not supported`)
	case syntax.OpCapture:
		return b.build(re.Sub[0], next)
	case syntax.OpConcat:
		var err error
		for i := len(re.Sub) - 1; i >= 0; i-- {
			if next, err = b.build(re.Sub[i], next); err != nil {
				return 0, err
			}
		}
		return next, nil
	case syntax.OpAlternate:
		entry := int32(-1)
		for i := len(re.Sub) - 1; i >= 0; i-- {
			e, err := b.build(re.Sub[i], next)
			if err != nil {
				return 0, err
			}
			if entry < 0 {
				entry = e
			} else {
				entry = b.add(nfaState{op: nSplit, out: e, out2: entry})
			}
		}
		return entry, nil
	case syntax.OpStar, syntax.OpPlus:
		split := b.add(nfaState{op: nSplit, out2: next})
		body, err := b.build(re.Sub[0], split)
		if err != nil {
			return 0, err
		}
		b.states[split].out = body
		if re.Op == syntax.OpPlus {
			return body, nil
		}
		return split, nil
	case syntax.OpQuest:
		body, err := b.build(re.Sub[0], next)
		if err != nil {
			return 0, err
		}
		return b.add(nfaState{op: nSplit, out: body, out2: next}), nil
	}
	return 0, fmt.Errorf("%v is not supported", re)
}

// foldRanges returns the ranges of r's case-folding orbit.
func foldRanges(r rune) []rune {
	rs := []rune{r, r}
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		rs = append(rs, f, f)
	}
	return rs
}

// closure returns the sorted set of NFA states reachable from set by ε
// moves, passing begin-of-text assertions only when atStart (dropping them
// otherwise: they can never hold later) and end-of-text ones only when
// atEnd (keeping them otherwise, for the acceptance test).
func (b *nfaBuilder) closure(set []int32, atStart, atEnd bool) []int32 {
	seen := map[int32]bool{}
	stack := slices.Clone(set)
	var out []int32
	for len(stack) > 0 {
		s := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[s] {
			continue
		}
		seen[s] = true
		st := &b.states[s]
		switch st.op {
		case nSplit:
			stack = append(stack, st.out, st.out2)
		case nEps:
			stack = append(stack, st.out)
		case nBegin:
			if atStart {
				stack = append(stack, st.out)
			}
		case nEnd:
			if atEnd {
				stack = append(stack, st.out)
			} else {
				out = append(out, s)
			}
		default:
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

func key(set []int32) string {
	bs := make([]byte, 0, 4*len(set))
	for _, s := range set {
		bs = append(bs, byte(s), byte(s>>8), byte(s>>16), byte(s>>24))
	}
	return string(bs)
}

// determinize builds the DFA by subset construction over the intervals the
// NFA's ranges cut the code points into, then removes dead states. It
// returns nil when the start state is dead.
func (b *nfaBuilder) determinize(start int32) (*dfa, error) {
	// Cut points of every range.
	cuts := []rune{0, unicode.MaxRune + 1}
	for _, s := range b.states {
		for i := 0; i+1 < len(s.ranges); i += 2 {
			cuts = append(cuts, s.ranges[i], s.ranges[i+1]+1)
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)

	type dstate struct {
		set    []int32
		trans  []rtrans
		accept bool
	}
	var states []dstate
	index := map[string]int32{}
	var work []int32
	addState := func(set []int32, atStart bool) (int32, error) {
		k := key(set)
		if atStart {
			k = "^" + k
		}
		if i, ok := index[k]; ok {
			return i, nil
		}
		if len(states) >= maxPatternStates {
			return 0, fmt.Errorf("more than %d automaton states", maxPatternStates)
		}
		acc := false
		for _, s := range b.closure(set, atStart, true) {
			if b.states[s].op == nMatch {
				acc = true
			}
		}
		states = append(states, dstate{set: set, accept: acc})
		i := int32(len(states) - 1)
		index[k] = i
		work = append(work, i)
		return i, nil
	}
	s0, err := addState(b.closure([]int32{start}, true, false), true)
	if err != nil {
		return nil, err
	}
	cutIndex := func(r rune) int {
		i, _ := slices.BinarySearch(cuts, r)
		return i
	}
	moves := make([][]int32, len(cuts))
	for len(work) > 0 {
		i := work[0]
		work = work[1:]
		set := states[i].set
		for c := range moves {
			moves[c] = moves[c][:0]
		}
		for _, s := range set {
			st := &b.states[s]
			if st.op != nRunes {
				continue
			}
			for j := 0; j+1 < len(st.ranges); j += 2 {
				for c := cutIndex(st.ranges[j]); c < cutIndex(st.ranges[j+1]+1); c++ {
					if n := len(moves[c]); n == 0 || moves[c][n-1] != st.out {
						moves[c] = append(moves[c], st.out)
					}
				}
			}
		}
		var trans []rtrans
		for c := 0; c+1 < len(cuts); c++ {
			lo, hi := cuts[c], cuts[c+1]-1
			moved := moves[c]
			if len(moved) == 0 {
				continue
			}
			to, err := addState(b.closure(moved, false, false), false)
			if err != nil {
				return nil, err
			}
			if n := len(trans); n > 0 && trans[n-1].to == to && trans[n-1].hi+1 == lo {
				trans[n-1].hi = hi
			} else {
				trans = append(trans, rtrans{lo, hi, to})
			}
		}
		states[i].trans = trans
	}

	// Live states: those that reach an accepting one.
	live := make([]bool, len(states))
	for changed := true; changed; {
		changed = false
		for i := range states {
			if live[i] {
				continue
			}
			if states[i].accept {
				live[i], changed = true, true
				continue
			}
			for _, t := range states[i].trans {
				if live[t.to] {
					live[i], changed = true, true
					break
				}
			}
		}
	}
	if !live[s0] {
		return nil, nil
	}
	d := &dfa{start: s0, trans: make([][]rtrans, len(states)), accept: make([]bool, len(states))}
	for i, s := range states {
		d.accept[i] = s.accept
		for _, t := range s.trans {
			if live[t.to] {
				d.trans[i] = append(d.trans[i], t)
			}
		}
	}
	return d, nil
}
