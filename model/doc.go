// Package model runs the transformer layers of a Llama-family model read from
// a GGUF file.
//
// Load reads a file's architecture (Config) and finds its tensors (views into
// the memory-mapped file, never copies). NewStage prepares layers [a, b) of it
// on a Backend; Stage.Forward runs one batch of rows through those layers:
// stage 0 also embeds token IDs, the last stage also applies the final norm and
// the output head and returns logits for the rows that ask for them. Any
// pipeline split therefore runs the same code.
//
// The package knows nothing of the cluster. It defines the two small
// interfaces it needs: Backend (matrix products and a worker pool) and KV
// (paged key/value storage addressed by the block IDs rows carry). model/cpu
// implements both.
//
// Numerics: every output element's reduction order depends only on model
// dimensions, never on the rows in a batch, where a prefill chunk ends, the
// thread count or the row's index (DESIGN.md "Numerics"). Element-wise steps
// here run per token in a fixed order; the Backend promises the same for its
// products.
//
// Concurrency: a Stage may be used by one goroutine at a time (it owns scratch
// buffers). A Model is immutable after Load and may be shared.
package model
