package deploy

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestCompose runs test-compose.sh: static binaries, scratch images, a
// coordinator and two shards under docker compose, greedy output, a killed
// and restarted shard, teardown. It needs Docker and takes minutes, so it
// runs only with STRATA_DOCKER_TESTS=1.
func TestCompose(t *testing.T) {
	if os.Getenv("STRATA_DOCKER_TESTS") != "1" {
		t.Skip("set STRATA_DOCKER_TESTS=1 to run the docker compose cluster test")
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
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "test-compose.sh", model)
	// The script cleans up on SIGTERM; give it time before the kill.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	cmd.Env = append(os.Environ(), "STRATA_TEST_TIMEOUT=840")
	out, err := cmd.CombinedOutput()
	t.Logf("test-compose.sh:\n%s", out)
	if err != nil {
		t.Fatalf("test-compose.sh: %v", err)
	}
}
