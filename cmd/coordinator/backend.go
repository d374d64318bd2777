package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/strata-llm/strata/coordinator"
	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/gguf"
)

// backend is where serve's batches go: shards in this process, or remote
// `shard join` shards behind the cluster.
type backend struct {
	pipe     coordinator.Pipeline
	run      func(ctx context.Context) error
	ready    func() error
	views    func(*coordinator.Engine) (func() coordinator.ClusterView, func() []coordinator.StageTiming)
	kvBlocks func() string // for the throughput log line
	epoch    uint64
	firstSeq uint64 // 0: the scheduler's default
	attrs    []any  // for the "serving" log line
	close    func()
}

// localBackend runs cfg.LocalShards stages in this process on one worker pool.
func localBackend(cfg serveConfig, m *model.Model) (*backend, error) {
	pool := cpu.NewPool(cfg.Threads)
	local, err := newLocal(m, localConfig{Shards: cfg.LocalShards, Pool: pool, KVMemory: cfg.KVMemory, KVType: cfg.KVType})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &backend{
		pipe:  local,
		run:   local.Run,
		ready: func() error { return nil },
		views: func(eng *coordinator.Engine) (func() coordinator.ClusterView, func() []coordinator.StageTiming) {
			lv := coordinator.NewLocalView(coordinator.LocalViewConfig{
				Engine: eng, Device: "cpu", CPUCores: uint32(pool.Workers()),
				Stages: func() []coordinator.LocalStage { return localStages(local) },
			})
			return lv.View, lv.StageTimings
		},
		kvBlocks: func() string {
			var kv []string
			for _, s := range local.StageStats() {
				kv = append(kv, fmt.Sprintf("shard %d: %d/%d", s.Stage, s.BlocksUsed, s.BlocksTotal))
			}
			return strings.Join(kv, ", ")
		},
		// Without the cluster's store there is nothing persisted: Unix
		// milliseconds still increase from one start to the next.
		epoch: uint64(time.Now().UnixMilli()),
		attrs: []any{"local_shards", cfg.LocalShards, "kv_blocks", local.Blocks(), "threads", pool.Workers()},
		close: pool.Close,
	}, nil
}

// clusterBackend serves through remote shards: gossip, gRPC, placement and
// the persisted epoch come from coordinator.Cluster.
func clusterBackend(cfg serveConfig, f *gguf.File, m *model.Model, maxBatchTokens int) (*backend, error) {
	sha, err := coordinator.FileSHA256(cfg.Model)
	if err != nil {
		return nil, err
	}
	shape, err := coordinator.ShapeFromModel(f, m, sha, cfg.KVType, cpu.DefaultBlockSize, maxBatchTokens)
	if err != nil {
		return nil, err
	}
	cc := coordinator.DefaultClusterConfig()
	cc.GossipAddr, cc.GRPCAddr, cc.DataDir = cfg.Gossip, cfg.GRPC, cfg.DataDir
	cc.MinShards, cc.ModelPath, cc.Shape, cc.KVMemory = cfg.MinShards, cfg.Model, shape, cfg.KVMemory
	cc.Log = cfg.Log.With("component", "cluster")
	c, err := coordinator.NewCluster(cc)
	if err != nil {
		return nil, err
	}
	return &backend{
		pipe:  c.Pipeline(),
		run:   c.Run,
		ready: c.Ready,
		views: func(*coordinator.Engine) (func() coordinator.ClusterView, func() []coordinator.StageTiming) {
			return c.View, nil
		},
		kvBlocks: func() string {
			var kv []string
			for _, s := range c.View().Shards {
				kv = append(kv, fmt.Sprintf("%s: %d/%d", s.ShardID, s.KVUsed, s.KVTotal))
			}
			return strings.Join(kv, ", ")
		},
		epoch:    c.Epoch(),
		firstSeq: c.FirstSeq(),
		attrs:    []any{"min_shards", cfg.MinShards, "gossip", cfg.Gossip, "grpc", c.GRPCAddr(), "data_dir", cfg.DataDir},
		close:    func() {},
	}, nil
}
