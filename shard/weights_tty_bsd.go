//go:build darwin || freebsd || netbsd || openbsd

package shard

import "golang.org/x/sys/unix"

// isTerminal reports whether fd is a terminal (TIOCGETA succeeds).
func isTerminal(fd uintptr) bool {
	_, err := unix.IoctlGetTermios(int(fd), unix.TIOCGETA)
	return err == nil
}
