package shard

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	mbits "math/bits"
	"sync"

	"github.com/strata-llm/strata/model/gguf"
	"github.com/strata-llm/strata/model/grammar"
	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/model/tokenizer"
)

// Constrained decoding on the last stage: a sequence whose first row's
// Params carry a Constraint (an OpenAI response_format) gets a
// grammar.Matcher in its sampler state. The matcher reads every token of
// the sequence at or after Params.OutputStart (the generated output,
// recomputed or not) in position order; before each draw the logits of the
// tokens it does not allow become -Inf. The mask depends only on the tokens
// read, so output is the same however the sequence is batched.

// maxGrammars bounds the compiled grammars a process keeps; past it the
// cache starts over (a grammar's masks warm up again in microseconds to
// milliseconds per state).
const maxGrammars = 64

// grammars caches compiled grammars by the SHA-256 of their constraint, so
// that requests with the same schema share warm masks.
var grammars struct {
	mu sync.Mutex
	m  map[[32]byte]*grammar.Grammar
}

// compileConstraint returns the grammar of a response_format, compiled
// once per process while the cache holds it.
func compileConstraint(c []byte) (*grammar.Grammar, error) {
	k := sha256.Sum256(c)
	grammars.mu.Lock()
	g := grammars.m[k]
	grammars.mu.Unlock()
	if g != nil {
		return g, nil
	}
	g, err := grammar.Compile(c)
	if err != nil {
		return nil, err
	}
	if g == nil { // {"type":"text"}: the coordinator sends no constraint for it
		return nil, errors.New("response_format of type text is no constraint")
	}
	grammars.mu.Lock()
	defer grammars.mu.Unlock()
	if len(grammars.m) >= maxGrammars || grammars.m == nil {
		grammars.m = make(map[[32]byte]*grammar.Grammar)
	}
	grammars.m[k] = g
	return g, nil
}

// VocabSource gives the last stage its tokenizer's grammar.Vocab, built on
// first use, and the token it samples should a mask allow nothing.
type VocabSource func() (*grammar.Vocab, int32, error)

// vocabs holds one Vocab per model file (by its SHA-256), so that new
// placements of the same model keep the grammars' warm masks (which are
// cached per Vocab).
var vocabs struct {
	mu sync.Mutex
	m  map[string]VocabSource
}

// ModelVocab returns the VocabSource of the model file f whose SHA-256 is
// sha: the tokenizer is read from f and the trie built once, on the first
// constrained request.
func ModelVocab(sha string, f *gguf.File) VocabSource {
	vocabs.mu.Lock()
	defer vocabs.mu.Unlock()
	if src, ok := vocabs.m[sha]; ok && sha != "" {
		return src
	}
	type built struct {
		v   *grammar.Vocab
		end int32
	}
	once := sync.OnceValues(func() (built, error) {
		tok, err := tokenizer.FromGGUF(f)
		if err != nil {
			return built{}, err
		}
		return built{grammar.NewVocab(tok), endToken(tok)}, nil
	})
	src := func() (*grammar.Vocab, int32, error) {
		b, err := once()
		return b.v, b.end, err
	}
	if sha != "" {
		if vocabs.m == nil || len(vocabs.m) >= 8 {
			vocabs.m = map[string]VocabSource{}
		}
		vocabs.m[sha] = src
	}
	return src
}

// endToken is the token an empty mask falls back on: EOS, else the first
// end-of-generation token.
func endToken(tok *tokenizer.Tokenizer) int32 {
	if id := tok.EOS(); id >= 0 {
		return id
	}
	for id := range int32(tok.VocabSize()) {
		if tok.IsEOG(id) {
			return id
		}
	}
	return 0
}

// SetVocab gives the runner the source of its tokenizer's Vocab, which
// constrained sequences need; without one, their first rows are dropped.
func (r *Runner) SetVocab(src VocabSource) { r.vocab = src }

// constraint is one constrained sequence's automaton.
type constraint struct {
	m      *grammar.Matcher
	start  int // the position of the first generated token
	next   int // the position of the next token to read
	outEnd int // the position after the last token it may generate; 0: no bound
	end    int32
	mask   []uint64
	cands  []int32 // fit's likeliest tokens
}

// newConstraint compiles p's constraint and reads the output p carries
// (that before the first row at pos). An error drops the row.
func (r *Runner) newConstraint(p *sample.Params, pos int) (*constraint, error) {
	if r.vocab == nil {
		return nil, errors.New("this stage has no tokenizer to constrain decoding with")
	}
	v, end, err := r.vocab()
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	g, err := compileConstraint(p.Constraint)
	if err != nil {
		return nil, err
	}
	c := &constraint{m: g.NewMatcher(v), start: p.OutputStart, next: p.OutputStart, outEnd: p.OutputEnd, end: end}
	if pos > c.start && len(p.Output) != pos-c.start {
		return nil, fmt.Errorf("first row at %d carries %d output tokens from %d", pos, len(p.Output), c.start)
	}
	if err := c.read(c.start, p.Output); err != nil {
		return nil, err
	}
	return c, nil
}

// read advances the matcher over tokens at positions from pos on, skipping
// the prompt's; each position is read once, in order.
func (c *constraint) read(pos int, tokens []int32) error {
	for i, t := range tokens {
		p := pos + i
		if p < c.next {
			continue
		}
		if p != c.next {
			return fmt.Errorf("constrained output read at %d, expected %d", p, c.next)
		}
		if err := c.m.Advance(t); err != nil {
			return err
		}
		c.next++
	}
	return nil
}

// apply sets the logits of the tokens the matcher does not allow to -Inf.
func (c *constraint) apply(logits []float32) {
	c.mask = c.m.Mask(c.mask)
	maskLogits(logits, c.mask, c.end)
}

// maxRedraws bounds the draws fit makes, each with the token before it
// masked out, before it cuts the mask to tokens that fit; fitCands is how
// many of the likeliest tokens it keeps then, when they fit.
const (
	maxRedraws = 3
	fitCands   = 32
)

// fit keeps a constrained document closable within the request's
// max_tokens: s, drawn at pos from logits under the mask, stands if the
// document can still close in the tokens left after it (a byte per token
// at worst; grammar.Matcher.CloseAfter). Otherwise the token is masked
// out and the draw made again, a few times, and then the mask is cut to
// the likeliest tokens that fit and those along a shortest completion
// (grammar.Matcher.FitMask) and the draw made from what is left.
// Everything depends only on the logits and the tokens read, so the
// numerics contract holds.
func (c *constraint) fit(logits []float32, pos int, draw func() sample.Result, s sample.Result) sample.Result {
	left := c.outEnd - pos // tokens it may still generate, this one included
	if c.outEnd == 0 || left <= 0 || c.m.MinClose() > left {
		// No bound, or too small a one for any document (a max_tokens
		// below the shortest document): the draw stands and the output
		// ends cut, as without a constraint. Otherwise some allowed token
		// fits (every byte has a token of its own), so the draws below
		// never run out of tokens.
		return s
	}
	fits := func(id int32) bool {
		d, ok := c.m.CloseAfter(id)
		return ok && d <= left-1
	}
	for range maxRedraws {
		if fits(s.Token) {
			return s
		}
		logits[s.Token] = float32(math.Inf(-1))
		s = draw()
	}
	if fits(s.Token) {
		return s
	}
	c.cands = likeliest(logits, fitCands, c.cands)
	if c.m.FitMask(c.mask, left, c.cands) == 0 {
		return s // not reached while every byte has a token
	}
	maskLogits(logits, c.mask, c.end)
	return draw()
}

// likeliest returns the IDs of the k largest finite logits, in dst:
// ties to the lower ID, so the choice depends on the logits only.
func likeliest(logits []float32, k int, dst []int32) []int32 {
	dst = dst[:0]
	for i, l := range logits {
		if math.IsInf(float64(l), -1) || math.IsNaN(float64(l)) {
			continue
		}
		if len(dst) == k && l <= logits[dst[k-1]] {
			continue
		}
		// Insert in descending order (ties keep the earlier, lower ID first).
		j := len(dst)
		if j < k {
			dst = append(dst, 0)
		} else {
			j = k - 1
		}
		for j > 0 && logits[dst[j-1]] < l {
			dst[j] = dst[j-1]
			j--
		}
		dst[j] = int32(i)
	}
	return dst
}

// ninfs is a word's worth of -Inf, copied over the logits of a word of
// the mask that allows nothing (copy moves it in vector registers).
var ninfs = func() (a [64]float32) {
	for i := range a {
		a[i] = float32(math.Inf(-1))
	}
	return a
}()

// maskLogits sets logits[id] to -Inf where bit id of mask is clear (and
// past the mask: model rows beyond the tokenizer's vocabulary). With
// nothing allowed (a vocabulary that cannot spell some byte the document
// needs), only the end token stays, so the sequence ends rather than
// leave the grammar.
func maskLogits(logits []float32, mask []uint64, end int32) {
	ninf := float32(math.Inf(-1))
	any := false
	for w, bits := range mask {
		lo := w * 64
		if lo >= len(logits) {
			break
		}
		hi := min(lo+64, len(logits))
		switch bits {
		case 0:
			copy(logits[lo:hi], ninfs[:])
			continue
		case ^uint64(0):
			any = true
			continue
		}
		any = true
		row := logits[lo:hi]
		for clear := ^bits; clear != 0; clear &= clear - 1 {
			if j := mbits.TrailingZeros64(clear); j < len(row) {
				row[j] = ninf
			}
		}
	}
	for i := len(mask) * 64; i < len(logits); i++ {
		logits[i] = ninf
	}
	if !any && int(end) < len(logits) {
		logits[end] = 0
	}
}
