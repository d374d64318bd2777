//go:build nocuda

package cuda

import (
	"errors"
	"fmt"
)

// A binary built with -tags nocuda has no dynamic loader (it is static, for
// images built FROM scratch): every library load fails, so --device cuda:N
// fails at start with one line saying why.

var errNoGPUBuild = errors.New("this binary was built without GPU support (-tags nocuda, a static build); use a build without that tag")

func dlopen(path string) (uintptr, error) { return 0, fmt.Errorf("%s: %w", path, errNoGPUBuild) }

func dlsym(uintptr, string) (uintptr, error) { return 0, errNoGPUBuild }

func registerFunc(any, uintptr) { panic("cuda: registerFunc in a -tags nocuda build") }
