package gguf

import "golang.org/x/sys/unix"

// adviseDrop drops the whole pages b covers from the process (and, where
// only this process maps them, from the page cache: MADV_PAGEOUT, Linux
// 5.4 on; older kernels refuse it and MADV_DONTNEED still unmaps them).
func adviseDrop(b []byte) error {
	_ = unix.Madvise(b, unix.MADV_PAGEOUT)
	return unix.Madvise(b, unix.MADV_DONTNEED)
}
