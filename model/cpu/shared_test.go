package cpu_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/gguf"
)

// sharedAbsent is how a test that needs a file of ../shared meets its
// absence (err): it skips, naming the file, or, with
// STRATA_REQUIRE_SHARED=1 (which .ci/run sets where ../shared/models
// exists), fails, so that a test that cannot run never passes for one that
// did.
func sharedAbsent(t testing.TB, path string, err error) {
	t.Helper()
	if abs, aerr := filepath.Abs(path); aerr == nil {
		path = abs
	}
	if os.Getenv("STRATA_REQUIRE_SHARED") == "1" {
		t.Fatalf("STRATA_REQUIRE_SHARED=1, and %s, which this test needs, is absent: %v", path, err)
	}
	t.Skipf("NOT RUN: needs %s: %v (set STRATA_REQUIRE_SHARED=1 to fail instead)", path, err)
}

// openGGUF opens the GGUF file at path for a test, closing it when the test
// ends.
func openGGUF(t testing.TB, path string) *gguf.File {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// openModel opens and loads the GGUF file at path for a test, closing it
// when the test ends.
func openModel(t testing.TB, path string) *model.Model {
	t.Helper()
	m, err := model.Load(openGGUF(t, path))
	if err != nil {
		t.Fatal(err)
	}
	return m
}
