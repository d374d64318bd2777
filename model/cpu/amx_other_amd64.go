//go:build amd64 && !purego && !linux

package cpu

// requestAMX reports false: strata asks for AMX permission on Linux only.
func requestAMX() bool { return false }
