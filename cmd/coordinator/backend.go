package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"

	"github.com/strata-llm/strata/coordinator"
	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/gguf"
)

// backend is where serve's batches go: the cluster (gossip, gRPC,
// placement, the persisted epoch, from coordinator.Cluster) and the shards
// it runs in this process, which reach it over gRPC like remote `shard join`
// shards do.
type backend struct {
	c     *coordinator.Cluster
	local *localShards // nil without --local-shards
}

// newBackend opens the cluster's store in dataDir, binds its listeners and
// the local shards' (which load modelPath); run serves them. f and m are
// modelPath opened. The cluster's lifecycle log records are also recorded
// in hist (nil: not recorded).
func newBackend(cfg serveConfig, dataDir, modelPath string, f *gguf.File, m *model.Model, maxBatchTokens int, hist *coordinator.History) (*backend, error) {
	sha, err := coordinator.FileSHA256(modelPath)
	if err != nil {
		return nil, err
	}
	shape, err := coordinator.ShapeFromModel(f, m, sha, cfg.KVType, cpu.DefaultBlockSize, maxBatchTokens)
	if err != nil {
		return nil, err
	}
	cc := coordinator.DefaultClusterConfig()
	cc.GossipAddr, cc.GRPCAddr, cc.DataDir = cfg.Gossip, cfg.GRPC, dataDir
	cc.MinShards, cc.ModelPath, cc.Shape, cc.KVMemory = cfg.MinShards, modelPath, shape, cfg.KVMemory
	cc.PlacementMix = cfg.PlacementMix
	if cfg.Private {
		cc.LeaveTimeout = 0 // nobody outside this process to tell
	}
	cc.Secure = !cfg.Insecure
	cc.Log = cfg.Log // the cluster adds its component
	if hist != nil {
		cc.Log = slog.New(hist.LogHandler(cfg.Log.Handler()))
	}
	c, err := coordinator.NewCluster(cc)
	if err != nil {
		return nil, err
	}
	b := &backend{c: c}
	if cfg.LocalShards > 0 {
		host, _, _ := net.SplitHostPort(cfg.Gossip) // checked by NewCluster
		lc := localConfig{
			Shards: cfg.LocalShards, Coordinator: c.GossipAddr(), Host: host, Model: modelPath, SHA256: sha,
			DataDir: dataDir, Threads: cfg.Threads, KVMemory: cfg.KVMemory, Log: cfg.Log,
			Devices: cfg.Devices, CUDALibDir: cfg.CUDALibDir,
		}
		if a := c.Authority(); a != nil {
			lc.Issuer = a
		}
		b.local, err = newLocalShards(lc)
		if err != nil {
			b.discard()
			return nil, err
		}
	}
	return b, nil
}

// run serves the cluster and the local shards until ctx ends.
func (b *backend) run(ctx context.Context) error {
	var wg sync.WaitGroup
	var clusterErr, localErr error
	wg.Go(func() { clusterErr = b.c.Run(ctx) })
	if b.local != nil {
		wg.Go(func() { localErr = b.local.run(ctx) })
	}
	wg.Wait()
	return errors.Join(clusterErr, localErr)
}

// discard closes a backend that will not serve: run on a cancelled context
// closes what newBackend opened.
func (b *backend) discard() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = b.run(ctx)
}

// views returns the cluster view and stage timings the server reports: the
// cluster's, with the local shards' KV read from the shards themselves.
func (b *backend) views(eng *coordinator.Engine) (func() coordinator.ClusterView, func() []coordinator.StageTiming) {
	if b.local == nil {
		return b.c.View, nil
	}
	lv := coordinator.NewLocalView(coordinator.LocalViewConfig{Engine: eng, Cluster: b.c.View, Shards: b.local.stats})
	return lv.View, lv.StageTimings
}

// kvBlocks describes each shard's KV blocks for the throughput log line.
func kvBlocks(view func() coordinator.ClusterView) string {
	var kv []string
	for _, s := range view().Shards {
		kv = append(kv, fmt.Sprintf("%s: %d/%d", s.ShardID, s.KVUsed, s.KVTotal))
	}
	return strings.Join(kv, ", ")
}
