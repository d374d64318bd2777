//go:build !(linux || darwin)

package gguf

import (
	"fmt"
	"io"
	"math"
	"os"
)

// mapFile reads the whole file: this platform has no mapping support here.
// The returned release function is nil; the garbage collector frees the bytes.
func mapFile(f *os.File, size int64) ([]byte, func([]byte) error, error) {
	if size > math.MaxInt {
		return nil, nil, fmt.Errorf("file of %d bytes is too large to read", size)
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, nil, fmt.Errorf("read: %w", err)
	}
	return data, nil, nil
}
