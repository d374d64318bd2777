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
		{"qwen2moe", func(s *RandomSpec) { s.Arch, s.ExpertFF, s.SharedFF = "qwen2moe", 32, 80 }, "qwen2moe", 4, 2, 32, false, true, false},
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
			shared := tt.arch == "qwen2moe"
			if wantFF := map[bool]int{false: 0, true: 80}[shared]; c.SharedFF != wantFF || c.QKVBias != shared {
				t.Fatalf("shared FF %d, want %d; QKV bias %v", c.SharedFF, wantFF, c.QKVBias)
			}
			for i, L := range m.LayerWeights {
				if L.Gate != nil || L.Up != nil || L.Down != nil || L.Router == nil || L.Router.Rows != tt.experts || L.Router.Type != ggml.F32 || len(L.Experts) != tt.experts {
					t.Fatalf("layer %d: %+v", i, L)
				}
				want := 4 + 1 + 3*tt.experts
				if shared {
					sh := L.Shared
					if sh == nil || sh.GateInp.Rows != 1 || sh.GateInp.Cols != 64 || sh.GateInp.Type != ggml.F32 || sh.Gate.Rows != 80 || sh.Up.Rows != 80 || sh.Down.Rows != 64 || sh.Down.Cols != 80 || sh.Gate.Type != ggml.Q8_0 {
						t.Fatalf("layer %d: shared expert %+v", i, sh)
					}
					want += 4
				} else if L.Shared != nil {
					t.Fatalf("layer %d: a shared expert in %s", i, tt.arch)
				}
				if n := len(L.Matrices()); n != want {
					t.Fatalf("layer %d: %d matrices, want Q, K, V, O, the router, 3 per expert and 4 of a shared expert: %d", i, n, want)
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
	q2 := q
	q2.Arch = "qwen2moe"
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
		{"shared experts outside qwen2moe", q, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "qwen3moe.expert_shared_feed_forward_length", uint32(64)), ts
		}, "qwen3moe.expert_shared_feed_forward_length = 64: shared experts are supported in qwen2moe files only"},
		{"shared expert count outside qwen2moe", mix, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "llama.expert_shared_count", uint32(1)), ts
		}, "llama.expert_shared_count = 1: shared experts are supported in qwen2moe files only"},
		{"shared expert tensor outside qwen2moe", mix, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return kvs, append(ts, tensor("blk.0.ffn_up_shexp.weight", []uint64{64, 64}))
		}, "tensor blk.0.ffn_up_shexp.weight: shared experts (outside qwen2moe) and expert biases are not supported"},
		{"qwen2moe without experts", q2, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return dropKV(kvs, "qwen2moe.expert_count"), ts
		}, "qwen2moe.expert_count must be > 0 for qwen2moe"},
		{"qwen2moe two shared experts", q2, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "qwen2moe.expert_shared_count", uint32(2)), ts
		}, "qwen2moe.expert_shared_count = 2: a qwen2moe layer has one shared expert"},
		{"qwen2moe without the shared gate", q2, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return kvs, slices.DeleteFunc(ts, func(t gguf.WriteTensor) bool { return t.Name == "blk.0.ffn_gate_inp_shexp.weight" })
		}, "blk.0.ffn_gate_inp_shexp.weight"},
		{"qwen2moe shared gate of two rows", q2, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			ts = slices.DeleteFunc(ts, func(t gguf.WriteTensor) bool { return t.Name == "blk.0.ffn_gate_inp_shexp.weight" })
			return kvs, append(ts, tensor("blk.0.ffn_gate_inp_shexp.weight", []uint64{64, 2}))
		}, `"blk.0.ffn_gate_inp_shexp.weight" has shape [64 2], want [64]`},
		{"qwen2moe shared expert of the wrong width", q2, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kvs, "qwen2moe.expert_shared_feed_forward_length", uint32(32)), ts
		}, `"blk.0.ffn_gate_shexp.weight" has shape [64 64], want [64 32]`},
		{"qwen2moe without biases", q2, func(kvs []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return kvs, slices.DeleteFunc(ts, func(t gguf.WriteTensor) bool { return t.Name == "blk.0.attn_k.bias" })
		}, "blk.0.attn_k.bias"},
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

// TestSharedGate: the shared expert's gate is the sigmoid, computed as
// silu(x)/x in float32 (llama.cpp's graph), 1/2 at 0 where that is 0/0.
func TestSharedGate(t *testing.T) {
	for _, x := range []float32{-30, -3, -0.5, -1e-30, 0, 1e-30, 0.25, 2, 40} {
		g := sharedGate(x)
		silu := x / (1 + float32(math.Exp(float64(-x))))
		want := silu / x
		if x == 0 {
			want = 0.5
		}
		if math.Float32bits(g) != math.Float32bits(want) {
			t.Fatalf("sharedGate(%g) = %g, want %g", x, g, want)
		}
		if exact := 1 / (1 + math.Exp(-float64(x))); math.Abs(float64(g)-exact) > 1e-6 {
			t.Fatalf("sharedGate(%g) = %g, sigmoid %g", x, g, exact)
		}
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
