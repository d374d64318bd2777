package chat

import (
	"bytes"
	"encoding/json"
	"strings"
)

// ToolSyntax is how a model writes function calls in its output, chosen
// from its chat template.
type ToolSyntax uint8

const (
	// Hermes is Hermes 2/3's and Qwen 2.5/3's: each call a JSON object
	// {"name": ..., "arguments": {...}} between <tool_call> and
	// </tool_call>, after any text. It is also the syntax of templates that
	// show none.
	Hermes ToolSyntax = iota
	// Mistral is Mistral's: [TOOL_CALLS] then name[ARGS]{...} (Mistral Small
	// 3.2 and later; [CALL_ID]id may precede [ARGS]) or a JSON array of
	// {"name", "arguments"} objects (earlier models).
	Mistral
	// Llama3 is Llama 3.1's and 3.2's JSON calls: the whole output a JSON
	// object {"name": ..., "parameters": {...}}, several separated by ";",
	// optionally after <|python_tag|>.
	Llama3
)

func (s ToolSyntax) String() string {
	switch s {
	case Mistral:
		return "mistral"
	case Llama3:
		return "llama3"
	}
	return "hermes"
}

// ToolSyntax returns the call syntax the template's source shows.
func (t *Template) ToolSyntax() ToolSyntax {
	switch {
	case strings.Contains(t.src, "[TOOL_CALLS]"):
		return Mistral
	case strings.Contains(t.src, "<tool_call>"):
		return Hermes
	case strings.Contains(t.src, "<|python_tag|>") || strings.Contains(t.src, "ipython"):
		return Llama3
	}
	return Hermes
}

// Marker is the text that opens a call in the syntax ("" for Llama3,
// whose calls open with the output: see CallStart).
func (s ToolSyntax) Marker() string {
	switch s {
	case Mistral:
		return "[TOOL_CALLS]"
	case Llama3:
		return "<|python_tag|>"
	}
	return "<tool_call>"
}

// CallStart returns the byte offset in text where calls may begin: the
// first marker, for Llama3 also a '{' opening the output (when text is
// the output's start: atStart); -1 when none does. held is how many bytes
// at the end of text could still begin one (a partial marker), which a
// stream holds back.
func (s ToolSyntax) CallStart(text string, atStart bool) (start, held int) {
	m := s.Marker()
	if i := strings.Index(text, m); i >= 0 {
		return i, 0
	}
	if s == Llama3 && atStart {
		if t := strings.TrimLeft(text, " \t\r\n"); strings.HasPrefix(t, "{") {
			return len(text) - len(t), 0
		}
	}
	for k := min(len(m)-1, len(text)); k > 0; k-- {
		if strings.HasSuffix(text, m[:k]) {
			return -1, k
		}
	}
	return -1, 0
}

// ParsedCall is a call read from a model's output: arguments as compact
// JSON text.
type ParsedCall struct {
	Name, Arguments string
}

// ParseToolCalls splits a model's whole output into its text and its
// calls. ok is false when the output holds no call, or calls that do not
// parse (cut short, malformed): then all of it is text.
func (s ToolSyntax) ParseToolCalls(text string) (content string, calls []ParsedCall, ok bool) {
	start, _ := s.CallStart(text, true)
	if start < 0 {
		return text, nil, false
	}
	content, rest := strings.TrimRight(text[:start], " \t\r\n"), text[start:]
	switch s {
	case Hermes:
		calls, ok = parseHermes(rest)
	case Mistral:
		calls, ok = parseMistral(rest)
	case Llama3:
		calls, ok = parseLlama3(strings.TrimPrefix(rest, s.Marker()))
	}
	if !ok || len(calls) == 0 {
		return text, nil, false
	}
	return content, calls, true
}

// callObject reads {"name": ..., argsKey: {...}} (arguments also as a JSON
// string holding an object, as some models write them).
func callObject(raw json.RawMessage, argsKeys ...string) (ParsedCall, bool) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return ParsedCall{}, false
	}
	var name string
	if json.Unmarshal(obj["name"], &name) != nil || name == "" {
		return ParsedCall{}, false
	}
	for _, k := range argsKeys {
		a, present := obj[k]
		if !present {
			continue
		}
		args, ok := compactArgs(a)
		return ParsedCall{Name: name, Arguments: args}, ok
	}
	return ParsedCall{Name: name, Arguments: "{}"}, true
}

// compactArgs returns arguments as compact JSON text: an object, or the
// object a JSON string holds.
func compactArgs(a json.RawMessage) (string, bool) {
	var str string
	if json.Unmarshal(a, &str) == nil {
		a = json.RawMessage(str)
	}
	var buf bytes.Buffer
	if json.Compact(&buf, a) != nil || buf.Len() == 0 || buf.Bytes()[0] != '{' {
		return "", false
	}
	return buf.String(), true
}

// nextValue reads one JSON value at the start of text (after whitespace)
// and returns it and the text after it.
func nextValue(text string) (json.RawMessage, string, bool) {
	dec := json.NewDecoder(strings.NewReader(text))
	var raw json.RawMessage
	if dec.Decode(&raw) != nil {
		return nil, "", false
	}
	return raw, text[dec.InputOffset():], true
}

func parseHermes(text string) ([]ParsedCall, bool) {
	var calls []ParsedCall
	for {
		text = strings.TrimLeft(text, " \t\r\n")
		if text == "" {
			return calls, true
		}
		body, ok := strings.CutPrefix(text, "<tool_call>")
		if !ok {
			return nil, false
		}
		inner, after, ok := strings.Cut(body, "</tool_call>")
		if !ok {
			return nil, false
		}
		raw, rest, ok := nextValue(inner)
		if !ok || strings.TrimSpace(rest) != "" {
			return nil, false
		}
		c, ok := callObject(raw, "arguments", "parameters")
		if !ok {
			return nil, false
		}
		calls = append(calls, c)
		text = after
	}
}

func parseMistral(text string) ([]ParsedCall, bool) {
	var calls []ParsedCall
	for {
		text = strings.TrimLeft(text, " \t\r\n")
		if text == "" {
			return calls, true
		}
		body, ok := strings.CutPrefix(text, "[TOOL_CALLS]")
		if !ok {
			return nil, false
		}
		body = strings.TrimLeft(body, " \t\r\n")
		if strings.HasPrefix(body, "[") { // [{"name": ..., "arguments": ...}, ...]
			raw, rest, ok := nextValue(body)
			var items []json.RawMessage
			if !ok || json.Unmarshal(raw, &items) != nil || len(items) == 0 {
				return nil, false
			}
			for _, it := range items {
				c, ok := callObject(it, "arguments", "parameters")
				if !ok {
					return nil, false
				}
				calls = append(calls, c)
			}
			text = rest
			continue
		}
		name, args, ok := strings.Cut(body, "[ARGS]")
		if !ok {
			return nil, false
		}
		name, _, _ = strings.Cut(name, "[CALL_ID]")
		if name = strings.TrimSpace(name); name == "" || strings.ContainsAny(name, "[]{}\" \n") {
			return nil, false
		}
		raw, rest, ok := nextValue(args)
		if !ok {
			return nil, false
		}
		a, ok := compactArgs(raw)
		if !ok {
			return nil, false
		}
		calls = append(calls, ParsedCall{Name: name, Arguments: a})
		text = rest
	}
}

func parseLlama3(text string) ([]ParsedCall, bool) {
	var calls []ParsedCall
	for {
		text = strings.TrimLeft(text, " \t\r\n;")
		if text == "" {
			return calls, true
		}
		raw, rest, ok := nextValue(text)
		if !ok {
			return nil, false
		}
		c, ok := callObject(raw, "parameters", "arguments")
		if !ok {
			return nil, false
		}
		calls = append(calls, c)
		text = rest
	}
}

// CallFormat is the parts of a wrapped JSON grammar (model/grammar's
// WrapFormat, or WrapRepeatFormat when Repeat) that makes the output
// calls in a syntax.
type CallFormat struct {
	Prefix string
	Schema []byte
	Suffix string
	// Repeat: one or more prefix-value-suffix calls, each after the first
	// following Sep.
	Repeat bool
	Sep    string
}

// CallGrammar returns the grammar that makes the output one call in the
// syntax (several, one or more, when several), each to one of the
// functions named, whose parameters schemas are params (JSON Schema
// texts, nil for any object). Mistral's name-first form names one
// function, each call after [TOOL_CALLS]; with several functions, its
// JSON-array form holds the calls. Hermes's calls follow one another on
// new lines, Llama 3's after ";".
func (s ToolSyntax) CallGrammar(names []string, params [][]byte, several bool) CallFormat {
	obj := func(i int, argsKey string) []byte {
		n, _ := json.Marshal(names[i])
		p := params[i]
		if p == nil {
			p = []byte(`{"type":"object"}`)
		}
		var b bytes.Buffer
		b.WriteString(`{"type":"object","properties":{"name":{"const":`)
		b.Write(n)
		b.WriteString(`},"` + argsKey + `":`)
		b.Write(p)
		b.WriteString(`},"required":["name","` + argsKey + `"],"additionalProperties":false}`)
		return b.Bytes()
	}
	anyOf := func(argsKey string) []byte {
		if len(names) == 1 {
			return obj(0, argsKey)
		}
		var b bytes.Buffer
		b.WriteString(`{"anyOf":[`)
		for i := range names {
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(obj(i, argsKey))
		}
		b.WriteString(`]}`)
		return b.Bytes()
	}
	switch s {
	case Mistral:
		if len(names) == 1 {
			p := params[0]
			if p == nil {
				p = []byte(`{"type":"object"}`)
			}
			return CallFormat{Prefix: "[TOOL_CALLS]" + names[0] + "[ARGS]", Schema: p, Repeat: several}
		}
		var b bytes.Buffer
		b.WriteString(`{"type":"array","items":`)
		b.Write(anyOf("arguments"))
		if several {
			b.WriteString(`,"minItems":1}`)
		} else {
			b.WriteString(`,"minItems":1,"maxItems":1}`)
		}
		return CallFormat{Prefix: "[TOOL_CALLS]", Schema: b.Bytes()}
	case Llama3:
		return CallFormat{Schema: anyOf("parameters"), Repeat: several, Sep: ";"}
	}
	return CallFormat{Prefix: "<tool_call>\n", Schema: anyOf("arguments"), Suffix: "\n</tool_call>", Repeat: several, Sep: "\n"}
}
