// Package ggml describes the tensor element types that GGUF files carry: their
// numeric IDs, block geometry (elements per block, bytes per block), half-float
// conversions, and the reference quantize/dequantize routines for each block
// format.
//
// It is a leaf package: the GGUF reader (model/gguf) uses it to size tensors,
// the CPU backend (model/cpu) to compute on them. Everything here is pure and
// safe to call concurrently.
package ggml
