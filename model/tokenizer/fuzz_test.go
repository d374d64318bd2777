package tokenizer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzRoundTrip encodes random text with an SPM vocabulary (Llama 2's when
// the shared files are present, a small synthetic one otherwise) and checks
// that nothing panics, that decoding gives the text back, and that a Decoder
// streams the same text in valid UTF-8 chunks. With the shared files it
// checks the GPT-2 vocabulary too, on valid UTF-8.
func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{"", " ", "Hello world", "  leading", "é🦙\x00\xff\xc3", "a<|user|>b</s>", "\t\n\r\v"} {
		f.Add(s)
	}
	if inp, err := os.ReadFile(filepath.Join(sharedDir, "tokenizers", "ggml-vocab-llama-spm.gguf.inp")); err == nil {
		for _, s := range strings.Split(string(inp), "\n__ggml_vocab_test__\n") {
			f.Add(s)
		}
	}
	spm, gpt2 := fuzzTokenizers(f)
	f.Fuzz(func(t *testing.T, s string) {
		ids := spm.Encode(s, EncodeOptions{})
		special := spm.Encode(s, EncodeOptions{AddSpecial: true, ParseSpecial: true})
		checkMinTokens(t, "SPM", spm, s, ids, special)
		// SPM with byte fallback is lossless, except that a U+2581 in the
		// input decodes as the space it stands for, and that a malformed
		// lead byte can swallow the U+2581 of a following space into a
		// symbol spelled in bytes (as in llama.cpp).
		lossless := !strings.Contains(s, spaceMark) && (utf8.ValidString(s) || !strings.Contains(s, " "))
		if got := spm.Decode(ids); lossless && got != s {
			t.Fatalf("SPM: Decode(Encode(%q)) = %q (ids %v)", s, got, ids)
		}
		d := spm.NewDecoder()
		var sb strings.Builder
		for _, id := range ids {
			chunk := d.Add(id)
			if !utf8.ValidString(chunk) {
				t.Fatalf("SPM: Decoder chunk %q is not valid UTF-8", chunk)
			}
			sb.WriteString(chunk)
		}
		sb.WriteString(d.Flush())
		if lossless && utf8.ValidString(s) && s != "" && sb.String() != " "+s {
			t.Fatalf("SPM: Decoder streamed %q, want %q", sb.String(), " "+s)
		}

		if gpt2 == nil {
			return
		}
		ids = gpt2.Encode(s, EncodeOptions{})
		special = gpt2.Encode(s, EncodeOptions{AddSpecial: true, ParseSpecial: true})
		checkMinTokens(t, "GPT-2", gpt2, s, ids, special)
		// Byte-level BPE is lossless on valid UTF-8.
		if got := gpt2.Decode(ids); utf8.ValidString(s) && got != s {
			t.Fatalf("GPT-2: Decode(Encode(%q)) = %q (ids %v)", s, got, ids)
		}
	})
}

func fuzzTokenizers(f *testing.F) (spm, gpt2 *Tokenizer) {
	if _, err := os.Stat(filepath.Join(sharedDir, "tokenizers", "ggml-vocab-llama-spm.gguf")); err != nil {
		tok, err := New(tinySPM())
		if err != nil {
			f.Fatal(err)
		}
		return tok, nil
	}
	return sharedTokenizer(f, "tokenizers/ggml-vocab-llama-spm.gguf"),
		sharedTokenizer(f, "tokenizers/ggml-vocab-gpt-2.gguf")
}

// checkMinTokens fails when MinTokens promises more tokens than an encoding
// of s made.
func checkMinTokens(t *testing.T, name string, tok *Tokenizer, s string, encodings ...[]int32) {
	t.Helper()
	for _, ids := range encodings {
		if m := tok.MinTokens(s); m > len(ids) {
			t.Fatalf("%s: MinTokens(%q) = %d, but it encodes to %d tokens", name, s, m, len(ids))
		}
	}
}
