package cpu_test

import (
	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
)

func newKV(m *model.Model, layers int) (*cpu.KV, error) {
	return cpu.NewKV(cpu.KVConfig{Layers: layers, Blocks: 8, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: ggml.F16})
}

func newBackend(p *cpu.Pool) *cpu.Backend { return cpu.NewBackend(p) }

func newKVType(m *model.Model, layers int, typ ggml.Type) (*cpu.KV, error) {
	return cpu.NewKV(cpu.KVConfig{Layers: layers, Blocks: 8, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: typ})
}
