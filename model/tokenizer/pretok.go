package tokenizer

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// A splitter subdivides the code points c[start:end] into pieces and appends
// their lengths (in code points, summing to end-start) to out. It sees
// nothing outside [start, end), as llama.cpp's splitters see only the
// current piece.
type splitter func(c []rune, start, end int, out []int) []int

// preTokenizer is a BPE pre-tokenizer: splitters applied in turn, each to
// every piece the previous ones produced (llama.cpp's unicode_regex_split).
type preTokenizer struct {
	name         string
	splits       []splitter
	ignoreMerges bool // a word that is a whole token skips merging
	addBOS       bool // llama.cpp's default for tokenizer.ggml.add_bos_token
	noBOS        bool // llama.cpp's default BOS is none, not 11
}

var (
	preGPT2    = preTokenizer{name: "gpt-2", splits: []splitter{splitGPT2}}
	preLlama3  = preTokenizer{name: "llama3", splits: []splitter{splitLlama3}, ignoreMerges: true, addBOS: true}
	preDBRX    = preTokenizer{name: "dbrx", splits: []splitter{splitLlama3}}
	preGLM4    = preTokenizer{name: "chatglm-bpe", splits: []splitter{splitLlama3}, noBOS: true}
	preQwen2   = preTokenizer{name: "qwen2", splits: []splitter{splitQwen2}}
	preSmolLM  = preTokenizer{name: "smollm", splits: []splitter{splitEachNumber, splitGPT2}}
	preDefault = preTokenizer{name: "default", splits: []splitter{splitPunctRuns, splitGPT2, splitNumberRuns, splitASCIIDigits3}}
)

// preTokenizers maps tokenizer.ggml.pre to a pre-tokenizer, as llama.cpp's
// llama_vocab::impl::load does for the pre-tokenizers implemented here.
var preTokenizers = map[string]*preTokenizer{
	"": &preDefault, "default": &preDefault,

	"gpt-2": &preGPT2, "gpt2": &preGPT2, "phi-2": &preGPT2, "jina-es": &preGPT2,
	"jina-de": &preGPT2, "gigachat": &preGPT2, "jina-v2-es": &preGPT2,
	"jina-v2-de": &preGPT2, "a.x-4.0": &preGPT2, "mellum": &preGPT2,
	"modern-bert": &preGPT2, "jina-v1-en": &preGPT2, "jina-v2-code": &preGPT2,
	"roberta-bpe": &preGPT2, "exaone4": &preGPT2, "mpt": &preGPT2, "olmo": &preGPT2,
	"jais": &preGPT2, "trillion": &preGPT2, "granite-docling": &preGPT2,

	"llama3": &preLlama3, "llama-v3": &preLlama3, "llama-bpe": &preLlama3,
	"falcon3": &preLlama3, "falcon-h1": &preLlama3, "pixtral": &preLlama3,
	"midm-2.0": &preLlama3, "lfm2": &preLlama3, "jina-v5-nano": &preLlama3,
	"dbrx": &preDBRX, "smaug-bpe": &preDBRX,
	"chatglm-bpe": &preGLM4, "glm4": &preGLM4,

	"qwen2": &preQwen2, "deepseek-r1-qwen": &preQwen2, "kormo": &preQwen2,
	"f2llmv2": &preQwen2, "megrez": &preQwen2, "stablelm2": &preQwen2,
	"hunyuan": &preQwen2, "solar-open": &preQwen2, "grok-2": &preQwen2,

	"smollm": &preSmolLM, "starcoder": &preSmolLM, "refact": &preSmolLM,
	"command-r": &preSmolLM, "codeshell": &preSmolLM, "exaone": &preSmolLM,
	"minerva-7b": &preSmolLM, "mellum2": &preSmolLM,
}

func lookupPre(name string) (preTokenizer, error) {
	p, ok := preTokenizers[name]
	if !ok {
		return preTokenizer{}, fmt.Errorf("%w: pre-tokenizer tokenizer.ggml.pre = %q is not implemented", ErrUnsupported, name)
	}
	return *p, nil
}

// decodeRunes decodes s the way llama.cpp's unicode_cpts_from_utf8 does: a
// lead byte announces the length, continuation bytes are checked but
// overlong forms and surrogates are not, and each byte that starts no valid
// sequence becomes U+FFFD.
func decodeRunes(s string, out []rune) []rune {
	for i := 0; i < len(s); {
		b := s[i]
		n := 0
		switch {
		case b < 0x80:
			out = append(out, rune(b))
			i++
			continue
		case b&0xE0 == 0xC0:
			n = 2
		case b&0xF0 == 0xE0:
			n = 3
		case b&0xF8 == 0xF0:
			n = 4
		}
		ok := n > 0 && i+n <= len(s)
		for k := 1; ok && k < n; k++ {
			ok = s[i+k]&0xC0 == 0x80
		}
		if !ok {
			out = append(out, utf8.RuneError)
			i++
			continue
		}
		r := rune(b) & (0x7F >> n)
		for k := 1; k < n; k++ {
			r = r<<6 | rune(s[i+k]&0x3F)
		}
		out = append(out, r)
		i += n
	}
	return out
}

// appendRune encodes r as llama.cpp's unicode_cpt_to_utf8 does: surrogates
// are encoded as they are, and only values past U+10FFFF (which it rejects)
// become U+FFFD.
func appendRune(b []byte, r rune) []byte {
	switch {
	case r < 0x80:
		return append(b, byte(r))
	case r < 0x800:
		return append(b, 0xC0|byte(r>>6), 0x80|byte(r)&0x3F)
	case r < 0x10000:
		return append(b, 0xE0|byte(r>>12), 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
	case r <= unicode.MaxRune:
		return append(b, 0xF0|byte(r>>18), 0x80|byte(r>>12)&0x3F, 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
	}
	return utf8.AppendRune(b, utf8.RuneError)
}

// Character classes as llama.cpp's unicode tables define them: \p{L}, \p{N}
// and the White_Space property (which is what \s matches in its splitters).
func isLetter(r rune) bool { return unicode.IsLetter(r) }
func isNumber(r rune) bool { return unicode.IsNumber(r) }
func isSpace(r rune) bool {
	if r < 0x80 {
		return r == ' ' || (r >= '\t' && r <= '\r')
	}
	return unicode.Is(unicode.White_Space, r)
}

// isOther reports whether r is in [^\s\p{L}\p{N}].
func isOther(r rune) bool { return !isSpace(r) && !isLetter(r) && !isNumber(r) }

// pieces tracks the end of the last piece a splitter emitted.
type pieces struct {
	out  []int
	prev int
}

func (p *pieces) add(end int) {
	if end > p.prev {
		p.out = append(p.out, end-p.prev)
	}
	p.prev = end
}

// splitGPT2 splits like the GPT-2 regex
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// following llama.cpp's unicode_regex_split_custom_gpt2.
func splitGPT2(c []rune, start, end int, out []int) []int {
	p := pieces{out: out, prev: start}
	for pos := start; pos < end; {
		r := c[pos]
		if r == '\'' && pos+1 < end {
			if n := c[pos+1]; n == 's' || n == 't' || n == 'm' || n == 'd' {
				pos += 2
				p.add(pos)
				continue
			}
			if pos+2 < end {
				n, nn := c[pos+1], c[pos+2]
				if (n == 'r' && nn == 'e') || (n == 'v' && nn == 'e') || (n == 'l' && nn == 'l') {
					pos += 3
					p.add(pos)
					continue
				}
			}
		}
		// The class of the character after an optional leading space.
		q := pos
		if r == ' ' {
			q++
		}
		if q < end {
			var in func(rune) bool
			switch x := c[q]; {
			case isLetter(x):
				in = isLetter
			case isNumber(x):
				in = isNumber
			case isOther(x):
				in = isOther
			}
			if in != nil {
				pos = q
				for pos < end && in(c[pos]) {
					pos++
				}
				p.add(pos)
				continue
			}
		}
		ws := 0
		for pos+ws < end && isSpace(c[pos+ws]) {
			ws++
		}
		switch {
		case ws > 1 && pos+ws < end: // \s+(?!\S): leave one space for the next word
			pos += ws - 1
		case ws > 0:
			pos += ws
		default:
			pos++
		}
		p.add(pos)
	}
	return p.out
}

// splitLlama3 splits like the Llama 3 regex
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// following llama.cpp's unicode_regex_split_custom_llama3.
func splitLlama3(c []rune, start, end int, out []int) []int {
	return splitLlama3Like(c, start, end, out, 3)
}

// splitQwen2 splits like the Qwen2 regex, which is Llama 3's with \p{N} in
// place of \p{N}{1,3}. llama.cpp runs it through std::regex; its ordered
// alternation matches the same pieces as the Llama 3 state machine.
func splitQwen2(c []rune, start, end int, out []int) []int {
	return splitLlama3Like(c, start, end, out, 1)
}

func splitLlama3Like(c []rune, start, end int, out []int, maxDigits int) []int {
	p := pieces{out: out, prev: start}
	lower := func(r rune) rune {
		if r >= 'A' && r <= 'Z' {
			return r + ('a' - 'A')
		}
		return r
	}
	for pos := start; pos < end; {
		r := c[pos]
		if r == '\'' && pos+1 < end {
			if n := lower(c[pos+1]); n == 's' || n == 't' || n == 'm' || n == 'd' {
				pos += 2
				p.add(pos)
				continue
			}
			if pos+2 < end {
				n, nn := lower(c[pos+1]), lower(c[pos+2])
				if (n == 'r' && nn == 'e') || (n == 'v' && nn == 'e') || (n == 'l' && nn == 'l') {
					pos += 3
					p.add(pos)
					continue
				}
			}
		}
		// [^\r\n\p{L}\p{N}]?\p{L}+
		if r != '\r' && r != '\n' && !isNumber(r) {
			if isLetter(r) || (pos+1 < end && isLetter(c[pos+1])) {
				pos++
				for pos < end && isLetter(c[pos]) {
					pos++
				}
				p.add(pos)
				continue
			}
		}
		// \p{N}{1,maxDigits}
		if isNumber(r) {
			n := 0
			for pos < end && isNumber(c[pos]) && n < maxDigits {
				pos++
				n++
			}
			p.add(pos)
			continue
		}
		// ' '?[^\s\p{L}\p{N}]+[\r\n]*
		q := pos
		if r == ' ' {
			q++
		}
		if q < end && isOther(c[q]) {
			pos = q
			for pos < end && isOther(c[pos]) {
				pos++
			}
			for pos < end && (c[pos] == '\r' || c[pos] == '\n') {
				pos++
			}
			p.add(pos)
			continue
		}
		ws, lastNL := 0, -1
		for pos+ws < end && isSpace(c[pos+ws]) {
			if x := c[pos+ws]; x == '\r' || x == '\n' {
				lastNL = pos + ws + 1
			}
			ws++
		}
		switch {
		case lastNL >= 0: // \s*[\r\n]+
			pos = lastNL
		case ws > 1 && pos+ws < end: // \s+(?!\S)
			pos += ws - 1
		case ws > 0: // \s+
			pos += ws
		default:
			pos++
		}
		p.add(pos)
	}
	return p.out
}

// splitMatches splits c[start:end] into the matches of a single-character
// class pattern and the gaps between them, as llama.cpp's std::regex
// fallback does. With run set the pattern is class+, otherwise one class
// character per match.
func splitMatches(c []rune, start, end int, out []int, in func(rune) bool, run bool) []int {
	p := pieces{out: out, prev: start}
	for pos := start; pos < end; {
		if !in(c[pos]) {
			pos++
			continue
		}
		p.add(pos) // the gap before the match
		pos++
		for run && pos < end && in(c[pos]) {
			pos++
		}
		p.add(pos)
	}
	p.add(end)
	return p.out
}

// splitEachNumber is the regex \p{N}.
func splitEachNumber(c []rune, start, end int, out []int) []int {
	return splitMatches(c, start, end, out, isNumber, false)
}

// splitNumberRuns is the regex \p{N}+.
func splitNumberRuns(c []rune, start, end int, out []int) []int {
	return splitMatches(c, start, end, out, isNumber, true)
}

// splitPunctRuns is the regex [\p{P}\$\+<=>\^~\|]+.
func splitPunctRuns(c []rune, start, end int, out []int) []int {
	return splitMatches(c, start, end, out, func(r rune) bool {
		switch r {
		case '$', '+', '<', '=', '>', '^', '~', '|':
			return true
		}
		return unicode.IsPunct(r)
	}, true)
}

// splitASCIIDigits3 is the regex [0-9][0-9][0-9].
func splitASCIIDigits3(c []rune, start, end int, out []int) []int {
	p := pieces{out: out, prev: start}
	digit := func(i int) bool { return i < end && c[i] >= '0' && c[i] <= '9' }
	for pos := start; pos < end; {
		if digit(pos) && digit(pos+1) && digit(pos+2) {
			p.add(pos)
			pos += 3
			p.add(pos)
			continue
		}
		pos++
	}
	p.add(end)
	return p.out
}

// split runs the pre-tokenizer over text and returns its words, each already
// mapped to GPT-2's byte-level alphabet.
func (pt *preTokenizer) split(text string) []string {
	cpts := decodeRunes(text, make([]rune, 0, len(text)))
	if len(cpts) == 0 {
		return nil
	}
	lens := []int{len(cpts)}
	var next []int
	for _, s := range pt.splits {
		next = next[:0]
		start := 0
		for _, n := range lens {
			next = s(cpts, start, start+n, next)
			start += n
		}
		lens, next = next, lens
	}
	words := make([]string, 0, len(lens))
	var raw, enc []byte
	start := 0
	for _, n := range lens {
		raw = raw[:0]
		for _, r := range cpts[start : start+n] {
			raw = appendRune(raw, r)
		}
		start += n
		enc = enc[:0]
		for _, b := range raw {
			enc = append(enc, byteRunes[b]...)
		}
		words = append(words, string(enc))
	}
	return words
}

// byteRunes maps each byte to the UTF-8 of the printable code point GPT-2's
// byte-level BPE uses for it; runeBytes is the inverse.
var byteRunes, runeBytes = byteTables()

func byteTables() ([256]string, map[rune]byte) {
	var fwd [256]string
	inv := make(map[rune]byte, 256)
	n := 0
	for b := range 256 {
		r := rune(b)
		if !((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) {
			r = rune(256 + n)
			n++
		}
		fwd[b] = string(r)
		inv[r] = byte(b)
	}
	return fwd, inv
}
