package shard

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseSize reads a byte count as the --kv-memory flags of both binaries
// take it: 512MiB, 4GiB, 1G (binary), 1GB (decimal) or plain bytes.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSuffix(t, u.suffix), u.m
			break
		}
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || v <= 0 || v*float64(mult) > 1<<50 {
		return 0, fmt.Errorf("want a positive size such as 512MiB or 4GiB, got %q", s)
	}
	return int64(v * float64(mult)), nil
}
