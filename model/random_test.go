package model

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/strata-llm/strata/model/gguf"
)

// TestWriteRandomFile checks that the file holds exactly WriteRandom's bytes,
// loads as a model, and that no temporary file is left beside it.
func TestWriteRandomFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.gguf")
	spec := DemoSpec()
	if err := WriteRandomFile(path, spec); err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	if err := WriteRandom(&want, spec); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("file has %d bytes, WriteRandom %d (or they differ)", len(got), want.Len())
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := Load(f); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("%d entries in the directory, want the model alone", len(ents))
	}
	if err := WriteRandomFile(filepath.Join(dir, "missing", "m.gguf"), spec); err == nil {
		t.Fatal("no error for a missing directory")
	}
}
