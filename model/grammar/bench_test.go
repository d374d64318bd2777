package grammar

import (
	"sync"
	"testing"
	"time"
)

// benchSchema and benchDoc are a typical structured output: strings
// (free, bounded and patterned), an integer, an array and a nested
// object, pretty-printed as models write it.
const (
	benchSchema = `{"type":"object","properties":{
		"name":{"type":"string"},
		"bio":{"type":"string","maxLength":300},
		"age":{"type":"integer"},
		"tags":{"type":"array","items":{"type":"string"},"maxItems":8},
		"address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["city","zip"],"additionalProperties":false}},
		"required":["name","bio","age","tags","address"],"additionalProperties":false}`
	benchDoc = "{\n  \"name\": \"Ada Lovelace\",\n  \"bio\": \"English mathematician and writer, chiefly known for her work on Charles Babbage's proposed mechanical general-purpose computer, the Analytical Engine. She was the first to recognise that the machine had applications beyond pure calculation.\",\n  \"age\": 36,\n  \"tags\": [\"mathematics\", \"computing\", \"poetry\"],\n  \"address\": {\n    \"city\": \"London\",\n    \"zip\": \"10001\"\n  }\n}"
)

// benchVocab is a vocabulary for benchmarks with the token IDs of benchDoc.
type benchVocab struct {
	v    *Vocab
	toks []int32
}

var (
	benchOnce   sync.Once
	benchVocabs map[string]*benchVocab
)

// loadBenchVocabs loads llama-spm (32k) and gpt-2 (50k), and builds a
// 152k vocabulary from gpt-2's: its tokens, then variants of them
// (capitalised, with a leading space, underscore or quote, with a
// suffix) until 152,064 IDs (Qwen2's size), the last an end-of-generation
// token. benchDoc keeps its gpt-2 token IDs in it.
func loadBenchVocabs(b *testing.B) map[string]*benchVocab {
	benchOnce.Do(func() {
		benchVocabs = map[string]*benchVocab{}
		for name, file := range map[string]string{"llama-spm-32k": "ggml-vocab-llama-spm.gguf", "gpt2-50k": "ggml-vocab-gpt-2.gguf"} {
			tv := loadVocab(b, file)
			benchVocabs[name] = &benchVocab{tv.v, tv.encode(benchDoc)}
		}
		gpt := loadVocab(b, "ggml-vocab-gpt-2.gguf")
		if gpt.tok == nil {
			return
		}
		const size = 152064
		var toks [][]byte
		seen := map[string]bool{}
		for id := range int32(gpt.v.size) {
			bs := gpt.tok.TokenBytes(id)
			toks = append(toks, bs)
			seen[string(bs)] = true
		}
		variants := []func([]byte) []byte{
			func(s []byte) []byte { return append([]byte(" "), s...) },
			func(s []byte) []byte { return append([]byte("_"), s...) },
			func(s []byte) []byte { return append(append([]byte{}, s...), 's') },
			func(s []byte) []byte { return append([]byte("\""), s...) },
			func(s []byte) []byte { return append(append([]byte{}, s...), "ing"...) },
			func(s []byte) []byte {
				c := append([]byte{}, s...)
				for i, x := range c {
					if x >= 'a' && x <= 'z' {
						c[i] = x - 32
					}
				}
				return c
			},
		}
		for _, f := range variants {
			for id := 0; id < gpt.v.size && len(toks) < size-1; id++ {
				bs := toks[id]
				if len(bs) == 0 {
					continue
				}
				if nb := f(bs); !seen[string(nb)] {
					seen[string(nb)] = true
					toks = append(toks, nb)
				}
			}
		}
		eog := int32(len(toks))
		v := newVocab(len(toks)+1, func(id int32) []byte {
			if id == eog || gpt.tok.IsEOG(id) {
				return nil
			}
			return toks[id]
		}, func(id int32) bool { return id == eog || (int(id) < gpt.v.size && gpt.tok.IsEOG(id)) })
		benchVocabs["synthetic-152k"] = &benchVocab{v, benchVocabs["gpt2-50k"].toks}
	})
	return benchVocabs
}

var benchNames = []string{"llama-spm-32k", "gpt2-50k", "synthetic-152k"}

var benchSchemas = []struct{ name, schema string }{
	{"schema", benchSchema},
	{"json_object", ""},
}

func benchGrammar(b *testing.B, schema string) *Grammar {
	if schema == "" {
		return JSONObject()
	}
	return mustSchema(b, schema)
}

// BenchmarkMaskWarm is the cost per generated token after warm-up: Mask
// then Advance, over benchDoc's tokens, with the grammar's cache warmed
// by one pass. ns/token is the figure to compare with the 0.5 ms goal.
func BenchmarkMaskWarm(b *testing.B) {
	vocabs := loadBenchVocabs(b)
	for _, vn := range benchNames {
		bv := vocabs[vn]
		if bv == nil {
			continue
		}
		for _, s := range benchSchemas {
			b.Run(vn+"/"+s.name, func(b *testing.B) {
				g := benchGrammar(b, s.schema)
				m := g.NewMatcher(bv.v)
				var mask []uint64
				pass := func() {
					m.Reset()
					for _, id := range bv.toks {
						mask = m.Mask(mask)
						if err := m.Advance(id); err != nil {
							b.Fatal(err)
						}
					}
				}
				pass()
				b.ResetTimer()
				for b.Loop() {
					pass()
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(bv.toks)), "ns/token")
			})
		}
	}
}

// BenchmarkMaskCold is the cost per token of a grammar's first document:
// every window seen is walked over the trie once (the precompute that
// warm-up amortises), and "first" is the very first mask.
func BenchmarkMaskCold(b *testing.B) {
	vocabs := loadBenchVocabs(b)
	for _, vn := range benchNames {
		bv := vocabs[vn]
		if bv == nil {
			continue
		}
		for _, s := range benchSchemas {
			b.Run(vn+"/"+s.name, func(b *testing.B) {
				var mask []uint64
				var first time.Duration
				for b.Loop() {
					g := benchGrammar(b, s.schema)
					m := g.NewMatcher(bv.v)
					t0 := time.Now()
					mask = m.Mask(mask)
					first += time.Since(t0)
					for i, id := range bv.toks {
						if err := m.Advance(id); err != nil {
							b.Fatal(err)
						}
						if i+1 < len(bv.toks) {
							mask = m.Mask(mask)
						}
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(bv.toks)), "ns/token")
				b.ReportMetric(float64(first.Nanoseconds())/float64(b.N), "ns/first")
			})
		}
	}
}

// BenchmarkMaskColdString is one cold mask inside a free string, the
// costliest state to walk: nearly every token is alive.
func BenchmarkMaskColdString(b *testing.B) {
	vocabs := loadBenchVocabs(b)
	for _, vn := range benchNames {
		bv := vocabs[vn]
		if bv == nil {
			continue
		}
		b.Run(vn, func(b *testing.B) {
			var mask []uint64
			for b.Loop() {
				b.StopTimer()
				g := JSONObject()
				m := g.NewMatcher(bv.v)
				for _, id := range bv.toks[:4] { // {\n  "name
					if err := m.Advance(id); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				mask = m.Mask(mask)
			}
		})
	}
}

// BenchmarkCompile is the per-grammar precompute: parsing and compiling
// the schema (its pattern DFA included).
func BenchmarkCompile(b *testing.B) {
	for b.Loop() {
		if _, err := CompileSchema([]byte(benchSchema)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNewVocab is the per-tokenizer precompute: the byte trie.
func BenchmarkNewVocab(b *testing.B) {
	tv := loadVocab(b, "ggml-vocab-gpt-2.gguf")
	if tv.tok == nil {
		b.Skip("needs the gpt-2 vocabulary")
	}
	for b.Loop() {
		NewVocab(tv.tok)
	}
}

// BenchmarkFitMask is the budget check's cost on the last stage
// (shard/constrain.go): "step" is what every constrained step with a
// max_tokens pays (MinClose, and CloseAfter of the token drawn); "fit" is
// the rare full cut of a mask to the tokens that fit, paid only when a
// draw does not fit near the end of the budget, here at its worst: inside
// a free string, where nearly every token is allowed, with exactly the
// shortest completion's length left.
func BenchmarkFitMask(b *testing.B) {
	vocabs := loadBenchVocabs(b)
	for _, vn := range benchNames {
		bv := vocabs[vn]
		if bv == nil {
			continue
		}
		g := benchGrammar(b, benchSchema)
		m := g.NewMatcher(bv.v)
		// Into the "bio" string: 12 tokens in.
		for _, id := range bv.toks[:12] {
			if err := m.Advance(id); err != nil {
				b.Fatal(err)
			}
		}
		mask := m.Mask(nil)
		left := m.MinClose()
		next := bv.toks[12]
		b.Run(vn+"/step", func(b *testing.B) {
			for b.Loop() {
				if m.MinClose() > left {
					b.Fatal("MinClose moved")
				}
				if _, ok := m.CloseAfter(next); !ok {
					b.Fatal("next token refused")
				}
			}
		})
		// 32 candidates, as the last stage passes its likeliest tokens.
		var cands []int32
		for id := int32(0); len(cands) < 32; id += 97 {
			if mask[id>>6]&(1<<(id&63)) != 0 {
				cands = append(cands, id)
			}
		}
		b.Run(vn+"/fit", func(b *testing.B) {
			work := make([]uint64, len(mask))
			kept := 0
			for b.Loop() {
				copy(work, mask)
				kept = m.FitMask(work, left, cands)
			}
			b.ReportMetric(float64(kept), "kept")
		})
	}
}
