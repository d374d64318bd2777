package gguf

import (
	"os"
	"testing"
)

// TestParseHeader: the header alone gives every tensor's absolute offset
// and size, as Parse of the whole file does.
func TestParseHeader(t *testing.T) {
	const path = "../../../shared/models/stories260K.gguf"
	raw, err := os.ReadFile(path)
	if err != nil {
		sharedAbsent(t, path, err)
	}
	full, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	h, err := ParseHeader(raw[:full.DataOffset])
	if err != nil {
		t.Fatal(err)
	}
	if h.DataOffset != full.DataOffset || len(h.Tensors) != len(full.Tensors) {
		t.Fatalf("header: data offset %d, %d tensors; file: %d, %d", h.DataOffset, len(h.Tensors), full.DataOffset, len(full.Tensors))
	}
	for i, ft := range full.Tensors {
		ht := h.Tensors[i]
		if ht.Name != ft.Name || ht.Offset != ft.Offset || ht.Size() != uint64(len(ft.Data)) || ht.Data != nil {
			t.Fatalf("tensor %s: header offset %d size %d, file offset %d size %d", ft.Name, ht.Offset, ht.Size(), ft.Offset, len(ft.Data))
		}
	}
	if _, err := Parse(raw[:full.DataOffset]); err == nil {
		t.Fatal("Parse accepted a header without its tensor data")
	}
	if _, err := ParseHeader(raw[:full.DataOffset/2]); err == nil {
		t.Fatal("ParseHeader accepted half a header")
	}
}
