package grammar

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/strata-llm/strata/model/grammar/grammartest"
)

// TestWrapped: a wrapped grammar accepts exactly prefix, a value of the
// schema, suffix; random walks under its masks produce such documents.
func TestWrapped(t *testing.T) {
	schema := `{"type":"object","properties":{"name":{"const":"get_weather"},"arguments":{"type":"object","properties":{"city":{"type":"string","maxLength":8},"days":{"type":"integer"}},"required":["city","days"],"additionalProperties":false}},"required":["name","arguments"],"additionalProperties":false}`
	g, err := Compile(WrapFormat("<tool_call>\n", []byte(schema), "\n</tool_call>"))
	if err != nil {
		t.Fatal(err)
	}
	for doc, want := range map[string]bool{
		"<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":3}}\n</tool_call>":   true,
		"<tool_call>\n {\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":3}}\n</tool_call>":  true,
		"<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":3}} \n</tool_call>":  false, // no gap before the suffix
		"<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":3}}\n</tool_call>\n": false,
		"<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":3}}":                 false,
		" <tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":3}}\n</tool_call>":  false,
		"<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":3}}\n</tool_call>":     false,
	} {
		if g.Match([]byte(doc)) != want {
			t.Errorf("Match(%q) = %v, want %v", doc, !want, want)
		}
	}
	if !g.MatchPrefix([]byte("<tool_c")) || !g.MatchPrefix([]byte("<tool_call>\n{\"name\":\"get_")) || g.MatchPrefix([]byte("<tool_x")) {
		t.Error("MatchPrefix")
	}
	// A number value followed at once by the suffix.
	gn, err := Compile(WrapFormat("[ARGS]", []byte(`{"type":"integer"}`), "]"))
	if err != nil {
		t.Fatal(err)
	}
	if !gn.Match([]byte("[ARGS]12]")) || gn.Match([]byte("[ARGS]12 ]")) {
		t.Error("integer between prefix and suffix")
	}

	val := grammartest.NewValidator(t, schema)
	tv := loadVocab(t, "ggml-vocab-llama-spm.gguf")
	r := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		doc, _ := randomWalk(t, g, tv, r, 40)
		body, ok := bytes.CutPrefix(doc, []byte("<tool_call>\n"))
		body, ok2 := bytes.CutSuffix(body, []byte("\n</tool_call>"))
		if !ok || !ok2 {
			t.Fatalf("walk %q: not wrapped", doc)
		}
		if err := val.Validate(body); err != nil {
			t.Fatalf("walk %q: %v", doc, err)
		}
	}
}

// TestWrappedRepeat: with a separator, a wrapped grammar accepts one or
// more wrapped values (as a model writes several tool calls), and random
// walks under its masks, budgeted or not, end as such.
func TestWrappedRepeat(t *testing.T) {
	schema := `{"type":"object","properties":{"name":{"enum":["a","bb"]},"arguments":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],"additionalProperties":false}},"required":["name","arguments"],"additionalProperties":false}`
	call := `{"name":"a","arguments":{"n":1}}`
	for _, tc := range []struct {
		pre, suf, sep string
		docs          map[string]bool
	}{
		{"<tool_call>\n", "\n</tool_call>", "\n", map[string]bool{
			"<tool_call>\n" + call + "\n</tool_call>":                                          true,
			"<tool_call>\n" + call + "\n</tool_call>\n<tool_call>\n" + call + "\n</tool_call>": true,
			"<tool_call>\n" + call + "\n</tool_call><tool_call>\n" + call + "\n</tool_call>":   false,
			"<tool_call>\n" + call + "\n</tool_call>\n":                                        false,
		}},
		{"", "", ";", map[string]bool{
			call: true, call + ";" + call: true, call + " ; " + call: true, call + ";": false, call + call: false,
		}},
		{"[TOOL_CALLS]a[ARGS]", "", "", map[string]bool{
			"[TOOL_CALLS]a[ARGS]" + call:                                true,
			"[TOOL_CALLS]a[ARGS]" + call + "[TOOL_CALLS]a[ARGS]" + call: true,
			"[TOOL_CALLS]a[ARGS]" + call + "[TOOL_CALLS]":               false,
		}},
	} {
		g, err := Compile(WrapRepeatFormat(tc.pre, []byte(schema), tc.suf, tc.sep))
		if err != nil {
			t.Fatal(err)
		}
		for doc, want := range tc.docs {
			if g.Match([]byte(doc)) != want {
				t.Errorf("%q: Match(%q) = %v, want %v", tc.pre, doc, !want, want)
			}
		}
		if got, want := g.MinLen(), len(tc.pre)+len(`{"name":"a","arguments":{"n":0}}`)+len(tc.suf); got != want {
			t.Errorf("%q: MinLen %d, want %d", tc.pre, got, want)
		}
		tv := loadVocab(t, "ggml-vocab-llama-spm.gguf")
		r := rand.New(rand.NewPCG(5, 6))
		m := g.NewMatcher(tv.v)
		several := false
		for w := range 12 {
			var doc []byte
			if w%2 == 0 {
				doc, _ = randomWalk(t, g, tv, r, 60)
			} else {
				m.Reset()
				doc, _ = budgetedWalk(t, m, tv, r, g.MinLen()+w)
			}
			if !g.Match(doc) {
				t.Errorf("%q: walk %q does not match", tc.pre, doc)
			}
			several = several || bytes.Count(doc, []byte(`"name"`)) > 1
		}
		if !several {
			t.Errorf("%q: no walk wrote more than one value", tc.pre)
		}
	}
	if _, err := Compile(WrapRepeatFormat("", []byte(schema), "", "")); err == nil {
		t.Error("a repeat with neither separator nor prefix compiled")
	}
}
