// Package cuda is strata's NVIDIA GPU backend, reached with --device cuda:N.
//
// The binding is github.com/ebitengine/purego over libcuda.so.1 (the driver
// API: primary context, memory, streams, events, modules, launches, graphs)
// and libnvrtc.so.13 or .12 (the runtime compiler): no cgo and no CUDA
// headers at build time, so every machine builds and vets the package, and
// a machine without a driver gets ErrNoDriver from LoadDriver (or Open,
// OpenDevice) in one line. The kernels are the project's CUDA C
// (kernels.cu, embedded), compiled by NVRTC for the device's compute
// capability at start (CUBIN, or PTX for a device newer than NVRTC) and
// cached under the caller's directory by source hash and architecture.
//
// Use: OpenDevice once per process and device, then NewStage for a layer
// range and a KV pool; Stage.Forward has model.Stage.Forward's contract
// and is what the shard's Runner calls. Context methods bind the context to
// a locked OS thread for each call (Context.Do) and serialize on one mutex;
// a Stage is not safe for concurrent use (the Runner serializes batches).
// Device memory belongs to the Stage until Close.
//
// What runs: llama-style layers (RMSNorm, separate Q/K/V, RoPE normal or
// NeoX, grouped-query attention, SwiGLU); Supported names what does not.
// Weights stay F32, F16 or Q8_0 as stored; every other type is dequantized
// at load to F16 (2 bytes a weight; F32 where a value overflows F16 or a
// row's length is not a multiple of 8). The KV pool is f16 blocks in device
// memory with the CPU pool's layout and block IDs (KVLayout).
//
// Numerics: every output's reduction order depends only on the model's
// dimensions and the token's position (matrix products: one warp per
// output, a fixed lane split and shuffle tree, no split-K; attention: keys
// in chunks of 32, chunk c to warp c % nw with nw fixed by the head width,
// the warps merged in order), so a sequence's logits are bit-identical
// alone, in any batch and however its prompt is chunked; small batches
// replay CUDA graphs of the same launches. Activations for Q8_0 weights
// are quantized as the CPU backend quantizes them. The GPU and the CPU backend are not bit-identical; what is
// promised across them is stated in gpu_test.go (agreeMargin,
// lpTolerance) and checked by scripts/gpu-check.sh.
//
// Tombstones: one stream per device, and Forward returns only after the
// stream has finished the batch (an event recorded after the download and
// waited for), so a block freed after a Forward is never written by a
// kernel still in flight.
package cuda
