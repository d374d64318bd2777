package gguf

import (
	"os"
	"path/filepath"
	"testing"
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
