//go:build linux

package cpu

import (
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

// residentAt returns the resident bytes of the mapping that starts at
// address base (gguf.MappingResident); without smaps the test skips.
func residentAt(t *testing.T, base uintptr) int {
	t.Helper()
	n, err := gguf.MappingResident(base)
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("no smaps: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPrepareReleasesFilePages: once Prepare has repacked a mapped model's
// matrices, their file pages leave the process's resident set (the mapping
// keeps little more than the tensors that are not repacked), and the
// stored matrices still read their bytes.
func TestPrepareReleasesFilePages(t *testing.T) {
	if panelsFor(ggml.Q8_0) == nil {
		t.Skip("Q8_0: no panel kernels on this CPU")
	}
	path := filepath.Join(t.TempDir(), "m.gguf")
	spec := model.RandomSpec{Layers: 1, Embd: 256, Heads: 4, HeadsKV: 4, FF: 256, Vocab: 512, Context: 64, Type: ggml.Q8_0, Seed: 3}
	if err := model.WriteRandomFile(path, spec); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	t0 := f.Tensors[0]
	base := uintptr(unsafe.Pointer(unsafe.SliceData(t0.Data))) - uintptr(t0.Offset)
	var mats []*model.Weight
	for i := range m.LayerWeights {
		mats = append(mats, m.LayerWeights[i].Matrices()...)
	}
	mats = append(mats, m.Output)
	sums := map[*model.Weight]uint32{}
	var bytes int
	for _, w := range mats {
		sums[w] = crc32.ChecksumIEEE(w.Data) // reads every page
		bytes += len(w.Data)
	}
	before := residentAt(t, base)
	if before < bytes {
		t.Fatalf("%d bytes of the mapping resident after reading %d bytes of matrices", before, bytes)
	}
	pool := NewPool(1)
	defer pool.Close()
	be := NewBackend(pool)
	for _, w := range mats {
		be.Prepare(w)
	}
	after := residentAt(t, base)
	t.Logf("mapping resident: %d bytes before Prepare, %d after; matrices %d bytes, file %d", before, after, bytes, fileSize(t, path))
	if after > before-bytes*9/10 {
		t.Fatalf("%d bytes of the mapping resident after repacking %d bytes of matrices (%d before)", after, bytes, before)
	}
	for _, w := range mats {
		if crc32.ChecksumIEEE(w.Data) != sums[w] {
			t.Fatalf("%s reads other bytes after its pages were released", w.Name)
		}
	}
}

func fileSize(t *testing.T, path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}
