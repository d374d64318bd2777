package cpu_test

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// llamaCppOutputs is model/testdata/llamacpp/outputs.json: llama.cpp's greedy
// tokens for every shared model file and several prompts (see its README).
type llamaCppOutputs struct {
	Commit  string `json:"llama_cpp_commit"`
	Results []struct {
		Model        string  `json:"model"`
		Prompt       string  `json:"prompt"`
		PromptTokens []int32 `json:"prompt_tokens"`
		Tokens       []int32 `json:"tokens"`
		Text         string  `json:"text"`
		Threads      int     `json:"threads"`
		FlashAttn    string  `json:"flash_attn"`
	} `json:"results"`
}

// TestGreedyMatchesLlamaCpp replays every recorded llama.cpp run (five model
// files — F32, F16, BF16, Q8_0, Q4_0 — and five prompts) and requires the
// same 64 greedy tokens.
//
// One exception, measured rather than assumed: on the Q4_0 file llama.cpp's
// own output depends on its kernel (with --no-repack it changes "Sara had a
// red ball. She" from token 18), because 4-bit weights with 8-bit activations
// turn reduction-order noise into different rounding of the activations. For
// that file a run may diverge, but only where llama.cpp's token is within
// q40Margin of our best logit when fed llama.cpp's own tokens — a near tie,
// not a different model.
func TestGreedyMatchesLlamaCpp(t *testing.T) {
	raw, err := os.ReadFile("../testdata/llamacpp/outputs.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref llamaCppOutputs
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	parent := t
	models := map[string]*model.Model{}
	seen := map[string]bool{}
	for _, r := range ref.Results {
		key := r.Model + "|" + r.Prompt
		if seen[key] { // the same run recorded with other threads or attention settings
			continue
		}
		seen[key] = true
		t.Run(fmt.Sprintf("%s/%s", r.Model, r.Prompt), func(t *testing.T) {
			m := models[r.Model]
			if m == nil {
				var err error
				if m, err = model.Load(openShared(parent, r.Model)); err != nil { // open for the whole test
					t.Fatal(err)
				}
				models[r.Model] = m
			}
			e := newEngine(t, m, 2, 8, ggml.F16)
			got := e.greedy(t, r.PromptTokens, len(r.Tokens))
			if slices.Equal(got, r.Tokens) {
				return
			}
			i := 0
			for i < len(got) && got[i] == r.Tokens[i] {
				i++
			}
			if r.Model != "stories260K-Q4_0.gguf" {
				t.Fatalf("first difference at generated token %d: got %v, llama.cpp %v", i, got[i:min(i+5, len(got))], r.Tokens[i:min(i+5, len(r.Tokens))])
			}
			margin := forcedMargin(t, newEngine(t, m, 2, 8, ggml.F16), r.PromptTokens, r.Tokens, i)
			t.Logf("Q4_0 near tie at generated token %d: llama.cpp's %d is %.4f below our best", i, r.Tokens[i], margin)
			if margin > q40Margin {
				t.Errorf("Q4_0 diverges at token %d by %.4f logits, more than a near tie (%.2f)", i, margin, q40Margin)
			}
		})
	}
}

// q40Margin bounds how far below our best logit llama.cpp's choice may be
// where a Q4_0 run diverges (observed: 0.0009 to 0.045).
const q40Margin = 0.1

// forcedMargin feeds prompt and llama.cpp's first i tokens, then returns how
// far llama.cpp's next token's logit lies below our largest.
func forcedMargin(t *testing.T, e *engine, prompt, want []int32, i int) float32 {
	t.Helper()
	seq := append(slices.Clone(prompt), want[:i]...)
	blocks := e.blocksFor(nil, len(seq))
	logits, err := e.stage.Forward([]model.Row{{Seq: 1, First: true, Tokens: seq, Blocks: blocks, Logits: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return logits[argmax(logits)] - logits[want[i]]
}
