package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// mixedView is the part of GET /v1/cluster the mixed test reads.
type mixedView struct {
	Ready     bool   `json:"ready"`
	Placement uint64 `json:"placement_version"`
	Shards    []struct {
		ShardID   string `json:"shard_id"`
		NodeID    string `json:"node_id"`
		Stage     int    `json:"stage"`
		State     string `json:"state"`
		Local     bool   `json:"local"`
		Connected bool   `json:"connected"`
	} `json:"shards"`
}

func readMixedView(api string) (mixedView, error) {
	var v mixedView
	resp, err := http.Get("http://" + api + "/v1/cluster")
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("/v1/cluster: %s", resp.Status)
	}
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

// localNode returns the node ID of the one local shard of a ready 2-stage
// pipeline whose other stage is remote, failing the test otherwise.
func localNode(t *testing.T, api string) string {
	t.Helper()
	v, err := readMixedView(api)
	if err != nil {
		t.Fatal(err)
	}
	var local, remote []string
	stages := map[int]bool{}
	for _, s := range v.Shards {
		if s.Stage < 0 || s.State != "ready" {
			continue
		}
		stages[s.Stage] = true
		if s.Local {
			local = append(local, s.NodeID)
		} else {
			remote = append(remote, s.NodeID)
		}
	}
	if !v.Ready || len(local) != 1 || len(remote) != 1 || !stages[0] || !stages[1] {
		t.Fatalf("want a ready pipeline of one local and one remote stage, got %+v", v)
	}
	return local[0]
}

// TestE2ELocalAndRemoteShards: `coordinator serve --local-shards 1
// --min-shards 2` holds readiness until one `shard join` process joins, then
// serves through a 2-stage pipeline of its local shard and the remote one,
// both over gRPC: greedy text equals the single-process text, and afterwards
// neither holds a KV block (the local one on the coordinator's /metrics, the
// remote one on its own). SIGTERM exits 0; restarted on the same --data-dir,
// the local shard keeps its node ID and the pipeline comes back unchanged.
func TestE2ELocalAndRemoteShards(t *testing.T) {
	coordBin, shardBin := binaries(t)
	c := &e2eCluster{t: t, model: stories, api: freeAddr(t), gossip: freeAddr(t), shardBin: shardBin, dataDir: t.TempDir()}
	grpcAddr := freeAddr(t)
	serveArgs := []string{"serve", "--model", stories, "--listen", c.api, "--gossip", c.gossip, "--grpc", grpcAddr,
		"--local-shards", "1", "--min-shards", "2", "--data-dir", c.dataDir, "--threads", "1", "--kv-memory", "8MiB", "--grace", "1s"}
	c.coord = start(t, "coordinator", coordBin, serveArgs...)

	// The local shard registers and opens its control stream, but the
	// pipeline waits for the remote one. The view is published after the
	// cluster's loop has handled an event and tried to place: once it shows
	// the stream up, a 1-stage pipeline would have been placed, were it
	// wrong to.
	deadline := time.Now().Add(guard(30 * time.Second))
	for {
		v, err := readMixedView(c.api)
		if err == nil && len(v.Shards) == 1 && v.Shards[0].Local && v.Shards[0].Connected {
			if v.Placement != 0 {
				t.Fatalf("placed with 1 of --min-shards 2 joined: %+v", v)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the local shard did not register and connect within %v: %+v, %v", guard(30*time.Second), v, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := http.Get("http://" + c.api + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with 1 of --min-shards 2 joined: %d, want 503", resp.StatusCode)
	}

	c.addShard()
	waitReady(t, "http://"+c.api+"/readyz", 60*time.Second)
	node := localNode(t, c.api)
	ctx, cancel := context.WithTimeout(context.Background(), guard(2*time.Minute))
	defer cancel()
	for _, stream := range []bool{false, true} {
		text, _, err := c.complete(ctx, "Once upon a time", 64, stream)
		if err != nil || text != onceUponATime {
			t.Fatalf("stream %v, through a local and a remote shard: %q, %v\nwant %q", stream, text, err, onceUponATime)
		}
	}
	c.checkShardsIdle(t)
	waitIdle := func() {
		t.Helper()
		deadline := time.Now().Add(guard(5 * time.Second))
		for {
			used, ok1 := metric(t, c.api, "strata_kv_blocks_used")
			inv, ok2 := metric(t, c.api, "strata_kv_invariant_ok")
			if ok1 && ok2 && used == 0 && inv == 1 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the local shard on the coordinator's /metrics: blocks used %v (found %v), invariant ok %v (found %v)", used, ok1, inv, ok2)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitIdle()

	// SIGTERM drains and exits 0; the local shard leaves with the process.
	if err := c.coord.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.coord.done:
	case <-time.After(guard(15 * time.Second)):
		t.Fatalf("the coordinator did not exit within %v of SIGTERM", guard(15*time.Second))
	}
	if code := c.coord.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}

	c.coord = start(t, "coordinator-restarted", coordBin, serveArgs...)
	waitReady(t, "http://"+c.api+"/readyz", 60*time.Second)
	if again := localNode(t, c.api); again != node {
		t.Errorf("the local shard's node ID changed across a restart on the same --data-dir: %s, then %s", node, again)
	}
	text, _, err := c.complete(ctx, "Once upon a time", 64, false)
	if err != nil || text != onceUponATime {
		t.Fatalf("after the restart: %q, %v", text, err)
	}
	c.checkShardsIdle(t)
	waitIdle()
}
