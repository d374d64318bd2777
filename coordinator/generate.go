package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"time"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/model/tokenizer"
)

// GenerateConfig is what Generate needs.
type GenerateConfig struct {
	Model     string // GGUF file; empty runs the built-in demo model
	Prompt    string
	MaxTokens int // tokens to generate; <= 0 means until the context is full or the model ends
	Sample    sample.Params
	Threads   int       // <= 0: all CPUs
	KVType    ggml.Type // ggml.F16 (default) or ggml.F32
	Out       io.Writer // generated text is streamed here
	Log       *slog.Logger
	// IgnoreEOS keeps generating past an end-of-generation token, as
	// llama.cpp's --ignore-eos does: benchmarks need exactly MaxTokens.
	IgnoreEOS bool
}

// DefaultGenerateConfig returns the defaults of the generate command.
func DefaultGenerateConfig() GenerateConfig {
	return GenerateConfig{
		Prompt:    "Once upon a time",
		MaxTokens: 64,                     // enough to see the model work, quick on any CPU
		Sample:    sample.DefaultParams(), // greedy: reproducible
		Threads:   runtime.NumCPU(),
		KVType:    ggml.F16, // halves KV memory; what llama.cpp uses by default
		Out:       io.Discard,
		Log:       slog.New(slog.DiscardHandler),
	}
}

// GenerateStats reports what Generate did and how fast.
type GenerateStats struct {
	PromptTokens    int
	GeneratedTokens int
	PromptTime      time.Duration // prefill
	GenerateTime    time.Duration // decode steps after the first token
	Tokens          []int32       // the generated token IDs
	Text            string
}

// PromptTPS is prompt tokens per second of prefill.
func (s GenerateStats) PromptTPS() float64 { return tps(s.PromptTokens, s.PromptTime) }

// GenerateTPS is generated tokens per second of decode (the first token comes
// from prefill and is not counted).
func (s GenerateStats) GenerateTPS() float64 { return tps(s.GeneratedTokens-1, s.GenerateTime) }

func tps(n int, d time.Duration) float64 {
	if d <= 0 || n <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// OpenModel opens a GGUF file, or the built-in demo model when path is empty,
// and loads its weights and tokenizer. Close the file when done.
func OpenModel(path string) (*gguf.File, *model.Model, *tokenizer.Tokenizer, error) {
	var f *gguf.File
	var err error
	if path == "" {
		f, err = model.RandomFile(model.DemoSpec())
	} else {
		f, err = gguf.Open(path)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	m, err := model.Load(f)
	if err != nil {
		f.Close()
		return nil, nil, nil, err
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		f.Close()
		return nil, nil, nil, err
	}
	if tok.VocabSize() != m.Vocab {
		f.Close()
		return nil, nil, nil, fmt.Errorf("coordinator: vocabulary has %d tokens but the embedding %d rows", tok.VocabSize(), m.Vocab)
	}
	return f, m, tok, nil
}

// Generate runs cfg.Prompt through the whole model in this process and
// streams the continuation to cfg.Out.
func Generate(ctx context.Context, cfg GenerateConfig) (GenerateStats, error) {
	var st GenerateStats
	f, m, tok, err := OpenModel(cfg.Model)
	if err != nil {
		return st, err
	}
	defer f.Close()
	if err := cfg.Sample.Validate(m.Vocab); err != nil {
		return st, err
	}
	prompt := tok.Encode(cfg.Prompt, tokenizer.EncodeOptions{AddSpecial: true})
	if len(prompt) == 0 {
		return st, errors.New("coordinator: the prompt encodes to no tokens")
	}
	limit := m.Context - len(prompt)
	if limit <= 0 {
		return st, fmt.Errorf("coordinator: prompt of %d tokens fills the context of %d", len(prompt), m.Context)
	}
	n := cfg.MaxTokens
	if n <= 0 || n > limit {
		n = limit
	}
	blocks := (len(prompt) + n + cpu.DefaultBlockSize - 1) / cpu.DefaultBlockSize
	pool := cpu.NewPool(cfg.Threads)
	defer pool.Close()
	kv, err := cpu.NewKV(cpu.KVConfig{Layers: m.Layers, Blocks: blocks, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: cfg.KVType})
	if err != nil {
		return st, err
	}
	stage, err := model.NewStage(m, 0, m.Layers, cpu.NewBackend(pool), kv)
	if err != nil {
		return st, err
	}
	table := make([]int32, blocks) // one sequence owns the whole pool
	for i := range table {
		table[i] = int32(i)
	}
	cfg.Log.Info("generate", "model", m.Arch, "layers", m.Layers, "embd", m.Embd, "prompt_tokens", len(prompt), "max_tokens", n, "threads", pool.Workers())

	var sampler sample.Sampler
	cfg.Sample.NoLogprob = true // generate prints text only
	dec := tok.NewDecoder()
	history := append([]int32(nil), prompt...)
	st.PromptTokens = len(prompt)
	row := model.Row{Seq: 1, First: true, Tokens: prompt, Blocks: table, Logits: true}
	start := time.Now()
	var text []byte
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		logits, err := stage.Forward([]model.Row{row}, nil)
		if err != nil {
			return st, err
		}
		if i == 0 {
			st.PromptTime = time.Since(start)
			start = time.Now()
		}
		pos := row.Pos + len(row.Tokens)
		r := sampler.Sample(logits, &cfg.Sample, history, pos)
		st.Tokens = append(st.Tokens, r.Token)
		st.GeneratedTokens++
		history = append(history, r.Token)
		if tok.IsEOG(r.Token) && !cfg.IgnoreEOS {
			break
		}
		piece := dec.Add(r.Token)
		text = append(text, piece...)
		if _, err := io.WriteString(cfg.Out, piece); err != nil {
			return st, err
		}
		row = model.Row{Seq: 1, Pos: pos, Tokens: []int32{r.Token}, Blocks: table, Logits: true}
	}
	st.GenerateTime = time.Since(start)
	rest := dec.Flush()
	text = append(text, rest...)
	if _, err := io.WriteString(cfg.Out, rest); err != nil {
		return st, err
	}
	st.Text = string(text)
	return st, nil
}
