package grammar

import (
	"bytes"
	"slices"

	"github.com/strata-llm/strata/model/tokenizer"
)

// Vocab is a tokenizer's vocabulary as a byte trie, built once per
// tokenizer and shared by every grammar and matcher. It is immutable and
// safe for concurrent use.
type Vocab struct {
	size int // token IDs are 0..size-1; masks have size bits

	// The trie, in depth-first preorder; node 0 is the root (no byte).
	// Node i's subtree is nodes [i, end[i]); the tokens whose bytes end at
	// node i are ids[tokStart[i]:tokStart[i+1]], and those of its subtree
	// ids[tokStart[i]:tokStart[end[i]]].
	byt      []byte
	depth    []int32
	end      []int32
	tokStart []int32
	ids      []int32
	maxDepth int

	data []byte  // every token's bytes
	off  []int32 // token id's bytes are data[off[id]:off[id+1]]

	eog []int32 // end-of-generation tokens, allowed when the document is whole
	cap int32   // the longest token in bytes, plus one (see Grammar.norm)

	// strChars[id] is how many characters token id adds to a string it
	// continues (up to its closing quote, if any); longStr lists the tokens
	// that add any, most first. A bounded string's mask is the unbounded
	// one less the tokens that add more characters than the string allows.
	strChars []int32
	longStr  []int32
}

// NewVocab builds the trie of tok's vocabulary: each token's bytes are
// tok.TokenBytes(id). End-of-generation tokens (tok.IsEOG) are allowed
// only where the document may end; other tokens with no bytes (control,
// unknown) are never allowed.
func NewVocab(tok *tokenizer.Tokenizer) *Vocab {
	n := tok.VocabSize()
	return newVocab(n, func(id int32) []byte { return tok.TokenBytes(id) }, tok.IsEOG)
}

func newVocab(n int, bytesOf func(int32) []byte, isEOG func(int32) bool) *Vocab {
	v := &Vocab{size: n, off: make([]int32, n+1)}
	for id := range int32(n) {
		b := bytesOf(id)
		if isEOG(id) {
			v.eog = append(v.eog, id)
			b = nil
		}
		v.data = append(v.data, b...)
		v.off[id+1] = int32(len(v.data))
	}
	order := make([]int32, 0, n)
	for id := range int32(n) {
		if v.off[id+1] > v.off[id] {
			order = append(order, id)
		}
	}
	slices.SortStableFunc(order, func(a, b int32) int { return bytes.Compare(v.bytes(a), v.bytes(b)) })

	v.byt = append(v.byt, 0)
	v.depth = append(v.depth, 0)
	v.end = append(v.end, 0)
	v.tokStart = append(v.tokStart, 0)
	path := []int32{0} // path[d]: the node at depth d of the current string
	var prev []byte
	for _, id := range order {
		s := v.bytes(id)
		common := 0
		for common < len(s) && common < len(prev) && s[common] == prev[common] {
			common++
		}
		// Close the nodes of prev below the common prefix.
		for len(path) > common+1 {
			v.end[path[len(path)-1]] = int32(len(v.byt))
			path = path[:len(path)-1]
		}
		for d := common; d < len(s); d++ {
			v.byt = append(v.byt, s[d])
			v.depth = append(v.depth, int32(d+1))
			v.end = append(v.end, 0)
			v.tokStart = append(v.tokStart, int32(len(v.ids)))
			path = append(path, int32(len(v.byt)-1))
		}
		v.ids = append(v.ids, id)
		v.maxDepth = max(v.maxDepth, len(s))
		prev = s
	}
	for len(path) > 0 {
		v.end[path[len(path)-1]] = int32(len(v.byt))
		path = path[:len(path)-1]
	}
	v.tokStart = append(v.tokStart, int32(len(v.ids)))
	v.cap = int32(v.maxDepth) + 1

	v.strChars = make([]int32, n)
	for id := range int32(n) {
		if c := stringChars(v.bytes(id)); c > 0 {
			v.strChars[id] = c
			v.longStr = append(v.longStr, id)
		}
	}
	slices.SortStableFunc(v.longStr, func(a, b int32) int { return int(v.strChars[b] - v.strChars[a]) })
	return v
}

// stringChars counts the characters b adds to a JSON string when it
// starts between characters: every byte that starts a character (not a
// UTF-8 continuation, not the rest of an escape) up to an unescaped
// quote. It matches what stepString counts wherever b is valid there.
func stringChars(b []byte) int32 {
	n := int32(0)
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case c == '"':
			return n
		case c == '\\':
			n++
			if i+1 < len(b) && b[i+1] == 'u' {
				i += 5
			} else {
				i++
			}
		case c&0xC0 == 0x80:
		default:
			n++
		}
	}
	return n
}

// Size returns the number of token IDs: masks have this many bits.
func (v *Vocab) Size() int { return v.size }

// MaskWords returns the length of a mask in uint64 words.
func (v *Vocab) MaskWords() int { return (v.size + 63) / 64 }

func (v *Vocab) bytes(id int32) []byte { return v.data[v.off[id]:v.off[id+1]] }

func (v *Vocab) isEOG(id int32) bool {
	_, ok := slices.BinarySearch(v.eog, id)
	return ok
}
