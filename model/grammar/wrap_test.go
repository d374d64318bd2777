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
