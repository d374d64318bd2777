//go:build !(cgo && linux)

package shard

// probeGPUs reports no GPUs: this build has no NVML (it needs cgo on Linux).
func probeGPUs() []GPU { return nil }
