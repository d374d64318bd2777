package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/strata-llm/strata/coordinator"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/shard"
)

// localConfig describes the shards serve runs inside its own process.
type localConfig struct {
	Shards int
	// Coordinator is the cluster's gossip address (Cluster.GossipAddr); its
	// host is also what the shards advertise.
	Coordinator string
	// Host is the interface the shards bind, on ephemeral ports: the host of
	// the coordinator's --gossip ("" for every interface).
	Host     string
	Model    string // the GGUF file every shard loads (checked by SHA-256 as usual)
	SHA256   string // Model's, as the coordinator hashed it: the shards need not read it again
	DataDir  string // shard i keeps its node identity in DataDir/local-shard-i
	Threads  int    // workers of the one pool the shards share
	KVMemory int64  // bytes of KV cache each shard offers
	// Devices: shard i computes on Devices[i] (the last repeated; none:
	// cpu); CUDALibDir is searched first for NVRTC.
	Devices    []string
	CUDALibDir string
	// Issuer gives each shard its certificate (the cluster's authority);
	// nil runs them plaintext, like the cluster (--insecure).
	Issuer shard.Issuer
	Log    *slog.Logger
}

// localShards are shard.Nodes run inside the coordinator's process. Each
// joins the coordinator's gossip, registers and serves its stage over gRPC
// like any `shard join`, on ephemeral ports; all of them compute on one
// worker pool.
type localShards struct {
	nodes []*shard.Node
	pool  *cpu.Pool
	cfg   localConfig
	cal   *shard.SharedCalibration // one pool: one measurement for all
}

// newLocalShards opens each shard's data dir and binds its stage endpoint;
// run serves them (call it, with a cancelled context if need be: it closes
// what this opened).
func newLocalShards(cfg localConfig) (*localShards, error) {
	advertise, _, err := net.SplitHostPort(cfg.Coordinator)
	if err != nil {
		return nil, fmt.Errorf("local shards: coordinator gossip address %q: %w", cfg.Coordinator, err)
	}
	l := &localShards{pool: cpu.NewPool(cfg.Threads), cfg: cfg, cal: &shard.SharedCalibration{}}
	for i := range cfg.Shards {
		n, err := l.newNode(i, advertise)
		if err != nil {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_ = l.run(ctx) // closes the nodes made so far and the pool
			return nil, fmt.Errorf("local shard %d: %w", i, err)
		}
		l.nodes = append(l.nodes, n)
	}
	return l, nil
}

// newNode makes local shard i (not run), advertising host advertise.
func (l *localShards) newNode(i int, advertise string) (*shard.Node, error) {
	cfg := l.cfg
	sc := shard.DefaultConfig()
	sc.Coordinator, sc.Model, sc.ModelSHA256 = cfg.Coordinator, cfg.Model, cfg.SHA256
	sc.Gossip, sc.GRPC = net.JoinHostPort(cfg.Host, "0"), net.JoinHostPort(cfg.Host, "0")
	sc.Advertise = advertise
	sc.DataDir = filepath.Join(cfg.DataDir, fmt.Sprintf("local-shard-%d", i))
	sc.Name = fmt.Sprintf("local-%d", i)
	sc.Pool, sc.KVMemory, sc.SharedCalibration = l.pool, cfg.KVMemory, l.cal
	if len(cfg.Devices) > 0 {
		sc.Device = cfg.Devices[min(i, len(cfg.Devices)-1)]
	}
	sc.CUDALibDir = cfg.CUDALibDir
	sc.Issuer, sc.Insecure = cfg.Issuer, cfg.Issuer == nil
	// No gossip leave: the shards stop when the coordinator in this
	// process does, and announcing it to a cluster that is going away
	// only slows the shutdown. Retries within 1 s: the coordinator is
	// reached over loopback.
	sc.LeaveTimeout, sc.MaxBackoff = 0, time.Second
	sc.Logger = cfg.Log.With("local_shard", i)
	return shard.New(sc)
}

// run runs every node until ctx ends and they have left the cluster, then
// closes the pool.
func (l *localShards) run(ctx context.Context) error {
	errs := make([]error, len(l.nodes))
	var wg sync.WaitGroup
	for i, n := range l.nodes {
		wg.Go(func() {
			if err := n.Run(ctx); err != nil {
				errs[i] = fmt.Errorf("local shard %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	l.pool.Close()
	return errors.Join(errs...)
}

// stats snapshots every node for the coordinator's view and metrics.
func (l *localShards) stats() []coordinator.LocalShard {
	out := make([]coordinator.LocalShard, len(l.nodes))
	for i, n := range l.nodes {
		s := n.Stats()
		out[i] = coordinator.LocalShard{ShardID: s.ShardID, BlocksUsed: s.BlocksUsed, BlocksTotal: s.BlocksTotal,
			Sequences: s.Sequences, InvariantOK: s.InvariantOK, Batches: s.Batches, Busy: s.Busy}
	}
	return out
}
