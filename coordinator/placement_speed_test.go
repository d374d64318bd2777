package coordinator

import (
	"strings"
	"testing"

	"github.com/strata-llm/strata/transport/pb"
)

// TestClusterPlacesByCalibration: two shards of equal memory register
// their calibrations, one twice as fast: the fast one holds three of the
// four layers (and the other the head, which it computes cheaper than a
// layer), and /v1/cluster shows both calibrations and the predicted stage
// times.
func TestClusterPlacesByCalibration(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	c := startCluster(t, t.TempDir(), 2, func(cfg *ClusterConfig) { cfg.Shape.Model = sha })
	cal := func(ns uint64) *pb.Calibration {
		return &pb.Calibration{ModelSha256: sha, Layers: 2, Decode1Ns: ns, Decode8Ns: 2 * ns, PrefillNs: 20 * ns, PrefillTokens: 64}
	}
	slow := newFakeShard(t, c.GRPCAddr(), "node-slow", 1, 1<<20)
	slow.cal = cal(200)
	slow.join()
	waitUntil(t, "node-slow connected", func() bool { return connected(c.View(), "node-slow") })
	fast := newFakeShard(t, c.GRPCAddr(), "node-fast", 2, 1<<20)
	fast.cal = cal(100)
	fast.join()
	waitReady(t, c.Cluster)
	fa, _, _, _ := fast.snapshot()
	if len(fa) == 0 || fa[0].GetEndLayer()-fa[0].GetFirstLayer() != 3 {
		t.Fatalf("the fast shard's assigns %v: want 3 of 4 layers", fa)
	}
	v := c.View()
	if v.PlacementMix != string(MixBalanced) {
		t.Fatalf("placement mix %q, want balanced", v.PlacementMix)
	}
	for _, s := range v.Shards {
		if s.Calibration == nil || s.PredictedStageNs <= 0 {
			t.Fatalf("shard %s in the view: calibration %v, predicted %d ns", s.NodeID, s.Calibration, s.PredictedStageNs)
		}
	}
}

// TestClusterIgnoresAnotherModelsCalibration: a calibration of another
// model counts for nothing; placement falls back to memory.
func TestClusterIgnoresAnotherModelsCalibration(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	c := startCluster(t, t.TempDir(), 2, func(cfg *ClusterConfig) { cfg.Shape.Model = sha })
	other := &pb.Calibration{ModelSha256: strings.Repeat("cd", 32), Layers: 2, Decode1Ns: 1, Decode8Ns: 1, PrefillNs: 1, PrefillTokens: 64}
	a := newFakeShard(t, c.GRPCAddr(), "node-a", 1, 1<<20)
	a.cal = other
	a.join()
	waitUntil(t, "node-a connected", func() bool { return connected(c.View(), "node-a") })
	b := newFakeShard(t, c.GRPCAddr(), "node-b", 2, 1<<20)
	b.join()
	waitReady(t, c.Cluster)
	for _, s := range c.View().Shards {
		if s.Calibration != nil || s.End-s.First != 2 {
			t.Fatalf("shard %s: calibration %v, layers [%d,%d): want none and an even split", s.NodeID, s.Calibration, s.First, s.End)
		}
	}
}
