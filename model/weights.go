package model

import (
	"fmt"
	"math"
	"slices"
	"strings"

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
	Q, K, V, O          *Weight   // Q, K, V nil when QKV is set
	QKV                 *Weight   // attn_qkv: Q's rows, then K's, then V's; nil unless the file fuses them
	QBias, KBias, VBias []float32 // nil unless Config.QKVBias
	QNorm, KNorm        []float32 // per-head norms (HeadDim each); nil unless Config.QKNorm
	FFNNorm             []float32
	Gate, Up, Down      *Weight // Gate, Up nil when GateUp is set
	GateUp              *Weight // ffn_up of 2×FF rows, the gate's then the up's; nil unless Config.FusedGateUp
	// PostAttnNorm and PostFFNNorm normalise the attention and FFN outputs
	// before the residual adds (post_attention_norm, post_ffw_norm); nil
	// unless Config.PostNorms.
	PostAttnNorm, PostFFNNorm []float32
	// Router (ffn_gate_inp: Experts rows of Embd) and Experts replace Gate,
	// Up and Down in a mixture-of-experts layer (Config.Experts > 0); nil
	// otherwise.
	Router  *Weight
	Experts []Expert
	// Shared is a mixture-of-experts layer's shared expert (Config.SharedFF
	// > 0); nil otherwise.
	Shared *SharedExpert
}

// Matrices returns the layer's matrices that are present.
func (l *Layer) Matrices() []*Weight {
	var ws []*Weight
	for _, w := range []*Weight{l.Q, l.K, l.V, l.QKV, l.O, l.Gate, l.Up, l.GateUp, l.Down, l.Router} {
		if w != nil {
			ws = append(ws, w)
		}
	}
	for _, e := range l.Experts {
		ws = append(ws, e.Gate, e.Up, e.Down)
	}
	if sh := l.Shared; sh != nil {
		ws = append(ws, sh.GateInp, sh.Gate, sh.Up, sh.Down)
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
	// RopeFactors divides the angle of each rotated pair (RopeDims/2 of
	// them): rope_factors_long.weight when Context exceeds RopeOrigContext,
	// else rope_factors_short.weight; nil when the file has neither.
	RopeFactors []float32
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
	if err := m.loadRopeFactors(f); err != nil {
		return nil, err
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
		}
		// A file may fuse Q, K and V into one matrix, as llama.cpp's loader
		// accepts for every architecture.
		if _, err := f.Tensor(name("attn_qkv.weight")); err == nil {
			if cfg.QKVBias {
				return nil, fmt.Errorf("model: %s with Q/K/V biases is not supported", name("attn_qkv.weight"))
			}
			mats = append(mats, mat{&l.QKV, "attn_qkv.weight", qDim + 2*kvDim, cfg.Embd})
		} else {
			mats = append(mats,
				mat{&l.Q, "attn_q.weight", qDim, cfg.Embd},
				mat{&l.K, "attn_k.weight", kvDim, cfg.Embd},
				mat{&l.V, "attn_v.weight", kvDim, cfg.Embd})
		}
		switch {
		case cfg.Experts > 0:
			if err := m.loadExperts(f, l, i); err != nil {
				return nil, err
			}
		case cfg.FusedGateUp:
			mats = append(mats,
				mat{&l.GateUp, "ffn_up.weight", 2 * cfg.FF, cfg.Embd},
				mat{&l.Down, "ffn_down.weight", cfg.Embd, cfg.FF})
		default:
			mats = append(mats,
				mat{&l.Gate, "ffn_gate.weight", cfg.FF, cfg.Embd},
				mat{&l.Up, "ffn_up.weight", cfg.FF, cfg.Embd},
				mat{&l.Down, "ffn_down.weight", cfg.Embd, cfg.FF})
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
		if cfg.PostNorms {
			if l.PostAttnNorm, err = vector(f, name("post_attention_norm.weight"), cfg.Embd); err != nil {
				return nil, err
			}
			if l.PostFFNNorm, err = vector(f, name("post_ffw_norm.weight"), cfg.Embd); err != nil {
				return nil, err
			}
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

// loadRopeFactors sets m.RopeFactors for the architectures whose RoPE takes
// them, choosing as llama.cpp does: rope_freqs.weight (Llama 3) when
// present, else rope_factors_long.weight when Context exceeds
// RopeOrigContext and rope_factors_short.weight when not (Phi-3's longrope;
// one pair for all layers, as llama.cpp's converter writes them). A file
// with one of the long/short pair but not the other is refused.
func (m *Model) loadRopeFactors(f *gguf.File) error {
	if !archs[m.Arch].ropeFactors {
		return nil
	}
	has := func(name string) bool { _, err := f.Tensor(name); return err == nil }
	long, short := has("rope_factors_long.weight"), has("rope_factors_short.weight")
	var name string
	switch {
	case has("rope_freqs.weight"):
		name = "rope_freqs.weight"
	case long != short:
		return fmt.Errorf("model: rope_factors_long.weight and rope_factors_short.weight must come together")
	case long && m.Context > m.RopeOrigContext:
		name = "rope_factors_long.weight"
	case long:
		name = "rope_factors_short.weight"
	default:
		return nil
	}
	ff, err := vector(f, name, m.RopeDims/2)
	if err != nil {
		return err
	}
	for i, v := range ff {
		if !(v > 0) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("model: tensor %q element %d is %g, want a positive divisor", name, i, v)
		}
	}
	m.RopeFactors = ff
	return nil
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
	if !slices.Contains(MatrixTypes, t.Type) {
		return nil, unsupportedType(name, t.Type)
	}
	return &Weight{Name: name, Type: t.Type, Rows: t.Rows(), Cols: cols, Data: t.Data}, nil
}

// MatrixTypes are the tensor types strata computes with, for the layers'
// matrices, the token embedding (whose rows are dequantized) and the output
// head: the float types and the block types llama-quantize writes, including
// the fallbacks it picks for rows that are not a multiple of 256 (Q5_0,
// Q5_1, Q8_0, IQ4_NL, F16). Every Backend implements them all.
var MatrixTypes = []ggml.Type{
	ggml.F32, ggml.F16, ggml.BF16,
	ggml.Q8_0, ggml.Q4_0, ggml.Q5_0, ggml.Q5_1, ggml.IQ4_NL,
	ggml.Q2_K, ggml.Q3_K, ggml.Q4_K, ggml.Q5_K, ggml.Q6_K, ggml.IQ4_XS,
}

// unsupportedType is the one-line refusal of a tensor of a type strata
// cannot compute with.
func unsupportedType(name string, t ggml.Type) error {
	return fmt.Errorf("model: tensor %s has type %v, which strata cannot compute; supported: %s", name, t, matrixTypeNames())
}

// matrixTypeNames lists MatrixTypes, comma separated.
func matrixTypeNames() string {
	names := make([]string, len(MatrixTypes))
	for i, t := range MatrixTypes {
		names[i] = t.String()
	}
	return strings.Join(names, ", ")
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
