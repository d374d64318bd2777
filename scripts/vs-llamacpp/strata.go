package main

import (
	"fmt"
	"math"
	"slices"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/model/tokenizer"
)

// strataRun is strata's answer for one prompt: greedy tokens, the margin
// of each step (its best logit over its second, end-of-generation tokens
// excluded as llama.cpp's ignore_eos excludes them), and the
// log-probabilities of every token at the first step.
type strataRun struct {
	Tokens  []int32
	Logits  [][]float32 // per generated token, the logits it was chosen from
	Margins []float32   // per generated token, best minus second logit
	FirstLP []float64   // log-softmax of the first step's raw logits, in float64
	// Top and Sampled are the sampler's answer at the first step (greedy,
	// top topN log-probabilities): what the OpenAI API's top_logprobs
	// reports.
	Top     []sample.TokenLogprob
	Sampled int32
}

// strataGreedy runs prompt (token IDs, BOS included) and n greedy steps
// through the whole model in this process, as coordinator.Generate does:
// one stage of all layers on the CPU backend, a KV cache of kvType (F16 is
// generate's and llama.cpp's default).
func strataGreedy(m *model.Model, tok *tokenizer.Tokenizer, prompt []int32, n, threads, topN int, kvType ggml.Type) (strataRun, error) {
	var r strataRun
	pool := cpu.NewPool(threads)
	defer pool.Close()
	blocks := (len(prompt) + n + cpu.DefaultBlockSize - 1) / cpu.DefaultBlockSize
	kv, err := cpu.NewKV(cpu.KVConfig{Layers: m.Layers, Blocks: blocks, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: kvType})
	if err != nil {
		return r, err
	}
	st, err := model.NewStage(m, 0, m.Layers, cpu.NewBackend(pool), kv)
	if err != nil {
		return r, err
	}
	table := make([]int32, blocks)
	for i := range table {
		table[i] = int32(i)
	}
	row := model.Row{Seq: 1, First: true, Tokens: prompt, Blocks: table, Logits: true}
	var sampler sample.Sampler
	for i := range n {
		logits, err := st.Forward([]model.Row{row}, nil)
		if err != nil {
			return r, err
		}
		if len(logits) != m.Vocab {
			return r, fmt.Errorf("stage returned %d logits, want %d", len(logits), m.Vocab)
		}
		if i == 0 {
			r.FirstLP = logSoftmax(logits)
			p := sample.DefaultParams()
			p.TopLogprobs = topN
			res := sampler.Sample(logits, &p, prompt, len(prompt))
			r.Top, r.Sampled = res.Top, res.Token
		}
		best, second := top2(logits, tok.IsEOG)
		r.Tokens = append(r.Tokens, best)
		r.Margins = append(r.Margins, logits[best]-logits[second])
		r.Logits = append(r.Logits, slices.Clone(logits))
		row = model.Row{Seq: 1, Pos: row.Pos + len(row.Tokens), Tokens: []int32{best}, Blocks: table, Logits: true}
	}
	return r, nil
}

// top2 returns the two largest logits' tokens, skipping those skip names;
// ties go to the lower ID.
func top2(logits []float32, skip func(int32) bool) (best, second int32) {
	best, second = -1, -1
	for i, v := range logits {
		id := int32(i)
		if skip(id) {
			continue
		}
		switch {
		case best < 0 || v > logits[best]:
			best, second = id, best
		case second < 0 || v > logits[second]:
			second = id
		}
	}
	return best, second
}

// logSoftmax is the log-softmax of x in float64.
func logSoftmax(x []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = max(mx, float64(v))
	}
	var sum float64
	for _, v := range x {
		sum += math.Exp(float64(v) - mx)
	}
	lse := mx + math.Log(sum)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - lse
	}
	return out
}
