package grammar

import (
	"strings"
	"testing"
)

func mustSchema(t testing.TB, schema string) *Grammar {
	t.Helper()
	g, err := CompileSchema([]byte(schema))
	if err != nil {
		t.Fatalf("CompileSchema(%s): %v", schema, err)
	}
	return g
}

// TestMatch runs the automaton over whole byte strings, valid and invalid
// documents of each schema.
func TestMatch(t *testing.T) {
	tests := []struct {
		name   string
		schema string
		good   []string
		bad    []string
	}{
		{
			name:   "json_object",
			schema: "",
			good: []string{`{}`, `{"a":1}`, ` {"a": [1, 2.5, -3e10, true, false, null, "x", {"b": {}}]}`,
				"{\n  \"a\": \"\\u00e9\\n\",\n  \"b\": []\n}\n", `{"a":"é😀"}`, `{"a":"\ud7ff"}`},
			bad: []string{``, `[]`, `1`, `"x"`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{,}`, `{"a":01}`, `{"a":1.}`,
				`{"a":.5}`, `{"a":+1}`, `{"a":"\x01"}`, `{"a":"\ud800"}`, `{"a":"\q"}`, "{\"a\":\"\xff\"}",
				"{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\xc0\xaf\"}", `{"a":1}}`, `{"a":tru}`, `{"a":nulll}`,
				"{  }", "{\n\n}", "{\n" + strings.Repeat(" ", maxIndent+1) + "}", `{"a":1e100}`,
				`{"a":1234567890123456}`},
		},
		{
			name:   "required properties in order",
			schema: `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"],"additionalProperties":false}`,
			good:   []string{`{"name":"Ann","age":3}`, `{ "name": "", "age": -0 }`, "{\n\t\"name\": \"x\",\n\t\"age\": 12\n}"},
			bad:    []string{`{}`, `{"name":"Ann"}`, `{"age":3,"name":"Ann"}`, `{"name":"Ann","age":3.5}`, `{"name":"Ann","age":3,"x":1}`, `{"name":1,"age":3}`, `{"nam":"Ann","age":3}`},
		},
		{
			name:   "optional properties",
			schema: `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},"required":["b"]}`,
			good:   []string{`{"b":1}`, `{"a":1,"b":2}`, `{"b":2,"c":3}`, `{"a":1,"b":2,"c":3}`},
			bad:    []string{`{}`, `{"a":1}`, `{"a":1,"c":3}`, `{"b":1,"a":2}`, `{"b":1,}`, `{"a":1,"a":1,"b":2}`},
		},
		{
			name:   "array bounds",
			schema: `{"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":3}`,
			good:   []string{`[true]`, `[true,false]`, `[ true , false , true ]`},
			bad:    []string{`[]`, `[true,false,true,false]`, `[1]`, `[true,]`},
		},
		{
			name:   "string lengths",
			schema: `{"type":"string","minLength":2,"maxLength":3}`,
			good:   []string{`"ab"`, `"abc"`, `"é😀"`, `"\n\u0041"`},
			bad:    []string{`""`, `"a"`, `"abcd"`, `"\n"`, `"😀"`},
		},
		{
			name:   "pattern",
			schema: `{"type":"string","pattern":"^[a-c]+-[0-9]{2}$"}`,
			good:   []string{`"a-12"`, `"abcab-00"`, `"\u0061-12"`},
			bad:    []string{`"-12"`, `"a-1"`, `"a-123"`, `"d-12"`, `""`},
		},
		{
			name:   "unanchored pattern",
			schema: `{"type":"string","pattern":"x[0-9]"}`,
			good:   []string{`"x1"`, `"abc x9 def"`, `"é x0 é"`},
			bad:    []string{`""`, `"x"`, `"xa"`},
		},
		{
			name:   "enum",
			schema: `{"enum":["red","green",1,12,null,{"a":[1]}]}`,
			good:   []string{`"red"`, `"green"`, `1`, `12`, `null`, `{"a":[1]}`, ` "red" `},
			bad:    []string{`"blue"`, `2`, `123`, `"re"`, `{"a": [1]}`, `true`},
		},
		{
			name:   "const and type filter",
			schema: `{"type":"string","enum":["a",1,"b"]}`,
			good:   []string{`"a"`, `"b"`},
			bad:    []string{`1`},
		},
		{
			name:   "anyOf",
			schema: `{"anyOf":[{"type":"string","maxLength":2},{"type":"string","pattern":"^z+$"},{"type":"integer"}]}`,
			good:   []string{`"ab"`, `"zzzzz"`, `7`, `"z"`},
			bad:    []string{`"abc"`, `"zzza"`, `7.5`},
		},
		{
			name:   "type list",
			schema: `{"type":["number","null"]}`,
			good:   []string{`1.5`, `null`, `-2e-3`},
			bad:    []string{`"1"`, `true`},
		},
		{
			name: "recursive ref",
			schema: `{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v","kids"],"additionalProperties":false}},
				"$ref":"#/$defs/node"}`,
			good: []string{`{"v":1,"kids":[]}`, `{"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[]}]},{"v":4,"kids":[]}]}`},
			bad:  []string{`{"v":1}`, `{"v":1,"kids":[{"v":2}]}`},
		},
		{
			name:   "root recursion",
			schema: `{"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["next"]}`,
			good:   []string{`{"next":null}`, `{"next":{"next":{"next":null}}}`},
			bad:    []string{`{}`, `{"next":{}}`},
		},
		{
			name:   "map",
			schema: `{"type":"object","additionalProperties":{"type":"integer"}}`,
			good:   []string{`{}`, `{"a":1,"b":2}`},
			bad:    []string{`{"a":"x"}`},
		},
		{
			name:   "empty object only",
			schema: `{"type":"object","additionalProperties":false}`,
			good:   []string{`{}`, `{ }`},
			bad:    []string{`{"a":1}`},
		},
		{
			name:   "format date-time",
			schema: `{"type":"string","format":"date-time"}`,
			good:   []string{`"2024-02-28T23:59:59Z"`, `"1999-12-31T00:00:00.123+05:30"`},
			bad:    []string{`"2024-02-30T00:00:00Z"`, `"2024-04-31T00:00:00Z"`, `"2024-01-01 00:00:00Z"`, `"2024-01-01T24:00:00Z"`},
		},
		{
			name:   "unproductive optional property dropped",
			schema: `{"type":"object","properties":{"a":false,"b":{"type":"null"}},"required":["b"]}`,
			good:   []string{`{"b":null}`},
			bad:    []string{`{"a":1,"b":null}`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := JSONObject()
			if tc.schema != "" {
				g = mustSchema(t, tc.schema)
			}
			for _, doc := range tc.good {
				if !g.Match([]byte(doc)) {
					t.Errorf("Match(%q) = false, want true", doc)
				}
			}
			for _, doc := range tc.bad {
				if g.Match([]byte(doc)) {
					t.Errorf("Match(%q) = true, want false", doc)
				}
			}
		})
	}
}

// TestWhitespaceBound checks that a gap holds at most one newline and
// maxIndent spaces, so generation cannot loop on whitespace.
func TestWhitespaceBound(t *testing.T) {
	g := JSONObject()
	ok := "{\n" + strings.Repeat(" ", maxIndent) + "\"a\"" + " :\n\t1 }"
	if !g.Match([]byte(ok)) {
		t.Errorf("Match(%q) = false, want true", ok)
	}
	for _, bad := range []string{"{  \"a\":1}", "{\"a\":1}  ", "{\n \n\"a\":1}", " \n{}"} {
		if g.Match([]byte(bad)) {
			t.Errorf("Match(%q) = true, want false", bad)
		}
	}
}
