// Package cpu is strata's CPU backend: matrix products on quantized weights
// read in place from the model file, a persistent worker pool, and paged
// key/value storage.
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
package cpu
