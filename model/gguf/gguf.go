package gguf

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/strata-llm/strata/model/ggml"
)

// Limits on what Parse accepts. Every count and length in a file is checked
// against one of these, and against the bytes that remain, before anything is
// allocated for it. Write refuses input that Parse would refuse.
const (
	// MaxKVs is the most metadata key-value pairs a file may hold.
	MaxKVs = 1 << 16
	// MaxTensors is the most tensors a file may hold.
	MaxTensors = 1 << 20
	// MaxNameLen is the longest key or tensor name, in bytes (the GGUF
	// specification allows keys of up to 65535 bytes).
	MaxNameLen = 1<<16 - 1
	// MaxStringLen is the longest string value, in bytes. Chat templates are
	// the longest strings in real files, at tens of kilobytes.
	MaxStringLen = 1 << 24
	// MaxArrayLen is the most elements in one array value. Vocabularies and
	// merge lists have up to a few hundred thousand.
	MaxArrayLen = 1 << 24
	// MaxNesting is the most levels of arrays inside arrays: an array of
	// scalars is one level.
	MaxNesting = 8
	// MaxDims is the most dimensions of a tensor, ggml's GGML_MAX_DIMS.
	MaxDims = 4
	// MaxTensorBytes is the largest tensor, in bytes (1 TiB).
	MaxTensorBytes = 1 << 40
	// MaxAlignment is the largest general.alignment accepted, in bytes.
	MaxAlignment = 1 << 20
)

// DefaultAlignment is the alignment of tensor data, in bytes, when a file has
// no general.alignment key.
const DefaultAlignment = 32

// Keys with a meaning to the reader itself.
const (
	KeyAlignment    = "general.alignment"
	KeyArchitecture = "general.architecture"
)

// Sentinel errors. Errors from Parse, Open and the accessors are *Error values
// that wrap one of these, so callers can test them with errors.Is.
var (
	ErrNotGGUF     = errors.New("gguf: not a GGUF file")
	ErrVersion     = errors.New("gguf: unsupported version")
	ErrTruncated   = errors.New("gguf: truncated file")
	ErrLimit       = errors.New("gguf: limit exceeded")
	ErrCorrupt     = errors.New("gguf: invalid file")
	ErrNotFound    = errors.New("gguf: not found")
	ErrWrongType   = errors.New("gguf: wrong type")
	ErrInvalidArgs = errors.New("gguf: invalid write input")
)

// Error describes a problem with a file, or with a lookup in it.
type Error struct {
	// Path is the file's path when it came from Open.
	Path string
	// Offset is the absolute byte offset in the file of the field at fault,
	// or -1 when the error is not about a place in the file.
	Offset int64
	// Key is the metadata key concerned, if any.
	Key string
	// Tensor is the tensor name concerned, if any.
	Tensor string
	// Msg says what is wrong.
	Msg string
	// Err is the sentinel that classifies the error (ErrTruncated, ErrLimit, ...).
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("gguf: ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	if e.Offset >= 0 {
		b.WriteString("offset ")
		b.WriteString(strconv.FormatInt(e.Offset, 10))
		b.WriteString(": ")
	}
	if e.Key != "" {
		fmt.Fprintf(&b, "key %q: ", e.Key)
	}
	if e.Tensor != "" {
		fmt.Fprintf(&b, "tensor %q: ", e.Tensor)
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns the sentinel that classifies e.
func (e *Error) Unwrap() error { return e.Err }

// File is a parsed GGUF file. Its metadata is decoded into Go values owned by
// the File; its tensors are views of the file's bytes (see the package doc).
type File struct {
	// Version is the GGUF version, 2 or 3.
	Version uint32
	// Alignment is the alignment of tensor data, in bytes.
	Alignment uint64
	// KV holds the metadata in file order.
	KV []KV
	// Tensors holds the tensor descriptions in file order.
	Tensors []*Tensor
	// DataOffset is the absolute offset of the tensor data section. For a
	// file without tensors it may equal or exceed the file's size.
	DataOffset uint64

	data    []byte // the whole file; a mapping when unmap is set
	unmap   func([]byte) error
	kvIndex map[string]int
	tIndex  map[string]int
}

// KV is one metadata key-value pair.
//
// Value holds one of uint8, int8, uint16, int16, uint32, int32, uint64, int64,
// float32, float64, bool, string; an array as a typed slice ([]uint8, []int8,
// []uint16, []int16, []uint32, []int32, []uint64, []int64, []float32,
// []float64, []bool, []string); or an array of arrays as []any whose elements
// are themselves such arrays.
type KV struct {
	Key   string
	Value any
}

// Tensor describes one tensor and holds a view of its bytes.
type Tensor struct {
	// Name is the tensor's name, unique in its file.
	Name string
	// Type is the element type.
	Type ggml.Type
	// Dims are the dimensions, ne[0] first: Dims[0] is the row length (the
	// innermost, contiguous dimension).
	Dims []uint64
	// Offset is the absolute offset of the tensor's data in the file, in bytes.
	Offset uint64
	// Data is a view of exactly the tensor's bytes.
	Data []byte
}

// Elements returns the number of elements in t.
func (t *Tensor) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Size returns the tensor's bytes: len(Data) for a placed tensor, and the
// same for one from ParseHeader, which has no Data.
// A tensor of an unknown type or without dimensions (never one from this
// package's parsers) has size 0.
func (t *Tensor) Size() uint64 {
	if !t.Type.Known() || len(t.Dims) == 0 {
		return 0
	}
	n, _ := tensorSize(t.Type, t.Dims)
	return n
}

// RowLen returns the number of elements in one row, Dims[0].
func (t *Tensor) RowLen() int {
	if len(t.Dims) == 0 {
		return 1
	}
	return int(t.Dims[0])
}

// Rows returns the number of rows, the product of Dims[1:] (1 for a vector).
func (t *Tensor) Rows() int {
	n := 1
	for _, d := range t.Dims[min(1, len(t.Dims)):] {
		n *= int(d)
	}
	return n
}

// RowBytes returns the bytes in one row.
func (t *Tensor) RowBytes() int {
	n := t.RowLen()
	bs := t.Type.BlockSize()
	if bs == 0 {
		return 0
	}
	return n / bs * t.Type.TypeSize()
}

// Row returns a view of row i's bytes. It panics if i is out of range, as
// slice indexing does.
func (t *Tensor) Row(i int) []byte {
	rb := t.RowBytes()
	if i < 0 || i >= t.Rows() {
		panic(fmt.Sprintf("gguf: tensor %q: row %d out of range [0, %d)", t.Name, i, t.Rows()))
	}
	return t.Data[i*rb : (i+1)*rb : (i+1)*rb]
}

// Close releases the file's memory mapping, if it has one. Afterwards every
// tensor's Data is nil, and views taken earlier must not be used. Metadata
// stays valid. Close is idempotent.
func (f *File) Close() error {
	if f.data == nil {
		return nil
	}
	for _, t := range f.Tensors {
		t.Data = nil
	}
	data, unmap := f.data, f.unmap
	f.data, f.unmap = nil, nil
	if unmap != nil {
		if err := unmap(data); err != nil {
			return fmt.Errorf("gguf: unmap: %w", err)
		}
	}
	return nil
}

// Get returns the value of key and whether it is present.
func (f *File) Get(key string) (any, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return nil, false
	}
	return f.KV[i].Value, true
}

// Has reports whether key is present.
func (f *File) Has(key string) bool {
	_, ok := f.kvIndex[key]
	return ok
}

func missing(key string) error {
	return &Error{Offset: -1, Key: key, Msg: "missing", Err: ErrNotFound}
}

func wrongType(key string, v any, want string) error {
	return &Error{Offset: -1, Key: key, Msg: fmt.Sprintf("is %s, want %s", typeName(v), want), Err: ErrWrongType}
}

func (f *File) lookup(key string) (any, error) {
	v, ok := f.Get(key)
	if !ok {
		return nil, missing(key)
	}
	return v, nil
}

// String returns the string value of key.
func (f *File) String(key string) (string, error) {
	v, err := f.lookup(key)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", wrongType(key, v, "string")
	}
	return s, nil
}

// asInt converts any integer value to a sign and magnitude.
func asInt(v any) (mag uint64, neg, ok bool) {
	switch x := v.(type) {
	case uint8:
		return uint64(x), false, true
	case uint16:
		return uint64(x), false, true
	case uint32:
		return uint64(x), false, true
	case uint64:
		return x, false, true
	case int8:
		return absInt(int64(x))
	case int16:
		return absInt(int64(x))
	case int32:
		return absInt(int64(x))
	case int64:
		return absInt(x)
	}
	return 0, false, false
}

func absInt(x int64) (uint64, bool, bool) {
	if x < 0 {
		return uint64(-(x + 1)) + 1, true, true
	}
	return uint64(x), false, true
}

// Uint returns the value of key, which must be of an integer type and not
// negative.
func (f *File) Uint(key string) (uint64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return 0, err
	}
	m, neg, ok := asInt(v)
	if !ok {
		return 0, wrongType(key, v, "unsigned integer")
	}
	if neg {
		return 0, &Error{Offset: -1, Key: key, Msg: fmt.Sprintf("value %v is negative", v), Err: ErrWrongType}
	}
	return m, nil
}

// Int returns the value of key, which must be of an integer type and fit in
// an int64.
func (f *File) Int(key string) (int64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return 0, err
	}
	m, neg, ok := asInt(v)
	if !ok {
		return 0, wrongType(key, v, "integer")
	}
	if neg {
		return -int64(m-1) - 1, nil
	}
	if m > math.MaxInt64 {
		return 0, &Error{Offset: -1, Key: key, Msg: fmt.Sprintf("value %d overflows int64", m), Err: ErrWrongType}
	}
	return int64(m), nil
}

// Float returns the value of key, which must be a float32, a float64 or an
// integer.
func (f *File) Float(key string) (float64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return 0, err
	}
	switch x := v.(type) {
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	}
	m, neg, ok := asInt(v)
	if !ok {
		return 0, wrongType(key, v, "number")
	}
	if neg {
		return -float64(m), nil
	}
	return float64(m), nil
}

// Bool returns the boolean value of key.
func (f *File) Bool(key string) (bool, error) {
	v, err := f.lookup(key)
	if err != nil {
		return false, err
	}
	b, ok := v.(bool)
	if !ok {
		return false, wrongType(key, v, "bool")
	}
	return b, nil
}

// Strings returns the string array value of key. The slice belongs to f: the
// caller must not modify it.
func (f *File) Strings(key string) ([]string, error) {
	v, err := f.lookup(key)
	if err != nil {
		return nil, err
	}
	s, ok := v.([]string)
	if !ok {
		return nil, wrongType(key, v, "string array")
	}
	return s, nil
}

// Float32s returns the float32 array value of key. The slice belongs to f: the
// caller must not modify it.
func (f *File) Float32s(key string) ([]float32, error) {
	v, err := f.lookup(key)
	if err != nil {
		return nil, err
	}
	s, ok := v.([]float32)
	if !ok {
		return nil, wrongType(key, v, "float32 array")
	}
	return s, nil
}

// Int32s returns the value of key as int32s. An int32 array is returned as is
// and belongs to f: the caller must not modify it. Another integer array is
// converted into a new slice if every element fits in an int32.
func (f *File) Int32s(key string) ([]int32, error) {
	v, err := f.lookup(key)
	if err != nil {
		return nil, err
	}
	switch s := v.(type) {
	case []int32:
		return s, nil
	case []int8:
		return convInt32(key, s)
	case []uint8:
		return convInt32(key, s)
	case []int16:
		return convInt32(key, s)
	case []uint16:
		return convInt32(key, s)
	case []uint32:
		return convInt32(key, s)
	case []int64:
		return convInt32(key, s)
	case []uint64:
		return convInt32(key, s)
	}
	return nil, wrongType(key, v, "int32 array")
}

func convInt32[T int8 | uint8 | int16 | uint16 | uint32 | int64 | uint64](key string, s []T) ([]int32, error) {
	out := make([]int32, len(s))
	for i, x := range s {
		var fits bool
		if x < 0 {
			fits = int64(x) >= math.MinInt32
		} else {
			fits = uint64(x) <= math.MaxInt32
		}
		if !fits {
			return nil, &Error{Offset: -1, Key: key, Msg: fmt.Sprintf("element %d (%d) overflows int32", i, x), Err: ErrWrongType}
		}
		out[i] = int32(x)
	}
	return out, nil
}

// Tensor returns the tensor called name.
func (f *File) Tensor(name string) (*Tensor, error) {
	i, ok := f.tIndex[name]
	if !ok {
		return nil, &Error{Offset: -1, Tensor: name, Msg: "missing", Err: ErrNotFound}
	}
	return f.Tensors[i], nil
}

// Architecture returns general.architecture, such as "llama".
func (f *File) Architecture() (string, error) { return f.String(KeyArchitecture) }

// typeName names the GGUF type of a metadata value, for messages.
func typeName(v any) string {
	switch v.(type) {
	case []any:
		return "array of arrays"
	case nil:
		return "nil"
	}
	return fmt.Sprintf("%T", v)
}
