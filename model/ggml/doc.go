// Package ggml describes the tensor element types that GGUF files carry: their
// numeric IDs, block geometry (elements per block, bytes per block), half-float
// conversions, and row conversions between float32 and each block format.
//
// There are two quantizers because llama.cpp has two. QuantizeRow is the
// reference quantizer that writes model files (ggml's quantize_row_*_ref);
// QuantizeActivationRow is what ggml's CPU backend uses on x86-64 with
// AVX2/AVX-512 to convert activations before a dot product. They differ for
// Q8_0 (round half to even and multiplier 127/amax instead of roundf and 1/d);
// Q8_1, the activation format of Q5_1 weights, exists only as the latter.
// DequantizeRow reproduces ggml's to_float routines exactly.
//
// It is a leaf package: the GGUF reader (model/gguf) uses it to size tensors,
// the CPU backend (model/cpu) to compute on them. Everything here is pure and
// safe to call concurrently; the row functions write only to dst.
package ggml
