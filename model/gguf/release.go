package gguf

import (
	"os"
	"sync"
	"unsafe"
)

// mappings holds the live read-only file mappings made by Open, by the
// address of their first byte, so that Release can tell a view of one from
// any other memory (where dropping pages would lose data). mapFile adds a
// mapping and its release function removes it before unmapping, both under
// the lock that Release holds while it advises the kernel.
var mappings = struct {
	sync.Mutex
	m map[uintptr]int // first byte → length
}{m: map[uintptr]int{}}

func register(data []byte) {
	if len(data) == 0 {
		return
	}
	mappings.Lock()
	mappings.m[uintptr(unsafe.Pointer(unsafe.SliceData(data)))] = len(data)
	mappings.Unlock()
}

func unregister(data []byte) {
	if len(data) == 0 {
		return
	}
	mappings.Lock()
	delete(mappings.m, uintptr(unsafe.Pointer(unsafe.SliceData(data))))
	mappings.Unlock()
}

// Release tells the kernel that this process no longer needs the pages
// under b, a view of a file that Open mapped (a tensor's Data, say): the
// whole pages inside b leave the process's resident set and, where no one
// else maps them, the page cache (MADV_PAGEOUT, then MADV_DONTNEED, on
// Linux). The mapping is read-only and file-backed, so b still reads the
// same bytes afterwards: a page touched again is read back from the file.
// Release returns the bytes it advised about; it does nothing (0) for
// memory that is not part of a live mapping of Open's (a File from Parse,
// a platform without mappings) and for the pages b shares with its
// neighbours. It is safe for concurrent use, and with Close.
func Release(b []byte) int {
	if len(b) == 0 {
		return 0
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	hi := lo + uintptr(len(b))
	page := uintptr(os.Getpagesize())
	start, end := (lo+page-1)&^(page-1), hi&^(page-1)
	if end <= start {
		return 0
	}
	mappings.Lock()
	defer mappings.Unlock()
	for base, n := range mappings.m {
		if lo >= base && hi <= base+uintptr(n) {
			if adviseDrop(b[start-lo:end-lo]) != nil {
				return 0
			}
			return int(end - start)
		}
	}
	return 0
}
