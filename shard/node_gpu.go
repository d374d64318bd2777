package shard

import (
	"fmt"
	"path/filepath"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cuda"
)

// openGPU opens the device of --device cuda:N and loads the kernels
// (compiled by NVRTC, cached under DataDir/cuda-kernels); nil for --device
// cpu. Without a driver the error is one line naming what was tried.
func openGPU(cfg Config) (*cuda.Device, error) {
	if cfg.Device == "cpu" {
		return nil, nil
	}
	ord, err := cuda.ParseDevice(cfg.Device)
	if err != nil {
		return nil, fmt.Errorf("--device: %w", err)
	}
	var dirs []string
	if cfg.CUDALibDir != "" {
		dirs = append(dirs, cfg.CUDALibDir)
	}
	d, err := cuda.OpenDevice(cuda.DeviceConfig{Ordinal: ord, LibDirs: dirs, CacheDir: filepath.Join(cfg.DataDir, "cuda-kernels")})
	if err != nil {
		return nil, fmt.Errorf("--device %s: %w", cfg.Device, err)
	}
	return d, nil
}

// gpuFree is the device's free memory in bytes (0 when unknown).
func gpuFree(d *cuda.Device) uint64 {
	var free uint64
	d.Ctx.Do(func() error {
		var err error
		free, _, err = d.Ctx.MemInfo()
		return err
	})
	return free
}

// gpuOffer is the device memory a GPU shard offers placement for weights
// and KV out of free bytes: all but cuda.DefaultMargin (the context, the
// module, activations and allocator slack), so that a pool sized from it
// without --kv-memory still leaves the stage room to run.
func gpuOffer(free uint64) uint64 {
	if free <= cuda.DefaultMargin {
		return 0
	}
	return free - cuda.DefaultMargin
}

// gpuStage builds layers [first, end) of m on the GPU with a pool of
// blocks blocks of bs positions (f16, in device memory).
func (n *Node) gpuStage(m *model.Model, first, end, blocks, bs int, kvF16 bool) (Stage, func(), error) {
	if !kvF16 {
		return nil, nil, fmt.Errorf("assign names an f32 KV cache; a GPU shard keeps f16 blocks")
	}
	l := cuda.KVLayout{Layers: end - first, Blocks: blocks, BlockSize: bs, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim}
	if need := l.Bytes(); n.cfg.KVMemory > 0 && need > n.cfg.KVMemory {
		return nil, nil, fmt.Errorf("assigned KV pool of %d blocks × %d positions needs %d bytes, --kv-memory is %d", blocks, bs, need, n.cfg.KVMemory)
	}
	st, err := cuda.NewStage(n.gpu, m, first, end, blocks, bs)
	if err != nil {
		return nil, nil, err
	}
	return st, func() { st.Close() }, nil
}
