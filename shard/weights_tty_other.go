//go:build !linux && !darwin && !freebsd && !netbsd && !openbsd

package shard

// isTerminal reports false: no progress bar on this platform.
func isTerminal(uintptr) bool { return false }
