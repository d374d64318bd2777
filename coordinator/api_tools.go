package coordinator

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/strata-llm/strata/model/chat"
	"github.com/strata-llm/strata/model/grammar"
	"github.com/strata-llm/strata/model/sample"
)

// Tool limits.
const (
	maxTools = 128 // functions per request
)

// toolName is OpenAI's rule for function names.
var toolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// toolSet is a chat request's tools as the generation uses them.
type toolSet struct {
	syntax   chat.ToolSyntax
	names    []string
	params   [][]byte // each function's parameters schema, compact; nil for none
	choice   string   // "auto", "required" or a function's name (none: no toolSet)
	parallel bool     // parallel_tool_calls: more than one call may be returned
}

// parseTools reads tools, tool_choice and parallel_tool_calls. It returns
// nil when the request has no tools or tool_choice is "none": then the
// template sees no tools and the output is text. The template's tools
// array is the request's, compact.
func (s *Server) parseTools(f fields) (*toolSet, []byte, *apiError) {
	raw, ok := f.get("tools")
	choiceRaw, hasChoice := f.get("tool_choice")
	if !ok || string(raw) == "[]" {
		if hasChoice && string(choiceRaw) != `"none"` && string(choiceRaw) != `"auto"` {
			return nil, nil, invalid("tool_choice", "tool_choice %s needs tools", show(choiceRaw))
		}
		if _, _, err := f.boolean("parallel_tool_calls"); err != nil {
			return nil, nil, err
		}
		return nil, nil, nil
	}
	var items []json.RawMessage
	if kindOf(raw) != "array" || json.Unmarshal(raw, &items) != nil {
		return nil, nil, wrongType("tools", "an array of tools", raw)
	}
	if len(items) > maxTools {
		return nil, nil, invalid("tools", "tools must hold <= %d functions, got %d", maxTools, len(items))
	}
	ts := &toolSet{syntax: s.info.Template.ToolSyntax(), choice: "auto", parallel: true}
	for i, item := range items {
		name := fmt.Sprintf("tools[%d]", i)
		var t struct {
			Type     string `json:"type"`
			Function *struct {
				Name       string          `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		if kindOf(item) != "object" || json.Unmarshal(item, &t) != nil {
			return nil, nil, wrongType(name, `a {"type": "function", "function": {...}} object`, item)
		}
		if t.Type != "function" {
			return nil, nil, unsupported(name+".type", `%s.type must be "function", got %q`, name, t.Type)
		}
		if t.Function == nil {
			return nil, nil, invalid(name+".function", "%s.function is required", name)
		}
		if !toolName.MatchString(t.Function.Name) {
			return nil, nil, invalid(name+".function.name", "%s.function.name must be 1 to 64 letters, digits, underscores and dashes, got %q", name, t.Function.Name)
		}
		for _, prev := range ts.names {
			if prev == t.Function.Name {
				return nil, nil, invalid(name+".function.name", "%s.function.name %q is not unique", name, prev)
			}
		}
		var params []byte
		if p := t.Function.Parameters; len(p) > 0 && string(p) != "null" {
			if kindOf(p) != "object" {
				return nil, nil, wrongType(name+".function.parameters", "a JSON Schema object", p)
			}
			var buf bytes.Buffer
			json.Compact(&buf, p) // valid: it was unmarshalled
			params = buf.Bytes()
		}
		ts.names = append(ts.names, t.Function.Name)
		ts.params = append(ts.params, params)
	}
	if hasChoice {
		switch kindOf(choiceRaw) {
		case "string":
			c, _, err := rawString("tool_choice", choiceRaw)
			if err != nil {
				return nil, nil, err
			}
			switch c {
			case "none":
				return nil, nil, nil
			case "auto", "required":
				ts.choice = c
			default:
				return nil, nil, invalid("tool_choice", `tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}, got %q`, c)
			}
		case "object":
			var c struct {
				Type     string `json:"type"`
				Function struct {
					Name string `json:"name"`
				} `json:"function"`
			}
			if json.Unmarshal(choiceRaw, &c) != nil || c.Type != "function" {
				return nil, nil, invalid("tool_choice", `tool_choice must be {"type": "function", "function": {"name": ...}}, got %s`, show(choiceRaw))
			}
			i := indexOf(ts.names, c.Function.Name)
			if i < 0 {
				return nil, nil, invalid("tool_choice", "tool_choice names function %q, which is not in tools", c.Function.Name)
			}
			ts.choice = c.Function.Name
		default:
			return nil, nil, wrongType("tool_choice", "a string or an object", choiceRaw)
		}
	}
	if p, ok, err := f.boolean("parallel_tool_calls"); err != nil {
		return nil, nil, err
	} else if ok {
		ts.parallel = p
	}
	var buf bytes.Buffer
	json.Compact(&buf, raw)
	return ts, buf.Bytes(), nil
}

func indexOf(names []string, name string) int {
	for i, n := range names {
		if n == name {
			return i
		}
	}
	return -1
}

// constraint returns the response format that forces one call (tool_choice
// required or a named function), nil for auto. A parameters schema the
// grammar cannot enforce is a 400 naming the tool and the part.
func (ts *toolSet) constraint() ([]byte, *apiError) {
	if ts.choice == "auto" {
		return nil, nil
	}
	names, params := ts.names, ts.params
	if ts.choice != "required" {
		i := indexOf(ts.names, ts.choice)
		names, params = names[i:i+1], params[i:i+1]
	}
	for i, p := range params {
		if p == nil {
			continue
		}
		if _, err := grammar.CompileSchema(p); err != nil {
			field := fmt.Sprintf("tools[%d].function.parameters", indexOf(ts.names, names[i]))
			if se, ok := errors.AsType[*grammar.SchemaError](err); ok {
				e := invalid(field, "%s cannot be enforced for tool_choice %q: %s", field, ts.choice, schemaProblem(se))
				e.code = "unsupported_schema"
				return nil, e
			}
			return nil, invalid(field, "%s: %v", field, err)
		}
	}
	// tool_choice required with parallel_tool_calls: one or more calls; a
	// named function: that one call.
	f := ts.syntax.CallGrammar(names, params, ts.choice == "required" && ts.parallel)
	rf := grammar.WrapFormat(f.Prefix, f.Schema, f.Suffix)
	if f.Repeat {
		rf = grammar.WrapRepeatFormat(f.Prefix, f.Schema, f.Suffix, f.Sep)
	}
	if len(rf) > sample.MaxConstraint {
		return nil, invalid("tools", "the tools' parameters schemas are too large to enforce (%d bytes, limit %d)", len(rf), sample.MaxConstraint)
	}
	if _, err := grammar.Compile(rf); err != nil {
		return nil, invalid("tools", "the tools cannot be enforced for tool_choice %q: %v", ts.choice, err)
	}
	return rf, nil
}

// toolCallOut is a call in a whole response; toolCallDelta one in a
// streamed chunk.
type toolCallOut struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

type toolCallDelta struct {
	Index    int          `json:"index"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function toolFunction `json:"function"`
}

// callID returns a new call ID: Mistral's templates want 9 letters and
// digits, others get OpenAI's "call_" form.
func callID(syn chat.ToolSyntax) string {
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	n := 24
	if syn == chat.Mistral {
		n = 9
	}
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = alnum[int(b[i])%len(alnum)]
	}
	if syn == chat.Mistral {
		return string(b)
	}
	return "call_" + string(b)
}

// toolStream splits a chat completion into text and calls as it comes:
// text before a call's start goes out at once (less a partial marker held
// back); from the call's start on, a forced call (tool_choice required or
// a named function: the grammar shapes it) goes out a piece at a time as
// OpenAI streams calls, its name once whole and then its arguments; any
// other output is held from there and parsed at the end (under "auto" the
// model may write a call that does not parse, which is then text).
type toolStream struct {
	ts     *toolSet
	stream bool // a streamed answer: a forced call goes out in pieces
	all    strings.Builder
	sent   int  // bytes of all given out as text
	start  bool // a call has started: no more text goes out

	cs   *chat.CallStream // a forced call, streamed
	id   string           // its call ID, once its name went out
	name string
	args strings.Builder // its arguments given out
}

// push adds text and returns the text that may go out now and the pieces
// of a forced call that are certain. Whitespace at the end is held too:
// the text before calls is trimmed, as in a whole answer.
func (t *toolStream) push(text string) (string, []toolCallDelta) {
	t.all.WriteString(text)
	if t.start {
		return "", t.feed(text)
	}
	rest := t.all.String()[t.sent:]
	start, held := t.ts.syntax.CallStart(rest, t.sent == 0)
	end := len(rest) - held
	if start >= 0 {
		t.start, end = true, start
	}
	out := strings.TrimRight(rest[:end], " \t\r\n")
	var calls []toolCallDelta
	if t.start && t.stream && t.ts.choice != "auto" {
		t.cs = chat.NewCallStream(t.ts.syntax)
		calls = t.feed(rest[start:])
	}
	t.sent += len(out)
	return out, calls
}

// feed gives a forced call's new text to its stream and returns the
// deltas it makes certain: the call's ID, type and name (arguments empty),
// then pieces of its arguments.
func (t *toolStream) feed(text string) []toolCallDelta {
	if t.cs == nil {
		return nil
	}
	name, args := t.cs.Feed(text)
	var out []toolCallDelta
	if name != "" {
		t.id, t.name = callID(t.ts.syntax), name
		out = append(out, toolCallDelta{Index: 0, ID: t.id, Type: "function", Function: toolFunction{Name: name}})
	}
	if args != "" {
		t.args.WriteString(args)
		out = append(out, toolCallDelta{Index: 0, Function: toolFunction{Arguments: args}})
	}
	return out
}

// finish returns the text still to go out and the calls, when the output
// held calls that parse (at most one without parallel_tool_calls);
// otherwise all that is held is text.
func (t *toolStream) finish() (string, []chat.ParsedCall) {
	all := t.all.String()
	content, calls, ok := t.ts.syntax.ParseToolCalls(all)
	if !ok {
		return all[t.sent:], nil
	}
	if !t.ts.parallel {
		calls = calls[:1]
	}
	if len(content) > t.sent {
		return content[t.sent:], calls
	}
	return "", calls
}

// finishStream is finish for a stream: the text still to go out, the
// deltas of what was not streamed yet (the rest of a streamed call's
// arguments, whole calls after it), and whether the output ended in calls.
// A streamed call whose whole text then does not parse as that call (only
// when max_tokens is below the shortest call) ends there: what went out
// stays the answer.
func (t *toolStream) finishStream() (string, []toolCallDelta, bool) {
	rest, calls := t.finish()
	var out []toolCallDelta
	first := 0
	if t.id != "" {
		sent := t.args.String()
		if len(calls) == 0 || calls[0].Name != t.name || !strings.HasPrefix(calls[0].Arguments, sent) {
			return "", nil, false
		}
		if more := calls[0].Arguments[len(sent):]; more != "" {
			out = append(out, toolCallDelta{Index: 0, Function: toolFunction{Arguments: more}})
		}
		first = 1
	}
	// As OpenAI streams calls: per call, a chunk with its index, ID, type
	// and name (empty arguments), then its arguments.
	for i := first; i < len(calls); i++ {
		out = append(out,
			toolCallDelta{Index: i, ID: callID(t.ts.syntax), Type: "function", Function: toolFunction{Name: calls[i].Name}},
			toolCallDelta{Index: i, Function: toolFunction{Arguments: calls[i].Arguments}})
	}
	return rest, out, len(calls) > 0
}

// toolMessage reads an assistant message's tool_calls and a tool
// message's tool_call_id (required) and name.
func toolMessage(name, role string, m fields, msg *chat.Message) *apiError {
	if raw, ok := m.get("tool_calls"); ok && string(raw) != "[]" {
		if role != "assistant" {
			return invalid(name+".tool_calls", "%s.tool_calls is only allowed on assistant messages", name)
		}
		var calls []struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function *struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		}
		if kindOf(raw) != "array" || json.Unmarshal(raw, &calls) != nil {
			return wrongType(name+".tool_calls", `an array of {"id", "type": "function", "function": {"name", "arguments"}} calls`, raw)
		}
		for j, c := range calls {
			if c.Function == nil || c.Function.Name == "" {
				return invalid(fmt.Sprintf("%s.tool_calls[%d].function", name, j), "%s.tool_calls[%d].function.name is required", name, j)
			}
			msg.ToolCalls = append(msg.ToolCalls, chat.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
		}
	}
	if role == "tool" {
		id, ok, err := m.str("tool_call_id")
		if err != nil {
			err.param = name + ".tool_call_id"
			return err
		}
		if !ok || id == "" {
			return invalid(name+".tool_call_id", "%s.tool_call_id is required on tool messages", name)
		}
		msg.ToolCallID = id
	}
	if n, ok, err := m.str("name"); err != nil {
		err.param = name + ".name"
		return err
	} else if ok && role == "tool" {
		msg.Name = n
	}
	return nil
}
