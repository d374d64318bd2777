package chat

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/strata-llm/strata/model/grammar"
)

func TestToolSyntaxFromTemplates(t *testing.T) {
	for file, want := range map[string]ToolSyntax{
		"tools/Qwen-Qwen3-0.6B.jinja":                             Hermes,
		"tools/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": Hermes,
		"tools/Mistral-Small-3.2-24B-Instruct-2506.jinja":         Mistral,
		"meta-llama-Llama-3.1-8B-Instruct.jinja":                  Llama3,
	} {
		src, err := os.ReadFile(filepath.Join("../../../shared/chat-templates", file))
		if err != nil {
			t.Skipf("shared templates absent: %v", err)
		}
		tmpl, err := New(string(src))
		if err != nil {
			t.Fatal(err)
		}
		if got := tmpl.ToolSyntax(); got != want {
			t.Errorf("%s: %v, want %v", file, got, want)
		}
	}
}

func TestParseToolCalls(t *testing.T) {
	w := ParsedCall{Name: "get_weather", Arguments: `{"city":"Oslo","days":2}`}
	tm := ParsedCall{Name: "get_time", Arguments: `{}`}
	for _, tc := range []struct {
		syn     ToolSyntax
		text    string
		content string
		calls   []ParsedCall
	}{
		{Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>", "", []ParsedCall{w}},
		{Hermes, "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{}\"}\n</tool_call>", "Let me look.", []ParsedCall{w, tm}},
		{Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"", nil}, // cut
		{Hermes, "no calls here", "no calls here", nil},
		{Mistral, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\", \"days\": 2}", "", []ParsedCall{w}},
		{Mistral, "ok[TOOL_CALLS]get_weather[CALL_ID]abcdefghi[ARGS]{\"city\":\"Oslo\",\"days\":2}[TOOL_CALLS]get_time[ARGS]{}", "ok", []ParsedCall{w, tm}},
		{Mistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}]", "", []ParsedCall{w}},
		{Mistral, "[TOOL_CALLS]get_weather[ARGS]{\"city\": ", "[TOOL_CALLS]get_weather[ARGS]{\"city\": ", nil},
		{Llama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": 2}}", "", []ParsedCall{w}},
		{Llama3, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": 2}}; {\"name\": \"get_time\", \"parameters\": {}}", "", []ParsedCall{w, tm}},
		{Llama3, "The answer is {not a call}", "The answer is {not a call}", nil},
	} {
		content, calls, ok := tc.syn.ParseToolCalls(tc.text)
		if content != tc.content || !reflect.DeepEqual(calls, tc.calls) || ok != (tc.calls != nil) {
			t.Errorf("%v %q: %q %+v %v; want %q %+v", tc.syn, tc.text, content, calls, ok, tc.content, tc.calls)
		}
	}
}

func TestCallStartHoldsPartialMarker(t *testing.T) {
	for _, tc := range []struct {
		syn         ToolSyntax
		text        string
		start, held int
	}{
		{Hermes, "abc <tool_c", -1, 7},
		{Hermes, "abc <tool_call>", 4, 0},
		{Hermes, "abc <", -1, 1},
		{Mistral, "x[TOOL", -1, 5},
		{Llama3, "  {\"name\"", 2, 0},
		{Llama3, "so {", -1, 0},
	} {
		if s, h := tc.syn.CallStart(tc.text, true); s != tc.start || h != tc.held {
			t.Errorf("%v %q: %d, %d; want %d, %d", tc.syn, tc.text, s, h, tc.start, tc.held)
		}
	}
}

// TestRenderTools: tools and a call loop render through the tools
// templates: the tools' JSON in the order written, the call's arguments,
// the tool message's content.
func TestRenderTools(t *testing.T) {
	tools := []byte(`[{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string","description":"The city"}},"required":["city"]}}}]`)
	msgs := []Message{
		{Role: "user", Content: "Weather in Oslo?"},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "abcdefghi", Name: "get_weather", Arguments: `{"city":"Oslo"}`}}},
		{Role: "tool", Content: `{"temperature": 21}`, ToolCallID: "abcdefghi"},
	}
	for _, file := range []string{
		"tools/Qwen-Qwen3-0.6B.jinja",
		"tools/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
		"tools/Mistral-Small-3.2-24B-Instruct-2506.jinja",
	} {
		src, err := os.ReadFile(filepath.Join("../../../shared/chat-templates", file))
		if err != nil {
			t.Skipf("shared templates absent: %v", err)
		}
		tmpl, err := New(string(src))
		if err != nil {
			t.Fatal(err)
		}
		out, err := tmpl.Render(msgs, Options{BOS: "<s>", EOS: "</s>", AddGenerationPrompt: true, Tools: tools})
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, want := range []string{"get_weather", `"city": "Oslo"`, `{"temperature": 21}`} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: %q missing from\n%s", file, want, out)
			}
		}
		if !strings.Contains(out, `"type": "object", "properties": {"city"`) && !strings.Contains(out, `"type":"object","properties":{"city"`) {
			t.Errorf("%s: tools' parameters not in the order written:\n%s", file, out)
		}
	}
}

// TestCallGrammar: the grammar of a forced call accepts the call as each
// syntax writes it, and the parser reads it back.
func TestCallGrammar(t *testing.T) {
	params := [][]byte{[]byte(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}`), nil}
	names := []string{"get_weather", "get_time"}
	for _, tc := range []struct {
		syn   ToolSyntax
		names int
		doc   string
	}{
		{Hermes, 2, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>"},
		{Hermes, 1, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>"},
		{Mistral, 1, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}"},
		{Mistral, 2, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]"},
		{Llama3, 2, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"},
	} {
		f := tc.syn.CallGrammar(names[:tc.names], params[:tc.names], false)
		if f.Repeat {
			t.Errorf("%v: one call repeats", tc.syn)
		}
		g, err := grammar.Compile(grammar.WrapFormat(f.Prefix, f.Schema, f.Suffix))
		if err != nil {
			t.Fatalf("%v: %v", tc.syn, err)
		}
		// Several calls: the grammar takes the call twice, in the
		// syntax's way, and the parser reads both.
		fs := tc.syn.CallGrammar(names[:tc.names], params[:tc.names], true)
		rf := grammar.WrapFormat(fs.Prefix, fs.Schema, fs.Suffix)
		two := tc.doc + fs.Sep + tc.doc
		if fs.Repeat {
			rf = grammar.WrapRepeatFormat(fs.Prefix, fs.Schema, fs.Suffix, fs.Sep)
		} else { // Mistral's array form: two items
			two = strings.Replace(tc.doc, "}}]", "}}, "+strings.TrimPrefix(strings.TrimSuffix(tc.doc, "]"), "[TOOL_CALLS][")+"]", 1)
		}
		gs, err := grammar.Compile(rf)
		if err != nil {
			t.Fatalf("%v: %v", tc.syn, err)
		}
		if !gs.Match([]byte(tc.doc)) || !gs.Match([]byte(two)) {
			t.Errorf("%v: the grammar of several calls refuses one or two: %q", tc.syn, two)
		}
		if _, calls, ok := tc.syn.ParseToolCalls(two); !ok || len(calls) != 2 {
			t.Errorf("%v: %q parses to %+v", tc.syn, two, calls)
		}
		if !g.Match([]byte(tc.doc)) {
			t.Errorf("%v: grammar refuses %q", tc.syn, tc.doc)
		}
		if _, calls, ok := tc.syn.ParseToolCalls(tc.doc); !ok || len(calls) != 1 {
			t.Errorf("%v: %q parses to %+v", tc.syn, tc.doc, calls)
		}
		bad := strings.Replace(tc.doc, "Oslo\"", "Oslo\", \"x\": 1", 1)
		if tc.names == 1 && g.Match([]byte(bad)) {
			t.Errorf("%v: grammar accepts %q", tc.syn, bad)
		}
	}
}
