//go:build cgo && linux

package shard

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// probeGPUs lists NVIDIA GPUs through NVML. Without the driver library
// (nvml.Init fails) the shard is CPU only.
func probeGPUs() []GPU {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil
	}
	defer nvml.Shutdown()
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil
	}
	var out []GPU
	for i := range n {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		g := GPU{Index: i}
		if name, ret := dev.GetName(); ret == nvml.SUCCESS {
			g.Name = name
		}
		if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemoryTotal, g.MemoryFree = mem.Total, mem.Free
		}
		out = append(out, g)
	}
	return out
}
