//go:build unix

package trust

import (
	"os"
	"syscall"
)

// matchOwner gives the file at path the owner of the directory dir, so
// that a token file rewritten by root (`coordinator token create` run by
// an administrator) stays readable by the coordinator's own user (a
// systemd DynamicUser). Errors are ignored: a process that may not chown
// is already that user.
func matchOwner(path, dir string) {
	fi, err := os.Stat(dir)
	if err != nil {
		return
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 {
		_ = os.Chown(path, int(st.Uid), int(st.Gid))
	}
}
