package shard

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// GPU is one NVIDIA GPU as NVML reports it.
type GPU struct {
	Index       int
	Name        string
	MemoryTotal uint64 // bytes
	MemoryFree  uint64 // bytes
}

// Devices is what a shard reports in Register: its CPU cores and memory and,
// when an NVIDIA driver is present (and the binary was built with cgo on
// Linux), its GPUs.
type Devices struct {
	CPUCores    int
	MemoryBytes uint64 // available memory for weights and KV
	GPUs        []GPU
}

// ProbeDevices reports this machine's devices. A missing /proc/meminfo
// gives MemoryBytes 0 (unknown); a missing GPU driver gives no GPUs: both
// are normal, never errors.
func ProbeDevices() Devices {
	d := Devices{CPUCores: runtime.NumCPU()}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		d.MemoryBytes, _ = parseMeminfo(f)
		f.Close()
	}
	d.GPUs = probeGPUs()
	return d
}

// parseMeminfo returns MemAvailable (MemTotal on kernels without it) in
// bytes from /proc/meminfo's format ("MemAvailable:   123456 kB").
func parseMeminfo(r io.Reader) (uint64, error) {
	var total, avail uint64
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		if len(f) >= 3 && f[2] == "kB" {
			v <<= 10
		}
		switch f[0] {
		case "MemTotal:":
			total = v
		case "MemAvailable:":
			avail = v
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("meminfo: %w", err)
	}
	if avail == 0 {
		return total, nil
	}
	return avail, nil
}
