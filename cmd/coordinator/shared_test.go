package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
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

// guard stretches a hang guard. The durations these tests give their
// contexts are several times what an idle 2-core machine needs; a machine
// running other jobs (CI beside two CPU hogs, or helpers' builds) runs the
// same requests five times slower under the race detector — a Mistral
// tool-call loop of twelve 1,800-token prompts took 80 s at load average
// 13 and failed its one-minute guard. A guard is there to end a hang, not
// to time the product, so it gets five times its figure, at most five
// minutes (and never less than the figure).
func guard(d time.Duration) time.Duration {
	return max(d, min(5*d, 5*time.Minute))
}
