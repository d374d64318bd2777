package bench

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// CPU names the processor every figure was measured on, as "model name
// (vendor_id)" from /proc/cpuinfo, with the number of CPUs Go sees; figures
// must name it because SIMD penalties differ by vendor (an AVX→SSE
// transition costs nothing on AMD Zen and a lot on Intel). Where
// /proc/cpuinfo is unreadable it says only the architecture.
func CPU() string {
	name, vendor := cpuinfo("/proc/cpuinfo")
	if name == "" {
		name = runtime.GOARCH
	}
	if vendor != "" {
		name += " (" + vendor + ")"
	}
	return name + ", " + strconv.Itoa(runtime.NumCPU()) + " CPUs"
}

// cpuinfo returns the first "model name" and "vendor_id" of a
// /proc/cpuinfo file, or empty strings.
func cpuinfo(path string) (name, vendor string) {
	f, err := os.Open(path)
	if err != nil {
		return "", ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() && (name == "" || vendor == "") {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name":
			if name == "" {
				name = strings.TrimSpace(v)
			}
		case "vendor_id":
			if vendor == "" {
				vendor = strings.TrimSpace(v)
			}
		}
	}
	return name, vendor
}

// VmRSS returns this process's resident set in bytes (VmRSS from
// /proc/self/status), or 0 where that is unreadable.
func VmRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			fs := strings.Fields(v)
			if len(fs) == 2 && fs[1] == "kB" {
				if kb, err := strconv.ParseInt(fs[0], 10, 64); err == nil {
					return kb << 10
				}
			}
			return 0
		}
	}
	return 0
}
