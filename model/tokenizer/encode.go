package tokenizer

import (
	"strings"
)

// EncodeOptions controls Encode.
type EncodeOptions struct {
	// AddSpecial adds BOS and EOS as the vocabulary asks (Vocab.AddBOS,
	// Vocab.AddEOS).
	AddSpecial bool
	// ParseSpecial recognises the text of control and unknown tokens, such
	// as "<|im_start|>" in a rendered chat template, as those tokens.
	// User-defined tokens are recognised either way, as in llama.cpp.
	ParseSpecial bool
}

// spaceMark is U+2581, which SentencePiece vocabularies use for a space.
const spaceMark = "\u2581"

// cSpace is the set of bytes C's isspace accepts, which llama.cpp strips next
// to special tokens that carry the lstrip/rstrip attributes.
const cSpace = " \t\n\v\f\r"

// fragment is a piece of the input: either raw text or a special token.
type fragment struct {
	text string
	id   int32 // -1 for text
}

// Encode returns the token IDs of text, exactly as llama.cpp's
// llama_tokenize(text, opt.AddSpecial, opt.ParseSpecial) does.
func (t *Tokenizer) Encode(text string, opt EncodeOptions) []int32 {
	var frags []fragment
	if text != "" {
		frags = t.partition(text, opt.ParseSpecial)
	}
	out := make([]int32, 0, len(text)/3+2)
	if opt.AddSpecial && t.addBOS {
		out = append(out, t.bos)
	}
	if t.spm {
		prevSpecial := true // a dummy prefix goes before the first text
		var buf strings.Builder
		for _, f := range frags {
			if f.id >= 0 {
				out = append(out, f.id)
				prevSpecial = true
				continue
			}
			buf.Reset()
			if t.addSpace && prevSpecial {
				buf.WriteString(spaceMark)
			}
			for i := 0; i < len(f.text); {
				j := strings.IndexByte(f.text[i:], ' ')
				if j < 0 {
					buf.WriteString(f.text[i:])
					break
				}
				buf.WriteString(f.text[i : i+j])
				buf.WriteString(spaceMark)
				i += j + 1
			}
			out = t.encodeSPM(buf.String(), out)
			prevSpecial = false
		}
	} else {
		for _, f := range frags {
			if f.id >= 0 {
				out = append(out, f.id)
				continue
			}
			out = t.encodeBPE(f.text, out)
		}
	}
	if opt.AddSpecial && t.addEOS {
		out = append(out, t.eos)
	}
	return out
}

// partition splits text at the special tokens it contains, longest token
// first, as llama.cpp's tokenizer_st_partition does.
func (t *Tokenizer) partition(text string, parseSpecial bool) []fragment {
	frags := []fragment{{text: text, id: -1}}
	var next []fragment
	for _, id := range t.special {
		a := t.attrs[id]
		if !parseSpecial && a&(attrControl|attrUnknown) != 0 {
			continue
		}
		tok := t.tokens[id]
		next = next[:0]
		for _, f := range frags {
			if f.id >= 0 || !strings.Contains(f.text, tok) {
				next = append(next, f)
				continue
			}
			s := f.text
			for {
				i := strings.Index(s, tok)
				if i < 0 {
					if s != "" {
						next = append(next, fragment{text: s, id: -1})
					}
					break
				}
				left := s[:i]
				if a&attrLStrip != 0 {
					left = strings.TrimRight(left, cSpace)
				}
				if left != "" {
					next = append(next, fragment{text: left, id: -1})
				}
				next = append(next, fragment{id: id})
				s = s[i+len(tok):]
				if a&attrRStrip != 0 {
					s = strings.TrimLeft(s, cSpace)
				}
			}
		}
		frags, next = next, frags
	}
	return frags
}

// utf8Len returns the length of the UTF-8 sequence that lead byte b
// announces, counting a stray continuation byte as one (llama.cpp's
// unicode_len_utf8).
func utf8Len(b byte) int {
	switch {
	case b < 0xC0:
		return 1
	case b < 0xE0:
		return 2
	case b < 0xF0:
		return 3
	}
	return 4
}

// symbol is a run of bytes of the text being merged, in a doubly linked list
// of the runs still alive. n is 0 once the symbol was merged into its left
// neighbour.
type symbol struct {
	start, n   int
	prev, next int
}

func splitSymbols(text string, syms []symbol) []symbol {
	for off := 0; off < len(text); {
		n := min(utf8Len(text[off]), len(text)-off)
		i := len(syms)
		syms = append(syms, symbol{start: off, n: n, prev: i - 1, next: i + 1})
		off += n
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	return syms
}

// merge joins symbol r into its left neighbour l.
func merge(syms []symbol, l, r int) {
	syms[l].n += syms[r].n
	syms[r].n = 0
	syms[l].next = syms[r].next
	if nx := syms[r].next; nx >= 0 {
		syms[nx].prev = l
	}
}

// spmBigram is a candidate merge of two adjacent symbols into a token.
type spmBigram struct {
	left, right int
	score       float32
	size        int
}

// before orders the queue: higher score first, then leftmost.
func (a spmBigram) before(b spmBigram) bool {
	return a.score > b.score || (a.score == b.score && a.left < b.left)
}

// encodeSPM appends the tokens of text (spaces already escaped) as
// llama.cpp's llm_tokenizer_spm_session does: repeatedly merge the adjacent
// pair whose concatenation is the best-scoring token, then spell whatever
// is not a token in byte tokens.
func (t *Tokenizer) encodeSPM(text string, out []int32) []int32 {
	syms := splitSymbols(text, make([]symbol, 0, len(text)))
	q := queue[spmBigram]{items: make([]spmBigram, 0, 2*len(syms))}
	try := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		s := text[syms[l].start : syms[l].start+syms[l].n+syms[r].n]
		id, ok := t.ids[s]
		if !ok {
			return
		}
		q.push(spmBigram{left: l, right: r, score: t.scores[id], size: len(s)})
	}
	for i := 1; i < len(syms); i++ {
		try(i-1, i)
	}
	for q.len() > 0 {
		b := q.pop()
		l, r := &syms[b.left], &syms[b.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != b.size {
			continue // stale: one side has merged since
		}
		merge(syms, b.left, b.right)
		try(syms[b.left].prev, b.left)
		try(b.left, syms[b.left].next)
	}
	for i := 0; i >= 0 && len(syms) > 0; i = syms[i].next {
		s := text[syms[i].start : syms[i].start+syms[i].n]
		if id, ok := t.ids[s]; ok {
			out = append(out, id)
			continue
		}
		// A symbol that is no token is always a single character: spell it
		// in bytes.
		for k := 0; k < len(s); k++ {
			if id := t.byteToken[s[k]]; id >= 0 {
				out = append(out, id)
			} else if t.unk >= 0 {
				out = append(out, t.unk)
			}
		}
	}
	return out
}

// bpeBigram is a candidate merge of two adjacent symbols by merge rank. ln
// and rn are the lengths of the two sides when it was queued.
type bpeBigram struct {
	left, right int
	rank        int32
	ln, rn      int
}

// before orders the queue: lowest rank first, then leftmost.
func (a bpeBigram) before(b bpeBigram) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.left < b.left)
}

// encodeBPE appends the tokens of text as llama.cpp's
// llm_tokenizer_bpe_session does: pre-tokenize into words, map bytes to
// GPT-2's alphabet, and merge each word's pairs by rank.
func (t *Tokenizer) encodeBPE(text string, out []int32) []int32 {
	var (
		syms []symbol
		q    queue[bpeBigram]
		key  []byte
	)
	for _, word := range t.pre.split(text) {
		if t.ignoreMerges {
			if id, ok := t.ids[word]; ok {
				out = append(out, id)
				continue
			}
		}
		syms = splitSymbols(word, syms[:0])
		add := func(l, r int) {
			if l < 0 || r < 0 {
				return
			}
			ls, rs := syms[l], syms[r]
			key = append(key[:0], word[ls.start:ls.start+ls.n]...)
			key = append(key, ' ')
			key = append(key, word[rs.start:rs.start+rs.n]...)
			rank, ok := t.ranks[string(key)]
			if !ok {
				return
			}
			q.push(bpeBigram{left: l, right: r, rank: rank, ln: ls.n, rn: rs.n})
		}
		for i := 1; i < len(syms); i++ {
			add(i-1, i)
		}
		for q.len() > 0 {
			b := q.pop()
			l, r := syms[b.left], syms[b.right]
			if l.n == 0 || r.n == 0 || l.n != b.ln || r.n != b.rn {
				continue // stale
			}
			merge(syms, b.left, b.right)
			add(syms[b.left].prev, b.left)
			add(b.left, syms[b.left].next)
		}
		for i := 0; i >= 0 && len(syms) > 0; i = syms[i].next {
			s := word[syms[i].start : syms[i].start+syms[i].n]
			if id, ok := t.ids[s]; ok {
				out = append(out, id)
				continue
			}
			// As llama.cpp: try each byte of the symbol as a token of its
			// own, and drop those that are not.
			for k := 0; k < len(s); k++ {
				if id, ok := t.ids[s[k:k+1]]; ok {
					out = append(out, id)
				}
			}
		}
	}
	return out
}

// queue is a binary min-heap ordered by before.
type queue[T interface{ before(T) bool }] struct {
	items []T
}

func (q *queue[T]) len() int { return len(q.items) }

func (q *queue[T]) push(x T) {
	q.items = append(q.items, x)
	h := q.items
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h[i].before(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func (q *queue[T]) pop() T {
	h := q.items
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		c := 2*i + 1
		if c >= len(h) {
			break
		}
		if c+1 < len(h) && h[c+1].before(h[c]) {
			c++
		}
		if !h[c].before(h[i]) {
			break
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
	q.items = h
	return top
}
