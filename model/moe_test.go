package model

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

// TestMoEConfig loads the random qwen3moe and mixtral files and checks the
// expert keys read and the experts' views of the 3-D tensors.
func TestMoEConfig(t *testing.T) {
	base := RandomSpec{Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Type: ggml.Q8_0, Seed: 1}
	tests := []struct {
		name               string
		spec               func(s *RandomSpec)
		arch               string
		experts, used, ff  int
		norm, neox, qkNorm bool
	}{
		{"qwen3moe", func(s *RandomSpec) { s.Arch, s.ExpertFF = "qwen3moe", 32 }, "qwen3moe", 4, 2, 32, true, true, true},
		{"qwen3moe raw weights", func(s *RandomSpec) {
			s.Arch, s.Experts, s.ExpertsUsed, s.RawExpertWeights = "qwen3moe", 8, 3, true
		}, "qwen3moe", 8, 3, 96, false, true, true},
		{"mixtral", func(s *RandomSpec) { s.Arch, s.ExpertFF = "mixtral", 32 }, "llama", 4, 2, 96, true, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := base
			tt.spec(&spec)
			f, err := RandomFile(spec)
			if err != nil {
				t.Fatal(err)
			}
			m, err := Load(f)
			if err != nil {
				t.Fatal(err)
			}
			c := m.Config
			if c.Arch != tt.arch || c.Experts != tt.experts || c.ExpertsUsed != tt.used || c.ExpertFF != tt.ff || c.ExpertWeightsNorm != tt.norm || (c.Rope == RopeNeoX) != tt.neox || c.QKNorm != tt.qkNorm {
				t.Fatalf("config %+v", c)
			}
			for i, L := range m.LayerWeights {
				if L.Gate != nil || L.Up != nil || L.Down != nil || L.Router == nil || L.Router.Rows != tt.experts || L.Router.Type != ggml.F32 || len(L.Experts) != tt.experts {
					t.Fatalf("layer %d: %+v", i, L)
				}
				if n := len(L.Matrices()); n != 4+1+3*tt.experts {
					t.Fatalf("layer %d: %d matrices, want Q, K, V, O, the router and 3 per expert", i, n)
				}
				gate, err := f.Tensor(L.Experts[0].Gate.Name[:strings.IndexByte(L.Experts[0].Gate.Name, '[')])
				if err != nil {
					t.Fatal(err)
				}
				per := len(gate.Data) / tt.experts
				for e, x := range L.Experts {
					if x.Gate.Rows != tt.ff || x.Gate.Cols != 64 || x.Up.Rows != tt.ff || x.Down.Rows != 64 || x.Down.Cols != tt.ff || x.Gate.Type != ggml.Q8_0 {
						t.Fatalf("layer %d expert %d: gate %dx%d, up %dx%d, down %dx%d", i, e, x.Gate.Rows, x.Gate.Cols, x.Up.Rows, x.Up.Cols, x.Down.Rows, x.Down.Cols)
					}
					// A view of the tensor's bytes, not a copy.
					if &x.Gate.Data[0] != &gate.Data[e*per] || len(x.Gate.Data) != per {
						t.Fatalf("layer %d expert %d: gate is not its slice of the tensor", i, e)
					}
				}
			}
		})
	}
}

// TestMoERefusals: what strata does not compute is refused at load, in one
// line naming the key or tensor.
func TestMoERefusals(t *testing.T) {
	q := RandomSpec{Arch: "qwen3moe", Layers: 1, Embd: 64, Heads: 4, HeadsKV: 2, FF: 64, Vocab: 300, Context: 256, Type: ggml.F32, Seed: 3}
	mix := q
	mix.Arch = "mixtral"
	tensor := func(name string, dims []uint64) gguf.WriteTensor {
		n := uint64(1)
		for _, d := range dims {
			n *= d
		}
		return gguf.WriteTensor{Name: name, Type: ggml.F32, Dims: dims, Data: make([]byte, 4*n)}
	}
	tests := []struct {
		name string
		spec RandomSpec
		edit func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor)
		want string
	}{
		{"qwen3moe without experts", q, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "qwen3moe.expert_count", uint32(0)), ts
		}, "qwen3moe.expert_count must be > 0 for qwen3moe"},
		{"too many experts", q, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "qwen3moe.expert_count", uint32(1<<20)), ts
		}, "qwen3moe.expert_count = 1048576, want 0..1024"},
		{"no used count", mix, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return dropKV(kvs, "llama.expert_used_count"), ts
		}, "llama.expert_used_count is missing for 4 experts"},
		{"more used than experts", mix, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "llama.expert_used_count", uint32(5)), ts
		}, "llama.expert_used_count = 5, want 0..4"},
		{"sigmoid gating", q, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "qwen3moe.expert_gating_func", uint32(2)), ts
		}, "qwen3moe.expert_gating_func = 2: only softmax gating (0 or 1) is supported"},
		{"scaled weights", q, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "qwen3moe.expert_weights_scale", float32(2.5)), ts
		}, "qwen3moe.expert_weights_scale = 2.5: scaled expert weights are not supported"},
		{"shared experts", q, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "qwen3moe.expert_shared_feed_forward_length", uint32(64)), ts
		}, "qwen3moe.expert_shared_feed_forward_length = 64: shared experts are not supported"},
		{"shared expert tensor", mix, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return kvs, append(ts, tensor("blk.0.ffn_up_shexp.weight", []uint64{64, 64}))
		}, "tensor blk.0.ffn_up_shexp.weight: shared experts and expert biases are not supported"},
		{"experts as a 2-D tensor", q, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			for i := range ts {
				if ts[i].Name == "blk.0.ffn_up_exps.weight" {
					ts[i].Dims = []uint64{64, 4 * 64}
				}
			}
			return kvs, ts
		}, `"blk.0.ffn_up_exps.weight" has shape [64 256], want [64 64 4]`},
		{"gate-less experts", mix, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return kvs, slices.DeleteFunc(ts, func(t gguf.WriteTensor) bool { return t.Name == "blk.0.ffn_gate_exps.weight" })
		}, "blk.0.ffn_gate_exps.weight"},
		{"experts as separate tensors", mix, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			ts = slices.DeleteFunc(ts, func(t gguf.WriteTensor) bool { return strings.Contains(t.Name, "_exps") })
			for e := range 4 {
				for _, n := range []string{"gate", "up"} {
					ts = append(ts, tensor("blk.0.ffn_"+n+"."+strconv.Itoa(e)+".weight", []uint64{64, 64}))
				}
			}
			return kvs, ts
		}, "tensor blk.0.ffn_gate.0.weight: experts stored as separate 2-D tensors (an old Mixtral conversion) are not supported"},
		{"router of the wrong width", q, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			ts = slices.DeleteFunc(ts, func(t gguf.WriteTensor) bool { return t.Name == "blk.0.ffn_gate_inp.weight" })
			return kvs, append(ts, tensor("blk.0.ffn_gate_inp.weight", []uint64{64, 5}))
		}, `"blk.0.ffn_gate_inp.weight" has shape [64 5], want [64 4]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kvs, ts := parseRandom(t, tt.spec)
			kvs, ts = tt.edit(kvs, ts)
			_, err := Load(writeParse(t, kvs, ts))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
		})
	}
}

// TestRoute checks the routing of one token: softmax probabilities, the
// most probable experts in descending order with ties to the lower ID, and
// the weights, renormalised or not.
func TestRoute(t *testing.T) {
	tests := []struct {
		name    string
		logits  []float32
		k       int
		norm    bool
		wantSel []int32
	}{
		{"descending", []float32{0, 3, 1, 2}, 2, true, []int32{1, 3}},
		{"ties to the lower id", []float32{1, 2, 2, 2, 0}, 2, true, []int32{1, 2}},
		{"all tied", []float32{5, 5, 5, 5}, 3, false, []int32{0, 1, 2}},
		{"tie after the first", []float32{9, 1, 1, 3}, 3, true, []int32{0, 3, 1}},
		{"one expert", []float32{-1, -2}, 1, true, []int32{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := slices.Clone(tt.logits)
			sel, w := make([]int32, tt.k), make([]float32, tt.k)
			route(p, tt.norm, sel, w)
			if !slices.Equal(sel, tt.wantSel) {
				t.Fatalf("chose %v, want %v", sel, tt.wantSel)
			}
			var sum, ws float64
			for _, v := range tt.logits {
				sum += math.Exp(float64(v))
			}
			for _, e := range sel {
				ws += math.Exp(float64(tt.logits[e])) / sum
			}
			for j, e := range sel {
				want := math.Exp(float64(tt.logits[e])) / sum
				if tt.norm {
					want /= ws
				}
				if math.Abs(float64(w[j])-want) > 1e-6 {
					t.Fatalf("weight %d (expert %d) %g, want %g", j, e, w[j], want)
				}
			}
		})
	}
}
