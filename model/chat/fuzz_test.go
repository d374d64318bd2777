package chat

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzTemplate compiles and renders arbitrary template text: a model file's
// template is input, so neither New nor Render may panic on it.
func FuzzTemplate(f *testing.F) {
	for _, name := range builtinNames {
		src, err := builtinFS.ReadFile("builtin/" + name + ".jinja")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(src))
	}
	files, _ := filepath.Glob(filepath.Join(sharedTemplates, "*.jinja"))
	for _, file := range files {
		if src, err := os.ReadFile(file); err == nil {
			f.Add(string(src))
		}
	}
	f.Add("{{ raise_exception('x') }}")
	f.Add("{% for m in messages %}{{ m.content | trim }}{% endfor %}{{ strftime_now('%d %b %Y') }}")
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := New(src)
		if err != nil {
			return
		}
		_, _ = tmpl.Render(conversation, Options{BOS: "<s>", EOS: "</s>", AddGenerationPrompt: true, Now: fixedNow})
	})
}
