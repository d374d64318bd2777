package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestE2EWeightStreaming: of two `shard join` processes, one has the model
// file and one has none and streams its range from the coordinator; the
// greedy text is llama.cpp's. After the whole cluster restarts on the same
// data dirs, the second shard loads its range from its cache without
// streaming again.
func TestE2EWeightStreaming(t *testing.T) {
	coordBin, shardBin := binaries(t)
	coordData, withData, withoutData := t.TempDir(), t.TempDir(), t.TempDir()
	api, gossip, grpcAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	withAddrs := []string{freeAddr(t), freeAddr(t)}
	withoutAddrs := []string{freeAddr(t), freeAddr(t)}

	run := func(round int) (coord, with, without *proc) {
		coord = start(t, fmt.Sprintf("coordinator-%d", round), coordBin, "serve", "--model", stories, "--listen", api,
			"--gossip", gossip, "--grpc", grpcAddr, "--min-shards", "2", "--data-dir", coordData,
			"--threads", "1", "--kv-memory", "8MiB")
		// The token joins at the first round; the second reuses the
		// certificates under the data dirs.
		join := append([]string{"join"}, joinArgs(t, coord)...)
		with = start(t, fmt.Sprintf("shard-with-file-%d", round), shardBin, append(join, "--model", stories,
			"--gossip", withAddrs[0], "--grpc", withAddrs[1], "--data-dir", withData, "--threads", "1")...)
		without = start(t, fmt.Sprintf("shard-without-file-%d", round), shardBin, append(slices.Clip(join),
			"--gossip", withoutAddrs[0], "--grpc", withoutAddrs[1], "--data-dir", withoutData, "--threads", "1")...)
		waitReady(t, "http://"+api+"/readyz", 60*time.Second)
		return coord, with, without
	}
	c := &e2eCluster{t: t, api: api}
	ctx, cancel := context.WithTimeout(context.Background(), guard(2*time.Minute))
	defer cancel()

	coord, with, without := run(1)
	text, _, err := c.complete(ctx, "Once upon a time", 64, false)
	if err != nil || text != onceUponATime {
		t.Fatalf("with one streamed shard: %q, %v", text, err)
	}
	if out := without.out.String(); !strings.Contains(out, "streamed weights") {
		t.Fatalf("the shard without the file did not stream:\n%s", tail(out, 3000))
	}
	if out := with.out.String(); strings.Contains(out, "streaming weights") {
		t.Fatalf("the shard with the file streamed:\n%s", tail(out, 3000))
	}
	cached, _ := filepath.Glob(filepath.Join(withoutData, "weights", "*.gguf"))
	if len(cached) != 1 {
		t.Fatalf("cache files %v, want one <sha256>.gguf", cached)
	}
	st, err := os.Stat(cached[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cached %s (%d bytes)", filepath.Base(cached[0]), st.Size())

	// Restart everything on the same data dirs and addresses: the same
	// placement comes back, and the cache serves it. The coordinator goes
	// first: a shard killed under a running coordinator would be a loss,
	// re-placed onto the other shard alone, and that placement restored.
	for _, p := range []*proc{coord, without, with} {
		p.kill()
	}
	_, _, without = run(2)
	text, _, err = c.complete(ctx, "Once upon a time", 64, false)
	if err != nil || text != onceUponATime {
		t.Fatalf("after a restart: %q, %v", text, err)
	}
	out := without.out.String()
	if strings.Contains(out, "streaming weights") || !strings.Contains(out, "weights from cache") {
		t.Fatalf("the restarted shard did not load from its cache:\n%s", tail(out, 3000))
	}
}
