package grammar

import "slices"

// kind is what a grammar node accepts.
type kind uint8

const (
	kRoot    kind = iota // optional whitespace, one value (child), optional whitespace; or a literal prefix, the value, a literal suffix (pre, suf)
	kObject              // an object with the properties listed, in that order
	kMap                 // an object with any keys and values of one node
	kArray               // an array of items of one node
	kString              // a string, with length bounds or a pattern
	kNumber              // any JSON number
	kInteger             // a JSON number with no fraction or exponent
	kLiteral             // one of a set of JSON texts (enum, const, true, false, null)
	kAnyOf               // one of several nodes: pushing it forks the stack
	kRef                 // an alias, resolved before use
	kNever               // nothing (the schema false)
)

// node is one compiled (sub)schema. Nodes are immutable after Compile.
type node struct {
	kind kind
	ptr  string // JSON pointer of the schema it came from, for messages

	child int32 // kRoot: the value; kMap: values; kArray: items; kRef: target

	// kObject.
	props    []prop
	firstReq []int32 // firstReq[i]: index of the first required property at or after i; len(props) if none
	keys     int32   // root of the key trie in Grammar.tries

	// kArray. maxItems < 0: unbounded.
	minItems, maxItems int32

	// kString. maxLen < 0: unbounded. pat is nil or a pattern's automaton.
	minLen, maxLen int32
	pat            *dfa

	// kLiteral: root of the literal trie in Grammar.tries.
	lit int32

	// kRoot of a wrapped grammar (Wrap): text before and after the value;
	// with repeat, after a whole item, sep and then another item.
	pre, suf []byte
	sep      []byte
	repeat   bool

	// kAnyOf: the alternatives as written; alts: after resolving
	// references and flattening nested anyOf, the concrete productive
	// nodes a push expands to (for a concrete node, itself).
	anyOf []int32
	alts  []int32
}

// prop is one property of a kObject node.
type prop struct {
	name     string
	node     int32
	required bool
}

// tnode is a node of a byte trie (object keys with their quotes, literal
// JSON texts). Children are sorted by byte.
type tnode struct {
	kids []tedge
	term int32   // key: the property index; literal: 0; -1 when no text ends here
	idx  []int32 // key tries: the property indices below, sorted
}

type tedge struct {
	b  byte
	to int32
}

func (t *tnode) next(c byte) int32 {
	for _, e := range t.kids {
		if e.b == c {
			return e.to
		}
	}
	return -1
}

// frame is one level of the pushdown automaton's stack: a node and the
// position inside it. It is comparable, so windows of frames key the mask
// cache.
type frame struct {
	node int32
	st   uint8 // position inside the node, per kind (the o*, m*, a*, s*, n* constants)
	ws   uint8 // whitespace state of the current gap, see wsStep
	// a, b, c are per kind:
	//   kObject: a = key trie node (oKey), b = next property index (or the
	//            property whose value comes next, in oColon and oValue)
	//   kArray:  a = items still required, b = items still allowed (-1: any)
	//   kString: a = characters still required, b = characters still
	//            allowed (-1: any); with a pattern, a = the character being
	//            decoded (its bits so far) and c = the pattern's state
	//   kNumber, kInteger: a = digits in the current part
	//   kLiteral: a = literal trie node
	a, b, c int32
}

// Whitespace. Each gap between JSON tokens (and before and after the
// document) holds nothing, one space, or a newline followed by at most
// maxIndent spaces and tabs: ws is 0 before any, 1 when the gap is spent,
// and 2+k after a newline and k indentation bytes.
const maxIndent = 32

func wsStep(w uint8, c byte) (uint8, bool) {
	switch c {
	case ' ':
		if w == 0 {
			return 1, true
		}
		if w >= 2 && w < 2+maxIndent {
			return w + 1, true
		}
	case '\t':
		if w >= 2 && w < 2+maxIndent {
			return w + 1, true
		}
	case '\n':
		if w == 0 {
			return 2, true
		}
	}
	return w, false
}

// Number bounds, so that generation cannot run on in digits and every
// number parses as a finite float64: at most maxIntDigits digits before the
// point, maxFracDigits after it, and maxExpDigits in the exponent.
const (
	maxIntDigits  = 15
	maxFracDigits = 15
	maxExpDigits  = 2
)

// Positions inside nodes (frame.st).
const (
	rBefore uint8 = iota // kRoot: before the value
	rAfter               // kRoot: after it
	rPrefix              // kRoot: inside the literal prefix (a = bytes of it matched)
	rSuffix              // kRoot: inside the literal suffix (a = bytes of it matched)
	rEnd                 // kRoot: after the suffix
	rSep                 // kRoot: inside the separator before another item (a = bytes of it matched)
)

const (
	oOpen  uint8 = iota // kObject: expect '{'
	oFirst              // after '{': a key or '}'
	oKey                // inside a key (a = trie node)
	oColon              // after a key: ':'
	oValue              // after ':': the value
	oAfter              // after a value: ',' or '}'
	oComma              // after ',': a key
)

const (
	mOpen  uint8 = iota // kMap: expect '{'
	mFirst              // after '{': a key or '}'
	mColon              // after a key: ':'
	mValue              // after ':': the value
	mAfter              // after a value: ',' or '}'
	mComma              // after ',': a key
)

const (
	aOpen  uint8 = iota // kArray: expect '['
	aFirst              // after '[': an item or ']'
	aAfter              // after an item: ',' or ']'
	aComma              // after ',': an item
)

const (
	sOpen uint8 = iota // kString: expect '"'
	sBody              // between characters
	sEsc               // after '\'
	sU1                // after "\u": 4 hex digits to go
	sU2                // 3 to go
	sU3                // 2 to go
	sU4                // 1 to go
	sU2D               // 3 to go, the first was d or D: the next must be 0-7 (no surrogates)
	sC1                // UTF-8: 1 continuation byte to go
	sC2                // 2 to go
	sC2E0              // 2 to go, the next in A0-BF (after E0)
	sC2ED              // 2 to go, the next in 80-9F (after ED: no surrogates)
	sC3                // 3 to go
	sC3F0              // 3 to go, the next in 90-BF (after F0)
	sC3F4              // 3 to go, the next in 80-8F (after F4: at most U+10FFFF)
)

const (
	nStart uint8 = iota // kNumber, kInteger: expect '-' or a digit
	nMinus              // after '-'
	nZero               // after a leading 0 (complete)
	nInt                // in the integer digits (complete; a = count)
	nDot                // after '.'
	nFrac               // in the fraction digits (complete; a = count)
	nE                  // after 'e' or 'E'
	nESign              // after the exponent's sign
	nExp                // in the exponent digits (complete; a = count)
)

// Actions of step.
const (
	actDead      = iota // the byte is not allowed
	actStay             // the frame consumed the byte
	actPush             // the frame changed; push the child returned and give it the byte
	actPop              // the frame consumed the byte and is complete
	actPopRefeed        // the frame was complete before the byte; give the byte to its parent
)

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isHex(c byte) bool {
	return isDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func hexVal(c byte) int32 {
	switch {
	case isDigit(c):
		return int32(c - '0')
	case c >= 'a' && c <= 'f':
		return int32(c-'a') + 10
	default:
		return int32(c-'A') + 10
	}
}

// step advances frame f over byte c. For actPush it returns the node to
// push.
func (g *Grammar) step(f *frame, c byte) (int, int32) {
	n := &g.nodes[f.node]
	switch n.kind {
	case kRoot:
		switch f.st {
		case rPrefix, rSuffix, rSep:
			lit := n.pre
			switch f.st {
			case rSuffix:
				lit = n.suf
			case rSep:
				lit = n.sep
			}
			if c != lit[f.a] {
				return actDead, 0
			}
			if f.a++; int(f.a) == len(lit) {
				f.a = 0
				switch f.st {
				case rPrefix:
					f.st = rBefore
				case rSuffix:
					f.st = rEnd
				default:
					f.st, f.ws = rBefore, 0
					if len(n.pre) > 0 {
						f.st = rPrefix
					}
				}
			}
			return actStay, 0
		case rEnd:
			return g.nextItem(n, f, c), 0
		case rAfter:
			// With a suffix, the value is followed by the suffix at once,
			// which holds whatever whitespace the syntax wants (a gap
			// before it would take the suffix's leading newline).
			if len(n.suf) > 0 {
				if c != n.suf[0] {
					return actDead, 0
				}
				if f.st, f.a = rSuffix, 1; len(n.suf) == 1 {
					f.st, f.a = rEnd, 0
				}
				return actStay, 0
			}
		}
		if w, ok := wsStep(f.ws, c); ok {
			f.ws = w
			return actStay, 0
		}
		if f.st == rAfter && n.repeat && len(n.suf) == 0 {
			return g.nextItem(n, f, c), 0
		}
		if f.st == rBefore {
			f.st, f.ws = rAfter, 0
			return actPush, n.child
		}
		return actDead, 0
	case kObject:
		return g.stepObject(n, f, c)
	case kMap:
		return stepMap(n, f, c, g.anyString)
	case kArray:
		return stepArray(n, f, c)
	case kString:
		if n.pat != nil {
			return stepPattern(n.pat, f, c), 0
		}
		return stepString(f, c), 0
	case kNumber, kInteger:
		return stepNumber(n.kind == kInteger, f, c), 0
	case kLiteral:
		t := &g.tries[f.a]
		if nx := t.next(c); nx >= 0 {
			if g.tries[nx].term >= 0 && len(g.tries[nx].kids) == 0 {
				return actPop, 0
			}
			f.a = nx
			return actStay, 0
		}
		if t.term >= 0 {
			return actPopRefeed, 0
		}
		return actDead, 0
	}
	return actDead, 0
}

// nextItem starts another item of a repeating wrapped root after a whole
// one: its separator's first byte, or with no separator its prefix's.
func (g *Grammar) nextItem(n *node, f *frame, c byte) int {
	if !n.repeat {
		return actDead
	}
	lit, st := n.sep, rSep
	if len(lit) == 0 {
		lit, st = n.pre, rPrefix
	}
	if len(lit) == 0 || c != lit[0] {
		return actDead
	}
	f.st, f.a, f.ws = st, 1, 0
	if len(lit) == 1 { // the separator or prefix is whole: as if its last byte had just been stepped
		f.st, f.a = rBefore, 0
		if st == rSep && len(n.pre) > 0 {
			f.st = rPrefix
		}
	}
	return actStay
}

// gap consumes whitespace in the frame's current gap.
func gap(f *frame, c byte) bool {
	if w, ok := wsStep(f.ws, c); ok {
		f.ws = w
		return true
	}
	return false
}

func (g *Grammar) stepObject(n *node, f *frame, c byte) (int, int32) {
	np := int32(len(n.props))
	switch f.st {
	case oOpen:
		if c == '{' {
			f.st, f.ws = oFirst, 0
			return actStay, 0
		}
		return actDead, 0
	case oFirst, oComma:
		if gap(f, c) {
			return actStay, 0
		}
		if c == '}' && f.st == oFirst && n.firstReq[f.b] == np {
			return actPop, 0
		}
		if c != '"' || f.b >= np {
			return actDead, 0
		}
		f.st, f.ws, f.a = oKey, 0, n.keys
		return g.stepKey(n, f, c)
	case oKey:
		return g.stepKey(n, f, c)
	case oColon:
		if gap(f, c) {
			return actStay, 0
		}
		if c == ':' {
			f.st, f.ws = oValue, 0
			return actStay, 0
		}
		return actDead, 0
	case oValue:
		if gap(f, c) {
			return actStay, 0
		}
		child := n.props[f.b].node
		f.st, f.ws, f.b = oAfter, 0, f.b+1
		return actPush, child
	case oAfter:
		if gap(f, c) {
			return actStay, 0
		}
		switch {
		case c == ',' && f.b < np:
			f.st, f.ws = oComma, 0
			return actStay, 0
		case c == '}' && n.firstReq[f.b] == np:
			return actPop, 0
		}
	}
	return actDead, 0
}

// stepKey advances through the key trie, keeping only keys whose index is
// in [f.b, the first required property at or after f.b].
func (g *Grammar) stepKey(n *node, f *frame, c byte) (int, int32) {
	nx := g.tries[f.a].next(c)
	if nx < 0 {
		return actDead, 0
	}
	lo, hi := f.b, n.firstReq[f.b]
	if hi >= int32(len(n.props)) {
		hi = int32(len(n.props)) - 1
	}
	t := &g.tries[nx]
	i, _ := slices.BinarySearch(t.idx, lo)
	if i == len(t.idx) || t.idx[i] > hi {
		return actDead, 0
	}
	if t.term >= 0 {
		f.st, f.ws, f.b = oColon, 0, t.term
		return actStay, 0
	}
	f.a = nx
	return actStay, 0
}

func stepMap(n *node, f *frame, c byte, key int32) (int, int32) {
	switch f.st {
	case mOpen:
		if c == '{' {
			f.st, f.ws = mFirst, 0
			return actStay, 0
		}
	case mFirst, mComma:
		if gap(f, c) {
			return actStay, 0
		}
		if c == '}' && f.st == mFirst {
			return actPop, 0
		}
		if c == '"' && n.child >= 0 {
			f.st, f.ws = mColon, 0
			return actPush, key
		}
	case mColon:
		if gap(f, c) {
			return actStay, 0
		}
		if c == ':' {
			f.st, f.ws = mValue, 0
			return actStay, 0
		}
	case mValue:
		if gap(f, c) {
			return actStay, 0
		}
		f.st, f.ws = mAfter, 0
		return actPush, n.child
	case mAfter:
		if gap(f, c) {
			return actStay, 0
		}
		switch c {
		case ',':
			f.st, f.ws = mComma, 0
			return actStay, 0
		case '}':
			return actPop, 0
		}
	}
	return actDead, 0
}

func stepArray(n *node, f *frame, c byte) (int, int32) {
	switch f.st {
	case aOpen:
		if c == '[' {
			f.st, f.ws = aFirst, 0
			return actStay, 0
		}
	case aFirst, aComma:
		if gap(f, c) {
			return actStay, 0
		}
		if c == ']' && f.st == aFirst && f.a == 0 {
			return actPop, 0
		}
		if f.b == 0 {
			return actDead, 0
		}
		f.st, f.ws = aAfter, 0
		if f.a > 0 {
			f.a--
		}
		if f.b > 0 {
			f.b--
		}
		return actPush, n.child
	case aAfter:
		if gap(f, c) {
			return actStay, 0
		}
		switch {
		case c == ',' && f.b != 0:
			f.st, f.ws = aComma, 0
			return actStay, 0
		case c == ']' && f.a == 0:
			return actPop, 0
		}
	}
	return actDead, 0
}

// char starts one character of a string without a pattern: it must be
// allowed by the length bounds.
func char(f *frame) bool {
	if f.b == 0 {
		return false
	}
	if f.b > 0 {
		f.b--
	}
	if f.a > 0 {
		f.a--
	}
	return true
}

func stepString(f *frame, c byte) int {
	switch f.st {
	case sOpen:
		if c == '"' {
			f.st = sBody
			return actStay
		}
	case sBody:
		switch {
		case c == '"':
			if f.a == 0 {
				return actPop
			}
		case c < 0x20:
		case c == '\\':
			if char(f) {
				f.st = sEsc
				return actStay
			}
		case c < 0x80:
			if char(f) {
				return actStay
			}
		default:
			st := utf8Lead(c)
			if st != 0 && char(f) {
				f.st = st
				return actStay
			}
		}
	case sEsc:
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			f.st = sBody
			return actStay
		case 'u':
			f.st = sU1
			return actStay
		}
	case sU1:
		if c == 'd' || c == 'D' {
			f.st = sU2D
			return actStay
		}
		if isHex(c) {
			f.st = sU2
			return actStay
		}
	case sU2D:
		if c >= '0' && c <= '7' {
			f.st = sU3
			return actStay
		}
	case sU2, sU3, sU4:
		if isHex(c) {
			if f.st == sU4 {
				f.st = sBody
			} else {
				f.st++ // sU2 → sU3 → sU4
			}
			return actStay
		}
	default:
		if st, ok := utf8Cont(f.st, c); ok {
			f.st = st
			return actStay
		}
	}
	return actDead
}

// utf8Lead returns the string state after a UTF-8 lead byte, or 0 (sOpen)
// when c cannot start a character.
func utf8Lead(c byte) uint8 {
	switch {
	case c >= 0xC2 && c <= 0xDF:
		return sC1
	case c == 0xE0:
		return sC2E0
	case c == 0xED:
		return sC2ED
	case c >= 0xE1 && c <= 0xEF:
		return sC2
	case c == 0xF0:
		return sC3F0
	case c >= 0xF1 && c <= 0xF3:
		return sC3
	case c == 0xF4:
		return sC3F4
	}
	return 0
}

// utf8Cont returns the state after continuation byte c in state st.
func utf8Cont(st uint8, c byte) (uint8, bool) {
	lo, hi := byte(0x80), byte(0xBF)
	var next uint8
	switch st {
	case sC1:
		next = sBody
	case sC2:
		next = sC1
	case sC2E0:
		lo, next = 0xA0, sC1
	case sC2ED:
		hi, next = 0x9F, sC1
	case sC3:
		next = sC2
	case sC3F0:
		lo, next = 0x90, sC2
	case sC3F4:
		hi, next = 0x8F, sC2
	default:
		return 0, false
	}
	if c < lo || c > hi {
		return 0, false
	}
	return next, true
}

func stepNumber(integer bool, f *frame, c byte) int {
	switch f.st {
	case nStart, nMinus:
		switch {
		case c == '-' && f.st == nStart:
			f.st = nMinus
			return actStay
		case c == '0':
			f.st = nZero
			return actStay
		case c >= '1' && c <= '9':
			f.st, f.a = nInt, 1
			return actStay
		}
		return actDead
	case nZero, nInt:
		switch {
		case isDigit(c) && f.st == nInt && f.a < maxIntDigits:
			f.a++
			return actStay
		case integer:
		case c == '.':
			f.st, f.a = nDot, 0
			return actStay
		case c == 'e' || c == 'E':
			f.st, f.a = nE, 0
			return actStay
		}
		if isDigit(c) {
			return actDead
		}
		return actPopRefeed
	case nDot:
		if isDigit(c) {
			f.st, f.a = nFrac, 1
			return actStay
		}
		return actDead
	case nFrac:
		switch {
		case isDigit(c) && f.a < maxFracDigits:
			f.a++
			return actStay
		case c == 'e' || c == 'E':
			f.st, f.a = nE, 0
			return actStay
		case isDigit(c):
			return actDead
		}
		return actPopRefeed
	case nE, nESign:
		switch {
		case (c == '+' || c == '-') && f.st == nE:
			f.st = nESign
			return actStay
		case isDigit(c):
			f.st, f.a = nExp, 1
			return actStay
		}
		return actDead
	case nExp:
		if isDigit(c) {
			if f.a < maxExpDigits {
				f.a++
				return actStay
			}
			return actDead
		}
		return actPopRefeed
	}
	return actDead
}

// complete reports whether f may end without another byte (a number or a
// literal that is a whole text), so that its parent can take over.
func (g *Grammar) complete(f frame) bool {
	switch g.nodes[f.node].kind {
	case kNumber, kInteger:
		switch f.st {
		case nZero, nInt, nFrac, nExp:
			return true
		}
	case kLiteral:
		return g.tries[f.a].term >= 0
	case kString:
		// A pattern string is complete only after its quote, which pops it.
	}
	return false
}

// accepting reports whether stack s is a whole document: the root after
// its value, above it only frames that may end as they are.
func (g *Grammar) accepting(s []frame) bool {
	i := len(s) - 1
	for i > 0 && g.complete(s[i]) {
		i--
	}
	if i != 0 {
		return false
	}
	if len(g.nodes[s[0].node].suf) > 0 {
		return s[0].st == rEnd
	}
	return s[0].st == rAfter
}
