package bench

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// Kind is what --bench-types names: one matrix type for every matrix, or a
// llama-quantize mixture (per-tensor types).
type Kind struct {
	Name string
	// Mix sets spec's Type and Types for this kind; spec's shape is left
	// as it is.
	Mix func(spec model.RandomSpec) model.RandomSpec
}

// ParseKind returns the kind named s: a matrix type (model.MatrixTypes,
// "q4_k" as well as "Q4_K") or a mixture among Mixtures.
func ParseKind(s string) (Kind, error) {
	u := strings.ToUpper(s)
	for _, t := range model.MatrixTypes {
		if t.String() == u {
			return Kind{Name: t.String(), Mix: func(spec model.RandomSpec) model.RandomSpec {
				spec.Type, spec.Types = t, nil
				return spec
			}}, nil
		}
	}
	if mix, ok := mixtures[u]; ok {
		return Kind{Name: u, Mix: mix}, nil
	}
	names := make([]string, 0, len(model.MatrixTypes)+len(mixtures))
	for _, t := range model.MatrixTypes {
		names = append(names, t.String())
	}
	names = append(names, slices.Sorted(maps.Keys(mixtures))...)
	return Kind{}, fmt.Errorf("want one of %s, got %q", strings.Join(names, ", "), s)
}

// mixtures are llama-quantize's file types that mix tensor types, by the
// name --bench-types takes. Its IQ4_XS file type is IQ4_XS_M here: IQ4_XS
// names the type alone.
var mixtures = map[string]func(model.RandomSpec) model.RandomSpec{
	"Q4_K_M":   func(s model.RandomSpec) model.RandomSpec { return kMix(ggml.Q4_K, s) },
	"Q5_K_M":   func(s model.RandomSpec) model.RandomSpec { return kMix(ggml.Q5_K, s) },
	"Q3_K_M":   q3KMix,
	"IQ4_XS_M": iq4XSMix,
}

// isMoE reports whether spec writes expert tensors.
func isMoE(spec model.RandomSpec) bool {
	return spec.Experts > 0 || spec.Arch == "qwen3moe" || spec.Arch == "mixtral"
}

// setDown sets layer i's ffn_down (and its experts', which the rule's
// "ffn_down" matches as well) to t.
func setDown(spec model.RandomSpec, i int, t ggml.Type) {
	spec.Types[fmt.Sprintf("blk.%d.ffn_down.weight", i)] = t
	if isMoE(spec) {
		spec.Types[fmt.Sprintf("blk.%d.ffn_down_exps.weight", i)] = t
	}
}

// q3KMix is llama-quantize's Q3_K_M (llama_tensor_get_type, no importance
// matrix, a dense Llama, not Falcon): Q3_K, except Q6_K for the output head,
// Q5_K for the first two layers' attn_v and Q4_K for the others', Q4_K for
// every attn_output, and for ffn_down Q5_K in the first sixteenth of the
// layers and Q4_K after.
func q3KMix(spec model.RandomSpec) model.RandomSpec {
	spec.Type = ggml.Q3_K
	spec.Types = map[string]ggml.Type{"output.weight": ggml.Q6_K, "attn_output.weight": ggml.Q4_K}
	n := spec.Layers
	for i := range n {
		v, d := ggml.Q4_K, ggml.Q4_K
		if i < 2 {
			v = ggml.Q5_K
		}
		if i < n/16 {
			d = ggml.Q5_K
		}
		spec.Types[fmt.Sprintf("blk.%d.attn_v.weight", i)] = v
		setDown(spec, i, d)
	}
	return spec
}

// iq4XSMix is llama-quantize's IQ4_XS file type (no importance matrix, a
// dense Llama with fewer than 4 query heads per KV head): IQ4_XS, except
// Q6_K for the output head and Q5_K for ffn_down in the first eighth of the
// layers.
func iq4XSMix(spec model.RandomSpec) model.RandomSpec {
	spec.Type = ggml.IQ4_XS
	spec.Types = map[string]ggml.Type{"output.weight": ggml.Q6_K}
	for i := range spec.Layers / 8 {
		setDown(spec, i, ggml.Q5_K)
	}
	return spec
}

// kMix is llama-quantize's Q4_K_M and Q5_K_M (llama_tensor_get_type, no
// importance matrix, a dense Llama): every matrix in base, except Q6_K for
// the output head and for attn_v and ffn_down in the layers use_more_bits
// picks (the first and last eighth, and every third layer between). Rows
// that are no multiple of 256 fall back as model.RandomSpec's Types
// describe.
func kMix(base ggml.Type, spec model.RandomSpec) model.RandomSpec {
	spec.Type = base
	spec.Types = map[string]ggml.Type{"output.weight": ggml.Q6_K}
	n := spec.Layers
	for i := range n {
		if i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2 {
			spec.Types[fmt.Sprintf("blk.%d.attn_v.weight", i)] = ggml.Q6_K
			setDown(spec, i, ggml.Q6_K)
		}
	}
	return spec
}
