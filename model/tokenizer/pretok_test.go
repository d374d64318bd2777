package tokenizer

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// words runs a splitter over s and returns the pieces as strings.
func words(sp []splitter, s string) []string {
	pt := preTokenizer{splits: sp}
	cpts := decodeRunes(s, nil)
	lens := []int{len(cpts)}
	for _, f := range pt.splits {
		var next []int
		start := 0
		for _, n := range lens {
			next = f(cpts, start, start+n, next)
			start += n
		}
		lens = next
	}
	var out []string
	start := 0
	for _, n := range lens {
		out = append(out, string(cpts[start:start+n]))
		start += n
	}
	return out
}

func TestSplitters(t *testing.T) {
	tests := []struct {
		pre  string
		in   string
		want []string
	}{
		{"gpt-2", "Hello world", []string{"Hello", " world"}},
		{"gpt-2", "  Hello", []string{" ", " Hello"}},
		{"gpt-2", "I'll  go!!\n\n", []string{"I", "'ll", " ", " go", "!!", "\n\n"}},
		{"gpt-2", "x  ", []string{"x", "  "}},
		{"gpt-2", "3333 3", []string{"3333", " 3"}},
		{"gpt-2", "WE'LL", []string{"WE", "'", "LL"}},
		{"llama3", "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～",
			[]string{"Hello", ",", " y", "'all", "!", " How", " are", " you", " 😁", " ?", "我想在apple工作", "131", "415", "1", "天", "～"}},
		{"llama3", "WE'LL\r\n\n  x", []string{"WE", "'LL", "\r\n\n", " ", " x"}},
		{"llama3", "a.\n\nb", []string{"a", ".\n\n", "b"}},
		{"llama3", "\t\tfoo", []string{"\t", "\tfoo"}},
		{"qwen2", "abc1234 ", []string{"abc", "1", "2", "3", "4", " "}},
		{"qwen2", "x = 10;\n", []string{"x", " =", " ", "1", "0", ";\n"}},
		{"smollm", "v2.10 abc", []string{"v", "2", ".", "1", "0", " abc"}},
		{"smollm", "a 12", []string{"a", " ", "1", "2"}},
		{"default", "x+=123456;", []string{"x", "+=", "123", "456", ";"}},
	}
	for _, tc := range tests {
		pre, err := lookupPre(tc.pre)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(words(pre.splits, tc.in), tc.want); diff != "" {
			t.Errorf("%s %q (-got +want):\n%s", tc.pre, tc.in, diff)
		}
	}
}

func TestUnknownPre(t *testing.T) {
	v := tinyBPE()
	v.Pre = "no-such-pre"
	if _, err := New(v); err == nil || !strings.Contains(err.Error(), "no-such-pre") {
		t.Errorf("New with unknown pre: err = %v", err)
	}
}

// refSplitter is a reference for the hand-written splitters: llama.cpp's
// regexes as ordered alternatives, each a Go regexp anchored at the current
// position (Go's leftmost-first matching of one alternative agrees with
// backtracking), the \s+(?!\S) lookahead done by hand, and runs of text no
// alternative matches kept as one piece, as std::regex_iterator keeps them.
type refSplitter struct {
	alts []*regexp.Regexp // nil marks \s+(?!\S)
}

// ws is \s as llama.cpp sees it: C's isspace plus the non-ASCII White_Space
// code points, which it collapses to \v.
const ws = `\t\n\v\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}`

func newRef(alts ...string) refSplitter {
	var r refSplitter
	for _, a := range alts {
		if a == "" {
			r.alts = append(r.alts, nil)
			continue
		}
		a = strings.ReplaceAll(a, `[^\s`, `[^`+ws)
		a = strings.ReplaceAll(a, `\s`, `[`+ws+`]`)
		r.alts = append(r.alts, regexp.MustCompile(`^(?:`+a+`)`))
	}
	return r
}

var spaceRE = regexp.MustCompile(`^[` + ws + `]+`)

func (r refSplitter) split(s string) []string {
	c := []rune(s)
	var out []string
	gap := 0
	for pos := 0; pos < len(c); {
		rest := string(c[pos:])
		n := 0
		for _, re := range r.alts {
			if re == nil {
				m := spaceRE.FindString(rest)
				k := len([]rune(m))
				if k > 0 && pos+k < len(c) {
					k-- // (?!\S) fails at the end of the run: give one back
				}
				n = k
			} else if m := re.FindString(rest); m != "" {
				n = len([]rune(m))
			}
			if n > 0 {
				break
			}
		}
		if n == 0 {
			pos++
			gap++
			continue
		}
		if gap > 0 {
			out = append(out, string(c[pos-gap:pos]))
			gap = 0
		}
		out = append(out, string(c[pos:pos+n]))
		pos += n
	}
	if gap > 0 {
		out = append(out, string(c[len(c)-gap:]))
	}
	return out
}

var contractionsCI = `'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]`

// TestSplittersMatchRegex compares the hand-written splitters with the
// regexes llama.cpp uses, on random text over an alphabet chosen to hit
// every branch.
func TestSplittersMatchRegex(t *testing.T) {
	refs := []struct {
		name string
		sp   splitter
		ref  refSplitter
	}{
		{"gpt2", splitGPT2, newRef(`'s|'t|'re|'ve|'m|'ll|'d`, ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`, "", `\s+`)},
		{"llama3", splitLlama3, newRef(contractionsCI, `[^\r\n\p{L}\p{N}]?\p{L}+`, `\p{N}{1,3}`, ` ?[^\s\p{L}\p{N}]+[\r\n]*`, `\s*[\r\n]+`, "", `\s+`)},
		{"qwen2", splitQwen2, newRef(contractionsCI, `[^\r\n\p{L}\p{N}]?\p{L}+`, `\p{N}`, ` ?[^\s\p{L}\p{N}]+[\r\n]*`, `\s*[\r\n]+`, "", `\s+`)},
	}
	alphabet := []rune("aZsStTreEvVlLmMdDé日 \t\n\r\v\u3000\u00a0\u0085'!.,?😁0123٣²\u200d\u0301\x00~")
	rng := rand.New(rand.NewPCG(1, 2))
	for _, r := range refs {
		for i := range 3000 {
			n := rng.IntN(12)
			b := make([]rune, n)
			for k := range b {
				b[k] = alphabet[rng.IntN(len(alphabet))]
			}
			s := string(b)
			got := words([]splitter{r.sp}, s)
			want := r.ref.split(s)
			if diff := cmp.Diff(got, want); diff != "" {
				t.Fatalf("%s case %d %q (-got +want):\n%s", r.name, i, s, diff)
			}
		}
	}
}

func TestDecodeRunes(t *testing.T) {
	tests := []struct {
		in   string
		want []rune
	}{
		{"aé", []rune{'a', 'é'}},
		{"\xff", []rune{0xFFFD}},
		{"\xe2\x82", []rune{0xFFFD, 0xFFFD}},
		{"\xed\xa0\x80", []rune{0xD800}}, // llama.cpp does not reject surrogates
		{"\xc3", []rune{0xFFFD}},
	}
	for _, tc := range tests {
		if diff := cmp.Diff(decodeRunes(tc.in, nil), tc.want); diff != "" {
			t.Errorf("decodeRunes(%q) (-got +want):\n%s", tc.in, diff)
		}
	}
}
