package main

import (
	"fmt"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/shard"
)

// localConfig describes shards run inside the coordinator's process.
type localConfig struct {
	Shards   int       // stages; layers are split evenly
	Pool     *cpu.Pool // shared by every stage (--threads workers in all)
	KVMemory int64     // bytes of KV cache per shard
	KVType   ggml.Type
}

// splitLayers cuts n layers into k contiguous ranges whose sizes differ by at
// most one, the larger ones first.
func splitLayers(n, k int) [][2]int {
	out := make([][2]int, k)
	a := 0
	for i := range out {
		size := n / k
		if i < n%k {
			size++
		}
		out[i] = [2]int{a, a + size}
		a += size
	}
	return out
}

// newLocal builds the in-process pipeline: one runner per layer range, each
// with a KV pool sized by cfg.KVMemory, and the pool the scheduler may use
// (the smallest stage's).
func newLocal(m *model.Model, cfg localConfig) (*shard.Local, error) {
	if cfg.Shards < 1 || cfg.Shards > m.Layers {
		return nil, fmt.Errorf("--local-shards must be in 1..%d (the model's layers), got %d", m.Layers, cfg.Shards)
	}
	ranges := splitLayers(m.Layers, cfg.Shards)
	blocks := -1
	for _, r := range ranges {
		per := cpu.KVBytes(cpu.KVConfig{Layers: r[1] - r[0], Blocks: 1, BlockSize: cpu.DefaultBlockSize, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: cfg.KVType})
		n := int(cfg.KVMemory / per)
		if blocks < 0 || n < blocks {
			blocks = n
		}
	}
	if blocks < 1 {
		return nil, fmt.Errorf("--kv-memory %d bytes holds no %d-position KV block", cfg.KVMemory, cpu.DefaultBlockSize)
	}
	var runners []*shard.Runner
	for _, r := range ranges {
		kv, err := cpu.NewKV(cpu.KVConfig{Layers: r[1] - r[0], Blocks: blocks, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: cfg.KVType})
		if err != nil {
			return nil, err
		}
		st, err := model.NewStage(m, r[0], r[1], cpu.NewBackend(cfg.Pool), kv)
		if err != nil {
			return nil, err
		}
		runners = append(runners, shard.NewRunner(st, blocks, kv.BlockSize()))
	}
	return shard.NewLocal(runners, blocks, cpu.DefaultBlockSize), nil
}
