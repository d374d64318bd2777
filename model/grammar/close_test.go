package grammar

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/strata-llm/strata/model/grammar/grammartest"
)

// closeSchemas are the fixed schemas plus ones whose shortest completions
// are long or chosen among several paths: required properties behind
// optional ones, minItems of objects, bounded strings, literals that
// share a prefix, patterns with a long mandatory part.
func closeSchemas(r *rand.Rand, nRandom int) []string {
	s := slices.Clone(fixedSchemas)
	s = append(s,
		`{"type":"object","properties":{"a":{"type":"string","minLength":5},"b":{"type":"array","items":{"type":"object","properties":{"x":{"enum":["long-value","lo"]}},"required":["x"]},"minItems":3},"c":{"type":"integer"}},"required":["b","c"]}`,
		`{"type":"array","items":{"type":"string","pattern":"^ab(cd|e)f{3}$"},"minItems":2,"maxItems":4}`,
		`{"anyOf":[{"type":"string","minLength":30},{"type":"array","items":{"type":"null"},"minItems":4}]}`,
	)
	for range nRandom {
		s = append(s, grammartest.RandomSchema(r))
	}
	return s
}

// TestMinCloseIsShortestCompletion compares MinClose with a breadth-first
// search for the shortest completion along random walks, and CloseAfter
// with MinClose after the token.
func TestMinCloseIsShortestCompletion(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 7))
	nRandom, steps, deep := 30, 30, 16
	if testing.Short() || raceEnabled {
		nRandom, steps, deep = 3, 10, 6
	}
	tv := loadVocab(t, "ggml-vocab-llama-spm.gguf")
	for i, schema := range closeSchemas(r, nRandom) {
		g := JSONObject()
		if schema != "" {
			g = mustSchema(t, schema)
		}
		m := g.NewMatcher(tv.v)
		var mask []uint64
		for step := range steps {
			got := m.MinClose()
			// The search tries printable ASCII first, so its completion is
			// the shortest unless a raw non-ASCII character (which it
			// writes as \u escapes) would be shorter.
			// (Only for short completions: a breadth-first search deeper
			// than that takes too long.)
			if got <= deep {
				want := shortestCompletion(t, m)
				if got > len(want) || (got < len(want) && !bytes.Contains(want, []byte(`\u`))) {
					t.Fatalf("schema %d %s, step %d: MinClose = %d, shortest completion %q", i, schema, step, got, want)
				}
			}
			mask = m.Mask(mask)
			var allowed []int32
			for wi, w := range mask {
				for ; w != 0; w &= w - 1 {
					if id := int32(wi*64 + bitsTrailing(w)); !tv.v.isEOG(id) {
						allowed = append(allowed, id)
					}
				}
			}
			if len(allowed) == 0 {
				break
			}
			pick := allowed[r.IntN(len(allowed))]
			after, ok := m.CloseAfter(pick)
			if !ok {
				t.Fatalf("schema %d: CloseAfter(%d %q) refuses a token the mask allows", i, pick, tv.v.bytes(pick))
			}
			if err := m.Advance(pick); err != nil {
				t.Fatal(err)
			}
			if now := m.MinClose(); now != after {
				t.Fatalf("schema %d: CloseAfter(%d %q) = %d, MinClose after Advance = %d", i, pick, tv.v.bytes(pick), after, now)
			}
		}
	}
}

// TestBudgetedWalkValidates is the property the last stage relies on: a
// walk that picks random allowed tokens, but only those after which the
// document can still close in the tokens left (FitMask when the pick
// does not fit), ends with a document that validates whatever the budget,
// as long as the budget covers the shortest document.
func TestBudgetedWalkValidates(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 3))
	nRandom, vocabs, extra := 60, walkVocabs, []int{0, 1, 7, 40}
	if testing.Short() || raceEnabled {
		nRandom, vocabs, extra = 6, walkVocabs[:1], []int{0, 7}
	}
	for _, file := range vocabs {
		tv := loadVocab(t, file)
		for i, schema := range closeSchemas(r, nRandom) {
			g := JSONObject()
			if schema != "" {
				g = mustSchema(t, schema)
			}
			val := grammartest.NewValidator(t, schema)
			m := g.NewMatcher(tv.v)
			short := m.MinClose()
			for _, e := range extra {
				budget := short + e
				m.Reset()
				doc, fitted := budgetedWalk(t, m, tv, r, budget)
				if err := val.Validate(doc); err != nil {
					t.Fatalf("%s: schema %d %s, budget %d (shortest %d, %d masks fitted): %q does not validate: %v", tv.name, i, schema, budget, short, fitted, doc, err)
				}
			}
		}
	}
}

// budgetedWalk draws random allowed tokens for at most budget tokens and
// returns the text and how many times the mask had to be fitted.
func budgetedWalk(t *testing.T, m *Matcher, tv *testVocab, r *rand.Rand, budget int) ([]byte, int) {
	t.Helper()
	var out []byte
	var mask []uint64
	fitted := 0
	for left := budget; left > 0 && !m.Done(); left-- {
		mask = m.Mask(mask)
		pick := randomBit(r, mask)
		if d, ok := m.CloseAfter(pick); !ok || d > left-1 {
			fitted++
			cands := []int32{pick, randomBit(r, mask), randomBit(r, mask)}
			if m.FitMask(mask, left, cands) == 0 {
				t.Fatalf("no token fits with %d left after %q (MinClose %d)", left, out, m.MinClose())
			}
			pick = randomBit(r, mask)
		}
		if err := m.Advance(pick); err != nil {
			t.Fatal(err)
		}
		out = append(out, tv.v.bytes(pick)...)
	}
	if !m.Done() && !m.Accepting() {
		t.Fatalf("budget %d spent and %q is not a whole document (MinClose %d)", budget, out, m.MinClose())
	}
	return out, fitted
}

func randomBit(r *rand.Rand, mask []uint64) int32 {
	var ids []int32
	for wi, w := range mask {
		for ; w != 0; w &= w - 1 {
			ids = append(ids, int32(wi*64+bitsTrailing(w)))
		}
	}
	if len(ids) == 0 {
		return -1
	}
	return ids[r.IntN(len(ids))]
}
