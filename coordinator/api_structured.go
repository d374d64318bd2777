package coordinator

import (
	"bytes"
	"encoding/json"
	"errors"

	"github.com/strata-llm/strata/model/grammar"
	"github.com/strata-llm/strata/model/sample"
)

// parseResponseFormat reads response_format: absent or {"type":"text"} is
// free text (nil); {"type":"json_object"} and {"type":"json_schema",...}
// are compiled here, so that a schema outside the supported subset is a 400
// naming its JSON pointer and keyword before anything is queued, and
// returned as the compact bytes the last stage compiles again (it caches
// grammars by their hash).
func parseResponseFormat(f fields) ([]byte, *apiError) {
	raw, ok := f.get("response_format")
	if !ok {
		return nil, nil
	}
	if kindOf(raw) != "object" {
		return nil, wrongType("response_format", "an object", raw)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, wrongType("response_format", "an object", raw)
	}
	var rf struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(buf.Bytes(), &rf) != nil || rf.Type == grammar.Wrapped {
		return nil, invalid("response_format", `response_format.type must be "text", "json_object" or "json_schema", got %s`, show(raw))
	}
	if buf.Len() > sample.MaxConstraint {
		return nil, invalid("response_format", "response_format must be <= %d bytes as compact JSON, got %d", sample.MaxConstraint, buf.Len())
	}
	g, err := grammar.Compile(buf.Bytes())
	if err != nil {
		if se, ok := errors.AsType[*grammar.SchemaError](err); ok {
			e := invalid("response_format", "response_format.json_schema.schema is not supported for structured output: %s", schemaProblem(se))
			e.code = "unsupported_schema"
			return nil, e
		}
		return nil, invalid("response_format", "%v", err)
	}
	if g == nil { // type text
		return nil, nil
	}
	return buf.Bytes(), nil
}

// schemaProblem names the part of a schema refused: its JSON pointer, its
// keyword and why.
func schemaProblem(se *grammar.SchemaError) string {
	if se.Keyword == "" {
		return "the schema at " + se.Pointer + " " + se.Reason
	}
	return "keyword \"" + se.Keyword + "\" at " + se.Pointer + " " + se.Reason
}
