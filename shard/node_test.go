package shard

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/membership"
	"github.com/strata-llm/strata/transport/pb"
)

const storiesPath = "../../shared/models/stories260K.gguf"

// fakeCoord is a coordinator reduced to what a shard needs: Register,
// Control (an Assign per node, tombstones on demand, heartbeat replies),
// and Results collected on a channel.
type fakeCoord struct {
	pb.UnimplementedCoordinatorServer
	epoch       atomic.Uint64 // a test raises it: a restarted coordinator
	leaseMs     int64
	heartbeatMs int64
	reply       atomic.Bool // answer heartbeats (renewing leases)
	// lastBeat is when the latest heartbeat arrived and the sequences it
	// listed live.
	lastBeat atomic.Pointer[beat]

	mu      sync.Mutex
	assigns map[string]*pb.Assign // by node ID
	out     map[string]chan *pb.CoordinatorToShard
	status  map[string]*pb.Status

	acks    chan uint64
	results chan *pb.BatchResult
}

// beat is a heartbeat as the fake coordinator saw it.
type beat struct {
	at   time.Time
	live []uint64
}

func newFakeCoord(epoch uint64) *fakeCoord {
	c := &fakeCoord{
		leaseMs: 2000, heartbeatMs: 50,
		assigns: map[string]*pb.Assign{}, out: map[string]chan *pb.CoordinatorToShard{}, status: map[string]*pb.Status{},
		acks: make(chan uint64, 16), results: make(chan *pb.BatchResult, 16),
	}
	c.reply.Store(true)
	c.epoch.Store(epoch)
	return c
}

func (c *fakeCoord) Register(_ context.Context, r *pb.RegisterRequest) (*pb.RegisterReply, error) {
	return &pb.RegisterReply{Epoch: c.epoch.Load(), ShardId: "shard-" + r.GetNodeId()[:6], ProtocolVersion: transport.ProtocolVersion,
		HeartbeatMs: c.heartbeatMs, LeaseMs: c.leaseMs}, nil
}

func (c *fakeCoord) outbox(node string) chan *pb.CoordinatorToShard {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.out[node] == nil {
		c.out[node] = make(chan *pb.CoordinatorToShard, 16)
	}
	return c.out[node]
}

func (c *fakeCoord) Control(s pb.Coordinator_ControlServer) error {
	m, err := s.Recv()
	if err != nil {
		return err
	}
	node := m.GetHello().GetNodeId()
	c.mu.Lock()
	a := c.assigns[node]
	c.mu.Unlock()
	if a != nil {
		if err := s.Send(&pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_Assign{Assign: a}}); err != nil {
			return err
		}
	}
	in := make(chan *pb.ShardToCoordinator)
	errc := make(chan error, 1)
	go func() { // ends with the stream
		for {
			m, err := s.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case in <- m:
			case <-s.Context().Done():
				return
			}
		}
	}()
	out := c.outbox(node)
	for {
		select {
		case err := <-errc:
			return err
		case <-s.Context().Done():
			return nil
		case m := <-out:
			if err := s.Send(m); err != nil {
				return err
			}
		case m := <-in:
			if hb := m.GetHeartbeat(); hb != nil {
				c.lastBeat.Store(&beat{at: time.Now(), live: hb.GetLiveSeqs()})
			}
			switch {
			case m.GetHeartbeat() != nil && c.reply.Load():
				if err := s.Send(&pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_HeartbeatReply{HeartbeatReply: &pb.HeartbeatReply{Epoch: c.epoch.Load(), LeaseMs: c.leaseMs}}}); err != nil {
					return err
				}
			case m.GetAck() != nil:
				c.acks <- m.GetAck().GetAckId()
			case m.GetStatus() != nil:
				c.mu.Lock()
				c.status[node] = m.GetStatus()
				c.mu.Unlock()
			}
		}
	}
}

func (c *fakeCoord) Results(s pb.Coordinator_ResultsServer) error {
	for {
		m, err := s.Recv()
		if err != nil {
			return nil
		}
		if r := m.GetResult(); r != nil {
			c.results <- r
		}
	}
}

func (c *fakeCoord) ready(node string, version uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.status[node]
	return st != nil && st.GetState() == pb.Status_READY && st.GetPlacementVersion() == version
}

// cluster is a fake coordinator (gRPC and gossip) and real shard Nodes
// serving consecutive layer ranges of stories260K.
type cluster struct {
	t      *testing.T
	coord  *fakeCoord
	nodes  []*Node
	stream pb.Stage_StreamClient
	failed chan *pb.BatchFailed
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func startCluster(t *testing.T, coord *fakeCoord, layers int, cuts ...int) *cluster {
	t.Helper()
	if _, err := os.Stat(storiesPath); err != nil {
		sharedAbsent(t, storiesPath, err)
	}
	ln, err := transport.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := transport.NewServer()
	pb.RegisterCoordinatorServer(srv, coord)
	go srv.Serve(ln) // ended by Stop below
	t.Cleanup(srv.Stop)

	mc := membership.DefaultConfig()
	mc.BindAddr, mc.BindPort = "127.0.0.1", 0
	mc.Meta = membership.Meta{Role: membership.RoleCoordinator, NodeID: "coord", Incarnation: 1, GRPCAddr: ln.Addr().String(), Protocol: transport.ProtocolVersion}
	ml, err := membership.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ml.Shutdown() })

	bounds := append(append([]int{0}, cuts...), layers)
	c := &cluster{t: t, coord: coord, failed: make(chan *pb.BatchFailed, 16)}
	for range len(bounds) - 1 {
		cfg := DefaultConfig()
		cfg.Insecure = true // this test's coordinator is a plaintext fake
		cfg.Coordinator = ml.Local().Addr
		cfg.Model = storiesPath
		cfg.Gossip, cfg.GRPC, cfg.Metrics = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
		cfg.DataDir = t.TempDir()
		cfg.Threads = 1
		cfg.LeaveTimeout = 500 * time.Millisecond
		cfg.LeaseTick = 20 * time.Millisecond
		cfg.MaxBackoff = 200 * time.Millisecond
		n, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, n)
	}
	for i, n := range c.nodes {
		a := &pb.Assign{PlacementVersion: 1, FirstLayer: uint32(bounds[i]), EndLayer: uint32(bounds[i+1]),
			Embed: i == 0, Head: i == len(c.nodes)-1, Stage: uint32(i), Stages: uint32(len(c.nodes)),
			KvBlocks: 32, BlockSize: 16}
		if i+1 < len(c.nodes) {
			a.NextAddr = c.nodes[i+1].GRPCAddr()
		}
		coord.mu.Lock()
		coord.assigns[n.NodeID()] = a
		coord.mu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(func() {
			if err := n.Run(ctx); err != nil {
				t.Errorf("node %s: %v", n.NodeID(), err)
			}
		})
	}
	t.Cleanup(func() {
		cancel()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("nodes did not stop within 20 s")
		}
	})
	for _, n := range c.nodes {
		waitFor(t, 20*time.Second, "shard READY", func() bool { return coord.ready(n.NodeID(), 1) })
	}
	cc, err := transport.Dial(c.nodes[0].GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	sctx, scancel := context.WithCancel(context.Background())
	t.Cleanup(scancel)
	if c.stream, err = pb.NewStageClient(cc).Stream(sctx); err != nil {
		t.Fatal(err)
	}
	go func() { // ends with the stream
		for {
			r, err := c.stream.Recv()
			if err != nil {
				return
			}
			c.failed <- r.GetFailed()
		}
	}()
	return c
}

// send sends one batch to stage 0.
func (c *cluster) send(h *pb.BatchHeader) {
	c.t.Helper()
	if err := transport.SendBatch(c.stream, h, nil); err != nil {
		c.t.Fatal(err)
	}
}

// result waits for batch id's result.
func (c *cluster) result(id uint64) *pb.BatchResult {
	c.t.Helper()
	select {
	case r := <-c.coord.results:
		if r.GetBatchId() != id {
			c.t.Fatalf("result of batch %d, want %d", r.GetBatchId(), id)
		}
		return r
	case f := <-c.failed:
		c.t.Fatalf("batch failed: %v", f)
	case <-time.After(20 * time.Second):
		c.t.Fatalf("no result for batch %d", id)
	}
	return nil
}

func (c *cluster) failure() *pb.BatchFailed {
	c.t.Helper()
	select {
	case f := <-c.failed:
		return f
	case r := <-c.coord.results:
		c.t.Fatalf("result %v where a failure was due", r)
	case <-time.After(20 * time.Second):
		c.t.Fatal("no BatchFailed")
	}
	return nil
}

// metric reads one sample of a node's /metrics ("name{labels}" prefix).
func metric(t *testing.T, n *Node, prefix string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + n.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, prefix) && (strings.HasPrefix(line[len(prefix):], " ") || strings.HasPrefix(line[len(prefix):], "{")) {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("metric %s not found", prefix)
	return 0
}

// labelled returns prefix{shard="…",extra} for n.
func labelled(n *Node, name, extra string) string {
	s := fmt.Sprintf(`%s{`, name)
	if extra != "" {
		s += extra + ","
	}
	return s + fmt.Sprintf(`shard="%s"}`, n.shardLabel())
}

// greedy decodes "Once upon a time" for steps tokens through the cluster.
func (c *cluster) greedy(epoch uint64, seq uint64, firstID uint64, steps int) []int32 {
	blocks := []int32{0, 1, 2}
	rows := []*pb.Row{{Seq: seq, First: true, Tokens: prompt, Blocks: blocks, Sample: true}}
	pos := len(prompt)
	var out []int32
	for i := range steps {
		id := firstID + uint64(i)
		c.send(&pb.BatchHeader{Epoch: epoch, PlacementVersion: 1, BatchId: id, Rows: rows})
		r := c.result(id)
		if len(r.GetSamples()) != 1 || len(r.GetDropped()) != 0 {
			c.t.Fatalf("batch %d: samples %v dropped %v", id, r.GetSamples(), r.GetDropped())
		}
		tok := r.GetSamples()[0].GetToken()
		if got := r.GetSamples()[0].GetPos(); got != int32(pos) {
			c.t.Fatalf("sample position %d, want %d", got, pos)
		}
		out = append(out, tok)
		rows = []*pb.Row{{Seq: seq, Pos: int32(pos), Tokens: []int32{tok}, Blocks: blocks, Sample: true}}
		pos++
	}
	return out
}

func TestNodeGreedyMatchesRunner(t *testing.T) {
	m := loadStories(t)
	want, _ := greedyA(t, newPipe(t, m), 12, -1)
	for _, cuts := range [][]int{nil, {2}} {
		t.Run(fmt.Sprintf("cuts%v", cuts), func(t *testing.T) {
			c := startCluster(t, newFakeCoord(100), m.Layers, cuts...)
			got := c.greedy(100, 1, 1, 12)
			if !slices.Equal(got, want) {
				t.Fatalf("tokens %v, in-process runner %v", got, want)
			}
			for _, n := range c.nodes {
				if v := metric(t, n, labelled(n, "strata_kv_blocks_used", "")); v != 1 {
					t.Errorf("blocks used %v, want 1", v)
				}
			}
		})
	}
}

func TestNodeTombstonesEpochsAndRefusals(t *testing.T) {
	m := loadStories(t)
	c := startCluster(t, newFakeCoord(100), m.Layers, 2)
	c.greedy(100, 1, 1, 2)
	for _, n := range c.nodes {
		if v := metric(t, n, labelled(n, "strata_kv_blocks_used", "")); v == 0 {
			t.Fatal("no blocks used after a prefill")
		}
	}
	// Backstop tombstone on every shard's control stream, acked.
	for i, n := range c.nodes {
		c.coord.outbox(n.NodeID()) <- &pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_Tombstones{Tombstones: &pb.Tombstones{
			AckId: uint64(10 + i), Tombstones: []*pb.Tombstone{{Epoch: 100, Seq: 1, Reason: pb.Tombstone_ABORTED}}}}}
		select {
		case id := <-c.coord.acks:
			if id != uint64(10+i) {
				t.Fatalf("ack %d, want %d", id, 10+i)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no ack")
		}
	}
	for _, n := range c.nodes {
		if v := metric(t, n, labelled(n, "strata_kv_blocks_used", "")); v != 0 {
			t.Errorf("blocks used %v after the tombstone, want 0", v)
		}
		if v := metric(t, n, labelled(n, "strata_tombstones_applied_total", `reason="aborted"`)); v != 1 {
			t.Errorf("tombstones applied (aborted) %v, want 1", v)
		}
		if v := metric(t, n, labelled(n, "strata_kv_invariant_ok", "")); v != 1 {
			t.Errorf("invariant gauge %v, want 1", v)
		}
	}
	// A late row behind the tombstone is dropped, reported, never computed.
	c.send(&pb.BatchHeader{Epoch: 100, PlacementVersion: 1, BatchId: 3, Rows: []*pb.Row{{Seq: 1, Pos: 6, Tokens: []int32{5}, Blocks: []int32{0, 1, 2}, Sample: true}}})
	r := c.result(3)
	if len(r.GetSamples()) != 0 || len(r.GetDropped()) != 1 || r.GetDropped()[0].GetSeq() != 1 || r.GetDropped()[0].GetReason() != "unknown_sequence" {
		t.Fatalf("late row: samples %v dropped %v", r.GetSamples(), r.GetDropped())
	}
	if v := metric(t, c.nodes[0], labelled(c.nodes[0], "strata_unknown_sequence_rows_total", "")); v != 1 {
		t.Errorf("unknown_sequence rows %v, want 1", v)
	}
	// An older epoch is refused whole.
	c.send(&pb.BatchHeader{Epoch: 99, PlacementVersion: 1, BatchId: 4, Rows: []*pb.Row{{Seq: 2, First: true, Tokens: prompt, Blocks: []int32{3}, Sample: true}}})
	if f := c.failure(); f.GetBatchId() != 4 || f.GetReason() != "stale_epoch" {
		t.Fatalf("older epoch: %v", f)
	}
	// So is another placement version.
	c.send(&pb.BatchHeader{Epoch: 100, PlacementVersion: 2, BatchId: 5})
	if f := c.failure(); f.GetBatchId() != 5 || f.GetReason() != "stale_placement" {
		t.Fatalf("other placement: %v", f)
	}
	// A batch of a newer epoch is refused, never adopted: the sequences of
	// the coordinator's epoch live on.
	c.send(&pb.BatchHeader{Epoch: 100, PlacementVersion: 1, BatchId: 6, Rows: []*pb.Row{{Seq: 7, First: true, Tokens: prompt, Blocks: []int32{4}, Sample: true}}})
	c.result(6)
	c.send(&pb.BatchHeader{Epoch: 1 << 62, PlacementVersion: 1, BatchId: 7})
	if f := c.failure(); f.GetBatchId() != 7 || f.GetReason() != "future_epoch" {
		t.Fatalf("newer epoch on the stage stream: %v", f)
	}
	for _, n := range c.nodes {
		if v := metric(t, n, labelled(n, "strata_kv_sequences", "")); v != 1 {
			t.Errorf("sequences %v after a batch of a newer epoch, want 1", v)
		}
	}
	if v := metric(t, c.nodes[0], labelled(c.nodes[0], "strata_wire_refused_total", `reason="future_epoch"`)); v != 1 {
		t.Errorf("refused future_epoch %v, want 1", v)
	}
	// A newer epoch on the control stream (a coordinator restart) frees
	// everything older on every stage.
	c.coord.epoch.Store(101)
	for _, n := range c.nodes {
		waitFor(t, 20*time.Second, "the newer epoch", func() bool {
			return metric(t, n, labelled(n, "strata_kv_sequences", "")) == 0
		})
		if v := metric(t, n, labelled(n, "strata_sequences_freed_total", `reason="epoch"`)); v != 1 {
			t.Errorf("freed by epoch %v, want 1", v)
		}
	}
	c.send(&pb.BatchHeader{Epoch: 101, PlacementVersion: 1, BatchId: 1, Rows: []*pb.Row{{Seq: 1, First: true, Tokens: prompt, Blocks: []int32{4}, Sample: true}}})
	if r := c.result(1); len(r.GetSamples()) != 1 {
		t.Fatalf("first batch of epoch 101: %v", r)
	}
}

func TestNodeLeaseExpiry(t *testing.T) {
	m := loadStories(t)
	coord := newFakeCoord(100)
	coord.leaseMs = 1000 // far above the 50 ms heartbeat, even on a loaded machine
	c := startCluster(t, coord, m.Layers)
	n := c.nodes[0]
	c.greedy(100, 1, 1, 1)
	created := time.Now() // after the create
	// While heartbeat replies renew it, the sequence outlives its lease: a
	// heartbeat sent 1.5 leases after the create still lists it.
	lease := time.Duration(coord.leaseMs) * time.Millisecond
	waitFor(t, 30*time.Second, "a heartbeat 1.5 leases after the create", func() bool {
		b := coord.lastBeat.Load()
		if b == nil || b.at.Sub(created) < lease*3/2 {
			return false
		}
		if !slices.Contains(b.live, 1) {
			t.Fatalf("heartbeat %v after the create lists %v: the sequence lapsed while replies renewed its lease", b.at.Sub(created), b.live)
		}
		return true
	})
	if v := metric(t, n, labelled(n, "strata_kv_sequences", "")); v != 1 {
		t.Fatalf("sequences %v while leases are renewed, want 1", v)
	}
	coord.reply.Store(false)
	waitFor(t, 5*time.Second, "lease expiry", func() bool {
		return metric(t, n, labelled(n, "strata_kv_sequences", "")) == 0
	})
	if v := metric(t, n, labelled(n, "strata_sequences_freed_total", `reason="lease"`)); v != 1 {
		t.Errorf("freed by lease %v, want 1", v)
	}
	if v := metric(t, n, labelled(n, "strata_kv_blocks_used", "")); v != 0 {
		t.Errorf("blocks used %v, want 0", v)
	}
}
