package tokenizer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMinTokens: the bound never exceeds the real count, on the synthetic
// vocabulary and on every shared vocabulary's test texts (Phi-3's strips
// whitespace around its special tokens), with and without special tokens
// parsed; and it is a useful bound, not zero, for long texts.
func TestMinTokens(t *testing.T) {
	texts := []string{"", " ", "Hello world", "<|user|>   \n\n  hi  <|end|>  ", strings.Repeat("<s>", 50), strings.Repeat(" ", 1000) + "x"}
	tiny, err := New(tinySPM())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range texts {
		checkMinTokens(t, "tiny", tiny, s, tiny.Encode(s, EncodeOptions{}), tiny.Encode(s, EncodeOptions{AddSpecial: true, ParseSpecial: true}))
	}
	long := strings.Repeat("Once upon a time there was a little girl named Lily. ", 400)
	if m, n := tiny.MinTokens(long), len(tiny.Encode(long, EncodeOptions{})); m < len(long)/tiny.maxCover/2 || m > n {
		t.Errorf("tiny: MinTokens of %d bytes = %d (max cover %d), encodes to %d", len(long), m, tiny.maxCover, n)
	}
	for _, name := range []string{"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-phi-3.gguf"} {
		t.Run(name, func(t *testing.T) {
			tok := sharedTokenizer(t, filepath.Join("tokenizers", name))
			inp, err := os.ReadFile(filepath.Join(sharedDir, "tokenizers", name+".inp"))
			if err != nil {
				t.Fatal(err)
			}
			all := append(texts, strings.Split(string(inp), "\n__ggml_vocab_test__\n")...)
			all = append(all, long, "<|user|>"+strings.Repeat("\n", 500)+"<|end|>"+strings.Repeat(" ", 500))
			for _, s := range all {
				checkMinTokens(t, name, tok, s, tok.Encode(s, EncodeOptions{}), tok.Encode(s, EncodeOptions{AddSpecial: true, ParseSpecial: true}))
			}
			m, n := tok.MinTokens(long), len(tok.Encode(long, EncodeOptions{}))
			t.Logf("%s: longest token covers %d bytes; %d-byte story: bound %d, tokens %d", name, tok.maxCover, len(long), m, n)
			if m == 0 {
				t.Errorf("MinTokens of a %d-byte text is 0", len(long))
			}
		})
	}
}
