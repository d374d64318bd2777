package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"

	"github.com/strata-llm/strata/model/ggml"
)

// magic is "GGUF" read as a little-endian uint32.
const magic = 0x46554747

// Metadata value types, as numbered by GGUF.
const (
	typeUint8   uint32 = 0
	typeInt8    uint32 = 1
	typeUint16  uint32 = 2
	typeInt16   uint32 = 3
	typeUint32  uint32 = 4
	typeInt32   uint32 = 5
	typeFloat32 uint32 = 6
	typeBool    uint32 = 7
	typeString  uint32 = 8
	typeArray   uint32 = 9
	typeUint64  uint32 = 10
	typeInt64   uint32 = 11
	typeFloat64 uint32 = 12
)

// minSize returns the fewest bytes a value of GGUF type t occupies, or 0 for
// an unknown type.
func minSize(t uint32) int {
	switch t {
	case typeUint8, typeInt8, typeBool:
		return 1
	case typeUint16, typeInt16:
		return 2
	case typeUint32, typeInt32, typeFloat32:
		return 4
	case typeUint64, typeInt64, typeFloat64, typeString:
		return 8 // a string is at least its length
	case typeArray:
		return 12 // element type and length
	}
	return 0
}

// Minimum encoded sizes used to bound counts by the bytes remaining.
const (
	minKVBytes     = 8 + 4 + 1     // key length, value type, smallest value
	minTensorBytes = 8 + 4 + 4 + 8 // name length, n_dims, type, offset (n_dims >= 1 adds 8 more)
)

// decoder reads little-endian values from data, tracking the offset and the
// key or tensor being read for error messages.
type decoder struct {
	data     []byte
	off      int
	key      string
	tensor   string
	alignOff int // offset of general.alignment's value type, for messages
}

func (d *decoder) errAt(off int, kind error, format string, args ...any) error {
	return &Error{Offset: int64(off), Key: d.key, Tensor: d.tensor, Msg: fmt.Sprintf(format, args...), Err: kind}
}

func (d *decoder) remaining() int { return len(d.data) - d.off }

// take returns the next n bytes, or an error naming what was being read.
func (d *decoder) take(n int, what string) ([]byte, error) {
	if n < 0 || n > d.remaining() {
		return nil, d.errAt(d.off, ErrTruncated, "%s: need %d bytes, %d remain", what, n, d.remaining())
	}
	b := d.data[d.off : d.off+n]
	d.off += n
	return b, nil
}

func (d *decoder) u32(what string) (uint32, error) {
	b, err := d.take(4, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (d *decoder) u64(what string) (uint64, error) {
	b, err := d.take(8, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

// count reads a uint64 count of items of at least minBytes each and checks
// it against limit and the bytes remaining.
func (d *decoder) count(what string, limit int, limitName string, minBytes int) (int, error) {
	off := d.off
	n, err := d.u64(what)
	if err != nil {
		return 0, err
	}
	if n > uint64(limit) {
		return 0, d.errAt(off, ErrLimit, "%s %d exceeds %s (%d)", what, n, limitName, limit)
	}
	if need := n * uint64(minBytes); need > uint64(d.remaining()) {
		return 0, d.errAt(off, ErrTruncated, "%s %d needs at least %d bytes, %d remain", what, n, need, d.remaining())
	}
	return int(n), nil
}

// prefixed adds context to the message of an *Error. Building the context
// only on failure keeps the per-item cost of parsing low.
func prefixed(err error, format string, args ...any) error {
	if e, ok := err.(*Error); ok {
		e.Msg = fmt.Sprintf(format, args...) + e.Msg
	}
	return err
}

// str reads a string of at most limit bytes. The bytes are copied.
func (d *decoder) str(what string, limit int) (string, error) {
	off := d.off
	n, err := d.u64(what + " length")
	if err != nil {
		return "", err
	}
	if n > uint64(limit) {
		name := "MaxStringLen"
		if limit == MaxNameLen {
			name = "MaxNameLen"
		}
		return "", d.errAt(off, ErrLimit, "%s length %d exceeds %s (%d)", what, n, name, limit)
	}
	if n > uint64(d.remaining()) {
		return "", d.errAt(off, ErrTruncated, "%s length %d exceeds the %d bytes remaining", what, n, d.remaining())
	}
	b, _ := d.take(int(n), what)
	return string(b), nil
}

// value reads a value of GGUF type t. depth is the number of arrays that
// enclose it.
func (d *decoder) value(t uint32, depth int) (any, error) {
	switch t {
	case typeArray:
		return d.array(depth + 1)
	case typeString:
		return d.str("string", MaxStringLen)
	}
	size := minSize(t)
	if size == 0 {
		return nil, d.errAt(d.off-4, ErrCorrupt, "unknown value type %d", t)
	}
	b, err := d.take(size, "value")
	if err != nil {
		return nil, err
	}
	return scalar(t, b), nil
}

// scalar decodes a fixed-size value of type t from b.
func scalar(t uint32, b []byte) any {
	switch t {
	case typeUint8:
		return b[0]
	case typeInt8:
		return int8(b[0])
	case typeBool:
		return b[0] != 0
	case typeUint16:
		return binary.LittleEndian.Uint16(b)
	case typeInt16:
		return int16(binary.LittleEndian.Uint16(b))
	case typeUint32:
		return binary.LittleEndian.Uint32(b)
	case typeInt32:
		return int32(binary.LittleEndian.Uint32(b))
	case typeFloat32:
		return math.Float32frombits(binary.LittleEndian.Uint32(b))
	case typeUint64:
		return binary.LittleEndian.Uint64(b)
	case typeInt64:
		return int64(binary.LittleEndian.Uint64(b))
	case typeFloat64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b))
	}
	return nil
}

// array reads an array's element type, length and elements. depth is the
// array's own nesting level, 1 for an array that is a key's value.
func (d *decoder) array(depth int) (any, error) {
	off := d.off
	if depth > MaxNesting {
		return nil, d.errAt(off, ErrLimit, "array nesting %d exceeds MaxNesting (%d)", depth, MaxNesting)
	}
	et, err := d.u32("array element type")
	if err != nil {
		return nil, err
	}
	size := minSize(et)
	if size == 0 {
		return nil, d.errAt(off, ErrCorrupt, "unknown array element type %d", et)
	}
	lenOff := d.off
	n64, err := d.u64("array length")
	if err != nil {
		return nil, err
	}
	if n64 > MaxArrayLen {
		return nil, d.errAt(lenOff, ErrLimit, "array length %d exceeds MaxArrayLen (%d)", n64, MaxArrayLen)
	}
	if need := n64 * uint64(size); need > uint64(d.remaining()) {
		return nil, d.errAt(lenOff, ErrTruncated, "array of %d elements needs at least %d bytes, %d remain", n64, need, d.remaining())
	}
	n := int(n64)
	switch et {
	case typeString:
		s := make([]string, n)
		for i := range s {
			if s[i], err = d.str("string", MaxStringLen); err != nil {
				return nil, err
			}
		}
		return s, nil
	case typeArray:
		s := make([]any, n)
		for i := range s {
			if s[i], err = d.array(depth + 1); err != nil {
				return nil, err
			}
		}
		return s, nil
	}
	// Fixed-size elements: the length check above covers them all.
	b, _ := d.take(n*size, "array")
	switch et {
	case typeUint8:
		return append([]uint8{}, b...), nil
	case typeInt8:
		return fixed(b, 1, func(b []byte) int8 { return int8(b[0]) }), nil
	case typeBool:
		return fixed(b, 1, func(b []byte) bool { return b[0] != 0 }), nil
	case typeUint16:
		return fixed(b, 2, binary.LittleEndian.Uint16), nil
	case typeInt16:
		return fixed(b, 2, func(b []byte) int16 { return int16(binary.LittleEndian.Uint16(b)) }), nil
	case typeUint32:
		return fixed(b, 4, binary.LittleEndian.Uint32), nil
	case typeInt32:
		return fixed(b, 4, func(b []byte) int32 { return int32(binary.LittleEndian.Uint32(b)) }), nil
	case typeFloat32:
		return fixed(b, 4, func(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }), nil
	case typeUint64:
		return fixed(b, 8, binary.LittleEndian.Uint64), nil
	case typeInt64:
		return fixed(b, 8, func(b []byte) int64 { return int64(binary.LittleEndian.Uint64(b)) }), nil
	case typeFloat64:
		return fixed(b, 8, func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) }), nil
	}
	return nil, d.errAt(off, ErrCorrupt, "unknown array element type %d", et)
}

func fixed[T any](b []byte, size int, dec func([]byte) T) []T {
	out := make([]T, len(b)/size)
	for i := range out {
		out[i] = dec(b[i*size:])
	}
	return out
}

// Parse parses a GGUF file held in data. The File's tensors are views of data,
// which must stay unmodified while they are used; its metadata is copied.
func Parse(data []byte) (*File, error) { return parse(data, true) }

// ParseHeader parses a file's header alone: its bytes up to the tensor
// data, as Coordinator.Weights sends them first. It checks what Parse
// checks except that the tensors fit in data; each Tensor gets its absolute
// Offset and a nil Data, and Size gives its byte count.
func ParseHeader(header []byte) (*File, error) { return parse(header, false) }

func parse(data []byte, place bool) (*File, error) {
	d := &decoder{data: data}
	m, err := d.u32("magic")
	if err != nil {
		return nil, &Error{Offset: 0, Msg: fmt.Sprintf("file of %d bytes is too short for a GGUF header", len(data)), Err: ErrNotGGUF}
	}
	if m != magic {
		return nil, &Error{Offset: 0, Msg: fmt.Sprintf("bad magic %q, want \"GGUF\"", data[:4]), Err: ErrNotGGUF}
	}
	f := &File{data: data, Alignment: DefaultAlignment}
	if f.Version, err = d.u32("version"); err != nil {
		return nil, err
	}
	switch {
	case f.Version == 2 || f.Version == 3:
	case f.Version == 1:
		return nil, d.errAt(4, ErrVersion, "version 1 is not supported (want 2 or 3); convert the file with a current llama.cpp")
	case bits.ReverseBytes32(f.Version) == 2 || bits.ReverseBytes32(f.Version) == 3:
		return nil, d.errAt(4, ErrVersion, "big-endian file (version %d byte-swapped) is not supported", bits.ReverseBytes32(f.Version))
	default:
		return nil, d.errAt(4, ErrVersion, "version %d is not supported (want 2 or 3)", f.Version)
	}

	// Both counts come before either section: bound them together.
	nTensors, err := d.count("tensor count", MaxTensors, "MaxTensors", minTensorBytes+8)
	if err != nil {
		return nil, err
	}
	nKV, err := d.count("key-value count", MaxKVs, "MaxKVs", minKVBytes)
	if err != nil {
		return nil, err
	}
	if need := uint64(nTensors)*(minTensorBytes+8) + uint64(nKV)*minKVBytes; need > uint64(d.remaining()) {
		return nil, d.errAt(8, ErrTruncated, "%d tensors and %d key-value pairs need at least %d bytes, %d remain", nTensors, nKV, need, d.remaining())
	}

	if err := d.readKVs(f, nKV); err != nil {
		return nil, err
	}
	if err := f.setAlignment(d.alignOff); err != nil {
		return nil, err
	}
	infoOffs, err := d.readTensorInfos(f, nTensors)
	if err != nil {
		return nil, err
	}
	f.DataOffset = alignUp(uint64(d.off), f.Alignment)
	if err := f.placeTensors(infoOffs, place); err != nil {
		return nil, err
	}
	return f, nil
}

func (d *decoder) readKVs(f *File, n int) error {
	f.KV = make([]KV, 0, n)
	f.kvIndex = make(map[string]int, n)
	for i := range n {
		d.key = ""
		keyOff := d.off
		key, err := d.str("key", MaxNameLen)
		if err != nil {
			return prefixed(err, "kv %d of %d: ", i, n)
		}
		if key == "" {
			return d.errAt(keyOff, ErrCorrupt, "kv %d of %d: empty key", i, n)
		}
		d.key = key
		if _, dup := f.kvIndex[key]; dup {
			return d.errAt(keyOff, ErrCorrupt, "duplicate key")
		}
		if key == KeyAlignment {
			d.alignOff = d.off
		}
		t, err := d.u32("value type")
		if err != nil {
			return err
		}
		v, err := d.value(t, 0)
		if err != nil {
			return err
		}
		f.kvIndex[key] = len(f.KV)
		f.KV = append(f.KV, KV{Key: key, Value: v})
	}
	d.key = ""
	return nil
}

// checkAlignment validates an alignment value taken from general.alignment.
func checkAlignment(v any) (uint64, error) {
	a, neg, ok := asInt(v)
	switch {
	case !ok:
		return 0, fmt.Errorf("is %s, want an integer", typeName(v))
	case neg || a == 0 || a&(a-1) != 0:
		return 0, fmt.Errorf("alignment %v is not a non-zero power of two", v)
	case a > MaxAlignment:
		return 0, fmt.Errorf("alignment %d exceeds MaxAlignment (%d)", a, MaxAlignment)
	}
	return a, nil
}

func (f *File) setAlignment(off int) error {
	v, ok := f.Get(KeyAlignment)
	if !ok {
		return nil
	}
	a, err := checkAlignment(v)
	if err != nil {
		return &Error{Offset: int64(off), Key: KeyAlignment, Msg: err.Error(), Err: ErrCorrupt}
	}
	f.Alignment = a
	return nil
}

func alignUp(off, a uint64) uint64 { return (off + a - 1) &^ (a - 1) }

// readTensorInfos reads n tensor descriptions. It returns, for each tensor,
// the offset of its data offset field, for messages.
func (d *decoder) readTensorInfos(f *File, n int) ([]int, error) {
	f.Tensors = make([]*Tensor, 0, n)
	f.tIndex = make(map[string]int, n)
	infoOffs := make([]int, 0, n)
	for i := range n {
		d.tensor = ""
		nameOff := d.off
		name, err := d.str("name", MaxNameLen)
		if err != nil {
			return nil, prefixed(err, "tensor %d of %d: ", i, n)
		}
		if name == "" {
			return nil, d.errAt(nameOff, ErrCorrupt, "tensor %d of %d: empty name", i, n)
		}
		d.tensor = name
		if _, dup := f.tIndex[name]; dup {
			return nil, d.errAt(nameOff, ErrCorrupt, "duplicate tensor name")
		}
		t := &Tensor{Name: name}
		dimsOff := d.off
		nd, err := d.u32("dimension count")
		if err != nil {
			return nil, err
		}
		if nd == 0 || nd > MaxDims {
			return nil, d.errAt(dimsOff, ErrCorrupt, "dimension count %d is not in [1, MaxDims (%d)]", nd, MaxDims)
		}
		if int(nd)*8 > d.remaining() {
			return nil, d.errAt(dimsOff, ErrTruncated, "%d dimensions need %d bytes, %d remain", nd, nd*8, d.remaining())
		}
		t.Dims = make([]uint64, nd)
		for j := range t.Dims {
			t.Dims[j], _ = d.u64("dimension")
		}
		typeOff := d.off
		typ, err := d.u32("tensor type")
		if err != nil {
			return nil, err
		}
		t.Type = ggml.Type(typ)
		if !t.Type.Known() {
			return nil, d.errAt(typeOff, ErrCorrupt, "unknown tensor type %d", typ)
		}
		if _, msg := tensorSize(t.Type, t.Dims); msg != "" {
			return nil, d.errAt(dimsOff, ErrCorrupt, "%s", msg)
		}
		infoOffs = append(infoOffs, d.off)
		if t.Offset, err = d.u64("tensor data offset"); err != nil {
			return nil, err
		}
		f.tIndex[name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, t)
	}
	d.tensor = ""
	return infoOffs, nil
}

// tensorSize returns the bytes a tensor of type t and dimensions dims
// occupies, or a message saying why the shape is invalid. t must be known.
func tensorSize(t ggml.Type, dims []uint64) (uint64, string) {
	elems := uint64(1)
	for j, n := range dims {
		if n == 0 {
			return 0, fmt.Sprintf("dimension %d is 0 (dims %v)", j, dims)
		}
		hi, lo := bits.Mul64(elems, n)
		if hi != 0 || lo > math.MaxInt64 || lo > math.MaxInt {
			return 0, fmt.Sprintf("dims %v overflow", dims)
		}
		elems = lo
	}
	bs := uint64(t.BlockSize())
	if dims[0]%bs != 0 {
		return 0, fmt.Sprintf("row length %d is not a multiple of the %s block size %d", dims[0], t, bs)
	}
	hi, size := bits.Mul64(elems/bs, uint64(t.TypeSize()))
	if hi != 0 || size > MaxTensorBytes {
		return 0, fmt.Sprintf("dims %v of %s exceed MaxTensorBytes (%d)", dims, t, uint64(MaxTensorBytes))
	}
	return size, ""
}

// placeTensors checks each tensor's data against the data section and sets
// its absolute Offset and (when place is set) its Data view.
func (f *File) placeTensors(infoOffs []int, place bool) error {
	n := uint64(len(f.data))
	for i, t := range f.Tensors {
		size, _ := tensorSize(t.Type, t.Dims)
		errAt := func(kind error, format string, args ...any) error {
			return &Error{Offset: int64(infoOffs[i]), Tensor: t.Name, Msg: fmt.Sprintf(format, args...), Err: kind}
		}
		rel := t.Offset
		if rel%f.Alignment != 0 {
			return errAt(ErrCorrupt, "data offset %d is not a multiple of the alignment %d", rel, f.Alignment)
		}
		if !place {
			if rel > MaxTensorBytes*MaxTensors {
				return errAt(ErrCorrupt, "data offset %d is past any file this reader accepts", rel)
			}
			t.Offset = f.DataOffset + rel
			continue
		}
		if f.DataOffset > n || rel > n-f.DataOffset || size > n-f.DataOffset-rel {
			return errAt(ErrTruncated, "data [%d, +%d) at data section offset %d ends past the end of the file (%d bytes)", rel, size, f.DataOffset, n)
		}
		t.Offset = f.DataOffset + rel
		end := t.Offset + size
		t.Data = f.data[t.Offset:end:end]
	}
	return nil
}
