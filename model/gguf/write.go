package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"

	"github.com/strata-llm/strata/model/ggml"
)

// WriteTensor is a tensor to write: its description and its bytes.
type WriteTensor struct {
	Name string
	Type ggml.Type
	Dims []uint64 // ne[0] first, as in Tensor
	Data []byte   // exactly the tensor's bytes; ignored by NewEncoder
}

// Write writes a GGUF version 3 file holding kvs, in order, and tensors, in
// order. Tensor data is aligned to general.alignment if kvs set it, else to
// DefaultAlignment. Write refuses (with an error wrapping ErrInvalidArgs)
// anything Parse would refuse: duplicate or empty names, unsupported value
// types, unknown tensor types, shapes that do not match len(Data), and
// anything beyond the package's limits.
func Write(w io.Writer, kvs []KV, tensors []WriteTensor) error {
	for _, t := range tensors {
		if _, err := infoSize(t, true); err != nil {
			return err
		}
	}
	e, err := NewEncoder(w, kvs, tensors)
	if err != nil {
		return err
	}
	for _, t := range tensors {
		if err := e.WriteData(t.Data); err != nil {
			return err
		}
	}
	return e.Close()
}

// Encoder writes a GGUF file whose tensor data arrives one tensor at a time,
// so that a large file need not be held in memory. Use NewEncoder, then
// WriteData once per tensor in order, then Close.
type Encoder struct {
	bw    *bufio.Writer
	sizes []uint64 // bytes of each tensor
	next  int      // index of the next tensor to write
	align uint64
	off   uint64 // bytes written so far
	err   error  // first write error; sticky
}

func invalid(key, tensor, format string, args ...any) error {
	return &Error{Offset: -1, Key: key, Tensor: tensor, Msg: fmt.Sprintf(format, args...), Err: ErrInvalidArgs}
}

// infoSize validates a tensor description, and len(Data) if checkData is
// set, and returns its size in bytes.
func infoSize(t WriteTensor, checkData bool) (uint64, error) {
	if t.Name == "" {
		return 0, invalid("", "", "empty tensor name")
	}
	if len(t.Name) > MaxNameLen {
		return 0, invalid("", t.Name, "name length %d exceeds MaxNameLen (%d)", len(t.Name), MaxNameLen)
	}
	if !t.Type.Known() {
		return 0, invalid("", t.Name, "unknown tensor type %d", uint32(t.Type))
	}
	if len(t.Dims) == 0 || len(t.Dims) > MaxDims {
		return 0, invalid("", t.Name, "dimension count %d is not in [1, MaxDims (%d)]", len(t.Dims), MaxDims)
	}
	size, msg := tensorSize(t.Type, t.Dims)
	if msg != "" {
		return 0, invalid("", t.Name, "%s", msg)
	}
	if checkData && uint64(len(t.Data)) != size {
		return 0, invalid("", t.Name, "%d bytes of data, want %d for %s %v", len(t.Data), size, t.Type, t.Dims)
	}
	return size, nil
}

// NewEncoder validates kvs and the tensor descriptions (Data is ignored) and
// writes everything up to the tensor data section to w.
func NewEncoder(w io.Writer, kvs []KV, tensors []WriteTensor) (*Encoder, error) {
	if len(kvs) > MaxKVs {
		return nil, invalid("", "", "%d key-value pairs exceed MaxKVs (%d)", len(kvs), MaxKVs)
	}
	if len(tensors) > MaxTensors {
		return nil, invalid("", "", "%d tensors exceed MaxTensors (%d)", len(tensors), MaxTensors)
	}
	e := &Encoder{bw: bufio.NewWriterSize(w, 1<<16), align: DefaultAlignment, sizes: make([]uint64, len(tensors))}
	seen := make(map[string]bool, max(len(kvs), len(tensors)))
	for _, kv := range kvs {
		if kv.Key == "" {
			return nil, invalid("", "", "empty key")
		}
		if len(kv.Key) > MaxNameLen {
			return nil, invalid(kv.Key, "", "key length %d exceeds MaxNameLen (%d)", len(kv.Key), MaxNameLen)
		}
		if seen[kv.Key] {
			return nil, invalid(kv.Key, "", "duplicate key")
		}
		seen[kv.Key] = true
		if err := checkValue(kv.Value, 0); err != nil {
			return nil, invalid(kv.Key, "", "%v", err)
		}
		if kv.Key == KeyAlignment {
			a, err := checkAlignment(kv.Value)
			if err != nil {
				return nil, invalid(kv.Key, "", "%v", err)
			}
			e.align = a
		}
	}
	clear(seen)
	for i, t := range tensors {
		if seen[t.Name] {
			return nil, invalid("", t.Name, "duplicate tensor name")
		}
		seen[t.Name] = true
		size, err := infoSize(t, false)
		if err != nil {
			return nil, err
		}
		e.sizes[i] = size
	}

	e.u32(magic)
	e.u32(3)
	e.u64(uint64(len(tensors)))
	e.u64(uint64(len(kvs)))
	for _, kv := range kvs {
		e.str(kv.Key)
		e.value(kv.Value, true)
	}
	var rel uint64
	for i, t := range tensors {
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.u64(d)
		}
		e.u32(uint32(t.Type))
		e.u64(rel)
		rel = alignUp(rel+e.sizes[i], e.align)
	}
	if len(tensors) > 0 {
		e.pad()
	}
	return e, e.err
}

// WriteData writes the next tensor's bytes, which must be exactly as many as
// its type and dimensions require, followed by padding to the alignment.
func (e *Encoder) WriteData(data []byte) error {
	if e.err != nil {
		return e.err
	}
	if e.next >= len(e.sizes) {
		return invalid("", "", "WriteData called for tensor %d of %d", e.next+1, len(e.sizes))
	}
	if uint64(len(data)) != e.sizes[e.next] {
		return invalid("", "", "tensor %d: %d bytes of data, want %d", e.next, len(data), e.sizes[e.next])
	}
	e.write(data)
	e.pad()
	e.next++
	return e.err
}

// Close flushes the output. It does not close the underlying writer. It
// reports an error if fewer tensors were written than were described.
func (e *Encoder) Close() error {
	if e.err != nil {
		return e.err
	}
	if e.next != len(e.sizes) {
		return invalid("", "", "closed after %d of %d tensors", e.next, len(e.sizes))
	}
	if err := e.bw.Flush(); err != nil {
		e.err = fmt.Errorf("gguf: write: %w", err)
	}
	return e.err
}

func (e *Encoder) write(b []byte) {
	if e.err != nil {
		return
	}
	if _, err := e.bw.Write(b); err != nil {
		e.err = fmt.Errorf("gguf: write: %w", err)
		return
	}
	e.off += uint64(len(b))
}

var zeros [256]byte

func (e *Encoder) pad() {
	for n := alignUp(e.off, e.align) - e.off; n > 0 && e.err == nil; {
		k := min(n, uint64(len(zeros)))
		e.write(zeros[:k])
		n -= k
	}
}

func (e *Encoder) u32(v uint32) { e.write(binary.LittleEndian.AppendUint32(nil, v)) }
func (e *Encoder) u64(v uint64) { e.write(binary.LittleEndian.AppendUint64(nil, v)) }
func (e *Encoder) str(s string) {
	e.u64(uint64(len(s)))
	if e.err == nil {
		if _, err := e.bw.WriteString(s); err != nil {
			e.err = fmt.Errorf("gguf: write: %w", err)
			return
		}
		e.off += uint64(len(s))
	}
}

// checkValue reports whether v is a value Write can encode and Parse would
// accept. depth is the number of enclosing arrays.
func checkValue(v any, depth int) error {
	if _, ok := scalarType(v); ok {
		if s, ok := v.(string); ok && len(s) > MaxStringLen {
			return fmt.Errorf("string length %d exceeds MaxStringLen (%d)", len(s), MaxStringLen)
		}
		return nil
	}
	_, n, ok := arrayType(v)
	if !ok {
		return fmt.Errorf("unsupported value type %T", v)
	}
	if depth+1 > MaxNesting {
		return fmt.Errorf("array nesting %d exceeds MaxNesting (%d)", depth+1, MaxNesting)
	}
	if n > MaxArrayLen {
		return fmt.Errorf("array length %d exceeds MaxArrayLen (%d)", n, MaxArrayLen)
	}
	switch s := v.(type) {
	case []string:
		for i, x := range s {
			if len(x) > MaxStringLen {
				return fmt.Errorf("element %d: string length %d exceeds MaxStringLen (%d)", i, len(x), MaxStringLen)
			}
		}
	case []any:
		for i, x := range s {
			if _, _, ok := arrayType(x); !ok {
				return fmt.Errorf("element %d of an array of arrays is %T, not an array", i, x)
			}
			if err := checkValue(x, depth+1); err != nil {
				return fmt.Errorf("element %d: %w", i, err)
			}
		}
	}
	return nil
}

func scalarType(v any) (uint32, bool) {
	switch v.(type) {
	case uint8:
		return typeUint8, true
	case int8:
		return typeInt8, true
	case uint16:
		return typeUint16, true
	case int16:
		return typeInt16, true
	case uint32:
		return typeUint32, true
	case int32:
		return typeInt32, true
	case uint64:
		return typeUint64, true
	case int64:
		return typeInt64, true
	case float32:
		return typeFloat32, true
	case float64:
		return typeFloat64, true
	case bool:
		return typeBool, true
	case string:
		return typeString, true
	}
	return 0, false
}

// arrayType returns the element type and length of an array value.
func arrayType(v any) (uint32, int, bool) {
	switch s := v.(type) {
	case []uint8:
		return typeUint8, len(s), true
	case []int8:
		return typeInt8, len(s), true
	case []uint16:
		return typeUint16, len(s), true
	case []int16:
		return typeInt16, len(s), true
	case []uint32:
		return typeUint32, len(s), true
	case []int32:
		return typeInt32, len(s), true
	case []uint64:
		return typeUint64, len(s), true
	case []int64:
		return typeInt64, len(s), true
	case []float32:
		return typeFloat32, len(s), true
	case []float64:
		return typeFloat64, len(s), true
	case []bool:
		return typeBool, len(s), true
	case []string:
		return typeString, len(s), true
	case []any:
		return typeArray, len(s), true
	}
	return 0, 0, false
}

// value writes v, preceded by its type when withType is set (a key's value,
// or an element of an array of arrays). v has passed checkValue.
func (e *Encoder) value(v any, withType bool) {
	if t, ok := scalarType(v); ok {
		if withType {
			e.u32(t)
		}
		e.scalar(v)
		return
	}
	et, n, _ := arrayType(v)
	if withType {
		e.u32(typeArray)
	}
	e.u32(et)
	e.u64(uint64(n))
	switch s := v.(type) {
	case []uint8:
		e.write(s)
	case []int8:
		for _, x := range s {
			e.scalar(x)
		}
	case []uint16:
		writeAll(e, s)
	case []int16:
		writeAll(e, s)
	case []uint32:
		writeAll(e, s)
	case []int32:
		writeAll(e, s)
	case []uint64:
		writeAll(e, s)
	case []int64:
		writeAll(e, s)
	case []float32:
		writeAll(e, s)
	case []float64:
		writeAll(e, s)
	case []bool:
		writeAll(e, s)
	case []string:
		for _, x := range s {
			e.str(x)
		}
	case []any:
		// Each element is an array: its element type and length, no value type.
		for _, x := range s {
			e.value(x, false)
		}
	}
}

func writeAll[T uint16 | int16 | uint32 | int32 | uint64 | int64 | float32 | float64 | bool](e *Encoder, s []T) {
	const chunk = 4096
	var buf []byte
	for len(s) > 0 && e.err == nil {
		k := min(len(s), chunk)
		buf = buf[:0]
		for _, x := range s[:k] {
			buf = appendScalar(buf, x)
		}
		e.write(buf)
		s = s[k:]
	}
}

func (e *Encoder) scalar(v any) {
	if s, ok := v.(string); ok {
		e.str(s)
		return
	}
	e.write(appendScalar(nil, v))
}

func appendScalar(b []byte, v any) []byte {
	le := binary.LittleEndian
	switch x := v.(type) {
	case uint8:
		return append(b, x)
	case int8:
		return append(b, uint8(x))
	case bool:
		if x {
			return append(b, 1)
		}
		return append(b, 0)
	case uint16:
		return le.AppendUint16(b, x)
	case int16:
		return le.AppendUint16(b, uint16(x))
	case uint32:
		return le.AppendUint32(b, x)
	case int32:
		return le.AppendUint32(b, uint32(x))
	case float32:
		return le.AppendUint32(b, math.Float32bits(x))
	case uint64:
		return le.AppendUint64(b, x)
	case int64:
		return le.AppendUint64(b, uint64(x))
	case float64:
		return le.AppendUint64(b, math.Float64bits(x))
	}
	return b
}
