//go:build !linux

package gguf

import "errors"

// adviseDrop does nothing here (Release reports 0): pages stay resident
// until the kernel needs them.
func adviseDrop([]byte) error { return errors.ErrUnsupported }
