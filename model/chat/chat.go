package chat

import (
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/ardanlabs/jinja"
)

// Message is one turn of a conversation.
type Message struct {
	// Role is "system", "user" or "assistant" (templates may accept others,
	// such as "tool").
	Role string
	// Content is the text of the turn.
	Content string
	// ToolCalls are an assistant turn's function calls; templates see
	// message.tool_calls only when there are some.
	ToolCalls []ToolCall
	// ToolCallID is the call a "tool" turn answers (message.tool_call_id),
	// and Name the function's name (message.name); "" leaves them out.
	ToolCallID, Name string
}

// ToolCall is one function call of an assistant turn, as OpenAI's API
// writes it: templates see {"id", "type": "function", "function": {"name",
// "arguments"}}, arguments as an object when they parse as one (templates
// write it with tojson) and as the string otherwise.
type ToolCall struct {
	ID, Name, Arguments string
}

// Options are the per-render variables a template sees besides the messages.
type Options struct {
	// BOS and EOS are the model's begin- and end-of-sequence token texts,
	// exposed as bos_token and eos_token.
	BOS, EOS string
	// AddGenerationPrompt asks the template to end with the header that
	// opens the assistant's turn.
	AddGenerationPrompt bool
	// Tools is the request's tools array (OpenAI's JSON), exposed as tools
	// with its objects' keys in the order written; nil means none.
	Tools []byte
	// Now is the time strftime_now formats (templates such as Llama 3.2 put
	// "Today Date" in the system prompt). Zero means the time of the call;
	// tests and anything that must be reproducible set it.
	Now time.Time
}

// RaiseError is the error Render returns when the template calls
// raise_exception, for example Gemma's "System role not supported".
type RaiseError struct {
	// Message is the text the template passed to raise_exception.
	Message string
}

// Error returns the template's message with the package prefix.
func (e *RaiseError) Error() string { return "chat: template raised: " + e.Message }

// ErrUnknownBuiltin is returned by Builtin for a name it does not know.
var ErrUnknownBuiltin = errors.New("chat: unknown builtin template")

// Template is a compiled chat template. It is immutable and safe for
// concurrent use.
type Template struct {
	name string
	src  string
	tmpl *jinja.Template
}

// New compiles a Jinja chat template. It returns an error when source does
// not parse.
func New(source string) (*Template, error) {
	return compile("", source)
}

func compile(name, source string) (_ *Template, err error) {
	defer recoverEngine(&err)
	t, err := jinja.Compile(source)
	if err != nil {
		return nil, fmt.Errorf("chat: compile template: %w", err)
	}
	return &Template{name: name, src: source, tmpl: t}, nil
}

// builtinFS holds the built-in templates; testdata/gen.py renders the same
// files with Python's Jinja2 to make the goldens the tests compare against.
//
//go:embed builtin/*.jinja
var builtinFS embed.FS

// builtinNames lists the names Builtin accepts, for its error message.
var builtinNames = []string{"llama2", "llama3", "chatml"}

// Builtin returns a built-in template by name:
//   - "llama2": <s>[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] assistant </s>,
//     as Llama 2 chat; roles must alternate user/assistant.
//   - "llama3": <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>,
//     as Llama 3 Instruct.
//   - "chatml": <|im_start|>role\ncontent<|im_end|>\n, as Qwen and many others.
func Builtin(name string) (*Template, error) {
	src, err := builtinFS.ReadFile("builtin/" + name + ".jinja")
	if err != nil {
		return nil, fmt.Errorf("%w: %q (have %q)", ErrUnknownBuiltin, name, builtinNames)
	}
	return compile(name, string(src))
}

// Fallback chooses a built-in template for a model file that carries none,
// from whether its vocabulary has a format's special tokens: "<|im_start|>"
// selects chatml, "<|start_header_id|>" selects llama3, anything else (and a
// nil hasToken) llama2.
func Fallback(hasToken func(string) bool) *Template {
	name := "llama2"
	switch {
	case hasToken == nil:
	case hasToken("<|im_start|>"):
		name = "chatml"
	case hasToken("<|start_header_id|>"):
		name = "llama3"
	}
	t, err := Builtin(name)
	if err != nil {
		panic(fmt.Sprintf("chat: builtin %q does not compile: %v", name, err))
	}
	return t
}

// Name returns the built-in name ("llama2", "llama3", "chatml"), or "" for a
// template made by New.
func (t *Template) Name() string { return t.name }

// Source returns the Jinja source the template was compiled from.
func (t *Template) Source() string { return t.src }

// Render formats msgs with the template. An error from raise_exception is a
// *RaiseError; other errors come from evaluating the template.
func (t *Template) Render(msgs []Message, opt Options) (_ string, err error) {
	defer recoverEngine(&err)
	now := opt.Now
	if now.IsZero() {
		now = time.Now()
	}
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		d := jinja.NewDict()
		d.AsDict().Set("role", jinja.NewString(m.Role))
		d.AsDict().Set("content", jinja.NewString(m.Content))
		if len(m.ToolCalls) > 0 {
			calls := make([]jinja.Value, len(m.ToolCalls))
			for j, c := range m.ToolCalls {
				fn := jinja.NewDict()
				fn.AsDict().Set("name", jinja.NewString(c.Name))
				args, err := FromJSON([]byte(c.Arguments))
				if err != nil || !args.IsDict() {
					args = jinja.NewString(c.Arguments)
				}
				fn.AsDict().Set("arguments", args)
				call := jinja.NewDict()
				call.AsDict().Set("id", jinja.NewString(c.ID))
				call.AsDict().Set("type", jinja.NewString("function"))
				call.AsDict().Set("function", fn)
				calls[j] = call
			}
			d.AsDict().Set("tool_calls", jinja.NewList(calls))
		}
		if m.ToolCallID != "" {
			d.AsDict().Set("tool_call_id", jinja.NewString(m.ToolCallID))
		}
		if m.Name != "" {
			d.AsDict().Set("name", jinja.NewString(m.Name))
		}
		list[i] = d
	}
	tools := jinja.None()
	if opt.Tools != nil {
		if tools, err = FromJSON(opt.Tools); err != nil {
			return "", fmt.Errorf("chat: tools: %w", err)
		}
	}
	vars := map[string]jinja.Value{
		"messages":              jinja.NewList(list),
		"add_generation_prompt": jinja.NewBool(opt.AddGenerationPrompt),
		"bos_token":             jinja.NewString(opt.BOS),
		"eos_token":             jinja.NewString(opt.EOS),
		"tools":                 tools,
		"raise_exception":       jinja.NewCallable("raise_exception", raiseException),
		"strftime_now":          jinja.NewCallable("strftime_now", strftimeNow(now)),
	}
	out, err := t.tmpl.RenderValues(vars)
	if err != nil {
		var re *RaiseError
		if errors.As(err, &re) {
			return "", re
		}
		return "", fmt.Errorf("chat: render: %w", err)
	}
	return out, nil
}

// recoverEngine turns a panic in the template engine into an error: the
// template comes from a model file, and bad input must not crash the server.
func recoverEngine(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("chat: template engine panicked: %v", r)
	}
}

func raiseException(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), &RaiseError{Message: "raise_exception called without a message"}
	}
	return jinja.Undefined(), &RaiseError{Message: text(args[0])}
}

func strftimeNow(now time.Time) func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
	return func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 || !args[0].IsString() {
			return jinja.Undefined(), fmt.Errorf("strftime_now: want one format string, got %d arguments", len(args))
		}
		s, err := strftime(now, args[0].AsString())
		if err != nil {
			return jinja.Undefined(), err
		}
		return jinja.NewString(s), nil
	}
}

// text returns v as Jinja's {{ v }} would print it.
func text(v jinja.Value) string {
	if v.IsString() {
		return v.AsString()
	}
	return v.String()
}
