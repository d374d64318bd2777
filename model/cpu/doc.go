// Package cpu is strata's CPU backend: matrix products on quantized weights
// (read in place from the model file, or repacked once into 16-row panels
// for the VNNI kernels), a persistent worker pool, and paged key/value
// storage.
//
// A Pool is shared by every stage of a process (--threads workers in all) and
// is safe for concurrent use: jobs from different callers run one after
// another. A Backend (one per stage) owns scratch buffers and is used by one
// goroutine at a time. A KV is written by Store from one goroutine and read by
// concurrent Attend calls for different outputs, never both at once.
//
// Numerics: matrix products convert each activation row to the weight type's
// dot-product type (ggml.Type.VecDotType) and compute every output with one
// VecDot call whose reduction order depends only on the row length; work is
// split over outputs only. So an output never depends on the batch it rode
// in, the thread count or its row index.
//
// Kernels: on amd64 the dot products, attention sums, SwiGLU, softmax's exp
// and the activation quantizers run as assembly generated with avo by
// internal/asmgen (go generate; the generated kernels_amd64.s and stubs are
// committed): AVX-512 for F32, F16 and BF16, AVX-512 VNNI for Q8_0, Q4_0,
// IQ4_NL, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS (on weights
// repacked into panels of 16 rows, see repack.go, repack_q5.go and
// repack_kquant.go), AVX2+FMA for F32, F16 and BF16 (on the stored rows;
// F16 and BF16 on both ISAs against float32 activations already rounded to
// f16 or bf16, so the loop widens only the weights: archMatTiles)
// and Q8_0, Q4_0, IQ4_NL, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and
// IQ4_XS (on the same panels; Q3_K's high bits and the fifth bits of Q5_K,
// and on AVX2 of Q5_0 and Q5_1, are planes, the bits of each weight
// vector's bytes in one byte, except Q5_K's on CPUs with AMX, whose kernel
// reads masks: panelSet.planes), with AVX2 versions of SwiGLU,
// f32→f16, the Q8_0 and Q8_K quantizers (elementwise_avx2.go in asmgen;
// the same bits as the AVX-512 ones) and of attention's score, weights and
// value passes (attendSIMD in kv.go, attn_avx2.go in asmgen), an AVX2 Q8_1
// quantizer that AVX-512 CPUs run too, AVX-VNNI prompt panels for Q4_0,
// IQ4_NL, Q5_0, Q5_1, Q8_0, IQ4_XS and the K-quants on AVX2 CPUs that have it (VPDPBUSD
// in its VEX encoding, which Go's assembler lacks: avxvnni.go in asmgen
// writes its bytes), and AMX tiles for Q4_0, IQ4_NL, IQ4_XS, Q4_K, Q5_K
// and Q6_K products of 16 activation rows or more (32 for Q6_K: prompts,
// batched decode) where the CPU has AMX-INT8 and Linux lets the process
// use it (amx.go in asmgen: the tiles sum each sub-block in integers, the
// fold is the VNNI kernels'), chosen at run time with
// golang.org/x/sys/cpu (the STRATA_CPU environment variable can hold a
// process to the AVX-512 kernels without AMX, the AVX2 kernels with or
// without AVX-VNNI, or the portable kernels, for measuring; see cpuEnv). Other architectures (or the
// purego tag) and x86 CPUs without AVX2 run the portable Go kernels, which
// give the same bits: tests compare the two on random inputs. Every type's
// order (dot.go, dot_quant.go, dot_kquant.go, dot_q5.go) sums each block or
// sub-block exactly in integers and folds it into one accumulator with one
// fma, so SIMD kernels can reproduce it. Matrix products use R×C tile
// kernels (up to 4 weight rows × 4 activation rows per call) or panel
// kernels (16 weight rows × up to 8 activation rows) that reduce each
// output exactly as the single-row kernel does; a product with one
// activation row (generation) runs one weight row a tile
// (Backend.runTile), one sequential stream for the hardware prefetcher,
// through a rows kernel that loops over the item's rows in assembly (one
// call from Go per 16 rows, not per row: tileSet.vec), and on Intel CPUs,
// whose prefetchers stop at each 4 KiB page, and AMD's from Zen 5,
// kernels that prefetch a page ahead of that stream in
// software (two pages for f16 and bf16 weights; aheadEnv,
// STRATA_PREFETCH), with AVX-512 or AVX2 alike. BF16 runs no VDPBF16PS,
// though Zen 4 and Sapphire Rapids have it: that instruction treats
// subnormal inputs as zero, flushes subnormal results and adds each
// lane's odd product before its even one, so it cannot give the bits of
// the portable kernel (and of the AVX2 and AVX-512 ones that widen bf16 to
// float32 exactly and add each product with one FMA) on every input.
package cpu
