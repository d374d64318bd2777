package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// Piece returns the token's raw text as the vocabulary stores it ("▁Hello",
// "Ġworld", "<0x0A>", "<|im_end|>"), or "" for an ID out of range.
func (t *Tokenizer) Piece(id int32) string {
	if id < 0 || int(id) >= len(t.tokens) {
		return ""
	}
	return t.tokens[id]
}

// appendText appends the bytes token id stands for, as llama.cpp's
// token_to_piece with special=false renders them: control and unknown
// tokens render as nothing, user-defined tokens as their text, SPM's U+2581
// as a space, GPT-2's byte alphabet as the bytes, byte tokens as their byte.
func (t *Tokenizer) appendText(b []byte, id int32) []byte {
	if id < 0 || int(id) >= len(t.tokens) {
		return b
	}
	a, s := t.attrs[id], t.tokens[id]
	switch {
	case a&(attrControl|attrUnknown) != 0:
		return b
	case a&attrUserDefined != 0:
		return append(b, s...)
	case a&attrNormal != 0:
		if t.spm {
			for {
				i := strings.Index(s, spaceMark)
				if i < 0 {
					return append(b, s...)
				}
				b = append(b, s[:i]...)
				b = append(b, ' ')
				s = s[i+len(spaceMark):]
			}
		}
		for _, r := range s {
			if c, ok := runeBytes[r]; ok {
				b = append(b, c)
			} else {
				b = utf8.AppendRune(b, r) // not in the byte alphabet: keep it
			}
		}
		return b
	case a&attrByte != 0:
		if c, ok := byteOfToken(s); ok {
			return append(b, c)
		}
	}
	return b
}

// TokenBytes returns the bytes id stands for on its own, as Decode renders
// it without stripping any space: nothing for control and unknown tokens or
// an ID out of range, and possibly part of a UTF-8 character for byte
// tokens and byte-level BPE.
func (t *Tokenizer) TokenBytes(id int32) []byte {
	return t.appendText(nil, id)
}

// byteOfToken returns the byte a byte token stands for: "<0xNN>", or a
// single byte.
func byteOfToken(s string) (byte, bool) {
	if len(s) == 1 {
		return s[0], true
	}
	if len(s) != 6 || s[:3] != "<0x" || s[5] != '>' {
		return 0, false
	}
	hi, ok1 := hexVal(s[3])
	lo, ok2 := hexVal(s[4])
	return hi<<4 | lo, ok1 && ok2
}

func hexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// Decode returns the text of ids. Control and unknown tokens render as
// nothing. For a vocabulary with a dummy prefix (SPM), the leading space of
// the first piece that renders any text is removed — leading control tokens
// such as BOS render nothing — so that Decode(Encode(s, opt)) == s whenever s
// holds no special token's text (after which SPM adds another dummy prefix)
// and no U+2581, and, for byte-level BPE, is valid UTF-8. The result holds
// the bytes the tokens stand for, which need not be valid UTF-8.
func (t *Tokenizer) Decode(ids []int32) string {
	var b []byte
	strip := t.addSpace
	for _, id := range ids {
		n := len(b)
		b = t.appendText(b, id)
		if strip && len(b) > n {
			if b[n] == ' ' {
				b = append(b[:n], b[n+1:]...)
			}
			strip = false
		}
	}
	return string(b)
}

// NewDecoder returns a Decoder for one stream of generated tokens.
func (t *Tokenizer) NewDecoder() *Decoder {
	return &Decoder{t: t}
}

// Decoder turns a stream of tokens into text without ever splitting a UTF-8
// character: bytes that may still become a character are held back until the
// token that completes them arrives. Unlike Decode it keeps the leading space
// of the first token, since generated tokens continue a prompt. A Decoder is
// not safe for concurrent use.
type Decoder struct {
	t       *Tokenizer
	pending []byte
}

// Add decodes id and returns the text completed by it: whole UTF-8
// characters only, with each byte that can start no valid character
// replaced by U+FFFD. Control tokens add nothing.
func (d *Decoder) Add(id int32) string {
	d.pending = d.t.appendText(d.pending, id)
	out, n := validText(d.pending, false)
	d.pending = append(d.pending[:0], d.pending[n:]...)
	return out
}

// Flush returns the bytes still held back, each invalid byte as U+FFFD, and
// resets the Decoder for a new stream.
func (d *Decoder) Flush() string {
	out, _ := validText(d.pending, true)
	d.pending = d.pending[:0]
	return out
}

// validText returns the valid UTF-8 text of b, with invalid bytes replaced by
// U+FFFD, and how many bytes of b it covers. Unless final, it stops before
// a trailing incomplete sequence that later bytes could complete.
func validText(b []byte, final bool) (string, int) {
	var sb strings.Builder
	i := 0
	for i < len(b) {
		if b[i] < utf8.RuneSelf {
			sb.WriteByte(b[i])
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			if !final && !utf8.FullRune(b[i:]) {
				break
			}
			sb.WriteRune(utf8.RuneError)
			i++
			continue
		}
		sb.Write(b[i : i+size])
		i += size
	}
	return sb.String(), i
}
