package gguf

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// MappingResident returns the resident bytes of the memory mapping that
// starts at address base, read from /proc/self/smaps: what Release gives
// back is seen there (VmRSS sums every mapping).
func MappingResident(base uintptr) (int, error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	start := fmt.Sprintf("%x-", base)
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, start) {
			in = true // the mapping's header; its first Rss line follows
			continue
		}
		if in && strings.HasPrefix(line, "Rss:") {
			fields := strings.Fields(line)
			if len(fields) < 2 {
				break
			}
			kb, err := strconv.Atoi(fields[1])
			if err != nil {
				return 0, fmt.Errorf("gguf: smaps %q: %w", line, err)
			}
			return kb << 10, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("gguf: no mapping at %#x in /proc/self/smaps", base)
}
