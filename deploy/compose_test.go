package deploy

import (
	"testing"
	"time"
)

// TestCompose runs test-compose.sh: static binaries, scratch images, a
// coordinator and two shards under docker compose, greedy output, a killed
// and restarted shard, teardown. It needs Docker and takes minutes, so it
// runs only with STRATA_DOCKER_TESTS=1.
func TestCompose(t *testing.T) {
	runDockerScript(t, "test-compose.sh", 15*time.Minute)
}
