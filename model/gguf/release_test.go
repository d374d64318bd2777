//go:build linux

package gguf

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/strata-llm/strata/model/ggml"
)

// mappingRSS returns the resident bytes of the mapping that starts at
// b's first byte (gguf.MappingResident); without smaps the test skips.
func mappingRSS(t *testing.T, b []byte) int {
	t.Helper()
	n, err := MappingResident(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("no smaps: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReleaseDropsPagesKeepsBytes: Release of an opened file's tensor takes
// its pages out of the process's resident set (smaps) while the tensor
// still reads its bytes; memory that is no live mapping of Open's (a heap
// copy, a File from Parse, a closed File's old view) is left alone.
func TestReleaseDropsPagesKeepsBytes(t *testing.T) {
	const n = 4 << 20
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i*131 ^ i>>9)
	}
	var buf bytes.Buffer
	if err := Write(&buf, []KV{{"general.architecture", "llama"}}, []WriteTensor{
		{Name: "small", Type: ggml.I8, Dims: []uint64{100}, Data: data[:100]},
		{Name: "big", Type: ggml.I8, Dims: []uint64{n}, Data: data},
	}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	big := f.Tensors[1].Data
	if !bytes.Equal(big, data) {
		t.Fatal("tensor bytes differ from the written ones")
	}
	before := mappingRSS(t, f.data)
	if before < n {
		t.Fatalf("after reading the tensor the mapping has %d bytes resident, want >= %d", before, n)
	}
	got := Release(big)
	page := os.Getpagesize()
	if got < n-2*page || got > n {
		t.Fatalf("Release advised %d bytes of a %d-byte tensor", got, n)
	}
	if after := mappingRSS(t, f.data); after > before-got {
		t.Fatalf("resident %d bytes after releasing %d of %d", after, got, before)
	}
	if !bytes.Equal(big, data) {
		t.Fatal("tensor bytes changed after Release")
	}
	if Release(f.Tensors[0].Data) != 0 {
		t.Fatal("Release dropped pages a 100-byte tensor shares with its neighbours")
	}

	heap := bytes.Clone(data)
	if Release(heap) != 0 || !bytes.Equal(heap, data) {
		t.Fatal("Release touched heap memory")
	}
	parsed, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if Release(parsed.Tensors[1].Data) != 0 || !bytes.Equal(parsed.Tensors[1].Data, data) {
		t.Fatal("Release touched a parsed (unmapped) file")
	}
	g, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	stale := g.Tensors[1].Data
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if Release(stale) != 0 {
		t.Fatal("Release advised about a closed file's mapping")
	}
}
