package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// restartView is the part of GET /v1/cluster the restart test reads.
type restartView struct {
	Epoch     uint64 `json:"epoch"`
	Placement uint64 `json:"placement_version"`
	Ready     bool   `json:"ready"`
	Live      int    `json:"live_sequences"`
}

func (c *e2eCluster) view(t *testing.T) (restartView, error) {
	t.Helper()
	resp, err := http.Get("http://" + c.api + "/v1/cluster")
	if err != nil {
		return restartView{}, err
	}
	defer resp.Body.Close()
	var v restartView
	if resp.StatusCode != 200 {
		return v, fmt.Errorf("/v1/cluster: %s", resp.Status)
	}
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

// metricWith reads the sum of the samples of name whose labels include
// label (e.g. `reason="epoch"`; "" for every sample).
func metricWith(t *testing.T, addr, name, label string) (float64, bool) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var sum float64
	found := false
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || !(strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			continue
		}
		if label != "" {
			labels, _, _ := strings.Cut(rest, "}")
			if !strings.Contains(labels, label) {
				continue
			}
		}
		var v float64
		fields := strings.Fields(line)
		fmt.Sscan(fields[len(fields)-1], &v)
		sum += v
		found = true
	}
	return sum, found
}

// shardMetric reads a metric of shard i, failing the test if it is absent.
func (c *e2eCluster) shardMetric(t *testing.T, i int, name, label string) float64 {
	t.Helper()
	v, ok := metricWith(t, c.shardMets[i], name, label)
	if !ok {
		t.Fatalf("shard %d: no %s{%s} on /metrics", i, name, label)
	}
	return v
}

// waitShards polls every live shard's /metrics until cond holds for each,
// or fails after d.
func (c *e2eCluster) waitShards(t *testing.T, d time.Duration, what string, cond func(i int) bool) {
	t.Helper()
	deadline := time.Now().Add(guard(d))
	for i, p := range c.shards {
		if p.exited() {
			continue
		}
		for !cond(i) {
			if time.Now().After(deadline) {
				t.Fatalf("shard %d: %s not reached within %v", i, what, guard(d))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// checkShardsIdle is how every cluster test ends: on every live shard no
// KV block is used and the invariant gauge is 1.
func (c *e2eCluster) checkShardsIdle(t *testing.T) {
	t.Helper()
	c.waitShards(t, 5*time.Second, "blocks used 0 and invariant ok", func(i int) bool {
		used, ok1 := metric(t, c.shardMets[i], "strata_kv_blocks_used")
		inv, ok2 := metric(t, c.shardMets[i], "strata_kv_invariant_ok")
		return ok1 && ok2 && used == 0 && inv == 1
	})
}

// TestE2ECoordinatorRestart: SIGKILL the coordinator while shards hold KV
// for streams in flight, start it again with the same --data-dir, --gossip
// and --grpc. The epoch increases; the shards re-register on their own and
// free every sequence of the old epoch (reason epoch); the placement comes
// back under a new version; greedy output is what it was; no sequence of
// the old epoch is served (the old streams end, and the shards hold no
// sequence before new work arrives).
func TestE2ECoordinatorRestart(t *testing.T) {
	coordBin, _ := binaries(t)
	grpcAddr := freeAddr(t)
	c := &e2eCluster{t: t, api: freeAddr(t), gossip: freeAddr(t), dataDir: t.TempDir()}
	_, c.shardBin = binaries(t)
	args := []string{"serve", "--model", stories, "--listen", c.api, "--gossip", c.gossip, "--grpc", grpcAddr,
		"--min-shards", "2", "--data-dir", c.dataDir, "--threads", "1", "--kv-memory", "8MiB"}
	c.coord = start(t, "coordinator", coordBin, args...)
	c.addShard()
	c.addShard()
	waitReady(t, "http://"+c.api+"/readyz", 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), guard(50*time.Second))
	defer cancel()
	text, _, err := c.complete(ctx, "Once upon a time", 64, false)
	if err != nil || text != onceUponATime {
		t.Fatalf("before the restart: %q, %v", text, err)
	}
	before, err := c.view(t)
	if err != nil || before.Epoch == 0 || before.Placement == 0 {
		t.Fatalf("/v1/cluster before the restart: %+v, %v", before, err)
	}
	epochFreed := make([]float64, len(c.shards))
	for i := range c.shards {
		epochFreed[i] = c.shardMetric(t, i, "strata_sequences_freed_total", `reason="epoch"`)
	}

	// Streams in flight, holding KV on both shards.
	const streams = 4
	ended := make(chan error, streams)
	for range streams {
		go func() {
			_, _, err := c.complete(ctx, "Once upon a time", 400, true)
			ended <- err
		}()
	}
	c.waitShards(t, 10*time.Second, "KV in use by the streams", func(i int) bool {
		used, _ := metric(t, c.shardMets[i], "strata_kv_blocks_used")
		return used > 0
	})

	// Crash and restart the coordinator on the same addresses and data dir.
	c.coord.cmd.Process.Signal(syscall.SIGKILL)
	<-c.coord.done
	killed := time.Now()
	for range streams {
		select {
		case err := <-ended:
			if err == nil {
				t.Error("a stream of the killed coordinator completed")
			}
		case <-ctx.Done():
			t.Fatal("a stream hung after the coordinator was killed")
		}
	}
	t.Logf("streams ended %v after the kill", time.Since(killed).Round(time.Millisecond))
	restarted := time.Now()
	c.coord = start(t, "coordinator (restarted)", coordBin, args...)

	// The shards rejoin and free everything older without a manual step.
	c.waitShards(t, 30*time.Second, "sequences of the old epoch freed", func(i int) bool {
		seqs, ok1 := metric(t, c.shardMets[i], "strata_kv_sequences")
		used, ok2 := metric(t, c.shardMets[i], "strata_kv_blocks_used")
		return ok1 && ok2 && seqs == 0 && used == 0
	})
	t.Logf("old epoch's sequences freed %v after the restart", time.Since(restarted).Round(time.Millisecond))
	waitReady(t, "http://"+c.api+"/readyz", 30*time.Second)
	t.Logf("service resumed %v after the restart", time.Since(restarted).Round(time.Millisecond))
	after, err := c.view(t)
	if err != nil {
		t.Fatal(err)
	}
	if after.Epoch <= before.Epoch {
		t.Fatalf("epoch %d after the restart, %d before: want it to increase", after.Epoch, before.Epoch)
	}
	if after.Placement <= before.Placement || !after.Ready {
		t.Fatalf("placement after the restart: %+v (before %+v)", after, before)
	}
	if after.Live != 0 {
		t.Fatalf("the restarted coordinator believes %d sequences live before any request", after.Live)
	}
	for i := range c.shards {
		if got := c.shardMetric(t, i, "strata_sequences_freed_total", `reason="epoch"`); got <= epochFreed[i] {
			t.Errorf("shard %d: strata_sequences_freed_total{reason=epoch} %v, was %v: the old sequences were not freed by the new epoch", i, got, epochFreed[i])
		}
		if got := c.shardMetric(t, i, "strata_kv_sequences", ""); got != 0 {
			t.Errorf("shard %d holds %v sequences before the new epoch's first request", i, got)
		}
	}

	text, _, err = c.complete(ctx, "Once upon a time", 64, false)
	if err != nil || text != onceUponATime {
		t.Fatalf("after the restart: %q, %v", text, err)
	}
	if c.coord.exited() {
		t.Fatal("the restarted coordinator exited")
	}
	c.checkShardsIdle(t)
	// The backstop is fully acked once idle.
	deadline := time.Now().Add(guard(5 * time.Second))
	for {
		v, ok := metric(t, c.api, "strata_tombstones_unacked")
		if ok && v == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("strata_tombstones_unacked = %v (found %v), want 0 on every shard", v, ok)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
