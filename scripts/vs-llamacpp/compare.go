package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/strata-llm/strata/coordinator"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
	"github.com/strata-llm/strata/model/tokenizer"
)

// prompts are regen.sh's five (stories260K's reference outputs).
var prompts = []string{"Once upon a time", "Lily and Tom went to the park", "The little dog",
	"One day, a big bear", "Sara had a red ball. She"}

// floor is issue 12's absolute tolerance on log-probabilities.
const floor = 2e-3

// promptResult is one prompt's comparison.
type promptResult struct {
	Prompt        string   `json:"prompt"`
	PromptTokens  []int32  `json:"prompt_tokens"`   // llama.cpp's /tokenize, BOS included
	StrataEncoded []int32  `json:"strata_encoded"`  // strata's encoding of the same text
	LlamaOn       llamaRun `json:"llama_fa_on"`     // flash attention on
	LlamaOff      llamaRun `json:"llama_fa_off"`    // flash attention off
	StrataTokens  []int32  `json:"strata_tokens"`   // greedy, fed PromptTokens
	Equal         int      `json:"equal"`           // leading tokens strata and llama.cpp (on) share
	OnOffEqual    int      `json:"llama_on_off_eq"` // leading tokens llama.cpp on and off share
	// At the first divergence (Equal < n): strata's best logit minus its
	// logit of llama.cpp's token, and llama.cpp's log-probability of its
	// token minus that of strata's (NaN when strata's token is not in its
	// list: then LlamaGapAtLeast says LlamaGap is a lower bound;
	// LlamaGapUnknown when llama-server gave no list there, and then a
	// near tie is judged on strata's side alone).
	StrataGap       float64 `json:"strata_gap,omitempty"`
	LlamaGap        float64 `json:"llama_gap,omitempty"`
	LlamaGapAtLeast bool    `json:"llama_gap_at_least,omitempty"`
	LlamaGapUnknown bool    `json:"llama_gap_unknown,omitempty"`
	NearTie         bool    `json:"near_tie,omitempty"`
	// Top-5 at the divergence on both sides (id:logprob).
	StrataTop5 []string `json:"strata_top5,omitempty"`
	LlamaTop5  []string `json:"llama_top5,omitempty"`
	// First generated token, over llama.cpp's top 10 (fa on): strata's
	// largest |Δ logprob| against fa on and fa off, and llama.cpp's own
	// largest |on − off| (over those of the 10 in off's top 20;
	// SpreadMissing counts the others).
	DeltaOn       float64 `json:"delta_on"`
	DeltaOff      float64 `json:"delta_off"`
	Spread        float64 `json:"spread"`
	SpreadMissing int     `json:"spread_missing,omitempty"`
	// FirstMissing: llama-server gave no list for the first token (it
	// ends inside a UTF-8 sequence); the prompt is left out of the
	// log-probability rule.
	FirstMissing bool `json:"first_missing,omitempty"`
	Pass         bool `json:"pass"`
	// SamplerDiff is the largest |sampler's top-10 logprob − the float64
	// log-softmax| (the API's figure beside this one's), and SamplerToken
	// whether the sampler's greedy token is the first generated one.
	SamplerDiff  float64 `json:"sampler_diff"`
	SamplerToken bool    `json:"sampler_token_equal"`
	MinGap       float64 `json:"min_gap"` // strata's smallest top-1/top-2 gap over the equal prefix
	MedianGap    float64 `json:"median_gap"`
}

// fileResult is one file's record.
type fileResult struct {
	File      string            `json:"file"`
	Label     string            `json:"label"`
	Types     string            `json:"types"`
	Llama     string            `json:"llama_version"`
	Settings  map[string]string `json:"llama_settings_on"`
	N         int               `json:"n_predict"`
	NProbs    int               `json:"n_probs"`
	Tie       float64           `json:"tie"`
	Threads   int               `json:"threads"`
	Prompts   []promptResult    `json:"prompts"`
	Equal     int               `json:"equal"`
	Total     int               `json:"total"`
	DeltaOn   float64           `json:"delta_on"`
	DeltaOff  float64           `json:"delta_off"`
	Spread    float64           `json:"spread"`
	Pass      bool              `json:"pass"`
	TokensOK  bool              `json:"tokens_ok"` // equal, or parting only at near ties
	MedianGap float64           `json:"median_gap"`
}

func compare(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	path := fs.String("model", "", "GGUF file (under --root)")
	root := fs.String("root", "/work/trixie", "directory llama-server sees as / (the model must lie under it); empty: the server sees this machine's paths")
	server := fs.String("server", "chroot /work/trixie llama-server", "command that starts llama-server (split on spaces)")
	label := fs.String("label", "", "the row's first cell (default: the file's name)")
	n := fs.Int("n", 64, "greedy tokens per prompt")
	nPrompts := fs.Int("prompts", len(prompts), "how many of the five prompts")
	nProbs := fs.Int("n-probs", 20, "llama.cpp's n_probs (the first 10 are compared; the rest find strata's or the other run's tokens)")
	tie := fs.Float64("tie", 0.1, "a divergence is a near tie when both sides' gaps are below this (logits)")
	threads := fs.Int("threads", 2, "threads of both engines")
	kv := fs.String("strata-kv", "f16", "strata's KV cache type, f16 or f32 (llama.cpp's stays f16)")
	jsonOut := fs.String("json", "", "append the full record as one JSON line to this file")
	header := fs.Bool("header", false, "print the table's header first")
	headerOnly := fs.Bool("header-only", false, "print the table's header and nothing else")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *headerOnly {
		fmt.Println(tableHeader)
		return nil
	}
	if *path == "" {
		return errors.New("compare: --model is required")
	}
	if *nPrompts < 1 || *nPrompts > len(prompts) || *n < 1 || *nProbs < 10 {
		return fmt.Errorf("compare: --prompts must be 1..%d, --n >= 1, --n-probs >= 10", len(prompts))
	}
	abs, err := filepath.Abs(*path)
	if err != nil {
		return err
	}
	seen := abs
	if *root != "" {
		r, err := filepath.Abs(*root)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(r, abs)
		if err != nil || strings.HasPrefix(rel, "..") {
			return fmt.Errorf("compare: %s is not under --root %s", abs, r)
		}
		seen = "/" + rel
	}
	kvType := ggml.F16
	switch *kv {
	case "f16":
	case "f32":
		kvType = ggml.F32
	default:
		return fmt.Errorf("compare: --strata-kv must be f16 or f32, got %q", *kv)
	}
	srv := strings.Fields(*server)
	if len(srv) == 0 {
		return errors.New("compare: --server is empty")
	}

	f, m, tok, err := coordinator.OpenModel(abs)
	if err != nil {
		return err
	}
	defer f.Close()
	res := fileResult{File: filepath.Base(abs), Label: cmp.Or(*label, filepath.Base(abs)), Types: typeSummary(f),
		Llama: llamaVersion(srv), N: *n, NProbs: *nProbs, Tie: *tie, Threads: *threads, Pass: true, TokensOK: true}
	ctxLen := min(m.Context, 2048)

	var runs [2][]llamaRun
	for i, fa := range []string{"on", "off"} {
		s, err := startLlama(ctx, srv, seen, fa, ctxLen, *threads)
		if err != nil {
			return err
		}
		for _, p := range prompts[:*nPrompts] {
			r, err := s.run(p, *n, *nProbs)
			if err != nil {
				s.stop()
				return fmt.Errorf("llama-server -fa %s, prompt %q: %w\n%s", fa, p, err, tail(s.log.String(), 1500))
			}
			runs[i] = append(runs[i], r)
		}
		s.stop()
		if fa == "on" {
			res.Settings = s.settings()
		}
	}

	var gaps []float64
	for i, p := range prompts[:*nPrompts] {
		on, off := runs[0][i], runs[1][i]
		pr := promptResult{Prompt: p, PromptTokens: on.Prompt, LlamaOn: on, LlamaOff: off,
			StrataEncoded: tok.Encode(p, tokenizer.EncodeOptions{AddSpecial: true})}
		s, err := strataGreedy(m, tok, on.Prompt, *n, *threads, 10, kvType)
		if err != nil {
			return fmt.Errorf("strata, prompt %q: %w", p, err)
		}
		pr.StrataTokens = s.Tokens
		pr.Equal = prefix(s.Tokens, on.Tokens)
		pr.OnOffEqual = prefix(on.Tokens, off.Tokens)
		var pg []float64
		for _, g := range s.Margins[:min(pr.Equal+1, len(s.Margins))] {
			pg = append(pg, float64(g))
		}
		gaps = append(gaps, pg...)
		pr.MinGap, pr.MedianGap = slices.Min(pg), median(pg)
		if k := pr.Equal; k < len(s.Tokens) {
			st, lt := s.Tokens[k], on.Tokens[k]
			pr.StrataGap = float64(s.Logits[k][st] - s.Logits[k][lt])
			lp := func(id int32) (float64, bool) {
				for _, e := range on.Top[k] {
					if e.ID == id {
						return e.Logprob, true
					}
				}
				return 0, false
			}
			mine, known := lp(lt)
			theirs, ok := lp(st)
			switch {
			case !known: // no list at this position (see llamaRun.Top)
				pr.LlamaGapUnknown = true
			case ok:
				pr.LlamaGap = mine - theirs
			default:
				pr.LlamaGap, pr.LlamaGapAtLeast = mine-on.Top[k][len(on.Top[k])-1].Logprob, true
			}
			pr.NearTie = pr.StrataGap < *tie && (pr.LlamaGapUnknown || pr.LlamaGap < *tie && !pr.LlamaGapAtLeast)
			pr.StrataTop5 = topStrings(logSoftmax(s.Logits[k]), 5)
			for _, e := range on.Top[k][:min(5, len(on.Top[k]))] { // none when unknown
				pr.LlamaTop5 = append(pr.LlamaTop5, fmt.Sprintf("%d:%.4f", e.ID, e.Logprob))
			}
			if !pr.NearTie {
				res.TokensOK = false
			}
		}
		if on.Top[0] == nil || off.Top[0] == nil {
			pr.FirstMissing = true // the first token ends inside a UTF-8 sequence
		} else {
			offLP := map[int32]float64{}
			for _, e := range off.Top[0] {
				offLP[e.ID] = e.Logprob
			}
			for _, e := range on.Top[0][:min(10, len(on.Top[0]))] {
				pr.DeltaOn = max(pr.DeltaOn, math.Abs(s.FirstLP[e.ID]-e.Logprob))
				if o, ok := offLP[e.ID]; ok {
					pr.Spread = max(pr.Spread, math.Abs(o-e.Logprob))
				} else {
					pr.SpreadMissing++
				}
			}
			for _, e := range off.Top[0][:min(10, len(off.Top[0]))] {
				pr.DeltaOff = max(pr.DeltaOff, math.Abs(s.FirstLP[e.ID]-e.Logprob))
			}
		}
		for _, e := range s.Top {
			pr.SamplerDiff = max(pr.SamplerDiff, math.Abs(float64(e.Logprob)-s.FirstLP[e.Token]))
		}
		pr.SamplerToken = s.Sampled == s.Tokens[0]
		pr.Pass = pr.DeltaOn <= max(pr.Spread, floor)
		res.Pass = res.Pass && pr.Pass
		res.Equal += pr.Equal
		res.Total += len(s.Tokens)
		res.DeltaOn = max(res.DeltaOn, pr.DeltaOn)
		res.DeltaOff = max(res.DeltaOff, pr.DeltaOff)
		res.Spread = max(res.Spread, pr.Spread)
		res.Prompts = append(res.Prompts, pr)
	}
	res.MedianGap = median(gaps)

	if *header {
		fmt.Println(tableHeader)
	}
	fmt.Println(res.row())
	for _, pr := range res.Prompts {
		if pr.Equal < len(pr.StrataTokens) {
			fmt.Fprintf(os.Stderr, "%s %q: diverges at %d: strata top-5 %v, llama.cpp top-5 %v\n", res.Label, pr.Prompt, pr.Equal, pr.StrataTop5, pr.LlamaTop5)
		}
		if !slices.Equal(pr.StrataEncoded, pr.PromptTokens) {
			fmt.Fprintf(os.Stderr, "%s %q: strata encodes %v, llama.cpp %v\n", res.Label, pr.Prompt, pr.StrataEncoded, pr.PromptTokens)
		}
	}
	if *jsonOut != "" {
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		out, err := os.OpenFile(*jsonOut, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		if _, err := out.Write(append(b, '\n')); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	}
	return nil
}

const tableHeader = "| file | tensor types | prompt tokens equal | tokens equal (strata = llama.cpp) | divergences: prompt@token strata gap / llama.cpp gap | llama.cpp fa on = off | median top-2 gap | max Δ top-10 logprob vs fa on (off) | llama.cpp spread on/off | pass |\n" +
	"|---|---|---|---|---|---|---|---|---|---|"

// row is the file's Markdown table row.
func (r fileResult) row() string {
	encOK, onOff := 0, 0
	var divs []string
	for i, p := range r.Prompts {
		if slices.Equal(p.StrataEncoded, p.PromptTokens) {
			encOK++
		}
		onOff += p.OnOffEqual
		if p.Equal < len(p.StrataTokens) {
			ge := ""
			if p.LlamaGapAtLeast {
				ge = "≥"
			}
			lg := fmt.Sprintf("%s%.4f", ge, p.LlamaGap)
			if p.LlamaGapUnknown {
				lg = "?"
			}
			d := fmt.Sprintf("%d@%d %.4f / %s", i, p.Equal, p.StrataGap, lg)
			if p.NearTie {
				d += " near tie"
			} else {
				d += " **not a tie**"
			}
			divs = append(divs, d)
		}
	}
	missing := 0
	for _, p := range r.Prompts {
		if p.FirstMissing {
			missing++
		}
	}
	pass := "yes"
	if !r.Pass {
		var bad []string
		for i, p := range r.Prompts {
			if !p.Pass {
				bad = append(bad, fmt.Sprint(i))
			}
		}
		pass = "**no** (prompts " + strings.Join(bad, ",") + ")"
	}
	if !r.TokensOK {
		pass += ", tokens **no**"
	}
	if missing > 0 {
		pass += fmt.Sprintf(" (%d prompts without llama.cpp's first list)", missing)
	}
	return fmt.Sprintf("| %s | %s | %d/%d | %d/%d | %s | %d/%d | %.3f | %.1e (%.1e) | %.1e | %s |",
		r.Label, r.Types, encOK, len(r.Prompts), r.Equal, r.Total, cmp.Or(strings.Join(divs, "; "), "none"),
		onOff, r.Total, r.MedianGap, r.DeltaOn, r.DeltaOff, r.Spread, pass)
}

// typeSummary lists the file's matrix types with their tensor counts,
// most common first (1-D tensors, the norms, left out).
func typeSummary(f *gguf.File) string {
	count := map[string]int{}
	for _, t := range f.Tensors {
		if len(t.Dims) >= 2 {
			count[t.Type.String()]++
		}
	}
	names := slices.Collect(maps.Keys(count))
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(count[b]-count[a], strings.Compare(a, b)) })
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s×%d", n, count[n]))
	}
	return strings.Join(parts, " ")
}

func prefix(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func median(x []float64) float64 {
	if len(x) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(x))
	return s[len(s)/2]
}

// topStrings is the k largest of lp as "id:logprob".
func topStrings(lp []float64, k int) []string {
	idx := make([]int, len(lp))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(lp[b], lp[a]) })
	var out []string
	for _, i := range idx[:min(k, len(idx))] {
		out = append(out, fmt.Sprintf("%d:%.4f", i, lp[i]))
	}
	return out
}
