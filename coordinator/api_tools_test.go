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
		ts := &toolStream{ts: &toolSet{syntax: tc.syn, parallel: tc.parallel}}
		var sent strings.Builder
		for _, p := range tc.pieces {
			sent.WriteString(ts.push(p))
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
