package tokenizer

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// noIDs returns a Vocab with every special-token ID absent.
func noIDs(v Vocab) Vocab {
	v.BOS, v.EOS, v.EOT, v.EOM, v.UNK, v.PAD = -1, -1, -1, -1, -1, -1
	v.FIMPre, v.FIMSuf, v.FIMMid, v.FIMPad, v.FIMRep, v.FIMSep = -1, -1, -1, -1, -1, -1
	return v
}

// tinySPM is a small SentencePiece vocabulary: the three specials, 256 byte
// tokens, a user-defined token and a few scored pieces.
func tinySPM() Vocab {
	v := noIDs(Vocab{Model: ModelSPM, AddBOS: true, AddSpacePrefix: true})
	add := func(s string, score float32, typ int32) {
		v.Tokens = append(v.Tokens, s)
		v.Scores = append(v.Scores, score)
		v.Types = append(v.Types, typ)
	}
	add("<unk>", 0, TypeUnknown)
	add("<s>", 0, TypeControl)
	add("</s>", 0, TypeControl)
	for b := range 256 {
		add(fmt.Sprintf("<0x%02X>", b), 0, TypeByte)
	}
	add("▁", -1, TypeNormal)            // 259
	add("a", -2, TypeNormal)            // 260
	add("b", -2, TypeNormal)            // 261
	add("▁a", -3, TypeNormal)           // 262
	add("ab", -1.5, TypeNormal)         // 263
	add("▁ab", -4, TypeNormal)          // 264
	add("<|user|>", 0, TypeUserDefined) // 265
	add("c", -2, TypeNormal)            // 266
	add("bc", -1, TypeNormal)           // 267
	v.UNK, v.BOS, v.EOS = 0, 1, 2
	return v
}

func mustNew(t *testing.T, v Vocab) *Tokenizer {
	t.Helper()
	tok, err := New(v)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return tok
}

func TestSPMMerges(t *testing.T) {
	tok := mustNew(t, tinySPM())
	tests := []struct {
		in   string
		opt  EncodeOptions
		want []int32
	}{
		{"", EncodeOptions{}, []int32{}},
		{"", EncodeOptions{AddSpecial: true}, []int32{1}},
		{"ab", EncodeOptions{}, []int32{264}},
		{"ab", EncodeOptions{AddSpecial: true}, []int32{1, 264}},
		// "▁a"+"b"... "ab" (-1.5) loses to "bc" (-1) in "abc": a, bc.
		{"abc", EncodeOptions{}, []int32{262, 267}},
		// é is not a piece: bytes.
		{"é", EncodeOptions{}, []int32{259, 3 + 0xC3, 3 + 0xA9}},
		// A user-defined token is split out even without ParseSpecial, and
		// the text after it gets a dummy prefix.
		{"a<|user|>b", EncodeOptions{}, []int32{262, 265, 259, 261}},
		// Control tokens only with ParseSpecial.
		{"</s>", EncodeOptions{ParseSpecial: true}, []int32{2}},
		{"a b", EncodeOptions{}, []int32{262, 259, 261}},
	}
	for _, tc := range tests {
		got := tok.Encode(tc.in, tc.opt)
		if diff := cmp.Diff(got, tc.want); diff != "" {
			t.Errorf("Encode(%q, %+v) (-got +want):\n%s", tc.in, tc.opt, diff)
		}
	}
	if got := tok.Decode([]int32{1, 264, 2}); got != "ab" {
		t.Errorf("Decode(BOS ▁ab EOS) = %q, want %q", got, "ab")
	}
	if got := string(tok.TokenBytes(262)); got != " a" {
		t.Errorf("TokenBytes(▁a) = %q, want %q", got, " a")
	}
	if got := tok.TokenBytes(1); len(got) != 0 {
		t.Errorf("TokenBytes(<s>) = %q, want nothing", got)
	}
	if got := tok.Decode([]int32{259, 262}); got != " a" {
		t.Errorf("Decode(▁ ▁a) = %q, want %q", got, " a")
	}
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(*Vocab)
		target error
		msg    string
	}{
		{"model", func(v *Vocab) { v.Model = "bert" }, ErrUnsupported, "bert"},
		{"empty", func(v *Vocab) { v.Tokens, v.Scores, v.Types = nil, nil, nil }, ErrInvalid, "no tokens"},
		{"dup", func(v *Vocab) { v.Tokens[260] = "b" }, ErrInvalid, "duplicate"},
		{"bos range", func(v *Vocab) { v.BOS = 9999 }, ErrInvalid, "BOS"},
		{"add bos", func(v *Vocab) { v.BOS = -1 }, ErrInvalid, "AddBOS"},
		{"scores", func(v *Vocab) { v.Scores = v.Scores[:3] }, ErrInvalid, "scores"},
	}
	for _, tc := range tests {
		v := tinySPM()
		tc.edit(&v)
		_, err := New(v)
		if !errors.Is(err, tc.target) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: err = %v, want %v mentioning %q", tc.name, err, tc.target, tc.msg)
		}
	}
}

func TestEOGAndStrip(t *testing.T) {
	v := tinySPM()
	v.Tokens = append(v.Tokens, "<|end|>", "<|assistant|>")
	v.Scores = append(v.Scores, 0, 0)
	v.Types = append(v.Types, TypeUserDefined, TypeUserDefined)
	v.Name = "Phi-3 mini"
	tok := mustNew(t, v)
	end, asst := int32(len(v.Tokens)-2), int32(len(v.Tokens)-1)
	if !tok.IsEOG(end) || !tok.IsEOG(2) || tok.IsEOG(asst) || tok.IsEOG(-1) {
		t.Errorf("IsEOG: end %v eos %v assistant %v", tok.IsEOG(end), tok.IsEOG(2), tok.IsEOG(asst))
	}
	if tok.EOT() != end {
		t.Errorf("EOT() = %d, want %d (found by text)", tok.EOT(), end)
	}
	// <|end|> became a control token (EOG text); <|assistant|> is
	// user-defined and, for Phi-3, strips the whitespace after it.
	// Without ParseSpecial the control token stays text.
	got := tok.Encode("<|assistant|>\n ab<|end|>", EncodeOptions{})
	if len(got) < 3 || got[0] != asst || got[1] != 264 || slices.Contains(got, end) {
		t.Errorf("Encode = %v, want %v then <|end|> spelled out", got, []int32{asst, 264})
	}
	got = tok.Encode("<|assistant|>\n ab<|end|>", EncodeOptions{ParseSpecial: true})
	if diff := cmp.Diff(got, []int32{asst, 264, end}); diff != "" {
		t.Errorf("Encode with ParseSpecial (-got +want):\n%s", diff)
	}
	if got := tok.Decode([]int32{asst, 264, end}); got != "<|assistant|> ab" {
		t.Errorf("Decode = %q", got)
	}
}

// tinyBPE is a byte-level vocabulary with a few merges.
func tinyBPE() Vocab {
	v := noIDs(Vocab{Model: ModelBPE, Pre: "gpt-2"})
	for b := range 256 {
		v.Tokens = append(v.Tokens, byteRunes[b])
	}
	v.Tokens = append(v.Tokens, "he", "ll", "hell", "hello", "Ġw", "Ġwo", "<|endoftext|>")
	v.Merges = []string{"h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"}
	v.Types = make([]int32, len(v.Tokens))
	for i := range v.Types {
		v.Types[i] = TypeNormal
	}
	v.Types[len(v.Types)-1] = TypeControl
	v.EOS = int32(len(v.Tokens) - 1)
	return v
}

func TestBPEMerges(t *testing.T) {
	tok := mustNew(t, tinyBPE())
	id := func(s string) int32 {
		i, ok := tok.Lookup(s)
		if !ok {
			t.Fatalf("no token %q", s)
		}
		return i
	}
	got := tok.Encode("hello wow", EncodeOptions{AddSpecial: true})
	want := []int32{id("hello"), id("Ġwo"), id("w")}
	if diff := cmp.Diff(got, want); diff != "" {
		t.Errorf("Encode (-got +want):\n%s", diff)
	}
	if s := tok.Decode(got); s != "hello wow" {
		t.Errorf("Decode = %q", s)
	}
	if !tok.IsEOG(id("<|endoftext|>")) {
		t.Error("<|endoftext|> is not EOG")
	}
	// Invalid UTF-8 becomes U+FFFD before byte encoding, as in llama.cpp.
	if s := tok.Decode(tok.Encode("a\xffb", EncodeOptions{})); s != "a\uFFFDb" {
		t.Errorf("round trip of invalid UTF-8 = %q", s)
	}
}

func TestDecoderByteTokens(t *testing.T) {
	tok := mustNew(t, tinySPM())
	bt := func(b byte) int32 { return 3 + int32(b) }
	tests := []struct {
		name string
		ids  []int32
		want []string // Add results, then Flush
	}{
		{"llama split", []int32{bt(0xF0), bt(0x9F), bt(0xA6), bt(0x99), 260}, []string{"", "", "", "🦙", "a", ""}},
		{"two-byte", []int32{262, bt(0xC3), bt(0xA9)}, []string{" a", "", "é", ""}},
		{"invalid byte", []int32{bt(0xFF), 260}, []string{"\uFFFD", "a", ""}},
		{"cut short", []int32{bt(0xE2), bt(0x82)}, []string{"", "", "\uFFFD\uFFFD"}},
		{"interrupted", []int32{bt(0xE2), 260}, []string{"", "\uFFFDa", ""}},
		{"control", []int32{1, bt(0xC3), 2, bt(0xA9)}, []string{"", "", "", "é", ""}},
	}
	for _, tc := range tests {
		d := tok.NewDecoder()
		var got []string
		for _, id := range tc.ids {
			got = append(got, d.Add(id))
		}
		got = append(got, d.Flush())
		if diff := cmp.Diff(got, tc.want); diff != "" {
			t.Errorf("%s (-got +want):\n%s", tc.name, diff)
		}
	}
}

// TestDecoderStreams feeds real tokenizations through a Decoder one token at
// a time: every chunk is valid UTF-8 and the chunks add up to the text.
func TestDecoderStreams(t *testing.T) {
	texts := []string{"héllo 🦙 wörld", "🚀 (normal) 😶‍🌫️ ✅", "កាន់តែពិសេស", "нещо на Български", "我想在apple工作"}
	for _, name := range []string{"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"} {
		tok := sharedTokenizer(t, "tokenizers/"+name)
		for _, s := range texts {
			ids := tok.Encode(s, EncodeOptions{})
			d := tok.NewDecoder()
			var sb strings.Builder
			split := false
			for _, id := range ids {
				chunk := d.Add(id)
				if !utf8.ValidString(chunk) {
					t.Errorf("%s %q: chunk %q is not valid UTF-8", name, s, chunk)
				}
				if chunk == "" {
					split = true
				}
				sb.WriteString(chunk)
			}
			sb.WriteString(d.Flush())
			want := s
			if tok.spm {
				want = " " + s // the Decoder keeps the dummy prefix
			}
			if sb.String() != want {
				t.Errorf("%s: streamed %q, want %q", name, sb.String(), want)
			}
			if !split && strings.ContainsAny(s, "🦙🚀") {
				t.Errorf("%s %q: expected some character split across tokens", name, s)
			}
		}
	}
}

// TestConcurrentUse encodes and decodes from many goroutines at once; run
// with -race it checks that a Tokenizer is safe for concurrent use.
func TestConcurrentUse(t *testing.T) {
	tok := sharedTokenizer(t, "tokenizers/ggml-vocab-gpt-2.gguf")
	spm := mustNew(t, tinySPM())
	texts := []string{"Hello world", "🦙 and <|endoftext|>", "a<|user|>b abc é"}
	want := make([][]int32, len(texts))
	for i, s := range texts {
		want[i] = tok.Encode(s, EncodeOptions{ParseSpecial: true})
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				k := (g + i) % len(texts)
				got := tok.Encode(texts[k], EncodeOptions{ParseSpecial: true})
				if !slices.Equal(got, want[k]) {
					t.Errorf("goroutine %d: Encode(%q) = %v, want %v", g, texts[k], got, want[k])
					return
				}
				// (No special token in the text: one would add a dummy prefix.)
				if s := spm.Decode(spm.Encode(texts[0], EncodeOptions{})); s != texts[0] {
					t.Errorf("goroutine %d: SPM round trip %q = %q", g, texts[0], s)
					return
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkEncode(b *testing.B) {
	for _, name := range []string{"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"} {
		tok := sharedTokenizer(b, "tokenizers/"+name)
		text := strings.Repeat("The quick brown fox jumps over the lazy dog, naïvely — 123 456!\n", 200)
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tok.Encode(text, EncodeOptions{})
			}
		})
	}
}
