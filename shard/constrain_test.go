package shard

import (
	"fmt"
	"math"
	"os"
	"slices"
	"testing"

	"github.com/strata-llm/strata/model/gguf"
	"github.com/strata-llm/strata/model/grammar"
	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/model/tokenizer"
	"github.com/strata-llm/strata/transport"
)

const constrainSchema = `{"type":"json_schema","json_schema":{"name":"t","strict":true,"schema":{"type":"object","properties":{"name":{"type":"string","maxLength":6},"n":{"type":"integer"},"ok":{"type":"boolean"}},"required":["name","n","ok"],"additionalProperties":false}}}`

// constrainedPipe returns a one-stage stories260K pipe whose last stage
// has the model's tokenizer for constrained decoding, the tokenizer, and
// its grammar vocabulary.
func constrainedPipe(t *testing.T) (pipe, *tokenizer.Tokenizer, *grammar.Vocab) {
	t.Helper()
	m := loadStories(t)
	f, err := gguf.Open("../../shared/models/stories260K.gguf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	p := newPipe(t, m)
	src := ModelVocab("", f)
	p[0].SetVocab(src)
	v, _, err := src()
	if err != nil {
		t.Fatal(err)
	}
	return p, tok, v
}

// TestConstrainedDecoding: on the last stage, a sequence whose first row
// carries a constraint samples only tokens that keep its output a prefix
// of a document (stories260K, sampling at temperature 1, whose free text
// is no JSON); a recomputed sequence (prompt and output as its prefill)
// samples what the original did next; and a matcher built from the output
// a first row carries (after a prefix-cache hit) masks as one that read it.
func TestConstrainedDecoding(t *testing.T) {
	p, tok, _ := constrainedPipe(t)
	g, err := grammar.Compile([]byte(constrainSchema))
	if err != nil {
		t.Fatal(err)
	}
	params := sample.DefaultParams()
	params.Temperature, params.Seed = 1, 5
	params.Constraint, params.OutputStart = []byte(constrainSchema), len(prompt)

	// decode runs sequence seq from its first row for up to n tokens.
	decode := func(seq uint64, blocks []int32, prefill []int32, n int) []int32 {
		pp := params
		rows := []Row{{Seq: seq, First: true, Tokens: prefill, Blocks: blocks, Sample: true, Params: &pp}}
		pos := len(prefill)
		var out []int32
		for step := 0; len(out) < n; step++ {
			res, dropped := p.run(t, Batch{Epoch: 1, ID: seq<<16 | uint64(step), Rows: rows})
			if len(dropped) > 0 || len(res.Samples) != 1 {
				t.Fatalf("step %d: dropped %+v, samples %+v", step, dropped, res.Samples)
			}
			id := res.Samples[0].Result.Token
			out = append(out, id)
			if tok.IsEOG(id) {
				break
			}
			rows = []Row{{Seq: seq, Pos: pos, Tokens: []int32{id}, Blocks: blocks, Sample: true}}
			pos++
		}
		return out
	}
	out := decode(1, []int32{0, 1, 2, 3, 4, 5}, prompt, 60)
	text := tok.Decode(out)
	if tok.IsEOG(out[len(out)-1]) {
		if !g.Match([]byte(text)) {
			t.Errorf("complete output %q is not a document", text)
		}
	} else if !g.MatchPrefix([]byte(text)) {
		t.Errorf("output %q is not a document's start", text)
	}
	if len(out) < 8 {
		t.Fatalf("output %q too short to test recomputation", text)
	}

	// Recompute after 5 tokens: the prefill holds them; the next token is
	// the original's.
	k := 5
	again := decode(2, []int32{10, 11, 12, 13, 14, 15}, slices.Concat(prompt, out[:k]), 3)
	if !slices.Equal(again, out[k:k+3]) {
		t.Errorf("recomputed: %v, original %v", again, out[k:k+3])
	}

	// The output a first row carries reads like the tokens themselves.
	withOutput := params
	withOutput.Output = out[:k]
	c1, err := p[0].newConstraint(&withOutput, len(prompt)+k)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := p[0].newConstraint(&params, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.read(0, slices.Concat(prompt, out[:k])); err != nil {
		t.Fatal(err)
	}
	if m1, m2 := c1.m.Mask(nil), c2.m.Mask(nil); !slices.Equal(m1, m2) {
		t.Error("a matcher built from carried output masks differently")
	}
	short := params
	short.Output = out[:k-1]
	if _, err := p[0].newConstraint(&short, len(prompt)+k); err == nil {
		t.Error("a first row missing output tokens was accepted")
	}
	if err := p[0].CheckInvariants(); err != nil {
		t.Error(err)
	}
}

// openSchema lets a nonsense model run on: free strings, an unbounded
// array of them, a free number.
const openSchema = `{"type":"json_schema","json_schema":{"name":"t","strict":true,"schema":{"type":"object","properties":{"title":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}},"x":{"type":"number"}},"required":["title","tags","x"],"additionalProperties":false}}}`

// TestConstrainedDecodingCloses: with OutputEnd (max_tokens), the last
// stage keeps the document closable and the output is a whole document
// however tight the budget; without it the same draws run past it.
func TestConstrainedDecodingCloses(t *testing.T) {
	p, tok, vocab := constrainedPipe(t)
	g, err := grammar.Compile([]byte(openSchema))
	if err != nil {
		t.Fatal(err)
	}
	shortest := g.NewMatcher(vocab).MinClose()
	seq := uint64(100)
	// run generates up to n tokens with OutputEnd set to the prompt's
	// length + budget (0: none) and returns them.
	run := func(seed uint64, n, budget int) []int32 {
		seq++
		params := sample.DefaultParams()
		params.Temperature, params.Seed = 1, seed
		params.Constraint, params.OutputStart = []byte(openSchema), len(prompt)
		if budget > 0 {
			params.OutputEnd = len(prompt) + budget
		}
		blocks := []int32{0, 1, 2, 3, 4, 5, 6, 7}
		rows := []Row{{Seq: seq, First: true, Tokens: prompt, Blocks: blocks, Sample: true, Params: &params}}
		pos := len(prompt)
		var out []int32
		for step := 0; len(out) < n; step++ {
			res, dropped := p.run(t, Batch{Epoch: 1, ID: seq<<16 | uint64(step), Rows: rows})
			if len(dropped) > 0 || len(res.Samples) != 1 {
				t.Fatalf("step %d: dropped %+v, samples %+v", step, dropped, res.Samples)
			}
			id := res.Samples[0].Result.Token
			if tok.IsEOG(id) {
				break
			}
			out = append(out, id)
			rows = []Row{{Seq: seq, Pos: pos, Tokens: []int32{id}, Blocks: blocks, Sample: true}}
			pos++
		}
		p.run(t, Batch{Epoch: 1, ID: seq<<16 | 0xFFFF, Tombstones: []transport.Tombstone{{Epoch: 1, Seq: seq, Reason: transport.ReasonFinished}}})
		return out
	}
	cut := 0
	for seed := uint64(1); seed <= 6; seed++ {
		for _, budget := range []int{shortest, shortest + 3, shortest + 10, 48} {
			out := run(seed, budget, budget)
			if text := tok.Decode(out); !g.Match([]byte(text)) {
				t.Errorf("seed %d, max_tokens %d (shortest document %d bytes): %q is no whole document", seed, budget, shortest, text)
			}
			if free := tok.Decode(run(seed, budget, 0)); !g.Match([]byte(free)) {
				cut++
			}
		}
	}
	// The property is not vacuous: unbudgeted, the model runs past most
	// of these budgets.
	if cut < 12 {
		t.Errorf("only %d of 24 unbudgeted runs were cut: the budgets test nothing", cut)
	}
	if err := p[0].CheckInvariants(); err != nil {
		t.Error(err)
	}
}

// TestConstraintWithoutVocab: a last stage without a tokenizer drops a
// constrained sequence's first row rather than sample it free.
func TestConstraintWithoutVocab(t *testing.T) {
	if _, err := os.Stat("../../shared/models/stories260K.gguf"); err != nil {
		sharedAbsent(t, "stories260K", err)
	}
	p := newPipe(t, loadStories(t))
	params := sample.DefaultParams()
	params.Constraint, params.OutputStart = []byte(`{"type":"json_object"}`), len(prompt)
	res, dropped := p.run(t, Batch{Epoch: 1, ID: 1, Rows: []Row{{Seq: 1, First: true, Tokens: prompt, Blocks: []int32{0}, Sample: true, Params: &params}}})
	if len(res.Samples) != 0 || len(dropped) != 1 {
		t.Errorf("samples %+v, dropped %+v", res.Samples, dropped)
	}
}

func TestMaskLogits(t *testing.T) {
	logits := make([]float32, 200)
	for i := range logits {
		logits[i] = 1
	}
	mask := make([]uint64, 3) // 192 tokens: 8 model rows past the tokenizer's
	mask[0] = ^uint64(0)
	mask[1] = 1<<3 | 1<<63
	maskLogits(logits, mask, 2)
	for i, l := range logits {
		allowed := i < 64 || i == 67 || i == 127
		if allowed != !math.IsInf(float64(l), -1) {
			t.Fatalf("logit %d = %v", i, l)
		}
	}
	clear(mask)
	maskLogits(logits, mask, 2)
	if logits[2] != 0 {
		t.Errorf("an empty mask leaves the end token at %v", logits[2])
	}
}

// BenchmarkMaskLogits is the last stage's cost of applying a mask to one
// row of logits, beside the grammar's cost of computing it (model/grammar
// BenchmarkMaskWarm): a mask inside a string (almost every token allowed)
// and at a key (a few).
func BenchmarkMaskLogits(b *testing.B) {
	for _, v := range []int{32000, 152064} {
		for _, kind := range []string{"string", "key"} {
			b.Run(fmt.Sprintf("%d/%s", v, kind), func(b *testing.B) {
				logits := make([]float32, v)
				mask := make([]uint64, (v+63)/64)
				for i := range mask {
					if kind == "string" {
						mask[i] = ^uint64(0) &^ (1 << (i % 64))
					} else if i%97 == 0 {
						mask[i] = 1 << (i % 64)
					}
				}
				for b.Loop() {
					maskLogits(logits, mask, 2)
				}
			})
		}
	}
}

func TestLikeliest(t *testing.T) {
	ninf := float32(math.Inf(-1))
	logits := []float32{0.5, ninf, 2, 0.5, 3, ninf, 2, -1}
	for k, want := range map[int][]int32{1: {4}, 3: {4, 2, 6}, 5: {4, 2, 6, 0, 3}, 8: {4, 2, 6, 0, 3, 7}} {
		if got := likeliest(logits, k, nil); !slices.Equal(got, want) {
			t.Errorf("k %d: %v, want %v", k, got, want)
		}
	}
}
