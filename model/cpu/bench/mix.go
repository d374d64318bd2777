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
	if base, ok := kMixtures[u]; ok {
		return Kind{Name: u, Mix: func(spec model.RandomSpec) model.RandomSpec { return kMix(base, spec) }}, nil
	}
	names := make([]string, 0, len(model.MatrixTypes)+len(kMixtures))
	for _, t := range model.MatrixTypes {
		names = append(names, t.String())
	}
	names = append(names, slices.Sorted(maps.Keys(kMixtures))...)
	return Kind{}, fmt.Errorf("want one of %s, got %q", strings.Join(names, ", "), s)
}

// kMixtures are the _M mixtures whose rules kMix writes, by their base type.
var kMixtures = map[string]ggml.Type{"Q4_K_M": ggml.Q4_K, "Q5_K_M": ggml.Q5_K}

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
			spec.Types[fmt.Sprintf("blk.%d.ffn_down.weight", i)] = ggml.Q6_K
			if spec.Experts > 0 || spec.Arch == "qwen3moe" || spec.Arch == "mixtral" {
				spec.Types[fmt.Sprintf("blk.%d.ffn_down_exps.weight", i)] = ggml.Q6_K // the rule matches "ffn_down"
			}
		}
	}
	return spec
}
