package deploy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
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

// runDockerScript runs one of this folder's docker test scripts on the
// shared stories260K (or $STRATA_MODEL) within limit, and fails with its
// output when it fails. The scripts need Docker and take minutes, so they
// run only with STRATA_DOCKER_TESTS=1.
func runDockerScript(t *testing.T, script string, limit time.Duration) {
	if os.Getenv("STRATA_DOCKER_TESTS") != "1" {
		t.Skipf("set STRATA_DOCKER_TESTS=1 to run %s", script)
	}
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skipf("docker absent: %v", err)
	}
	if err := exec.Command("docker", "info").Run(); err != nil {
		t.Skipf("docker daemon unreachable: %v", err)
	}
	model := "../../shared/models/stories260K.gguf"
	if m := os.Getenv("STRATA_MODEL"); m != "" {
		model = m
	}
	if _, err := os.Stat(model); err != nil {
		sharedAbsent(t, model, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script, model)
	// The scripts clean up on SIGINT; give them time before the kill.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	// The script's own deadline falls a minute before the test's.
	cmd.Env = append(os.Environ(), fmt.Sprintf("STRATA_TEST_TIMEOUT=%d", int((limit-time.Minute).Seconds())))
	out, err := cmd.CombinedOutput()
	t.Logf("%s:\n%s", script, out)
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
}
