package cpu_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

const sharedModels = "../../../shared/models"

func openShared(t testing.TB, name string) *gguf.File {
	t.Helper()
	path := filepath.Join(sharedModels, name)
	if _, err := os.Stat(path); err != nil {
		sharedAbsent(t, path, err)
	}
	return openGGUF(t, path)
}

// engine is a one-stage pipeline with a trivial block allocator: the test
// helper that hands out block IDs the coordinator's allocator would.
type engine struct {
	m     *model.Model
	stage *model.Stage
	kv    *cpu.KV
	pool  *cpu.Pool
	next  int32
}

// randomModel writes spec's random file in memory and loads it.
func randomModel(t testing.TB, spec model.RandomSpec) *model.Model {
	t.Helper()
	f, err := model.RandomFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newEngine(t testing.TB, m *model.Model, threads, blocks int, kvType ggml.Type) *engine {
	t.Helper()
	pool := cpu.NewPool(threads)
	t.Cleanup(pool.Close)
	kv, err := cpu.NewKV(cpu.KVConfig{Layers: m.Layers, Blocks: blocks, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: kvType})
	if err != nil {
		t.Fatal(err)
	}
	st, err := model.NewStage(m, 0, m.Layers, cpu.NewBackend(pool), kv)
	if err != nil {
		t.Fatal(err)
	}
	return &engine{m: m, stage: st, kv: kv, pool: pool}
}

// blocksFor hands out fresh blocks until table covers n positions.
func (e *engine) blocksFor(table []int32, n int) []int32 {
	for len(table)*e.kv.BlockSize() < n {
		table = append(table, e.next)
		e.next++
	}
	return table
}

func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

// greedy runs prompt as one prefill then n greedy decode steps.
func (e *engine) greedy(t testing.TB, prompt []int32, n int) []int32 {
	t.Helper()
	var blocks []int32
	blocks = e.blocksFor(blocks, len(prompt))
	logits, err := e.stage.Forward([]model.Row{{Seq: 1, Pos: 0, First: true, Tokens: prompt, Blocks: blocks, Logits: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []int32
	pos := len(prompt)
	for i := 0; i < n; i++ {
		tok := argmax(logits)
		out = append(out, tok)
		if i == n-1 {
			break
		}
		blocks = e.blocksFor(blocks, pos+1)
		logits, err = e.stage.Forward([]model.Row{{Seq: 1, Pos: pos, Tokens: []int32{tok}, Blocks: blocks, Logits: true}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		pos++
	}
	return out
}

// decodeSPM turns token IDs of a SentencePiece vocabulary into text without
// the tokenizer package: pieces with ▁ as space, byte tokens as bytes.
func decodeSPM(toks []string, ids []int32) string {
	var b strings.Builder
	for _, id := range ids {
		p := toks[id]
		if strings.HasPrefix(p, "<0x") && len(p) == 6 {
			v, _ := strconv.ParseUint(p[3:5], 16, 8)
			b.WriteByte(byte(v))
			continue
		}
		b.WriteString(strings.ReplaceAll(p, "▁", " "))
	}
	return b.String()
}

const onceUponATime = ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said"

func TestStories260KMatchesLlamaCpp(t *testing.T) {
	f := openShared(t, "stories260K.gguf")
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	toks, err := f.Strings("tokenizer.ggml.tokens")
	if err != nil {
		t.Fatal(err)
	}
	for _, portable := range []bool{false, true} {
		cpu.SetPortable(portable)
		e := newEngine(t, m, 2, 64, ggml.F16)
		got := e.greedy(t, []int32{1, 403, 407, 261, 378}, 64)
		cpu.SetPortable(false)
		if text := decodeSPM(toks, got); text != onceUponATime {
			t.Errorf("portable=%v: greedy text:\n%q\nwant\n%q\ntokens %v", portable, text, onceUponATime, got)
		}
	}
}
