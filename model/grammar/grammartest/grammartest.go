// Package grammartest holds what tests of constrained decoding share: a
// seeded generator of schemas from the supported subset and an independent
// validator (github.com/santhosh-tekuri/jsonschema/v6).
package grammartest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Validator checks documents against a schema with an independent JSON
// Schema implementation (draft 2020-12, formats asserted).
type Validator struct{ sch *jsonschema.Schema }

// NewValidator compiles schema ("" means any object) or fails t.
func NewValidator(t testing.TB, schema string) *Validator {
	t.Helper()
	if schema == "" {
		schema = `{"type":"object"}`
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatalf("schema %s: %v", schema, err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatalf("schema %s: %v", schema, err)
	}
	sch, err := c.Compile("schema.json")
	if err != nil {
		t.Fatalf("schema %s: %v", schema, err)
	}
	return &Validator{sch}
}

// Validate reports why doc is not valid JSON or does not validate.
func (v *Validator) Validate(doc []byte) error {
	if !json.Valid(doc) {
		return errors.New("not valid JSON")
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return err
	}
	return v.sch.Validate(inst)
}

// RandomSchema returns a random schema of the supported subset.
func RandomSchema(r *rand.Rand) string {
	var b strings.Builder
	b.WriteString(`{"$defs":{"rec":{"type":"object","properties":{"v":`)
	randomNode(r, &b, 2, false)
	b.WriteString(`,"next":{"anyOf":[{"$ref":"#/$defs/rec"},{"type":"null"}]}},"required":["v","next"],"additionalProperties":false}},`)
	b.WriteString(`"type":"object","properties":{`)
	n := 1 + r.IntN(4)
	var req []string
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d":`, i)
		randomNode(r, &b, 3, true)
		if r.IntN(3) > 0 {
			req = append(req, fmt.Sprintf(`"p%d"`, i))
		}
	}
	fmt.Fprintf(&b, `},"required":[%s],"additionalProperties":false}`, strings.Join(req, ","))
	return b.String()
}

func randomNode(r *rand.Rand, b *strings.Builder, depth int, recOK bool) {
	k := r.IntN(13)
	if depth == 0 {
		k = r.IntN(7)
	}
	switch k {
	case 0:
		switch r.IntN(4) {
		case 0:
			b.WriteString(`{"type":"string"}`)
		case 1:
			fmt.Fprintf(b, `{"type":"string","minLength":%d,"maxLength":%d}`, r.IntN(3), 3+r.IntN(8))
		case 2:
			b.WriteString([]string{`{"type":"string","pattern":"^[a-z]{2,5}$"}`, `{"type":"string","pattern":"\\d+x"}`, `{"type":"string","format":"date"}`}[r.IntN(3)])
		default:
			b.WriteString(`{"type":"string","enum":["alpha","beta","al","\"q\"","é"]}`)
		}
	case 1:
		b.WriteString(`{"type":"integer"}`)
	case 2:
		b.WriteString(`{"type":"number"}`)
	case 3:
		b.WriteString(`{"type":"boolean"}`)
	case 4:
		b.WriteString(`{"type":"null"}`)
	case 5:
		b.WriteString(`{"enum":[1,12,1.5,"x",null,true,[1,2],{"k":"v"}]}`)
	case 6:
		b.WriteString(`{"type":["string","integer","null"]}`)
	case 7, 8:
		b.WriteString(`{"type":"object","properties":{`)
		n := r.IntN(4)
		var req []string
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(b, `"k%d":`, i)
			randomNode(r, b, depth-1, recOK)
			if r.IntN(2) == 0 {
				req = append(req, fmt.Sprintf(`"k%d"`, i))
			}
		}
		fmt.Fprintf(b, `},"required":[%s],"additionalProperties":false}`, strings.Join(req, ","))
	case 9, 10:
		b.WriteString(`{"type":"array","items":`)
		randomNode(r, b, depth-1, recOK)
		if r.IntN(2) == 0 {
			fmt.Fprintf(b, `,"minItems":%d,"maxItems":%d`, r.IntN(2), 2+r.IntN(3))
		}
		b.WriteString(`}`)
	case 11:
		b.WriteString(`{"anyOf":[`)
		randomNode(r, b, depth-1, recOK)
		b.WriteByte(',')
		randomNode(r, b, depth-1, recOK)
		b.WriteString(`]}`)
	case 12:
		if recOK {
			b.WriteString(`{"$ref":"#/$defs/rec"}`)
		} else {
			b.WriteString(`{}`)
		}
	}
}
