//go:build !amd64 || purego

package cpu

import "github.com/strata-llm/strata/model/ggml"

// archTiles returns nil: other architectures run the portable kernels.
func archTiles(ggml.Type) *tileSet { return nil }

// archWsum returns nil: other architectures run the portable loop.

const haveAVX512 = false

func swigluAVX512(n int, gate, up *float32)                     { panic("unreachable") }
func expSubAVX512(n int, x *float32, sub float32, dst *float32) { panic("unreachable") }
func quantQ80AVX512(nb int, x *float32, dst *byte)              { panic("unreachable") }

var avx2Only bool
