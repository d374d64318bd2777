//go:build linux || darwin

package gguf

import (
	"fmt"
	"math"
	"os"
	"syscall"
)

// mapFile maps f's size bytes read-only and returns the mapping and the
// function that releases it. The mapping is registered for Release until
// that function runs.
func mapFile(f *os.File, size int64) ([]byte, func([]byte) error, error) {
	if size > math.MaxInt {
		return nil, nil, fmt.Errorf("file of %d bytes is too large to map", size)
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap: %w", err)
	}
	register(data)
	return data, func(b []byte) error {
		unregister(b) // before the range can be mapped again by anything else
		return syscall.Munmap(b)
	}, nil
}
