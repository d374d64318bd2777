package chat

import (
	"encoding/json"
	"strings"
)

// CallStream follows one call's text as the model writes it and gives out
// what is certain so far: the function's name once it is whole, and the
// arguments as compact JSON a piece at a time, as OpenAI streams
// delta.tool_calls. It is for a forced call (tool_choice required or a
// named function), whose output the grammar of CallGrammar shapes: one
// call, its name before its arguments, the arguments an object. Whitespace
// outside strings is dropped as it comes, so the pieces joined are what
// ParseToolCalls returns for the whole text (json.Compact elides only
// that). Text that strays from that shape stops the stream where it
// strays; the caller parses the whole at the end as before.
type CallStream struct {
	syn  ToolSyntax
	text strings.Builder

	nameSent bool
	argsSent int // bytes of the compact arguments given out
}

// NewCallStream returns a stream for calls in syntax s; feed it the output
// from the call's start (ToolSyntax.CallStart) on.
func NewCallStream(s ToolSyntax) *CallStream { return &CallStream{syn: s} }

// Feed adds text and returns the name when it became whole with this text
// ("" otherwise, and "" again later) and the arguments' compact bytes that
// are new. Arguments never come before the name.
func (c *CallStream) Feed(text string) (name, args string) {
	c.text.WriteString(text)
	n, ok, a := c.scan(c.text.String())
	if !ok {
		return "", ""
	}
	if !c.nameSent {
		c.nameSent, name = true, n
	}
	if len(a) > c.argsSent {
		args, c.argsSent = a[c.argsSent:], len(a)
	}
	return name, args
}

// Sent reports whether the name has been given out, and how many bytes of
// the arguments.
func (c *CallStream) Sent() (name bool, args int) { return c.nameSent, c.argsSent }

// scan reads the first call in s: its name when whole, and the compact
// arguments written so far.
func (c *CallStream) scan(s string) (name string, nameOK bool, args string) {
	s = strings.TrimLeft(s, " \t\r\n")
	s = strings.TrimPrefix(s, c.syn.Marker())
	s = strings.TrimLeft(s, " \t\r\n")
	switch {
	case c.syn == Mistral && !strings.HasPrefix(s, "["):
		// name[ARGS]{...}, or name[CALL_ID]id[ARGS]{...}
		head, body, ok := strings.Cut(s, "[ARGS]")
		if !ok {
			return "", false, ""
		}
		head, _, _ = strings.Cut(head, "[CALL_ID]")
		if name = strings.TrimSpace(head); name == "" || strings.ContainsAny(name, "[]{}\" \n") {
			return "", false, ""
		}
		body = strings.TrimLeft(body, " \t\r\n")
		if !strings.HasPrefix(body, "{") {
			return name, true, ""
		}
		args, _, _ = compactValue(body)
		return name, true, args
	case c.syn == Mistral: // [{"name": ..., "arguments": {...}}]
		s = strings.TrimLeft(s[1:], " \t\r\n")
	}
	if !strings.HasPrefix(s, "{") {
		return "", false, ""
	}
	keys := []string{"arguments", "parameters"}
	if c.syn == Llama3 {
		keys = []string{"parameters", "arguments"}
	}
	return scanCallObject(s, keys)
}

// scanCallObject reads an object {"name": ..., key: {...}} as far as s
// goes: the name once its string is whole, and the compact text of the
// first of keys' values written so far (only after the name: a call's
// arguments are not given out before its name).
func scanCallObject(s string, keys []string) (name string, nameOK bool, args string) {
	i := 1
	for {
		i = skipSpace(s, i)
		if i >= len(s) || s[i] == '}' {
			return
		}
		if s[i] == ',' {
			i++
			continue
		}
		end, ok := stringEnd(s, i)
		if !ok {
			return
		}
		var key string
		if json.Unmarshal([]byte(s[i:end]), &key) != nil {
			return
		}
		if i = skipSpace(s, end); i >= len(s) || s[i] != ':' {
			return
		}
		if i = skipSpace(s, i+1); i >= len(s) {
			return
		}
		switch {
		case key == "name":
			end, ok := stringEnd(s, i)
			if !ok || json.Unmarshal([]byte(s[i:end]), &name) != nil || name == "" {
				return "", false, ""
			}
			nameOK, i = true, end
		case key == keys[0] && nameOK && s[i] == '{':
			a, _, _ := compactValue(s[i:])
			return name, true, a
		default:
			_, n, done := compactValue(s[i:])
			if !done {
				return
			}
			i += n
		}
	}
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the offset after the JSON string that starts at
// s[i], and false when it is not whole yet (or no string starts there).
func stringEnd(s string, i int) (int, bool) {
	if i >= len(s) || s[i] != '"' {
		return 0, false
	}
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case '"':
			return j + 1, true
		}
	}
	return 0, false
}

// compactValue returns the JSON value at the start of s with whitespace
// outside strings dropped, as far as s goes, the bytes of s it read, and
// whether the value is whole. Only objects, arrays, strings and scalars
// that end before a delimiter are whole; a bare scalar at the very end of
// s is not (more digits may follow).
func compactValue(s string) (string, int, bool) {
	var b strings.Builder
	depth := 0
	inStr, esc := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case inStr:
			b.WriteByte(c)
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
				if depth == 0 {
					return b.String(), i + 1, true
				}
			}
			continue
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if depth == 0 && b.Len() > 0 {
				return b.String(), i, true // a scalar ended
			}
			continue
		case c == '"':
			inStr = true
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth == 0 {
				return b.String(), i, b.Len() > 0 // the enclosing object ends a scalar
			}
			depth--
			b.WriteByte(c)
			if depth == 0 {
				return b.String(), i + 1, true
			}
			continue
		case c == ',' && depth == 0:
			return b.String(), i, b.Len() > 0
		}
		b.WriteByte(c)
	}
	return b.String(), len(s), false
}
