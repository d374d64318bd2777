package model

import (
	"fmt"

	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

// Weight is a matrix of Rows rows by Cols columns stored row-major in Type,
// a view into the model file. A vector has Rows == 1.
type Weight struct {
	Name string
	Type ggml.Type
	Rows int
	Cols int
	Data []byte
}

// Row returns row i's bytes.
func (w *Weight) Row(i int) []byte {
	n := len(w.Data) / w.Rows
	return w.Data[i*n : (i+1)*n]
}

// Layer holds one transformer block's weights.
type Layer struct {
	AttnNorm            []float32
	Q, K, V, O          *Weight
	QBias, KBias, VBias []float32 // nil unless Config.QKVBias
	QNorm, KNorm        []float32 // per-head norms (HeadDim each); nil unless Config.QKNorm
	FFNNorm             []float32
	Gate, Up, Down      *Weight
}

// Matrices returns the layer's matrices that are present.
func (l *Layer) Matrices() []*Weight {
	var ws []*Weight
	for _, w := range []*Weight{l.Q, l.K, l.V, l.O, l.Gate, l.Up, l.Down} {
		if w != nil {
			ws = append(ws, w)
		}
	}
	return ws
}

// Model is a loaded model: its configuration and views of its tensors.
type Model struct {
	Config
	Embed        *Weight // token_embd: Vocab rows of Embd
	OutputNorm   []float32
	Output       *Weight // output head: Vocab rows of Embd (token_embd when tied)
	LayerWeights []Layer // one per layer, Config.Layers of them
}

// Load reads the architecture of f and finds every tensor it needs, checking
// each one's type and shape. The Model refers to f's memory: keep f open while
// the Model is in use.
func Load(f *gguf.File) (*Model, error) {
	cfg, err := ConfigFromGGUF(f)
	if err != nil {
		return nil, err
	}
	m := &Model{Config: cfg}
	embed, err := matrix(f, "token_embd.weight", -1, cfg.Embd)
	if err != nil {
		return nil, err
	}
	if embed.Rows > MaxVocab {
		return nil, fmt.Errorf("model: token_embd.weight has %d rows, limit MaxVocab %d", embed.Rows, MaxVocab)
	}
	m.Embed = embed
	m.Vocab = embed.Rows
	if m.OutputNorm, err = vector(f, "output_norm.weight", cfg.Embd); err != nil {
		return nil, err
	}
	if _, err := f.Tensor("output.weight"); err == nil {
		if m.Output, err = matrix(f, "output.weight", m.Vocab, cfg.Embd); err != nil {
			return nil, err
		}
	} else {
		m.Output = embed
		m.TiedOutput = true
	}
	kvDim, qDim := cfg.KVDim(), cfg.QDim()
	m.LayerWeights = make([]Layer, cfg.Layers)
	for i := range m.LayerWeights {
		l := &m.LayerWeights[i]
		name := func(s string) string { return fmt.Sprintf("blk.%d.%s", i, s) }
		type mat struct {
			dst        **Weight
			name       string
			rows, cols int
		}
		mats := []mat{
			{&l.O, "attn_output.weight", cfg.Embd, qDim},
			{&l.Down, "ffn_down.weight", cfg.Embd, cfg.FF},
			{&l.Q, "attn_q.weight", qDim, cfg.Embd},
			{&l.K, "attn_k.weight", kvDim, cfg.Embd},
			{&l.V, "attn_v.weight", kvDim, cfg.Embd},
			{&l.Gate, "ffn_gate.weight", cfg.FF, cfg.Embd},
			{&l.Up, "ffn_up.weight", cfg.FF, cfg.Embd},
		}
		for _, t := range mats {
			if *t.dst, err = matrix(f, name(t.name), t.rows, t.cols); err != nil {
				return nil, err
			}
		}
		if cfg.QKNorm {
			if l.QNorm, err = vector(f, name("attn_q_norm.weight"), cfg.HeadDim); err != nil {
				return nil, err
			}
			if l.KNorm, err = vector(f, name("attn_k_norm.weight"), cfg.HeadDim); err != nil {
				return nil, err
			}
		}
		if l.AttnNorm, err = vector(f, name("attn_norm.weight"), cfg.Embd); err != nil {
			return nil, err
		}
		if l.FFNNorm, err = vector(f, name("ffn_norm.weight"), cfg.Embd); err != nil {
			return nil, err
		}
		if cfg.QKVBias {
			if l.QBias, err = vector(f, name("attn_q.bias"), qDim); err != nil {
				return nil, err
			}
			if l.KBias, err = vector(f, name("attn_k.bias"), kvDim); err != nil {
				return nil, err
			}
			if l.VBias, err = vector(f, name("attn_v.bias"), kvDim); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// matrix finds a 2-D tensor of rows×cols (rows < 0: any).
func matrix(f *gguf.File, name string, rows, cols int) (*Weight, error) {
	t, err := f.Tensor(name)
	if err != nil {
		return nil, err
	}
	if len(t.Dims) != 2 || t.RowLen() != cols || (rows >= 0 && t.Rows() != rows) {
		return nil, fmt.Errorf("model: tensor %q has shape %v, want [%d %d]", name, t.Dims, cols, rows)
	}
	switch t.Type {
	case ggml.F32, ggml.F16, ggml.BF16, ggml.Q8_0, ggml.Q4_0, ggml.Q4_K, ggml.Q6_K:
	default:
		return nil, fmt.Errorf("model: tensor %q has type %v, which strata cannot multiply", name, t.Type)
	}
	return &Weight{Name: name, Type: t.Type, Rows: t.Rows(), Cols: cols, Data: t.Data}, nil
}

// vector finds a 1-D tensor of n elements and returns it as float32.
func vector(f *gguf.File, name string, n int) ([]float32, error) {
	t, err := f.Tensor(name)
	if err != nil {
		return nil, err
	}
	if t.Elements() != uint64(n) || t.Rows() != 1 {
		return nil, fmt.Errorf("model: tensor %q has shape %v, want [%d]", name, t.Dims, n)
	}
	out := make([]float32, n)
	if err := ggml.DequantizeRow(t.Type, t.Data, out); err != nil {
		return nil, fmt.Errorf("model: tensor %q: %w", name, err)
	}
	return out, nil
}
