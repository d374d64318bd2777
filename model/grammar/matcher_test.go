package grammar

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/strata-llm/strata/model/grammar/grammartest"
)

// fixedSchemas cover each feature of the subset.
var fixedSchemas = []string{
	"", // json_object
	`{"type":"object","properties":{"name":{"type":"string","minLength":1,"maxLength":12},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string","enum":["a","b","c"]},"minItems":1,"maxItems":3},"ok":{"type":"boolean"},"none":{"type":"null"},"score":{"type":"number"}},"required":["name","age","tags","ok","none","score"],"additionalProperties":false}`,
	`{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v","kids"],"additionalProperties":false}},"$ref":"#/$defs/node"}`,
	`{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"when":{"type":"string","format":"date-time"},"code":{"type":"string","pattern":"^[A-Z]{3}-[0-9]{2,4}$"},"ip":{"type":"string","format":"ipv4"}},"required":["id","when","code","ip"],"additionalProperties":false}`,
	`{"anyOf":[{"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number"}},"required":["kind","r"],"additionalProperties":false},{"type":"object","properties":{"kind":{"const":"rect"},"w":{"type":"number"},"h":{"type":"number"}},"required":["kind","w","h"],"additionalProperties":false}]}`,
	`{"type":"array","items":{"type":"array","items":{"type":"array","items":{"type":"object","properties":{"x":{"type":["integer","null"]}},"required":["x"]}}}}`,
	`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"},"c":{"type":"integer"}},"required":["b"]}`,
	`{"type":"object","additionalProperties":{"type":"array","items":{"type":"number"}}}`,
	`{"type":"string","maxLength":40}`,
	`{"type":"string","pattern":"é+[^a-z]\\d"}`,
}

// bitSet reports bit id of mask.
func bitSet(mask []uint64, id int32) bool { return mask[id>>6]&(1<<(id&63)) != 0 }

// shortestCompletion returns the shortest bytes that make the matcher's
// output a whole document, by breadth-first search over configurations.
func shortestCompletion(t *testing.T, m *Matcher) []byte {
	t.Helper()
	return shortestCompletionIn(t, m, 0x7E, 0xFF)
}

// shortestCompletionIn is shortestCompletion with a pass per upper bound
// of the bytes tried.
func shortestCompletionIn(t *testing.T, m *Matcher, his ...int) []byte {
	t.Helper()
	type item struct {
		cfg  config
		path []byte
	}
	var kb []byte
	keyOf := func(c *config) string {
		kb = kb[:0]
		for _, e := range c.ends {
			kb = binary.LittleEndian.AppendUint32(kb, uint32(e))
		}
		for _, f := range c.frames {
			kb = binary.LittleEndian.AppendUint32(kb, uint32(f.node))
			kb = append(kb, f.st, f.ws)
			kb = binary.LittleEndian.AppendUint32(kb, uint32(f.a))
			kb = binary.LittleEndian.AppendUint32(kb, uint32(f.b))
			kb = binary.LittleEndian.AppendUint32(kb, uint32(f.c))
		}
		return string(kb)
	}
	accepts := func(c *config) bool {
		for i := range c.len() {
			if m.g.accepting(c.stack(i)) {
				return true
			}
		}
		return false
	}
	var start config
	start.copyFrom(&m.cur)
	if accepts(&start) {
		return nil
	}
	// Printable ASCII first (a completion rarely needs more), then every
	// byte but whitespace other than '\n'.
	for _, hi := range his {
		queue := []item{{cfg: start}}
		seen := map[string]bool{keyOf(&start): true}
		var scratch []frame
		var next config
		for len(queue) > 0 && len(seen) < 500000 {
			it := queue[0]
			queue = queue[1:]
			for i := 0x20; i <= hi; i++ {
				c := i
				if c == 0x20 {
					c = '\n' // a wrapped grammar's prefix or suffix may hold one
				}
				m.g.stepConfig(&it.cfg, byte(c), &next, &scratch, maxStacks)
				if next.len() == 0 {
					continue
				}
				path := append(slices.Clone(it.path), byte(c))
				if accepts(&next) {
					return path
				}
				k := keyOf(&next)
				if seen[k] {
					continue
				}
				seen[k] = true
				var keep config
				keep.copyFrom(&next)
				queue = append(queue, item{keep, path})
			}
		}
	}
	t.Fatalf("no completion found")
	return nil
}

// randomWalk generates one document: free random allowed tokens, then the
// shortest completion spelled in single-byte tokens, then an
// end-of-generation token. Every token is checked against the mask; an
// empty mask fails the test.
func randomWalk(t *testing.T, g *Grammar, tv *testVocab, r *rand.Rand, free int) ([]byte, []int32) {
	t.Helper()
	m := g.NewMatcher(tv.v)
	var byteTok [256]int32
	for c := range 256 {
		byteTok[c] = -1
	}
	for id := range int32(tv.v.size) {
		if b := tv.v.bytes(id); len(b) == 1 && byteTok[b[0]] < 0 {
			byteTok[b[0]] = id
		}
	}
	var mask []uint64
	var out []byte
	var toks, allowed, plan []int32
	for step := 0; ; step++ {
		mask = m.Mask(mask)
		allowed = allowed[:0]
		for wi, w := range mask {
			for ; w != 0; w &= w - 1 {
				allowed = append(allowed, int32(wi*64+bitsTrailing(w)))
			}
		}
		if len(allowed) == 0 {
			t.Fatalf("%s: empty mask after %q", tv.name, out)
		}
		var pick int32
		switch {
		case m.Accepting() && (step >= free || r.IntN(8) == 0):
			pick = tv.v.eog[0]
		case step < free:
			pick = allowed[r.IntN(len(allowed))]
		default:
			if plan == nil {
				for _, c := range shortestCompletion(t, m) {
					if byteTok[c] < 0 {
						t.Fatalf("%s: no token for byte %#x", tv.name, c)
					}
					plan = append(plan, byteTok[c])
				}
			}
			if len(plan) == 0 {
				t.Fatalf("%s: completion ended but the matcher does not accept %q", tv.name, out)
			}
			pick, plan = plan[0], plan[1:]
		}
		if !bitSet(mask, pick) {
			t.Fatalf("%s: token %d %q is not in the mask after %q", tv.name, pick, tv.v.bytes(pick), out)
		}
		if err := m.Advance(pick); err != nil {
			t.Fatalf("%s: Advance(%d %q) after %q: %v", tv.name, pick, tv.v.bytes(pick), out, err)
		}
		toks = append(toks, pick)
		if m.Done() {
			return out, toks
		}
		out = append(out, tv.v.bytes(pick)...)
	}
}

func bitsTrailing(w uint64) int {
	n := 0
	for w&1 == 0 {
		w >>= 1
		n++
	}
	return n
}

var walkVocabs = []string{"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"}

// TestRandomWalkValidates is the property: any sequence of tokens the
// masks allow, ended when the matcher accepts, parses as JSON and
// validates against the schema.
func TestRandomWalkValidates(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 1))
	schemas := slices.Clone(fixedSchemas)
	nRandom := 40
	if testing.Short() || raceEnabled {
		nRandom = 8
	}
	for range nRandom {
		schemas = append(schemas, grammartest.RandomSchema(r))
	}
	for _, file := range walkVocabs {
		tv := loadVocab(t, file)
		for i, schema := range schemas {
			g := JSONObject()
			if schema != "" {
				g = mustSchema(t, schema)
			}
			val := grammartest.NewValidator(t, schema)
			walks := 3
			for w := range walks {
				doc, _ := randomWalk(t, g, tv, r, []int{0, 10, 40}[w])
				if err := val.Validate(doc); err != nil {
					t.Errorf("%s: schema %d %s: walk %d produced %q: %v", tv.name, i, schema, w, doc, err)
				}
				if !g.Match(doc) {
					t.Errorf("%s: schema %d: Match(%q) = false for a walk's output", tv.name, i, doc)
				}
			}
		}
	}
}

// TestMaskAgreesWithAllows compares every mask bit with a direct
// simulation of the token's bytes over the whole stack, along walks deep
// enough that tokens cross the cached window.
func TestMaskAgreesWithAllows(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	schemas := []string{
		"",
		`{"type":"array","items":{"type":"array","items":{"type":"array","items":{"type":"array","items":{"type":"integer"}}}}}`,
		fixedSchemas[1],
		fixedSchemas[2],
		fixedSchemas[4],
		`{"type":"array","items":{"type":"string","minLength":3,"maxLength":20}}`,
	}
	steps := 25
	if testing.Short() || raceEnabled {
		steps = 8
	}
	for _, file := range walkVocabs {
		tv := loadVocab(t, file)
		for _, schema := range schemas {
			g := JSONObject()
			if schema != "" {
				g = mustSchema(t, schema)
			}
			m := g.NewMatcher(tv.v)
			var mask []uint64
			// Prefer opening tokens to get deep, then anything.
			for step := range steps {
				mask = m.Mask(mask)
				var allowed []int32
				for id := range int32(tv.v.size) {
					if got, want := bitSet(mask, id), m.Allows(id); got != want {
						t.Fatalf("%s %s step %d: mask bit of %d %q = %v, Allows = %v", tv.name, schema, step, id, tv.v.bytes(id), got, want)
					}
					if bitSet(mask, id) && !tv.v.isEOG(id) {
						allowed = append(allowed, id)
					}
				}
				if len(allowed) == 0 {
					break
				}
				var deep []int32
				for _, id := range allowed {
					if b := tv.v.bytes(id); bytes.ContainsAny(b, "[{") {
						deep = append(deep, id)
					}
				}
				pick := allowed[r.IntN(len(allowed))]
				if len(deep) > 0 && step < steps/2 {
					pick = deep[r.IntN(len(deep))]
				}
				if err := m.Advance(pick); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// TestTokenizedDocumentAccepted checks that valid documents, tokenized as
// the model would write them, are accepted token by token and then end.
func TestTokenizedDocumentAccepted(t *testing.T) {
	docs := []struct{ schema, doc string }{
		{"", `{"a": [1, 2.5, -3e10, true, false, null, "x y z", {"b": {}}]}`},
		{"", "{\n  \"name\": \"Zoë 😀\",\n  \"list\": [\n    1,\n    2\n  ]\n}"},
		{fixedSchemas[1], `{"name": "Ann", "age": 42, "tags": ["a", "c"], "ok": true, "none": null, "score": 0.25}`},
		{fixedSchemas[2], `{"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]}`},
		{fixedSchemas[3], `{"id": "123e4567-e89b-12d3-a456-426614174000", "when": "2024-05-06T07:08:09Z", "code": "ABC-123", "ip": "10.0.0.255"}`},
		{fixedSchemas[4], `{"kind": "rect", "w": 2, "h": 3.5}`},
	}
	for _, file := range walkVocabs {
		tv := loadVocab(t, file)
		for _, d := range docs {
			g := JSONObject()
			if d.schema != "" {
				g = mustSchema(t, d.schema)
			}
			m := g.NewMatcher(tv.v)
			var mask []uint64
			for i, id := range tv.encode(d.doc) {
				mask = m.Mask(mask)
				if !bitSet(mask, id) {
					t.Fatalf("%s: token %d (%d %q) of %q not in the mask", tv.name, i, id, tv.v.bytes(id), d.doc)
				}
				if err := m.Advance(id); err != nil {
					t.Fatalf("%s: %v", tv.name, err)
				}
			}
			if !m.Accepting() {
				t.Errorf("%s: %q not accepting at its end", tv.name, d.doc)
			}
			mask = m.Mask(mask)
			if !bitSet(mask, tv.v.eog[0]) {
				t.Errorf("%s: end of generation not allowed after %q", tv.name, d.doc)
			}
		}
	}
}

// TestMatcherDeterministic checks the numerics contract: the mask depends
// only on the tokens so far. A matcher rebuilt from the token history (as
// after preemption), a clone, and one whose grammar cache was warmed by
// another sequence give the same masks.
func TestMatcherDeterministic(t *testing.T) {
	tv := loadVocab(t, "ggml-vocab-gpt-2.gguf")
	schema := fixedSchemas[1]
	_, toks := randomWalk(t, mustSchema(t, schema), tv, rand.New(rand.NewPCG(9, 9)), 20)

	cold := mustSchema(t, schema) // fresh caches
	warm := mustSchema(t, schema)
	randomWalk(t, warm, tv, rand.New(rand.NewPCG(1, 2)), 30) // warm its cache with other tokens
	a, b := cold.NewMatcher(tv.v), warm.NewMatcher(tv.v)
	var ma, mb []uint64
	for i, id := range toks {
		ma, mb = a.Mask(ma), b.Mask(mb)
		if !slices.Equal(ma, mb) {
			t.Fatalf("masks differ before token %d", i)
		}
		if i == len(toks)/2 {
			c := a.Clone()
			a.Reset()
			for _, prev := range toks[:i] {
				if err := a.Advance(prev); err != nil {
					t.Fatal(err)
				}
			}
			if mc := c.Mask(nil); !slices.Equal(mc, a.Mask(nil)) {
				t.Fatalf("clone and rebuilt matcher differ at token %d", i)
			}
		}
		if err := a.Advance(id); err != nil {
			t.Fatal(err)
		}
		if err := b.Advance(id); err != nil {
			t.Fatal(err)
		}
	}
	if !a.Done() || a.Advance(toks[0]) != ErrDone {
		t.Errorf("matcher not done after end of generation")
	}
}

// TestAdvanceRejects checks that a token outside the mask is refused and
// leaves the matcher as it was.
func TestAdvanceRejects(t *testing.T) {
	tv := loadVocab(t, "ggml-vocab-gpt-2.gguf")
	g := mustSchema(t, `{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}`)
	m := g.NewMatcher(tv.v)
	for _, id := range tv.encode(`{"a":`) {
		if err := m.Advance(id); err != nil {
			t.Fatal(err)
		}
	}
	before := m.Mask(nil)
	for _, text := range []string{`"`, `}`, `x`} {
		ids := tv.encode(text)
		if err := m.Advance(ids[0]); !errors.Is(err, ErrRejected) {
			t.Errorf("Advance(%q) = %v, want ErrRejected", text, err)
		}
	}
	if err := m.Advance(tv.v.eog[0]); !errors.Is(err, ErrRejected) {
		t.Errorf("Advance(end of generation) = %v, want ErrRejected", err)
	}
	if !slices.Equal(before, m.Mask(nil)) {
		t.Errorf("a rejected token changed the matcher")
	}
}

// TestConcurrentMatchers runs matchers of one grammar on several
// goroutines, sharing its mask cache (run with -race), and checks they
// agree with a matcher run alone.
func TestConcurrentMatchers(t *testing.T) {
	tv := loadVocab(t, "ggml-vocab-gpt-2.gguf")
	toks := tv.encode(`{"name": "Ann", "age": 42, "tags": ["a", "c"], "ok": true, "none": null, "score": 0.25}`)
	masks := func(g *Grammar) [][]uint64 {
		m := g.NewMatcher(tv.v)
		var out [][]uint64
		for _, id := range toks {
			out = append(out, m.Mask(nil))
			if err := m.Advance(id); err != nil {
				t.Error(err)
				return nil
			}
		}
		return out
	}
	want := masks(mustSchema(t, fixedSchemas[1]))
	shared := mustSchema(t, fixedSchemas[1])
	var wg sync.WaitGroup
	got := make([][][]uint64, 4)
	for i := range got {
		wg.Go(func() { got[i] = masks(shared) })
	}
	wg.Wait()
	for i := range got {
		for j := range want {
			if j >= len(got[i]) || !slices.Equal(got[i][j], want[j]) {
				t.Fatalf("goroutine %d: mask %d differs", i, j)
			}
		}
	}
}
