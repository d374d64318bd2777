package coordinator

import (
	"strings"
	"testing"

	"github.com/strata-llm/strata/model/chat"
)

// TestToolStream: a streamed answer's text goes out as it comes, less a
// possible call marker held back; from a call's start everything is held
// and comes back parsed at the end (text when it does not parse).
func TestToolStream(t *testing.T) {
	for _, tc := range []struct {
		syn      chat.ToolSyntax
		parallel bool
		pieces   []string
		sent     string // given out before the end
		rest     string // given out at the end
		calls    []string
	}{
		{chat.Hermes, true, []string{"Let me ", "check. <to", "ol_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>", "<tool_call>{\"name\":\"g\",\"arguments\":{}}</tool_call>"},
			"Let me check.", "", []string{`f{"a":1}`, `g{}`}},
		{chat.Hermes, false, []string{"<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"g\",\"arguments\":{}}</tool_call>"},
			"", "", []string{`f{}`}},
		{chat.Hermes, true, []string{"a <", "b"}, "a <b", "", nil},
		{chat.Hermes, true, []string{"x <tool_call>{\"name\": \"f\", \"argu"}, "x", " <tool_call>{\"name\": \"f\", \"argu", nil}, // cut: text
		{chat.Llama3, true, []string{"  ", "{\"name\": \"f\", ", "\"parameters\": {}}"}, "", "", []string{`f{}`}},
		{chat.Llama3, true, []string{"Hi {", "x}"}, "Hi {x}", "", nil},
		{chat.Mistral, true, []string{"[TOOL_", "CALLS]f[ARGS]{\"a\": [1]}"}, "", "", []string{`f{"a":[1]}`}},
	} {
		ts := &toolStream{ts: &toolSet{syntax: tc.syn, parallel: tc.parallel, choice: "auto"}}
		var sent strings.Builder
		for _, p := range tc.pieces {
			out, calls := ts.push(p)
			if calls != nil {
				t.Errorf("%v %q: a call streamed under tool_choice auto", tc.syn, tc.pieces)
			}
			sent.WriteString(out)
		}
		rest, calls := ts.finish()
		var got []string
		for _, c := range calls {
			got = append(got, c.Name+c.Arguments)
		}
		if sent.String() != tc.sent || rest != tc.rest || strings.Join(got, " ") != strings.Join(tc.calls, " ") {
			t.Errorf("%v %q: sent %q, rest %q, calls %v; want %q, %q, %v", tc.syn, tc.pieces, sent.String(), rest, got, tc.sent, tc.rest, tc.calls)
		}
	}
}

// TestToolStreamForced: a forced call goes out as it comes, as OpenAI
// streams calls (ID, type and name first; arguments in pieces); the end
// adds nothing the pieces did not say, and joined they are the call the
// whole text parses to.
func TestToolStreamForced(t *testing.T) {
	for _, tc := range []struct {
		syn    chat.ToolSyntax
		pieces []string
		call   string
	}{
		{chat.Hermes, []string{"<tool_", "call>\n{\"name\": \"get_", "weather\", \"arguments\": {\"city\"", ": \"Par", "is\", \"days\": [1,\n 2]}}\n</tool_call>"}, `get_weather{"city":"Paris","days":[1,2]}`},
		{chat.Mistral, []string{"[TOOL_CALLS]f[AR", "GS]{\"a\"", ": [1]}"}, `f{"a":[1]}`},
		{chat.Llama3, []string{"{\"name\": \"f\", \"parameters\": {", "}}"}, `f{}`},
	} {
		ts := &toolStream{ts: &toolSet{syntax: tc.syn, choice: "required"}, stream: true}
		var deltas []toolCallDelta
		for i, p := range tc.pieces {
			out, calls := ts.push(p)
			if out != "" {
				t.Errorf("%v: text %q beside a forced call", tc.syn, out)
			}
			if i == len(tc.pieces)-2 && len(calls) == 0 && len(deltas) == 0 {
				t.Errorf("%v: nothing streamed before the call's end", tc.syn)
			}
			deltas = append(deltas, calls...)
		}
		rest, more, ok := ts.finishStream()
		if rest != "" || !ok {
			t.Errorf("%v: rest %q, ok %v", tc.syn, rest, ok)
		}
		if len(more) != 0 {
			t.Errorf("%v: the end added %+v", tc.syn, more)
		}
		deltas = append(deltas, more...)
		if len(deltas) < 2 || deltas[0].ID == "" || deltas[0].Type != "function" || deltas[0].Function.Arguments != "" {
			t.Fatalf("%v: first delta %+v", tc.syn, deltas)
		}
		got := deltas[0].Function.Name
		for _, d := range deltas[1:] {
			if d.ID != "" || d.Function.Name != "" || d.Index != 0 {
				t.Errorf("%v: later delta %+v", tc.syn, d)
			}
			got += d.Function.Arguments
		}
		if got != tc.call {
			t.Errorf("%v: streamed %q, want %q", tc.syn, got, tc.call)
		}
	}
}

// TestToolStreamForcedSeveral: under tool_choice required with parallel
// calls, the first call streams as it comes and the rest follow whole at
// the end, each with its own index and ID.
func TestToolStreamForcedSeveral(t *testing.T) {
	ts := &toolStream{ts: &toolSet{syntax: chat.Hermes, choice: "required", parallel: true}, stream: true}
	var deltas []toolCallDelta
	for _, p := range []string{"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ", "1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arg", "uments\": {}}\n</tool_call>"} {
		_, d := ts.push(p)
		deltas = append(deltas, d...)
	}
	streamed := len(deltas)
	rest, more, ok := ts.finishStream()
	if rest != "" || !ok {
		t.Fatalf("rest %q, ok %v", rest, ok)
	}
	deltas = append(deltas, more...)
	calls := map[int]string{}
	ids := map[int]string{}
	for _, d := range deltas {
		calls[d.Index] += d.Function.Name + d.Function.Arguments
		if d.ID != "" {
			if ids[d.Index] != "" {
				t.Errorf("call %d has two IDs", d.Index)
			}
			ids[d.Index] = d.ID
		}
	}
	if calls[0] != `f{"a":1}` || calls[1] != `g{}` || len(calls) != 2 || ids[0] == "" || ids[1] == "" || ids[0] == ids[1] {
		t.Errorf("calls %v, IDs %v", calls, ids)
	}
	if streamed < 2 {
		t.Errorf("the first call was not streamed (%d deltas before the end)", streamed)
	}
}
