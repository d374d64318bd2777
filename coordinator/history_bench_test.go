package coordinator

import (
	"testing"
	"time"
)

// BenchmarkHistorySample is what the status page costs the coordinator
// when no one watches it: the one sample a second Server.Run takes (engine
// stats, two histogram reads, the cluster view of a loaded three-stage
// cluster with a spare and a lost shard) and its push into the ring. The
// page itself and /v1/cluster/history cost only when requested.
func BenchmarkHistorySample(b *testing.B) {
	info := testInfo(b)
	eng, err := NewEngine(DefaultEngineConfig(), newFakePipeline(info.Vocab, 256))
	if err != nil {
		b.Fatal(err)
	}
	view, _ := statusFixture(time.Now())
	srv := NewServer(ServerConfig{View: func() ClusterView { return view }}, eng, info, nil)
	sp := &sampler{s: srv}
	now := time.Now()
	sp.sample(now)
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Second)
		srv.hist.addSample(sp.sample(now))
	}
}
