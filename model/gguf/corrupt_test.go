package gguf

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/strata-llm/strata/model/ggml"
)

// raw builds GGUF bytes by hand, for files Write refuses to produce.
type raw []byte

func (r raw) u32(v uint32) raw { return binary.LittleEndian.AppendUint32(r, v) }
func (r raw) u64(v uint64) raw { return binary.LittleEndian.AppendUint64(r, v) }
func (r raw) str(s string) raw { return append(r.u64(uint64(len(s))), s...) }

func header(version uint32, nTensors, nKV uint64) raw {
	return raw("GGUF").u32(version).u64(nTensors).u64(nKV)
}

// kv appends a key whose value is a uint32.
func (r raw) kvU32(key string, v uint32) raw { return r.str(key).u32(typeUint32).u32(v) }

// tensor appends a tensor description.
func (r raw) tensor(name string, typ ggml.Type, off uint64, dims ...uint64) raw {
	r = r.str(name).u32(uint32(len(dims)))
	for _, d := range dims {
		r = r.u64(d)
	}
	return r.u32(uint32(typ)).u64(off)
}

// pad appends zeros up to a multiple of 32, then n bytes of data.
func (r raw) data(n int) raw {
	for len(r)%32 != 0 {
		r = append(r, 0)
	}
	return append(r, make([]byte, n)...)
}

func TestCorrupt(t *testing.T) {
	f32 := ggml.F32
	for _, tc := range []struct {
		name string
		data []byte
		want error
		msg  string // the error message must contain this
	}{
		{"empty", nil, ErrNotGGUF, "too short"},
		{"magic", raw("GGML").u32(3), ErrNotGGUF, "bad magic"},
		{"version 1", header(1, 0, 0), ErrVersion, "version 1 is not supported"},
		{"version 4", header(4, 0, 0), ErrVersion, "version 4 is not supported"},
		{"big endian", raw("GGUF").u32(0x03000000).u64(0).u64(0), ErrVersion, "big-endian"},
		{"no counts", raw("GGUF").u32(3).u32(0), ErrTruncated, "offset 8: tensor count"},
		{"tensor count", header(3, 1<<40, 0), ErrLimit, "offset 8: tensor count 1099511627776 exceeds MaxTensors (1048576)"},
		{"kv count", header(3, 0, 1<<62), ErrLimit, "offset 16: key-value count 4611686018427387904 exceeds MaxKVs (65536)"},
		{"kv count vs size", header(3, 0, 1000), ErrTruncated, "key-value count 1000 needs at least 13000 bytes, 0 remain"},
		{"both counts vs size", append(header(3, 1, 1), make([]byte, 32)...), ErrTruncated, "1 tensors and 1 key-value pairs need"},
		{"key length", header(3, 0, 1).u64(1 << 20).u32(0).u32(0), ErrLimit, "offset 24: kv 0 of 1: key length 1048576 exceeds MaxNameLen (65535)"},
		{"key truncated", header(3, 0, 1).u64(100).u32(0).u32(0).u32(0), ErrTruncated, "offset 24: kv 0 of 1: key length 100 exceeds the 12 bytes remaining"},
		{"empty key", header(3, 0, 1).str("").u32(typeUint8).u32(0), ErrCorrupt, "kv 0 of 1: empty key"},
		{"duplicate key", header(3, 0, 2).kvU32("a.b", 1).kvU32("a.b", 2), ErrCorrupt, `offset 43: key "a.b": duplicate key`},
		{"value type", header(3, 0, 1).str("k").u32(13).u32(0).u32(0), ErrCorrupt, `offset 33: key "k": unknown value type 13`},
		{"string length", header(3, 0, 1).str("k").u32(typeString).u64(1 << 32).u64(0), ErrLimit, `offset 37: key "k": string length 4294967296 exceeds MaxStringLen (16777216)`},
		{"string truncated", header(3, 0, 1).str("k").u32(typeString).u64(9).u64(0), ErrTruncated, `key "k": string length 9 exceeds the 8 bytes remaining`},
		{"array length", header(3, 0, 1).str("tokenizer.ggml.tokens").u32(typeArray).u32(typeString).u64(4294967295).u64(0),
			ErrLimit, `gguf: offset 61: key "tokenizer.ggml.tokens": array length 4294967295 exceeds MaxArrayLen (16777216)`},
		{"array vs size", header(3, 0, 1).str("k").u32(typeArray).u32(typeUint32).u64(1000).u64(0), ErrTruncated, `key "k": array of 1000 elements needs at least 4000 bytes, 8 remain`},
		{"array element type", header(3, 0, 1).str("k").u32(typeArray).u32(99).u64(1).u64(0), ErrCorrupt, `key "k": unknown array element type 99`},
		{"nesting", deepArray(MaxNesting + 1), ErrLimit, `key "deep": array nesting 9 exceeds MaxNesting (8)`},
		{"alignment zero", header(3, 0, 1).kvU32(KeyAlignment, 0), ErrCorrupt, `offset 49: key "general.alignment": alignment 0 is not a non-zero power of two`},
		{"alignment odd", header(3, 0, 1).kvU32(KeyAlignment, 48), ErrCorrupt, `alignment 48 is not a non-zero power of two`},
		{"alignment huge", header(3, 0, 1).kvU32(KeyAlignment, 1<<30), ErrCorrupt, `exceeds MaxAlignment`},
		{"alignment type", header(3, 0, 1).str(KeyAlignment).u32(typeString).str("32"), ErrCorrupt, `key "general.alignment": is string, want an integer`},
		{"tensor name", header(3, 1, 0).u64(1 << 40).u64(0).u64(0).u64(0), ErrLimit, "offset 24: tensor 0 of 1: name length 1099511627776 exceeds MaxNameLen"},
		{"empty tensor name", header(3, 1, 0).tensor("", f32, 0, 1).data(4), ErrCorrupt, "tensor 0 of 1: empty name"},
		{"duplicate tensor", header(3, 2, 0).tensor("w", f32, 0, 1).tensor("w", f32, 32, 1).data(36), ErrCorrupt, `offset 57: tensor "w": duplicate tensor name`},
		{"dims count", header(3, 1, 0).tensor("w", f32, 0, 1, 1, 1, 1, 1).data(4), ErrCorrupt, `offset 33: tensor "w": dimension count 5 is not in [1, MaxDims (4)]`},
		{"dims zero count", header(3, 1, 0).tensor("w", f32, 0).data(4), ErrCorrupt, `tensor "w": dimension count 0`},
		{"dim zero", header(3, 1, 0).tensor("w", f32, 0, 4, 0).data(4), ErrCorrupt, `tensor "w": dimension 1 is 0`},
		{"dims overflow", header(3, 1, 0).tensor("w", f32, 0, 1<<32, 1<<32).data(4), ErrCorrupt, `tensor "w": dims [4294967296 4294967296] overflow`},
		{"dims overflow 3", header(3, 1, 0).tensor("w", f32, 0, 1<<21, 1<<21, 1<<21).data(4), ErrCorrupt, `overflow`},
		{"tensor too big", header(3, 1, 0).tensor("w", f32, 0, 1<<40).data(4), ErrCorrupt, `exceed MaxTensorBytes`},
		{"tensor type", header(3, 1, 0).tensor("w", 99, 0, 4).data(16), ErrCorrupt, `offset 45: tensor "w": unknown tensor type 99`},
		{"block size", header(3, 1, 0).tensor("w", ggml.Q4_0, 0, 33).data(36), ErrCorrupt, `tensor "w": row length 33 is not a multiple of the Q4_0 block size 32`},
		{"misaligned", header(3, 1, 0).tensor("w", f32, 4, 1).data(8), ErrCorrupt, `offset 49: tensor "w": data offset 4 is not a multiple of the alignment 32`},
		{"out of bounds", header(3, 1, 0).tensor("w", f32, 32, 4).data(16), ErrTruncated, `offset 49: tensor "w": data [32, +16) at data section offset 64 ends past the end of the file (80 bytes)`},
		{"offset overflow", header(3, 1, 0).tensor("w", f32, 1<<63, 4).data(16), ErrTruncated, `tensor "w": data`},
		{"no data section", header(3, 1, 0).tensor("w", f32, 0, 4), ErrTruncated, `tensor "w": data`},
		{"tensor info truncated", append(header(3, 1, 0).str("w").u32(4), make([]byte, 19)...), ErrTruncated, `offset 33: tensor "w": 4 dimensions need 32 bytes, 19 remain`},
	} {
		f, err := Parse(tc.data)
		if err == nil {
			t.Errorf("%s: parsed %d KVs, %d tensors; want an error", tc.name, len(f.KV), len(f.Tensors))
			continue
		}
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: error %q\nwant %v containing %q", tc.name, err, tc.want, tc.msg)
		}
		if _, ok := errors.AsType[*Error](err); !ok {
			t.Errorf("%s: error %T is not *Error", tc.name, err)
		}
	}
}

// deepArray returns a file whose one key holds arrays nested depth deep.
func deepArray(depth int) raw {
	r := header(3, 0, 1).str("deep").u32(typeArray)
	for range depth - 1 {
		r = r.u32(typeArray).u64(1)
	}
	return r.u32(typeUint8).u64(1).u32(7)
}

func TestNestingLimit(t *testing.T) {
	f, err := Parse(deepArray(MaxNesting))
	if err != nil {
		t.Fatal(err)
	}
	v, _ := f.Get("deep")
	for range MaxNesting - 1 {
		v = v.([]any)[0]
	}
	if s, ok := v.([]uint8); !ok || len(s) != 1 || s[0] != 7 {
		t.Errorf("innermost value %#v", v)
	}
}

func TestVocabOnlyNoPadding(t *testing.T) {
	// A file without tensors need not have a data section, nor padding.
	data := header(3, 0, 2).kvU32("a", 1).str("b").u32(typeString).str("xyz")
	f, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Tensors) != 0 || f.DataOffset < uint64(len(data)) {
		t.Errorf("%d tensors, data offset %d", len(f.Tensors), f.DataOffset)
	}
}

// TestTruncations parses every prefix of a small file that cuts into its
// tensor data: each must fail with an *Error, and none may panic.
func TestTruncations(t *testing.T) {
	kvs := allValues()
	ts := allTensors(rand.New(rand.NewPCG(5, 6)))
	data := write(t, kvs, ts)
	f, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	last := f.Tensors[len(f.Tensors)-1]
	end := int(last.Offset) + len(last.Data)
	for n := range end {
		prefix := append([]byte(nil), data[:n]...)
		_, err := Parse(prefix)
		e, ok := errors.AsType[*Error](err)
		if !ok {
			t.Fatalf("prefix %d of %d: error %v, want an *Error", n, end, err)
		}
		if e.Offset < 0 || e.Offset > int64(n) {
			t.Errorf("prefix %d: error offset %d outside the data: %v", n, e.Offset, err)
		}
	}
	if _, err := Parse(data[:end]); err != nil {
		t.Errorf("file without trailing padding: %v", err)
	}
}

// TestByteCorruptions overwrites each byte of a small file in turn with a few
// values: parsing must not panic, and what parses must be self-consistent.
func TestByteCorruptions(t *testing.T) {
	data := write(t, allValues()[:8], allTensors(rand.New(rand.NewPCG(7, 8)))[:3])
	buf := make([]byte, len(data))
	for i := range data {
		for _, b := range []byte{0x00, 0x01, 0x7f, 0x80, 0xff, data[i] ^ 0x10} {
			copy(buf, data)
			buf[i] = b
			f, err := Parse(buf)
			if err != nil {
				if _, ok := errors.AsType[*Error](err); !ok {
					t.Fatalf("byte %d = %#x: error %T %v", i, b, err, err)
				}
				continue
			}
			checkTensors(t, f)
		}
	}
}
