package tokenizer

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/strata-llm/strata/model/gguf"
)

// sharedDir is where the shared test files live, relative to this package.
const sharedDir = "../../../shared"

// loadShared opens a tokenizer from a GGUF file under sharedDir, skipping the
// test when the file is absent.
func loadShared(t testing.TB, rel string) *Tokenizer {
	t.Helper()
	path := filepath.Join(sharedDir, rel)
	if _, err := os.Stat(path); err != nil {
		sharedAbsent(t, path, err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatalf("gguf.Open(%s): %v", path, err)
	}
	defer f.Close()
	tok, err := FromGGUF(f)
	if err != nil {
		t.Fatalf("FromGGUF(%s): %v", path, err)
	}
	return tok
}

var (
	cacheMu sync.Mutex
	cache   = map[string]*Tokenizer{}
)

// sharedTokenizer is loadShared with a cache, for the fuzz target and tests
// that load the same vocabulary more than once.
func sharedTokenizer(t testing.TB, rel string) *Tokenizer {
	t.Helper()
	cacheMu.Lock()
	defer cacheMu.Unlock()
	if tok, ok := cache[rel]; ok {
		return tok
	}
	tok := loadShared(t, rel)
	cache[rel] = tok
	return tok
}

type vector struct {
	text string
	want []int32
}

// readVectors reads NAME.gguf.inp and NAME.gguf.out the way llama.cpp's
// test-tokenizer-0 does: inputs are separated by "\n__ggml_vocab_test__\n"
// (the file ends with one), outputs are one line of space-separated IDs each.
func readVectors(t *testing.T, name string) []vector {
	t.Helper()
	base := filepath.Join(sharedDir, "tokenizers", name)
	inp, err := os.ReadFile(base + ".inp")
	if err != nil {
		sharedAbsent(t, base+".inp", err)
	}
	out, err := os.ReadFile(base + ".out")
	if err != nil {
		t.Fatal(err)
	}
	const sep = "\n__ggml_vocab_test__\n"
	var texts []string
	for s := string(inp); s != ""; {
		i := strings.Index(s, sep)
		if i < 0 {
			texts = append(texts, s)
			break
		}
		texts = append(texts, s[:i])
		s = s[i+len(sep):]
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(texts) {
		t.Fatalf("%s: %d inputs but %d outputs", name, len(texts), len(lines))
	}
	vs := make([]vector, len(texts))
	for i, line := range lines {
		vs[i].text = texts[i]
		vs[i].want = []int32{}
		for _, f := range strings.Fields(line) {
			id, err := strconv.ParseInt(f, 10, 32)
			if err != nil {
				t.Fatalf("%s.out line %d: %v", name, i+1, err)
			}
			vs[i].want = append(vs[i].want, int32(id))
		}
	}
	return vs
}

// TestVectors checks every llama.cpp test vector, tokenized as
// test-tokenizer-0 does (add_special=false, parse_special=false), and that
// decoding gives the text back.
func TestVectors(t *testing.T) {
	for _, name := range []string{"ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf", "ggml-vocab-gpt-2.gguf"} {
		t.Run(name, func(t *testing.T) {
			vs := readVectors(t, name)
			tok := loadShared(t, filepath.Join("tokenizers", name))
			pass := 0
			for i, v := range vs {
				got := tok.Encode(v.text, EncodeOptions{})
				if got == nil {
					got = []int32{}
				}
				if diff := cmp.Diff(got, v.want); diff != "" {
					t.Errorf("vector %d %q: Encode (-got +want):\n%s", i, v.text, diff)
					continue
				}
				pass++
				if dec := tok.Decode(got); dec != v.text {
					t.Errorf("vector %d: Decode(Encode(%q)) = %q", i, v.text, dec)
				}
			}
			t.Logf("%s: %d/%d vectors match", name, pass, len(vs))
		})
	}
}

func TestStories260K(t *testing.T) {
	tok := loadShared(t, "models/stories260K.gguf")
	if got := tok.VocabSize(); got != 512 {
		t.Errorf("VocabSize() = %d, want 512", got)
	}
	got := tok.Encode("Once upon a time", EncodeOptions{AddSpecial: true})
	want := []int32{1, 403, 407, 261, 378}
	if diff := cmp.Diff(got, want); diff != "" {
		t.Errorf("Encode (-got +want):\n%s", diff)
	}
	if dec := tok.Decode(got); dec != "Once upon a time" {
		t.Errorf("Decode = %q", dec)
	}
	if tok.BOS() != 1 || tok.EOS() != 2 || !tok.IsEOG(2) || tok.IsEOG(1) {
		t.Errorf("BOS %d EOS %d IsEOG(2) %v IsEOG(1) %v", tok.BOS(), tok.EOS(), tok.IsEOG(2), tok.IsEOG(1))
	}
}

func TestSpecialTokensLlama(t *testing.T) {
	tok := sharedTokenizer(t, "tokenizers/ggml-vocab-llama-spm.gguf")
	if tok.BOS() != 1 || tok.EOS() != 2 || tok.UNK() != 0 || !tok.AddBOS() || tok.AddEOS() {
		t.Fatalf("BOS %d EOS %d UNK %d AddBOS %v AddEOS %v", tok.BOS(), tok.EOS(), tok.UNK(), tok.AddBOS(), tok.AddEOS())
	}
	if got := tok.Piece(15043); got != "▁Hello" {
		t.Errorf("Piece(15043) = %q", got)
	}
	// With AddSpecial, BOS comes first and the text still gets its dummy
	// prefix; Decode drops both.
	got := tok.Encode("Hello world", EncodeOptions{AddSpecial: true})
	if diff := cmp.Diff(got, []int32{1, 15043, 3186}); diff != "" {
		t.Errorf("Encode (-got +want):\n%s", diff)
	}
	if dec := tok.Decode(got); dec != "Hello world" {
		t.Errorf("Decode = %q", dec)
	}
	// "</s>" is a control token: literal text unless ParseSpecial.
	plain := tok.Encode("a</s>b", EncodeOptions{})
	parsed := tok.Encode("a</s>b", EncodeOptions{ParseSpecial: true})
	// As in llama.cpp, text after a special token gets a dummy prefix too.
	if diff := cmp.Diff(parsed, []int32{263, 2, 289}); diff != "" {
		t.Errorf("ParseSpecial (-got +want):\n%s", diff)
	}
	for _, id := range plain {
		if id == 2 {
			t.Errorf("Encode without ParseSpecial produced EOS: %v", plain)
		}
	}
	if dec := tok.Decode(parsed); dec != "a b" {
		t.Errorf("Decode(%v) = %q, want control token dropped", parsed, dec)
	}
}

func TestSpecialTokensGPT2(t *testing.T) {
	tok := sharedTokenizer(t, "tokenizers/ggml-vocab-gpt-2.gguf")
	eot, ok := tok.Lookup("<|endoftext|>")
	if !ok {
		t.Fatal("no <|endoftext|>")
	}
	if !tok.IsEOG(eot) {
		t.Errorf("IsEOG(<|endoftext|>) = false")
	}
	if tok.AddBOS() {
		t.Errorf("AddBOS() = true for GPT-2")
	}
	got := tok.Encode("Hi<|endoftext|>", EncodeOptions{ParseSpecial: true})
	if len(got) < 2 || got[len(got)-1] != eot {
		t.Errorf("Encode with ParseSpecial = %v, want it to end with %d", got, eot)
	}
	got = tok.Encode("Hi<|endoftext|>", EncodeOptions{})
	for _, id := range got {
		if id == eot {
			t.Errorf("Encode without ParseSpecial = %v contains <|endoftext|>", got)
		}
	}
	// Byte-level round trip of text the vectors do not cover.
	for _, s := range []string{"tab\tand\r\nCRLF", "émoji 🦙🦙 and ZWJ 👨‍👩‍👧", "日本語のテキスト", "\x00\x01 control"} {
		if dec := tok.Decode(tok.Encode(s, EncodeOptions{})); dec != s {
			t.Errorf("round trip %q: got %q", s, dec)
		}
	}
}

// TestPhi3ChatTemplate encodes a rendered Phi-3 chat the way a server does
// (ParseSpecial): the special tokens are recognised, and, as llama.cpp sets
// for models named Phi-3, each strips the whitespace that follows it.
func TestPhi3ChatTemplate(t *testing.T) {
	tok := sharedTokenizer(t, "tokenizers/ggml-vocab-phi-3.gguf")
	id := func(s string) int32 {
		t.Helper()
		i, ok := tok.Lookup(s)
		if !ok {
			t.Fatalf("no token %q", s)
		}
		return i
	}
	user, end, asst := id("<|user|>"), id("<|end|>"), id("<|assistant|>")
	got := tok.Encode("<|user|>\nHello<|end|>\n<|assistant|>\n", EncodeOptions{AddSpecial: true, ParseSpecial: true})
	want := []int32{1, user, 15043, end, asst}
	if diff := cmp.Diff(got, want); diff != "" {
		t.Errorf("Encode (-got +want):\n%s", diff)
	}
	if !tok.IsEOG(end) || tok.IsEOG(user) {
		t.Errorf("IsEOG(<|end|>) = %v, IsEOG(<|user|>) = %v", tok.IsEOG(end), tok.IsEOG(user))
	}
	// All three are control tokens in this file: Decode drops them.
	if s := tok.Decode(got); s != "Hello" {
		t.Errorf("Decode = %q", s)
	}
}
