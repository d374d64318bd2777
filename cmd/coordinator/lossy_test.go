package main

import (
	"context"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/strata-llm/strata/coordinator"
	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
	"github.com/strata-llm/strata/shard"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// The tests in this file run a real coordinator.Cluster and real
// shard.Nodes in this process, on loopback, with interceptors that lose
// messages: backstop tombstones and acks on the control streams, heartbeat
// replies, and tombstone-only batches on the stage-0 link, and that delay
// chosen batches.

// lossy decides which messages are lost or delayed. Safe for concurrent use.
type lossy struct {
	mu         sync.Mutex
	rng        *rand.Rand
	dropTombs  float64                  // fraction of backstop Tombstones messages lost
	dropAcks   float64                  // fraction of Acks lost
	dropInBand float64                  // fraction of tombstone-only batches lost
	delay      map[uint64]time.Duration // batch ID → how long its send is held
	lost       map[string]int           // what was lost, by kind

	muteReplies atomic.Bool // lose every heartbeat reply (no lease renewal, no reconcile)
}

func newLossy(seed uint64) *lossy {
	return &lossy{rng: rand.New(rand.NewPCG(seed, 1)), delay: map[uint64]time.Duration{}, lost: map[string]int{}}
}

func (l *lossy) set(tombs, acks, inBand float64) {
	l.mu.Lock()
	l.dropTombs, l.dropAcks, l.dropInBand = tombs, acks, inBand
	l.mu.Unlock()
}

func (l *lossy) drop(kind string, frac func(*lossy) float64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := frac(l)
	if f <= 0 || l.rng.Float64() >= f {
		return false
	}
	l.lost[kind]++
	return true
}

func (l *lossy) count(kind string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost[kind]
}

// control is a server stream interceptor for service Coordinator.
func (l *lossy) control(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !strings.HasSuffix(info.FullMethod, "/Control") {
		return handler(srv, ss)
	}
	return handler(srv, &lossyControl{ServerStream: ss, l: l})
}

type lossyControl struct {
	grpc.ServerStream
	l *lossy
}

func (s *lossyControl) SendMsg(m any) error {
	if cm, ok := m.(*pb.CoordinatorToShard); ok {
		if cm.GetTombstones() != nil && s.l.drop("backstop", func(l *lossy) float64 { return l.dropTombs }) {
			return nil
		}
		if cm.GetHeartbeatReply() != nil && s.l.muteReplies.Load() {
			return nil
		}
	}
	return s.ServerStream.SendMsg(m)
}

func (s *lossyControl) RecvMsg(m any) error {
	for {
		if err := s.ServerStream.RecvMsg(m); err != nil {
			return err
		}
		if sm, ok := m.(*pb.ShardToCoordinator); ok && sm.GetAck() != nil && s.l.drop("ack", func(l *lossy) float64 { return l.dropAcks }) {
			continue
		}
		return nil
	}
}

// link is a client stream interceptor for the coordinator's stage-0 link.
func (l *lossy) link(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &lossyLink{ClientStream: cs, l: l}, nil
}

type lossyLink struct {
	grpc.ClientStream
	l *lossy
}

func (s *lossyLink) SendMsg(m any) error {
	if sm, ok := m.(*pb.StageMessage); ok && sm.GetHeader() != nil {
		h := sm.GetHeader()
		if h.GetBatchId() == 0 && len(h.GetRows()) == 0 && s.l.drop("in_band", func(l *lossy) float64 { return l.dropInBand }) {
			return nil
		}
		s.l.mu.Lock()
		d := s.l.delay[h.GetBatchId()]
		s.l.mu.Unlock()
		time.Sleep(d) // the link's sender holds this batch, and every later one
	}
	return s.ClientStream.SendMsg(m)
}

// lossyCluster is a Cluster and two shard Nodes of stories260K in this
// process.
type lossyCluster struct {
	t     *testing.T
	c     *coordinator.Cluster
	pipe  coordinator.Pipeline
	nodes []*shard.Node
	l     *lossy
	lease time.Duration
	next  uint64 // next batch ID
}

func startLossy(t *testing.T, seed uint64) *lossyCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("in-process cluster on loopback: skipped with -short")
	}
	if _, err := os.Stat(stories); err != nil {
		t.Skipf("model absent: %v", err)
	}
	f, err := gguf.Open(stories)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	sha, err := coordinator.FileSHA256(stories)
	if err != nil {
		t.Fatal(err)
	}
	shape, err := coordinator.ShapeFromModel(f, m, sha, ggml.F16, cpu.DefaultBlockSize, 64)
	if err != nil {
		t.Fatal(err)
	}
	l := newLossy(seed)
	cc := coordinator.DefaultClusterConfig()
	// Ephemeral ports, bound by NewCluster: a port picked free and bound
	// later can be taken in between by any other test process.
	cc.GossipAddr, cc.GRPCAddr, cc.DataDir = "127.0.0.1:0", "127.0.0.1:0", t.TempDir()
	cc.MinShards, cc.ModelPath, cc.Shape, cc.KVMemory = 2, stories, shape, 1<<20
	cc.Heartbeat, cc.Lease = 100*time.Millisecond, 2*time.Second // reconcile within ~1 s, well inside one lease
	cc.LossConfirm = 5 * time.Second
	cc.ServerOptions = []grpc.ServerOption{grpc.ChainStreamInterceptor(l.control)}
	cc.StageDialOptions = []grpc.DialOption{grpc.WithChainStreamInterceptor(l.link)}
	c, err := coordinator.NewCluster(cc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			t.Errorf("cluster: %v", err)
		}
	})
	pipe, err := c.Direct()
	if err != nil {
		t.Fatal(err)
	}
	lc := &lossyCluster{t: t, c: c, pipe: pipe, l: l, lease: cc.Lease, next: 1}
	for range 2 {
		sc := shard.DefaultConfig()
		sc.Insecure = true // the cluster here runs plaintext: these tests are about loss, not trust
		sc.Coordinator, sc.Model = c.GossipAddr(), stories
		sc.Gossip, sc.GRPC = "127.0.0.1:0", "127.0.0.1:0"
		sc.DataDir, sc.Threads = t.TempDir(), 1
		sc.LeaveTimeout, sc.LeaseTick, sc.MaxBackoff = 300*time.Millisecond, 20*time.Millisecond, 200*time.Millisecond
		n, err := shard.New(sc)
		if err != nil {
			t.Fatal(err)
		}
		lc.nodes = append(lc.nodes, n)
		wg.Go(func() {
			if err := n.Run(ctx); err != nil {
				t.Errorf("shard: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		cancel()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }() // waited for below
		select {
		case <-done:
		case <-time.After(guard(20 * time.Second)):
			t.Error("cluster and shards did not stop within 20 s")
		}
	})
	wctx, wcancel := context.WithTimeout(context.Background(), guard(30*time.Second))
	defer wcancel()
	if err := c.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	return lc
}

// nodeMetric reads the sum of a node's samples of name carrying label
// (name="value", or "" for all).
func nodeMetric(t *testing.T, n *shard.Node, name, label string) float64 {
	t.Helper()
	fams, err := n.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	k, v, _ := strings.Cut(label, "=")
	v = strings.Trim(v, `"`)
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			if label != "" {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k {
						if lp.GetValue() != v {
							continue metrics
						}
						found = true
					}
				}
				if !found {
					continue
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// total sums a metric over every shard.
func (lc *lossyCluster) total(name, label string) float64 {
	s := 0.0
	for _, n := range lc.nodes {
		s += nodeMetric(lc.t, n, name, label)
	}
	return s
}

func (lc *lossyCluster) result(id uint64) *transport.BatchResult {
	lc.t.Helper()
	deadline := time.After(guard(10 * time.Second))
	for {
		select {
		case r := <-lc.pipe.Results():
			if r.ID != id {
				continue // a tombstone-only batch's answer, or an older one
			}
			return r
		case <-deadline:
			lc.t.Fatalf("no answer for batch %d within 10 s", id)
			return nil
		}
	}
}

var lossyPrompt = []int32{1, 403, 407, 261, 378}

// prefill creates seq on every stage (block seq) and returns its token.
func (lc *lossyCluster) prefill(seq uint64) int32 {
	lc.t.Helper()
	id := lc.next
	lc.next++
	b := &transport.MicroBatch{Epoch: lc.c.Epoch(), ID: id, Rows: []transport.Row{
		{Seq: seq, First: true, Tokens: lossyPrompt, Blocks: []int32{int32(seq % 32)}, Sample: true}}}
	if err := lc.pipe.Dispatch(b); err != nil {
		lc.t.Fatal(err)
	}
	r := lc.result(id)
	if r.Lost || len(r.Dropped) != 0 || len(r.Samples) != 1 {
		lc.t.Fatalf("prefill of %d: %+v", seq, r)
	}
	return r.Samples[0].Token
}

// end emits seq's tombstone the way the engine does for an idle pipeline:
// in band in a tombstone-only batch, and so on the backstop.
func (lc *lossyCluster) end(seqs ...uint64) {
	lc.t.Helper()
	var ts []transport.Tombstone
	for _, s := range seqs {
		ts = append(ts, transport.Tombstone{Epoch: lc.c.Epoch(), Seq: s, Reason: transport.ReasonAborted})
	}
	if err := lc.pipe.Dispatch(&transport.MicroBatch{Epoch: lc.c.Epoch(), Tombstones: ts}); err != nil {
		lc.t.Fatal(err)
	}
}

// waitFreed waits, at most one lease plus a heartbeat of slack, until no
// shard holds a sequence; it returns how long that took.
func (lc *lossyCluster) waitFreed(since time.Time) time.Duration {
	lc.t.Helper()
	limit := lc.lease + 500*time.Millisecond
	for lc.total("strata_kv_sequences", "") != 0 || lc.total("strata_kv_blocks_used", "") != 0 {
		if time.Since(since) > limit {
			lc.t.Fatalf("shards still hold %v sequences %v after their end (lease %v)", lc.total("strata_kv_sequences", ""), time.Since(since), lc.lease)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(since)
}

// checkIdle is how every test ends: on every shard no block is used and
// the invariant gauge is 1.
func (lc *lossyCluster) checkIdle() {
	lc.t.Helper()
	for i, n := range lc.nodes {
		if v := nodeMetric(lc.t, n, "strata_kv_blocks_used", ""); v != 0 {
			lc.t.Errorf("shard %d: %v blocks used", i, v)
		}
		if v := nodeMetric(lc.t, n, "strata_kv_invariant_ok", ""); v != 1 {
			lc.t.Errorf("shard %d: strata_kv_invariant_ok %v", i, v)
		}
	}
}

// repairs reads every shard's counters of the paths that free a sequence.
func (lc *lossyCluster) repairs() map[string]float64 {
	return map[string]float64{
		"tombstone": lc.total("strata_tombstones_applied_total", `reason="aborted"`),
		"reconcile": lc.total("strata_sequences_freed_total", `reason="reconcile"`),
		"lease":     lc.total("strata_sequences_freed_total", `reason="lease"`),
		"epoch":     lc.total("strata_sequences_freed_total", `reason="epoch"`),
	}
}

func diff(a, b map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range b {
		out[k] = v - a[k]
	}
	return out
}

// TestLossyTombstonePaths loses each path in turn and checks that the next
// one frees the sequence within one lease, counted under its own reason.
func TestLossyTombstonePaths(t *testing.T) {
	lc := startLossy(t, 1)
	const shards = 2
	seq := uint64(lc.c.FirstSeq())
	step := func(name string, want string, setup func()) {
		t.Helper()
		seq++
		lc.prefill(seq)
		before := lc.repairs()
		setup()
		start := time.Now()
		lc.end(seq)
		took := lc.waitFreed(start)
		lc.l.set(0, 0, 0)
		lc.l.muteReplies.Store(false)
		got := diff(before, lc.repairs())
		t.Logf("%s: freed in %v by %v", name, took.Round(time.Millisecond), got)
		for k, v := range got {
			if w := 0.0; k == want {
				w = shards
				if v != w {
					t.Errorf("%s: %s repaired %v sequences, want %v (one per shard)", name, k, v, w)
				}
			} else if v != 0 {
				t.Errorf("%s: %s freed %v sequences, want none (%s should have)", name, k, v, want)
			}
		}
		lc.checkIdle()
	}
	// In band: every backstop message and ack lost.
	step("in band (backstop lost)", "tombstone", func() { lc.l.set(1, 1, 0) })
	if u := lc.c.UnackedTombstones(); len(u) != shards || u[lc.nodes[0].ShardID()] != 1 || u[lc.nodes[1].ShardID()] != 1 {
		t.Errorf("unacked backstop tombstones %v, want 1 per shard", u)
	}
	// Backstop: the tombstone-only batch lost, the control stream delivers.
	// (The message of the step above stays unacked: it is resent only when
	// the control stream reconnects.)
	step("backstop (in band lost)", "tombstone", func() { lc.l.set(0, 0, 1) })
	// Reconcile: both lost; the heartbeat reply names the sequence unknown.
	step("reconcile (both lost)", "reconcile", func() { lc.l.set(1, 1, 1) })
	// Lease: both lost and heartbeat replies too; the lease lapses.
	step("lease (both lost, replies lost)", "lease", func() { lc.l.set(1, 1, 1); lc.l.muteReplies.Store(true) })
	if lc.l.count("backstop") < 3*shards || lc.l.count("in_band") < 3 {
		t.Errorf("lost %v: the interceptors did not lose what the steps needed", lc.l.lost)
	}
}

// TestLossyFraction ends many sequences while a chosen fraction of the
// backstop tombstones, their acks and the in-band tombstone batches is lost:
// every block still returns within one lease, the invariant holds on every
// shard throughout, and the counters account for every sequence on every
// shard, split by the path that freed it.
func TestLossyFraction(t *testing.T) {
	lc := startLossy(t, 7)
	const shards, n = 2, 24
	first := uint64(lc.c.FirstSeq()) + 100
	before := lc.repairs()
	for s := first; s < first+n; s++ {
		lc.prefill(s)
	}
	lc.l.set(0.5, 0.5, 0.5)
	start := time.Now()
	for s := first; s < first+n; s += 2 {
		lc.end(s, s+1)
		lc.checkIdleInvariant()
	}
	took := lc.waitFreed(start)
	got := diff(before, lc.repairs())
	t.Logf("lost %v; freed in %v by %v", lc.l.lost, took.Round(time.Millisecond), got)
	if sum := got["tombstone"] + got["reconcile"] + got["lease"]; sum != shards*n {
		t.Errorf("freed %v sequence replicas (%v), want %d", sum, got, shards*n)
	}
	if got["epoch"] != 0 {
		t.Errorf("freed by epoch %v, want 0", got["epoch"])
	}
	if lc.l.count("in_band") == 0 || lc.l.count("backstop") == 0 || lc.l.count("ack") == 0 {
		t.Errorf("lost %v: want some of each kind", lc.l.lost)
	}
	var unacked int
	for _, u := range lc.c.UnackedTombstones() {
		unacked += u
	}
	if unacked == 0 {
		t.Error("no backstop tombstone awaits an ack, though acks and messages were lost")
	}
	lc.checkIdle()
}

// checkIdleInvariant checks the invariant gauge alone (blocks may be in use).
func (lc *lossyCluster) checkIdleInvariant() {
	lc.t.Helper()
	for i, n := range lc.nodes {
		if v := nodeMetric(lc.t, n, "strata_kv_invariant_ok", ""); v != 1 {
			lc.t.Errorf("shard %d: strata_kv_invariant_ok %v", i, v)
		}
	}
}

// TestLossyBatchBehindTombstone holds a batch on the stage-0 link while its
// sequence's tombstone reaches the shards by the backstop: the late row is
// dropped as unknown_sequence on the first stage, never re-created, the
// other row of the batch is computed as without the fault, and nothing is
// left afterwards.
func TestLossyBatchBehindTombstone(t *testing.T) {
	lc := startLossy(t, 3)
	a, s := uint64(lc.c.FirstSeq())+1000, uint64(lc.c.FirstSeq())+1001
	tokA := lc.prefill(a)
	tokS := lc.prefill(s)
	// What A's next token is without the fault.
	ref := uint64(lc.c.FirstSeq()) + 1002
	lc.prefill(ref)
	id := lc.next
	lc.next++
	b := &transport.MicroBatch{Epoch: lc.c.Epoch(), ID: id, Rows: []transport.Row{
		{Seq: ref, Pos: len(lossyPrompt), Tokens: []int32{tokA}, Blocks: []int32{int32(ref % 32)}, Sample: true}}}
	if err := lc.pipe.Dispatch(b); err != nil {
		t.Fatal(err)
	}
	want := lc.result(id)
	lc.end(ref)

	unknown := lc.total("strata_unknown_sequence_rows_total", "")
	id = lc.next
	lc.next++
	lc.l.mu.Lock()
	lc.l.delay[id] = 500 * time.Millisecond
	lc.l.mu.Unlock()
	b = &transport.MicroBatch{Epoch: lc.c.Epoch(), ID: id, Rows: []transport.Row{
		{Seq: a, Pos: len(lossyPrompt), Tokens: []int32{tokA}, Blocks: []int32{int32(a % 32)}, Sample: true},
		{Seq: s, Pos: len(lossyPrompt), Tokens: []int32{tokS}, Blocks: []int32{int32(s % 32)}, Sample: true},
	}}
	if err := lc.pipe.Dispatch(b); err != nil {
		t.Fatal(err)
	}
	lc.end(s) // in band behind the held batch; on the backstop at once
	r := lc.result(id)
	if r.Lost || len(r.Samples) != 1 || r.Samples[0].Seq != a || r.Samples[0].Token != want.Samples[0].Token {
		t.Fatalf("held batch: %+v, want A's sample %+v", r, want.Samples)
	}
	if len(r.Dropped) != 1 || r.Dropped[0].Seq != s || r.Dropped[0].Reason != transport.CodeUnknownSequence {
		t.Fatalf("held batch dropped %+v, want S as unknown_sequence", r.Dropped)
	}
	if got := lc.total("strata_unknown_sequence_rows_total", "") - unknown; got != 1 {
		t.Errorf("unknown_sequence rows %v, want 1 (dropped on the first stage, never forwarded)", got)
	}
	if f := lc.c.BatchFailedByReason(); len(f) != 0 {
		t.Errorf("BatchFailed %v: a row dropped at a stage comes back with the batch's result, not as a failure", f)
	}
	lc.end(a)
	lc.waitFreed(time.Now())
	lc.checkIdle()
}
