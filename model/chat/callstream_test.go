package chat

import (
	"math/rand/v2"
	"testing"
)

// TestCallStream: whatever pieces a forced call's text arrives in, the
// stream gives the name once, before any arguments, and the arguments
// joined are exactly what ParseToolCalls reads from the whole text.
func TestCallStream(t *testing.T) {
	args := "{\n  \"city\": \"Paris \\\"centre\\\" }, ]\",\n  \"days\": [1, 2,\n 30],\n  \"deep\": {\"a\": {\"b\": null}, \"t\": true},\n  \"x\": -1.5e3\n}"
	cases := []struct {
		syn  ToolSyntax
		text string
	}{
		{Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args + "}\n</tool_call>"},
		{Hermes, "<tool_call>\n{ \"name\" : \"get_weather\" ,\n \"arguments\" :" + args + " }\n</tool_call>"},
		{Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"},
		{Llama3, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": " + args + "}"},
		{Llama3, "{\"name\": \"get_weather\", \"parameters\": " + args + "}"},
		{Mistral, "[TOOL_CALLS]get_weather[ARGS]" + args},
		{Mistral, "[TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]" + args},
		{Mistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " + args + "}]"},
	}
	r := rand.New(rand.NewPCG(3, 9))
	for ci, tc := range cases {
		_, calls, ok := tc.syn.ParseToolCalls(tc.text)
		if !ok || len(calls) != 1 {
			t.Fatalf("case %d: the whole text does not parse: %v %v", ci, calls, ok)
		}
		for trial := range 30 {
			cs := NewCallStream(tc.syn)
			var name, got string
			names := 0
			for rest := tc.text; rest != ""; {
				n := 1 + r.IntN(8)
				if trial == 0 {
					n = 1
				}
				n = min(n, len(rest))
				nm, a := cs.Feed(rest[:n])
				rest = rest[n:]
				if nm != "" {
					name, names = nm, names+1
				}
				if a != "" && names == 0 {
					t.Fatalf("case %d: arguments %q before the name", ci, a)
				}
				got += a
			}
			if names != 1 || name != calls[0].Name {
				t.Fatalf("case %d: name %q given %d times, want %q once", ci, name, names, calls[0].Name)
			}
			if got != calls[0].Arguments {
				t.Fatalf("case %d trial %d: streamed arguments %q, whole %q", ci, trial, got, calls[0].Arguments)
			}
		}
	}
}

// TestCallStreamStops: text that is not a call's shape gives nothing out.
func TestCallStreamStops(t *testing.T) {
	for _, text := range []string{
		"<tool_call>\nnot json",
		"<tool_call>\n{\"arguments\": {\"a\": 1}",       // arguments before any name wait
		"<tool_call>\n{\"name\": 3, \"arguments\": {}}", // the name not a string
	} {
		cs := NewCallStream(Hermes)
		if name, args := cs.Feed(text); name != "" || args != "" {
			t.Errorf("%q: name %q, arguments %q", text, name, args)
		}
	}
}
