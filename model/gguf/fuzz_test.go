package gguf

import (
	"bytes"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// fuzzing reports whether the test binary runs with -test.fuzz, when large
// seeds would slow every mutation down.
func fuzzing() bool {
	f := flag.Lookup("test.fuzz")
	return f != nil && f.Value.String() != ""
}

// shrink returns a small file with the shape of a real one: each array cut
// to its first few elements and the first few tensors cut to one block.
func shrink(f *File) ([]byte, error) {
	kvs := make([]KV, len(f.KV))
	for i, kv := range f.KV {
		kvs[i] = KV{kv.Key, truncateArray(kv.Value, 8)}
	}
	var ts []WriteTensor
	for _, t := range f.Tensors[:min(4, len(f.Tensors))] {
		n := t.Type.TypeSize()
		ts = append(ts, WriteTensor{Name: t.Name, Type: t.Type, Dims: []uint64{uint64(t.Type.BlockSize())}, Data: t.Data[:n]})
	}
	var buf bytes.Buffer
	err := Write(&buf, kvs, ts)
	return buf.Bytes(), err
}

func truncateArray(v any, n int) any {
	switch s := v.(type) {
	case []string:
		return s[:min(n, len(s))]
	case []float32:
		return s[:min(n, len(s))]
	case []int32:
		return s[:min(n, len(s))]
	case []uint32:
		return s[:min(n, len(s))]
	}
	return v
}

// addSeeds adds generated files and files derived from the shared ones.
func addSeeds(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte(header(3, 0, 0)))
	f.Add([]byte(header(2, 0, 1).kvU32(KeyAlignment, 64)))
	f.Add([]byte(deepArray(3)))
	f.Add([]byte(header(3, 2, 0).tensor("a", 0, 0, 4).tensor("b", 2, 32, 32).data(32 + 18)))
	rng := rand.New(rand.NewPCG(9, 10))
	f.Add(write(f, allValues(), nil))
	f.Add(write(f, allValues()[:6], allTensors(rng)[:2]))
	f.Add(write(f, []KV{{KeyAlignment, uint8(8)}, {"a", []any{[]string{"x"}}}}, allTensors(rng)[3:5]))

	paths, _ := filepath.Glob(filepath.Join(sharedDir, "models", "*.gguf"))
	more, _ := filepath.Glob(filepath.Join(sharedDir, "tokenizers", "*.gguf"))
	for _, path := range append(paths, more...) {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		if !fuzzing() {
			f.Add(data) // whole files: once each in plain go test
		}
		f.Add(data[:min(len(data), 4096)])
		pf, err := Parse(data)
		if err != nil {
			f.Fatalf("%s: %v", path, err)
		}
		small, err := shrink(pf)
		if err != nil {
			f.Fatalf("shrink %s: %v", path, err)
		}
		f.Add(small)
	}
}

// FuzzParse checks that Parse never panics, that every error is an *Error,
// and that whatever parses is consistent and survives a Write/Parse round
// trip byte for byte.
func FuzzParse(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		pf, err := Parse(data)
		if err != nil {
			if _, ok := errors.AsType[*Error](err); !ok {
				t.Fatalf("error %T is not *Error: %v", err, err)
			}
			return
		}
		checkTensors(t, pf)
		for _, kv := range pf.KV {
			// None of these may panic, whatever the value's type.
			pf.String(kv.Key)
			pf.Uint(kv.Key)
			pf.Int(kv.Key)
			pf.Float(kv.Key)
			pf.Bool(kv.Key)
			pf.Strings(kv.Key)
			pf.Float32s(kv.Key)
			pf.Int32s(kv.Key)
		}
		w1 := rewrite(t, pf)
		pf2, err := Parse(w1)
		if err != nil {
			t.Fatalf("reparse of rewritten file: %v", err)
		}
		if w2 := rewrite(t, pf2); !bytes.Equal(w1, w2) {
			t.Fatalf("rewrite is not stable: %d bytes, then %d", len(w1), len(w2))
		}
	})
}

func rewrite(t *testing.T, f *File) []byte {
	t.Helper()
	ts := make([]WriteTensor, len(f.Tensors))
	for i, tn := range f.Tensors {
		ts[i] = WriteTensor{Name: tn.Name, Type: tn.Type, Dims: tn.Dims, Data: tn.Data}
	}
	var buf bytes.Buffer
	if err := Write(&buf, f.KV, ts); err != nil {
		t.Fatalf("Write of a parsed file: %v", err)
	}
	return buf.Bytes()
}
