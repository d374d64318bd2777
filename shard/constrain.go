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
	m     *grammar.Matcher
	start int // the position of the first generated token
	next  int // the position of the next token to read
	end   int32
	mask  []uint64
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
	c := &constraint{m: g.NewMatcher(v), start: p.OutputStart, next: p.OutputStart, end: end}
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
