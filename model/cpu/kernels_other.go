//go:build !amd64 || purego

package cpu

import "github.com/strata-llm/strata/model/ggml"

// archTiles returns nil: other architectures run the portable kernels.
func archTiles(ggml.Type) *tileSet { return nil }

// archMatTiles returns nil: other architectures run the portable kernels.
func archMatTiles(ggml.Type) *tileSet { return nil }

// archPanels returns nil: other architectures run the portable kernels.
func archPanels(ggml.Type) *panelSet { return nil }

func aheadAuto() bool { return false }

// archWsum returns nil: other architectures run the portable loop.

const (
	haveAVX512 = false
	haveF16C   = false
	haveAMX    = false
)

func f16AxpyAVX2(n int, acc *uint16, v *uint16, vs float32) { panic("unreachable") }
func f16RescaleAVX2(n int, acc *uint16, ms float32)         { panic("unreachable") }

func swigluAVX512(n int, gate, up *float32)                     { panic("unreachable") }
func expSubAVX512(n int, x *float32, sub float32, dst *float32) { panic("unreachable") }
func quantQ80AVX512(nb int, x *float32, dst *byte)              { panic("unreachable") }
func quantQ8KXAVX512(nb int, x *float32, dst *byte)             { panic("unreachable") }
func f32ToF16AVX512(n int, src *float32, dst *uint16)           { panic("unreachable") }
func swigluAVX2(n int, gate, up *float32)                       { panic("unreachable") }
func quantQ80AVX2(nb int, x *float32, dst *byte)                { panic("unreachable") }
func f32ToF16AVX2(n int, src *float32, dst *uint16)             { panic("unreachable") }
func quantQ8KXAVX2(nb int, x *float32, dst *byte)               { panic("unreachable") }
func quantQ81AVX2(nb int, x *float32, dst *byte)                { panic("unreachable") }
func scoresF16x16AVX512(hd int, k *byte, stride int, q *byte, out *float32) {
	panic("unreachable")
}
func scoreF16AVX512(hd int, k *byte, q *byte) float32 { panic("unreachable") }
func scoreF16AVX2(hd int, k *byte, q *byte) float32   { panic("unreachable") }
func scoresF16AVX2(hd int, k *byte, stride int, q *byte, out *float32, n int) {
	panic("unreachable")
}
func scoreF16Tail(n int, k *byte, q *byte, sum float64) float32 {
	panic("unreachable")
}
func f16ScaleAVX512(n int, src *uint16, scale float32, dst *float32) {
	panic("unreachable")
}
func softmaxF16x1AVX512(hd int, acc *uint16, v *byte, voff, stride, m int, ms, vs *float32) {
	panic("unreachable")
}
func softmaxF16x2AVX512(hd int, acc *uint16, v *byte, voff, stride, m int, ms, vs *float32) {
	panic("unreachable")
}
func softmaxF32x1AVX512(hd int, acc *float32, v *byte, voff, stride, m int, ms, vs *float32) {
	panic("unreachable")
}
func softmaxF32x2AVX512(hd int, acc *float32, v *byte, voff, stride, m int, ms, vs *float32) {
	panic("unreachable")
}
func softmaxF16x1AVX2(hd int, acc *uint16, v *byte, voff, stride, m int, ms, vs *float32) {
	panic("unreachable")
}
func softmaxF16x2AVX2(hd int, acc *uint16, v *byte, voff, stride, m int, ms, vs *float32) {
	panic("unreachable")
}
func softmaxF32x1AVX2(hd int, acc *float32, v *byte, voff, stride, m int, ms, vs *float32) {
	panic("unreachable")
}
func softmaxF32x2AVX2(hd int, acc *float32, v *byte, voff, stride, m int, ms, vs *float32) {
	panic("unreachable")
}
func softmaxWeightsx1AVX2(n int, s, ms, vs, m, sum *float32, scale float32) {
	panic("unreachable")
}
func softmaxWeightsx2AVX2(n int, s, ms, vs, m, sum *float32, scale float32) {
	panic("unreachable")
}
func softmaxWeightsx1AVX512(n int, s, ms, vs, m, sum *float32, scale float32) {
	panic("unreachable")
}
func softmaxWeightsx2AVX512(n int, s, ms, vs, m, sum *float32, scale float32) {
	panic("unreachable")
}

var avx2Only bool
