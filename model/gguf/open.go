package gguf

import (
	"errors"
	"fmt"
	"os"
)

// Open maps the file at path read-only and parses it. The File's tensors are
// views of the mapping, valid until Close.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	defer fd.Close() // the mapping outlives the descriptor
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("gguf: %s: not a regular file", path)
	}
	var data []byte
	var unmap func([]byte) error
	if st.Size() > 0 { // a zero-length mapping fails; Parse reports the empty file
		if data, unmap, err = mapFile(fd, st.Size()); err != nil {
			return nil, fmt.Errorf("gguf: %s: %w", path, err)
		}
	}
	f, err := Parse(data)
	if err != nil {
		if unmap != nil {
			_ = unmap(data) // the parse error is the one to report
		}
		if e, ok := errors.AsType[*Error](err); ok {
			e.Path = path
		}
		return nil, err
	}
	f.unmap = unmap
	return f, nil
}
