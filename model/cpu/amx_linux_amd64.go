//go:build amd64 && !purego && linux

package cpu

import "syscall"

// requestAMX asks Linux for permission to use AMX tile data in this process
// (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA): without it the
// first tile instruction raises SIGILL. It reports whether it was granted.
func requestAMX() bool {
	const archReqXcompPerm, xfeatureXtiledata = 0x1023, 18
	_, _, errno := syscall.RawSyscall(syscall.SYS_ARCH_PRCTL, archReqXcompPerm, xfeatureXtiledata, 0)
	return errno == 0
}
