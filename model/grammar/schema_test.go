package grammar

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"
)

// TestCompileRefuses checks that each unsupported schema is refused with
// the JSON pointer and keyword of the part at fault.
func TestCompileRefuses(t *testing.T) {
	tests := []struct {
		schema  string
		pointer string
		keyword string
	}{
		{`{"type":"integer","minimum":0}`, "#", "minimum"},
		{`{"type":"object","properties":{"a":{"type":"string","format":"email"}}}`, "#/properties/a", "format"},
		{`{"type":"object","properties":{"a/b":{"oneOf":[{"type":"string"}]}}}`, "#/properties/a~1b", "oneOf"},
		{`{"type":"array","items":{"type":"string"},"uniqueItems":true}`, "#", "uniqueItems"},
		{`{"type":"array","prefixItems":[{"type":"string"}]}`, "#", "prefixItems"},
		{`{"type":"array","items":[{"type":"string"}]}`, "#", "items"},
		{`{"type":"string","pattern":"(?<=a)b"}`, "#", "pattern"},
		{`{"type":"string","pattern":"(a)\\1"}`, "#", "pattern"},
		{`{"type":"string","pattern":"[a-z]+","maxLength":3}`, "#", "pattern"},
		{`{"type":"string","minLength":3,"maxLength":2}`, "#", "maxLength"},
		{`{"type":"array","minItems":3,"maxItems":2}`, "#", "maxItems"},
		{`{"type":"object","properties":{"a":{"type":"string"}},"required":["b"]}`, "#", "required"},
		{`{"$ref":"https://example.com/s.json"}`, "#", "$ref"},
		{`{"$ref":"#/$defs/missing"}`, "#", "$ref"},
		{`{"$defs":{"a":{"type":"string","not":{}}},"$ref":"#/$defs/a"}`, "#/$defs/a", "not"},
		{`{"allOf":[{"type":"string"},{"maxLength":3}]}`, "#", "allOf"},
		{`{"anyOf":[{"type":"string"}],"maxLength":3}`, "#", "maxLength"},
		{`{"enum":["a"],"maxLength":3}`, "#", "maxLength"},
		{`{"type":"integer","enum":["a"]}`, "#", "enum"},
		{`{"type":"strin"}`, "#", "type"},
		{`{"type":"object","frobnicate":true}`, "#", "frobnicate"},
		{`{"minLength":1,"minItems":1}`, "#", "type"},
		{`{"$id":"x","properties":{"a":{"$id":"y"}}}`, "#/properties/a", "$id"},
		// No finite document: a required property that recurses forever.
		{`{"type":"object","properties":{"n":{"$ref":"#"}},"required":["n"]}`, "#", ""},
		{`false`, "#", ""},
	}
	for _, tc := range tests {
		_, err := CompileSchema([]byte(tc.schema))
		var se *SchemaError
		if !errors.As(err, &se) {
			t.Errorf("CompileSchema(%s) = %v, want a *SchemaError", tc.schema, err)
			continue
		}
		if se.Pointer != tc.pointer || se.Keyword != tc.keyword {
			t.Errorf("CompileSchema(%s): pointer %q keyword %q (%v), want %q %q", tc.schema, se.Pointer, se.Keyword, err, tc.pointer, tc.keyword)
		}
	}
}

func TestCompileResponseFormat(t *testing.T) {
	g, err := Compile([]byte(`{"type":"text"}`))
	if g != nil || err != nil {
		t.Errorf("Compile(text) = %v, %v, want nil, nil", g, err)
	}
	g, err = Compile([]byte(`{"type":"json_object"}`))
	if err != nil || !g.Match([]byte(`{"a":1}`)) || g.Match([]byte(`[1]`)) {
		t.Errorf("Compile(json_object) = %v, %v: want any object", g, err)
	}
	g, err = Compile([]byte(`{"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"],"additionalProperties":false}}}`))
	if err != nil || !g.Match([]byte(`{"a":true}`)) || g.Match([]byte(`{"a":1}`)) {
		t.Errorf("Compile(json_schema) = %v, %v", g, err)
	}
	for _, bad := range []string{`{"type":"xml"}`, `[]`, `{"type":"json_schema","json_schema":1}`, `{`} {
		if _, err := Compile([]byte(bad)); !errors.Is(err, ErrFormat) {
			t.Errorf("Compile(%s) = %v, want ErrFormat", bad, err)
		}
	}
	_, err = Compile([]byte(`{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"integer","maximum":3}}}`))
	var se *SchemaError
	if !errors.As(err, &se) || se.Keyword != "maximum" {
		t.Errorf("Compile(json_schema with maximum) = %v, want a SchemaError on maximum", err)
	}
}

// fuzzDocs are documents every fuzzed grammar is run over.
var fuzzDocs = []string{`{}`, `{"a":1}`, `[]`, `[1,"x",null]`, `"s"`, `12.5`, `true`, `null`, `{"a":{"b":[{}]}}`, ` "é" `}

// FuzzCompileSchema checks that any schema text compiles or is refused
// without panicking, and that a compiled grammar accepts only valid JSON.
func FuzzCompileSchema(f *testing.F) {
	for _, s := range fixedSchemas {
		if s != "" {
			f.Add(s)
		}
	}
	f.Add(`{"type":"string","pattern":"^(a|b)*c{2,3}$"}`)
	f.Add(`{"anyOf":[{"$ref":"#"},{"type":"null"}]}`)
	f.Add(`{"enum":[1,12,"x",{"a":[]}]}`)
	f.Fuzz(func(t *testing.T, schema string) {
		g, err := CompileSchema([]byte(schema))
		if err != nil {
			var se *SchemaError
			if !errors.As(err, &se) {
				t.Fatalf("CompileSchema(%q) = %v, not a *SchemaError", schema, err)
			}
			return
		}
		for _, doc := range fuzzDocs {
			if g.Match([]byte(doc)) && !json.Valid([]byte(doc)) {
				t.Fatalf("schema %q accepts invalid JSON %q", schema, doc)
			}
		}
	})
}

// FuzzMatchJSONObject checks that whatever the json_object grammar
// accepts is one valid JSON object.
func FuzzMatchJSONObject(f *testing.F) {
	for _, d := range fuzzDocs {
		f.Add([]byte(d))
	}
	f.Add([]byte("{\n  \"a\": \"\\u00e9\\n\",\n  \"b\": [-0.5e+10]\n}\n"))
	g := JSONObject()
	f.Fuzz(func(t *testing.T, doc []byte) {
		if !g.Match(doc) {
			return
		}
		var v map[string]any
		if err := json.Unmarshal(doc, &v); err != nil || !utf8.Valid(doc) {
			t.Fatalf("json_object accepts %q: %v", doc, err)
		}
	})
}
