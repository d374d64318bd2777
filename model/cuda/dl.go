//go:build !nocuda

package cuda

import "github.com/ebitengine/purego"

// The dynamic loader, through purego: the only code of this package that
// needs it. purego makes the binary dynamically linked (it calls the
// system's dlopen, even with CGO_ENABLED=0); build with -tags nocuda for a
// static binary without GPU support (dl_nocuda.go), as the scratch images
// in deploy/ are.

func dlopen(path string) (uintptr, error) {
	return purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
}

func dlsym(lib uintptr, name string) (uintptr, error) { return purego.Dlsym(lib, name) }

func registerFunc(fptr any, p uintptr) { purego.RegisterFunc(fptr, p) }
