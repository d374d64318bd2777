package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/strata-llm/strata/model/ggml"
)

// allValues has a value of every metadata type, including nested and empty
// arrays.
func allValues() []KV {
	return []KV{
		{"general.architecture", "llama"},
		{"v.uint8", uint8(200)},
		{"v.int8", int8(-100)},
		{"v.uint16", uint16(60000)},
		{"v.int16", int16(-30000)},
		{"v.uint32", uint32(4000000000)},
		{"v.int32", int32(-2000000000)},
		{"v.uint64", uint64(1) << 63},
		{"v.int64", int64(-1) << 62},
		{"v.float32", float32(1.5)},
		{"v.float64", 2.25},
		{"v.bool", true},
		{"v.string", "héllo\x00world"},
		{"v.empty_string", ""},
		{"a.uint8", []uint8{0, 1, 255}},
		{"a.int8", []int8{-128, 0, 127}},
		{"a.uint16", []uint16{0, 65535}},
		{"a.int16", []int16{-32768, 32767}},
		{"a.uint32", []uint32{0, 1 << 31}},
		{"a.int32", []int32{-1, 0, 1}},
		{"a.uint64", []uint64{1 << 63}},
		{"a.int64", []int64{-1 << 63}},
		{"a.float32", []float32{-1, 0.5}},
		{"a.float64", []float64{3.25}},
		{"a.bool", []bool{true, false, true}},
		{"a.string", []string{"a", "", "ccc"}},
		{"a.empty", []float32{}},
		{"a.nested", []any{[]int32{1, 2}, []string{"x"}, []any{[]bool{true}, []any{}}, []uint8{}}},
		{"a.nested_empty", []any{}},
	}
}

// allTensors has a tensor of every type, with random bytes.
func allTensors(rng *rand.Rand) []WriteTensor {
	var ts []WriteTensor
	for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.BF16, ggml.Q4_0, ggml.Q8_0, ggml.Q4_K, ggml.Q6_K, ggml.Q8_K} {
		bs := uint64(typ.BlockSize())
		dims := []uint64{bs * 2, 3}
		if typ == ggml.F32 {
			dims = []uint64{5} // a vector, and a size that needs padding
		}
		if typ == ggml.F16 {
			dims = []uint64{3, 2, 2, 2}
		}
		size, msg := tensorSize(typ, dims)
		if msg != "" {
			panic(msg)
		}
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		ts = append(ts, WriteTensor{Name: "t." + typ.String(), Type: typ, Dims: dims, Data: data})
	}
	return ts
}

func write(t testing.TB, kvs []KV, ts []WriteTensor) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, kvs, ts); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, align := range []uint32{0, 1, 64, 4096} {
		kvs := allValues()
		want := uint64(DefaultAlignment)
		if align != 0 {
			kvs = append(kvs, KV{KeyAlignment, align})
			want = uint64(align)
		}
		ts := allTensors(rng)
		data := write(t, kvs, ts)
		f, err := Parse(data)
		if err != nil {
			t.Fatalf("align %d: %v", align, err)
		}
		if f.Version != 3 || f.Alignment != want || f.DataOffset%want != 0 {
			t.Errorf("align %d: version %d alignment %d data offset %d", align, f.Version, f.Alignment, f.DataOffset)
		}
		if diff := cmp.Diff(f.KV, kvs); diff != "" {
			t.Errorf("align %d: KV (-got +want):\n%s", align, diff)
		}
		if len(f.Tensors) != len(ts) {
			t.Fatalf("align %d: %d tensors, want %d", align, len(f.Tensors), len(ts))
		}
		for i, got := range f.Tensors {
			w := ts[i]
			if got.Name != w.Name || got.Type != w.Type || !cmp.Equal(got.Dims, w.Dims) || !bytes.Equal(got.Data, w.Data) {
				t.Errorf("align %d: tensor %d = %s %v %v (%d bytes), want %s %v %v (%d bytes)",
					align, i, got.Name, got.Type, got.Dims, len(got.Data), w.Name, w.Type, w.Dims, len(w.Data))
			}
		}
		checkTensors(t, f)

		// The Encoder writes the same bytes.
		var buf bytes.Buffer
		e, err := NewEncoder(&buf, kvs, ts)
		if err != nil {
			t.Fatal(err)
		}
		for _, tn := range ts {
			if err := e.WriteData(tn.Data); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), data) {
			t.Errorf("align %d: Encoder output differs from Write", align)
		}
	}
}

func TestAccessors(t *testing.T) {
	f, err := Parse(write(t, allValues(), nil))
	if err != nil {
		t.Fatal(err)
	}
	if u, err := f.Uint("v.uint8"); err != nil || u != 200 {
		t.Errorf("Uint(v.uint8) = %d, %v", u, err)
	}
	if u, err := f.Uint("v.uint64"); err != nil || u != 1<<63 {
		t.Errorf("Uint(v.uint64) = %d, %v", u, err)
	}
	if i, err := f.Int("v.int64"); err != nil || i != -1<<62 {
		t.Errorf("Int(v.int64) = %d, %v", i, err)
	}
	if i, err := f.Int("v.int8"); err != nil || i != -100 {
		t.Errorf("Int(v.int8) = %d, %v", i, err)
	}
	if x, err := f.Float("v.float32"); err != nil || x != 1.5 {
		t.Errorf("Float(v.float32) = %v, %v", x, err)
	}
	if x, err := f.Float("v.int16"); err != nil || x != -30000 {
		t.Errorf("Float(v.int16) = %v, %v", x, err)
	}
	if b, err := f.Bool("v.bool"); err != nil || !b {
		t.Errorf("Bool = %v, %v", b, err)
	}
	if s, err := f.String("v.string"); err != nil || s != "héllo\x00world" {
		t.Errorf("String = %q, %v", s, err)
	}
	if s, err := f.Int32s("a.uint8"); err != nil || !cmp.Equal(s, []int32{0, 1, 255}) {
		t.Errorf("Int32s(a.uint8) = %v, %v", s, err)
	}
	if s, err := f.Float32s("a.float32"); err != nil || !cmp.Equal(s, []float32{-1, 0.5}) {
		t.Errorf("Float32s = %v, %v", s, err)
	}
	if !f.Has("a.nested") || f.Has("nope") {
		t.Error("Has is wrong")
	}
	if _, ok := f.Get("nope"); ok {
		t.Error("Get(nope) found something")
	}
	for _, tc := range []struct {
		name string
		call func() error
		key  string
		want error
	}{
		{"Uint negative", func() error { _, err := f.Uint("v.int8"); return err }, "v.int8", ErrWrongType},
		{"Uint string", func() error { _, err := f.Uint("v.string"); return err }, "v.string", ErrWrongType},
		{"Int overflow", func() error { _, err := f.Int("v.uint64"); return err }, "v.uint64", ErrWrongType},
		{"Float bool", func() error { _, err := f.Float("v.bool"); return err }, "v.bool", ErrWrongType},
		{"String missing", func() error { _, err := f.String("nope"); return err }, "nope", ErrNotFound},
		{"Bool int", func() error { _, err := f.Bool("v.int32"); return err }, "v.int32", ErrWrongType},
		{"Strings float", func() error { _, err := f.Strings("a.float32"); return err }, "a.float32", ErrWrongType},
		{"Float32s float64", func() error { _, err := f.Float32s("a.float64"); return err }, "a.float64", ErrWrongType},
		{"Int32s overflow", func() error { _, err := f.Int32s("a.uint32"); return err }, "a.uint32", ErrWrongType},
		{"Int32s overflow64", func() error { _, err := f.Int32s("a.int64"); return err }, "a.int64", ErrWrongType},
		{"Int32s nested", func() error { _, err := f.Int32s("a.nested"); return err }, "a.nested", ErrWrongType},
		{"Architecture", func() error { _, err := (&File{}).Architecture(); return err }, KeyArchitecture, ErrNotFound},
	} {
		err := tc.call()
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), `"`+tc.key+`"`) {
			t.Errorf("%s: error %v, want %v naming %q", tc.name, err, tc.want, tc.key)
		}
	}
}

func TestWriteInvalid(t *testing.T) {
	good := WriteTensor{Name: "w", Type: ggml.F32, Dims: []uint64{2}, Data: make([]byte, 8)}
	for _, tc := range []struct {
		name string
		kvs  []KV
		ts   []WriteTensor
		want string
	}{
		{"empty key", []KV{{"", uint8(1)}}, nil, "empty key"},
		{"duplicate key", []KV{{"a", uint8(1)}, {"a", uint8(2)}}, nil, `key "a": duplicate`},
		{"bad type", []KV{{"a", 1}}, nil, "unsupported value type int"},
		{"bad nested", []KV{{"a", []any{"x"}}}, nil, "not an array"},
		{"alignment", []KV{{KeyAlignment, uint32(3)}}, nil, "power of two"},
		{"alignment type", []KV{{KeyAlignment, "32"}}, nil, "want an integer"},
		{"too deep", []KV{{"a", nest(MaxNesting + 1)}}, nil, "MaxNesting"},
		{"duplicate tensor", nil, []WriteTensor{good, good}, `tensor "w": duplicate`},
		{"empty name", nil, []WriteTensor{{Type: ggml.F32, Dims: []uint64{1}, Data: make([]byte, 4)}}, "empty tensor name"},
		{"unknown type", nil, []WriteTensor{{Name: "x", Type: 4, Dims: []uint64{1}, Data: make([]byte, 4)}}, "unknown tensor type 4"}, // retired Q4_2
		{"no dims", nil, []WriteTensor{{Name: "x", Type: ggml.F32, Data: []byte{}}}, "dimension count 0"},
		{"zero dim", nil, []WriteTensor{{Name: "x", Type: ggml.F32, Dims: []uint64{1, 0}, Data: []byte{}}}, "dimension 1 is 0"},
		{"block", nil, []WriteTensor{{Name: "x", Type: ggml.Q4_0, Dims: []uint64{33}, Data: make([]byte, 18)}}, "not a multiple"},
		{"size", nil, []WriteTensor{{Name: "x", Type: ggml.F16, Dims: []uint64{4}, Data: make([]byte, 4)}}, "4 bytes of data, want 8"},
		{"nil data", nil, []WriteTensor{{Name: "x", Type: ggml.F32, Dims: []uint64{2}}}, "0 bytes of data, want 8"},
		{"overflow", nil, []WriteTensor{{Name: "x", Type: ggml.F32, Dims: []uint64{1 << 32, 1 << 32}, Data: []byte{}}}, "overflow"},
	} {
		var buf bytes.Buffer
		err := Write(&buf, tc.kvs, tc.ts)
		if !errors.Is(err, ErrInvalidArgs) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want ErrInvalidArgs containing %q", tc.name, err, tc.want)
		}
		if buf.Len() != 0 {
			t.Errorf("%s: %d bytes written", tc.name, buf.Len())
		}
	}
}

func nest(depth int) any {
	var v any = []uint8{1}
	for range depth - 1 {
		v = []any{v}
	}
	return v
}

func TestEncoderMisuse(t *testing.T) {
	ts := []WriteTensor{{Name: "a", Type: ggml.F32, Dims: []uint64{2}}}
	var buf bytes.Buffer
	e, err := NewEncoder(&buf, nil, ts)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err == nil {
		t.Error("Close before data succeeded")
	}
	if err := e.WriteData(make([]byte, 4)); err == nil {
		t.Error("short data accepted")
	}
	if err := e.WriteData(make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	if err := e.WriteData(make([]byte, 8)); err == nil {
		t.Error("extra tensor accepted")
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
}

// TestVersion2 checks that a version 2 file, which has the same layout as
// version 3, parses.
func TestVersion2(t *testing.T) {
	data := write(t, allValues(), allTensors(rand.New(rand.NewPCG(3, 4))))
	binary.LittleEndian.PutUint32(data[4:], 2)
	f, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != 2 {
		t.Errorf("Version = %d", f.Version)
	}
}
