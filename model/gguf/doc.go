// Package gguf reads and writes GGUF files, the container llama.cpp uses for
// model weights and metadata (versions 2 and 3, little-endian).
//
// # Reading
//
// Open maps a file read-only; Parse reads one already in memory. Either
// decodes the whole header at once: metadata (File.KV) in file order, and the
// tensor descriptions (File.Tensors) in file order. Nothing is read lazily, so
// every error in the header is reported by Open or Parse.
//
// Metadata values are decoded into Go values owned by the File: strings and
// arrays are copies and stay valid after Close. Slices returned by Get,
// Strings, Float32s and Int32s (when no conversion was needed) are the File's
// own and must not be modified.
//
// Tensor.Data, and the slices returned by Tensor.Row, are views of the file's
// bytes, not copies: for Open, of the read-only mapping (writing to them
// faults); for Parse, of the caller's slice, which must stay unmodified while
// the File is used. Close unmaps the file and sets every Tensor.Data to nil;
// views taken before Close must not be used after it. A mapped file must not
// be truncated or rewritten while it is open. On platforms other than
// Linux and Darwin, Open reads the whole file into memory instead.
//
// # Validation
//
// The reader trusts nothing in the file. Every count and length is checked
// against a named limit (MaxKVs, MaxTensors, MaxNameLen, MaxStringLen,
// MaxArrayLen, MaxNesting, MaxDims, MaxTensorBytes, MaxAlignment) and against
// the bytes remaining before anything is allocated for it, so memory use is
// bounded by a small multiple of the file's size. Keys and tensor names must
// be non-empty and unique; tensor types must be known to package ggml; each
// dimension must be at least 1, the row length (Dims[0]) a multiple of the
// type's block size, and each tensor's data aligned and inside the file.
// Errors are *Error values that give the byte offset and the key or tensor
// concerned, and wrap a sentinel (ErrTruncated, ErrLimit, ErrCorrupt, ...).
// No input makes the reader panic.
//
// # Writing
//
// Write produces a version 3 file from metadata and in-memory tensors. An
// Encoder does the same with tensor data supplied one tensor at a time.
// Both refuse what the reader would refuse.
//
// # Concurrency
//
// A File is immutable after Open or Parse returns: any number of goroutines
// may call its methods and read its tensors at once. Close must not run
// concurrently with any other use of the File. An Encoder is for one goroutine.
package gguf
