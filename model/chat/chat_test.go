package chat

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// sharedTemplates is where the publishers' chat templates live; they are not
// copied into the repository.
const sharedTemplates = "../../../shared/chat-templates"

// cases mirrors testdata/cases.json, which testdata/gen.py also reads.
type cases struct {
	Now       time.Time
	Templates map[string]struct {
		BOS string `json:"bos"`
		EOS string `json:"eos"`
	}
	Conversations map[string]struct {
		AddGenerationPrompt bool `json:"add_generation_prompt"`
		Messages            []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		}
	}
}

func loadCases(t *testing.T) cases {
	t.Helper()
	b, err := os.ReadFile("testdata/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var c cases
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// loadTemplate compiles a template named in cases.json: "builtin-NAME" is a
// builtin, anything else a file in sharedTemplates (skipped when absent).
func loadTemplate(t *testing.T, name string) *Template {
	t.Helper()
	if b, ok := strings.CutPrefix(name, "builtin-"); ok {
		tmpl, err := Builtin(b)
		if err != nil {
			t.Fatal(err)
		}
		return tmpl
	}
	src, err := os.ReadFile(filepath.Join(sharedTemplates, name+".jinja"))
	if errors.Is(err, os.ErrNotExist) {
		sharedAbsent(t, filepath.Join(sharedTemplates, name+".jinja"), err)
	}
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := New(string(src))
	if err != nil {
		t.Fatalf("New(%s): %v", name, err)
	}
	return tmpl
}

// knownMismatch lists "template.conversation" renderings where the engine is
// known to differ from Jinja2, with the reason. Empty: every case matches.
var knownMismatch = map[string]string{}

// TestGolden renders every template for every conversation and compares with
// what Python's Jinja2 rendered (testdata/gen.py).
func TestGolden(t *testing.T) {
	c := loadCases(t)
	for name, tok := range c.Templates {
		for conv, cv := range c.Conversations {
			t.Run(name+"."+conv, func(t *testing.T) {
				if why, ok := knownMismatch[name+"."+conv]; ok {
					t.Skip(why)
				}
				tmpl := loadTemplate(t, name)
				msgs := make([]Message, len(cv.Messages))
				for i, m := range cv.Messages {
					msgs[i] = Message{Role: m.Role, Content: m.Content}
				}
				got, err := tmpl.Render(msgs, Options{BOS: tok.BOS, EOS: tok.EOS, AddGenerationPrompt: cv.AddGenerationPrompt, Now: c.Now})

				base := filepath.Join("testdata", "golden", name+"."+conv)
				if want, rerr := os.ReadFile(base + ".error"); rerr == nil {
					var re *RaiseError
					if !errors.As(err, &re) {
						t.Fatalf("Render: got %q, %v; want a *RaiseError %q", got, err, want)
					}
					if re.Message != string(want) {
						t.Errorf("RaiseError.Message = %q, want %q", re.Message, want)
					}
					return
				}
				want, rerr := os.ReadFile(base + ".golden")
				if rerr != nil {
					t.Fatalf("no golden for %s (run testdata/gen.py): %v", base, rerr)
				}
				if err != nil {
					t.Fatalf("Render: %v", err)
				}
				if diff := cmp.Diff(got, string(want)); diff != "" {
					t.Errorf("Render differs from Jinja2 (-got +want):\n%s", diff)
				}
			})
		}
	}
}

// TestGoldenComplete checks every template in the shared directory is covered.
func TestGoldenComplete(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(sharedTemplates, "*.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		sharedAbsent(t, filepath.Join(sharedTemplates, "*.jinja"), errors.New("no file matches"))
	}
	c := loadCases(t)
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".jinja")
		if _, ok := c.Templates[name]; !ok {
			t.Errorf("%s is not in testdata/cases.json", name)
		}
	}
}

var fixedNow = time.Date(2025, 3, 9, 14, 5, 7, 0, time.UTC)

var conversation = []Message{
	{Role: "system", Content: "Be brief."},
	{Role: "user", Content: "Hi"},
	{Role: "assistant", Content: "Hello!"},
	{Role: "user", Content: "Bye"},
}

func TestBuiltinFormats(t *testing.T) {
	tests := []struct {
		name string
		opt  Options
		msgs []Message
		want string
	}{
		{
			name: "llama2",
			opt:  Options{BOS: "<s>", EOS: "</s>", AddGenerationPrompt: true},
			msgs: conversation,
			want: "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]",
		},
		{
			name: "llama2",
			opt:  Options{BOS: "<s>", EOS: "</s>"},
			msgs: conversation[1:2],
			want: "<s>[INST] Hi [/INST]",
		},
		{
			name: "llama3",
			opt:  Options{BOS: "<|begin_of_text|>", AddGenerationPrompt: true},
			msgs: conversation,
			want: "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\n",
		},
		{
			name: "llama3",
			opt:  Options{BOS: "<|begin_of_text|>"},
			msgs: conversation[1:2],
			want: "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
		},
		{
			name: "chatml",
			opt:  Options{AddGenerationPrompt: true},
			msgs: conversation,
			want: "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" +
				"<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n",
		},
		{
			name: "chatml",
			msgs: conversation[1:2],
			want: "<|im_start|>user\nHi<|im_end|>\n",
		},
	}
	for _, tt := range tests {
		tmpl, err := Builtin(tt.name)
		if err != nil {
			t.Fatal(err)
		}
		if tmpl.Name() != tt.name {
			t.Errorf("Name() = %q, want %q", tmpl.Name(), tt.name)
		}
		tt.opt.Now = fixedNow
		got, err := tmpl.Render(tt.msgs, tt.opt)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if diff := cmp.Diff(got, tt.want); diff != "" {
			t.Errorf("%s (-got +want):\n%s", tt.name, diff)
		}
	}
}

func TestBuiltinUnknown(t *testing.T) {
	_, err := Builtin("vicuna")
	if !errors.Is(err, ErrUnknownBuiltin) {
		t.Fatalf("Builtin(vicuna) error = %v, want ErrUnknownBuiltin", err)
	}
	if !strings.Contains(err.Error(), `"vicuna"`) {
		t.Errorf("error %q does not name the template", err)
	}
}

func TestFallback(t *testing.T) {
	vocab := func(toks ...string) func(string) bool {
		return func(s string) bool {
			for _, t := range toks {
				if s == t {
					return true
				}
			}
			return false
		}
	}
	tests := []struct {
		hasToken func(string) bool
		want     string
	}{
		{vocab("<|im_start|>", "<|im_end|>"), "chatml"},
		{vocab("<|start_header_id|>", "<|eot_id|>"), "llama3"},
		{vocab("<s>", "</s>", "[INST]"), "llama2"},
		{nil, "llama2"},
	}
	for _, tt := range tests {
		if got := Fallback(tt.hasToken).Name(); got != tt.want {
			t.Errorf("Fallback chose %q, want %q", got, tt.want)
		}
	}
}

func TestNewParseError(t *testing.T) {
	for _, src := range []string{
		"{% if messages %}unclosed",
		"{{ messages ",
		"{% for m in messages %}{% endif %}",
	} {
		if _, err := New(src); err == nil {
			t.Errorf("New(%q) succeeded, want a parse error", src)
		}
	}
}

func TestRaiseException(t *testing.T) {
	tmpl, err := New(`{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tmpl.Render(conversation, Options{Now: fixedNow})
	var re *RaiseError
	if !errors.As(err, &re) || re.Message != "System role not supported" {
		t.Fatalf("Render error = %v, want *RaiseError with the template's message", err)
	}
	if got, err := tmpl.Render(conversation[1:], Options{Now: fixedNow}); err != nil || got != "ok" {
		t.Errorf("Render without system = %q, %v; want \"ok\", nil", got, err)
	}

	llama2, err := Builtin("llama2")
	if err != nil {
		t.Fatal(err)
	}
	_, err = llama2.Render([]Message{{Role: "user", Content: "a"}, {Role: "user", Content: "b"}}, Options{Now: fixedNow})
	if !errors.As(err, &re) || !strings.Contains(re.Message, "must alternate") {
		t.Errorf("llama2 with two user turns: error = %v, want the alternation RaiseError", err)
	}
}

func TestGemmaSystemRole(t *testing.T) {
	tmpl := loadTemplate(t, "google-gemma-2-2b-it")
	_, err := tmpl.Render(conversation, Options{BOS: "<bos>", Now: fixedNow})
	var re *RaiseError
	if !errors.As(err, &re) || re.Message != "System role not supported" {
		t.Fatalf("Render error = %v, want RaiseError \"System role not supported\"", err)
	}
	if err.Error() != "chat: template raised: System role not supported" {
		t.Errorf("Error() = %q", err.Error())
	}
}

func TestStrftimeNow(t *testing.T) {
	tests := []struct {
		format string
		now    time.Time
		want   string
	}{
		{"%d %b %Y", fixedNow, "09 Mar 2025"},
		{"%Y-%m-%d %H:%M:%S", fixedNow, "2025-03-09 14:05:07"},
		{"%A %B %e %y %j", fixedNow, "Sunday March  9 25 068"},
		{"%a %I%p 100%%", fixedNow, "Sun 02PM 100%"},
		{"%I %p", time.Date(2025, 1, 1, 0, 30, 0, 0, time.UTC), "12 AM"},
	}
	for _, tt := range tests {
		tmpl, err := New(`{{ strftime_now("` + tt.format + `") }}`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tmpl.Render(nil, Options{Now: tt.now})
		if err != nil {
			t.Fatalf("%q: %v", tt.format, err)
		}
		if got != tt.want {
			t.Errorf("strftime_now(%q) = %q, want %q", tt.format, got, tt.want)
		}
	}
	tmpl, err := New(`{{ strftime_now("%Q") }}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmpl.Render(nil, Options{Now: fixedNow}); err == nil || !strings.Contains(err.Error(), "%Q") {
		t.Errorf("unsupported directive: error = %v, want one naming %%Q", err)
	}
}

// TestRenderConcurrent renders one template from several goroutines; run with
// -race to check Template is safe for concurrent use.
func TestRenderConcurrent(t *testing.T) {
	tmpl, err := Builtin("chatml")
	if err != nil {
		t.Fatal(err)
	}
	want, err := tmpl.Render(conversation, Options{Now: fixedNow})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan string)
	for range 4 {
		go func() {
			got, _ := tmpl.Render(conversation, Options{Now: fixedNow})
			done <- got
		}()
	}
	for range 4 {
		if got := <-done; got != want {
			t.Errorf("concurrent Render = %q, want %q", got, want)
		}
	}
}
