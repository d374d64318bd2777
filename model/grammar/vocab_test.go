package grammar

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/strata-llm/strata/model/gguf"
	"github.com/strata-llm/strata/model/tokenizer"
)

// sharedDir is where the shared test files live, relative to this package.
const sharedDir = "../../../shared"

// testVocab is a vocabulary for the tests: a real tokenizer's, or a small
// synthetic one when the file is absent.
type testVocab struct {
	name string
	v    *Vocab
	tok  *tokenizer.Tokenizer // nil for the synthetic vocabulary
}

// encode tokenizes text the way the model would see it, or, for the
// synthetic vocabulary, greedily by the longest token.
func (tv *testVocab) encode(text string) []int32 {
	if tv.tok != nil {
		return tv.tok.Encode(text, tokenizer.EncodeOptions{})
	}
	var out []int32
	for b := []byte(text); len(b) > 0; {
		best, bestLen := int32(-1), 0
		for id := range int32(tv.v.size) {
			tb := tv.v.bytes(id)
			if len(tb) > bestLen && bytes.HasPrefix(b, tb) {
				best, bestLen = id, len(tb)
			}
		}
		out = append(out, best)
		b = b[bestLen:]
	}
	return out
}

var (
	vocabMu    sync.Mutex
	vocabCache = map[string]*testVocab{}
)

// loadVocab returns the vocabulary of shared/tokenizers/<file>, or the
// synthetic one (logged) when the file is absent.
func loadVocab(t testing.TB, file string) *testVocab {
	t.Helper()
	vocabMu.Lock()
	defer vocabMu.Unlock()
	if tv, ok := vocabCache[file]; ok {
		if tv.tok == nil {
			t.Logf("%s is absent: using a synthetic %d-token vocabulary", file, tv.v.size)
		}
		return tv
	}
	path := filepath.Join(sharedDir, "tokenizers", file)
	tv := &testVocab{name: file}
	if _, err := os.Stat(path); err != nil {
		t.Logf("%s is absent (%v): using a synthetic vocabulary", path, err)
		tv.name = "synthetic"
		tv.v = syntheticVocab(0)
	} else {
		f, err := gguf.Open(path)
		if err != nil {
			t.Fatalf("gguf.Open(%s): %v", path, err)
		}
		defer f.Close()
		tok, err := tokenizer.FromGGUF(f)
		if err != nil {
			t.Fatalf("FromGGUF(%s): %v", path, err)
		}
		tv.tok, tv.v = tok, NewVocab(tok)
	}
	vocabCache[file] = tv
	return tv
}

// syntheticWords are multi-byte tokens of the kind JSON output uses.
var syntheticWords = []string{
	`{"`, `":`, `",`, `"}`, `"]`, `},`, `}]`, `}}`, `]}`, `":"`, `","`, `": "`, `", "`,
	` {`, ` "`, ` [`, `[{`, `[]`, `{}`, `true`, `false`, `null`, ` true`, ` null`,
	"\n", "\n ", "\n  ", "\n    ", ` `, `  `, `name`, ` the`, `age`, `ing`, `123`, `0.`, `.5`, `e+`,
	`\n`, `\"`, `\u00`, `é`, `😀`, "\xe2\x82", "\xac", `"}]}`, `]]`, `}}}`, `,"`,
}

// syntheticVocab returns a vocabulary with every byte, syntheticWords,
// extra tokens up to size (variants: words with prefixes and suffixes)
// and one end-of-generation token, the last.
func syntheticVocab(size int) *Vocab {
	var toks [][]byte
	seen := map[string]bool{}
	add := func(b []byte) {
		if !seen[string(b)] {
			seen[string(b)] = true
			toks = append(toks, b)
		}
	}
	for c := range 256 {
		add([]byte{byte(c)})
	}
	for _, w := range syntheticWords {
		add([]byte(w))
	}
	prefixes := []string{"", " ", "Ġ", "_", "\n", "\"", " \"", "{", "[", ","}
	suffixes := []string{"", "s", "ed", "\"", "\":", "\",", "}", "]", "1", " x"}
	for i := 0; len(toks) < size-1; i++ {
		w := syntheticWords[i%len(syntheticWords)]
		p := prefixes[(i/len(syntheticWords))%len(prefixes)]
		s := suffixes[(i/len(syntheticWords)/len(prefixes))%len(suffixes)]
		n := i / (len(syntheticWords) * len(prefixes) * len(suffixes))
		mid := ""
		for ; n > 0; n /= 26 {
			mid += string(rune('a' + n%26))
		}
		add([]byte(p + mid + w + s))
		if i > 50*size {
			break
		}
	}
	eog := int32(len(toks))
	return newVocab(len(toks)+1, func(id int32) []byte {
		if id == eog {
			return nil
		}
		return toks[id]
	}, func(id int32) bool { return id == eog })
}

// TestVocabTrie checks the trie against the token list: every token sits
// at the node its bytes lead to, in preorder, inside its ancestors'
// subtrees.
func TestVocabTrie(t *testing.T) {
	for _, file := range []string{"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"} {
		tv := loadVocab(t, file)
		v := tv.v
		found := make([]bool, v.size)
		var path []byte
		for i := 1; i < len(v.byt); i++ {
			d := int(v.depth[i])
			path = append(path[:d-1], v.byt[i])
			if v.end[i] <= int32(i) || v.end[i] > int32(len(v.byt)) {
				t.Fatalf("%s: node %d: end %d", tv.name, i, v.end[i])
			}
			for _, id := range v.ids[v.tokStart[i]:v.tokStart[i+1]] {
				if !bytes.Equal(v.bytes(id), path) {
					t.Fatalf("%s: token %d %q at node %d with path %q", tv.name, id, v.bytes(id), i, path)
				}
				found[id] = true
			}
		}
		for id := range int32(v.size) {
			if len(v.bytes(id)) > 0 && !found[id] {
				t.Errorf("%s: token %d %q not in the trie", tv.name, id, v.bytes(id))
			}
		}
		if len(v.eog) == 0 {
			t.Errorf("%s: no end-of-generation token", tv.name)
		}
	}
}
