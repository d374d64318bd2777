package coordinator

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
	"google.golang.org/grpc"
)

// fakeShard is a shard process in miniature: it registers, keeps a control
// stream (recording Assigns, Tombstones and heartbeat replies, acking and
// reporting READY), serves Stage.Stream, forwards batches to the next stage
// or, on the last stage, answers each with a BatchResult on Results (the
// sampled token of a row is its last token + 1).
type fakeShard struct {
	t      *testing.T
	nodeID string
	inc    uint64
	mem    uint64
	ln     net.Listener
	srv    *grpc.Server
	cc     *grpc.ClientConn
	client pb.CoordinatorClient

	mu       sync.Mutex
	shardID  string
	epoch    uint64
	noAck    bool // record tombstones without acking
	hold     bool // receive batches without answering
	assigns  []*pb.Assign
	tombs    []*pb.Tombstones
	replies  []*pb.HeartbeatReply
	batches  []*pb.BatchHeader
	ctl      pb.Coordinator_ControlClient
	ctlStop  context.CancelFunc
	results  pb.Coordinator_ResultsClient
	next     pb.Stage_StreamClient
	nextConn *grpc.ClientConn
	kill     chan struct{}   // closed to break the current stage stream
	streams  int             // stage streams opened to this shard
	cal      *pb.Calibration // sent in Register when set
}

func newFakeShard(t *testing.T, coordAddr, nodeID string, inc, mem uint64) *fakeShard {
	t.Helper()
	ln, err := transport.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cc, err := transport.Dial(coordAddr)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeShard{t: t, nodeID: nodeID, inc: inc, mem: mem, ln: ln, srv: transport.NewServer(), cc: cc,
		client: pb.NewCoordinatorClient(cc), kill: make(chan struct{})}
	pb.RegisterStageServer(f.srv, fakeStage{f: f})
	go f.srv.Serve(ln)
	t.Cleanup(f.stop)
	return f
}

func (f *fakeShard) stop() {
	f.mu.Lock()
	if f.ctlStop != nil {
		f.ctlStop()
	}
	if f.nextConn != nil {
		f.nextConn.Close()
	}
	f.mu.Unlock()
	f.srv.Stop()
	f.cc.Close()
}

// join registers and opens the control stream.
func (f *fakeShard) join() {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := f.client.Register(ctx, &pb.RegisterRequest{
		NodeId: f.nodeID, Name: "box-" + f.nodeID, Incarnation: f.inc, GrpcAddr: f.ln.Addr().String(),
		ProtocolVersion: transport.ProtocolVersion, Devices: &pb.Devices{CpuCores: 2, MemoryBytes: f.mem, Device: "cpu"},
		Calibration: f.cal,
	})
	if err != nil {
		f.t.Fatalf("register %s: %v", f.nodeID, err)
	}
	f.mu.Lock()
	f.shardID, f.epoch = rep.GetShardId(), rep.GetEpoch()
	f.mu.Unlock()
	f.openControl()
}

// openControl opens a (new) control stream, dropping the old one.
func (f *fakeShard) openControl() {
	f.t.Helper()
	f.mu.Lock()
	if f.ctlStop != nil {
		f.ctlStop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.ctlStop = cancel
	hello := &pb.StreamHello{ShardId: f.shardID, NodeId: f.nodeID, Incarnation: f.inc, Epoch: f.epoch}
	f.mu.Unlock()
	ctl, err := f.client.Control(ctx)
	if err != nil {
		f.t.Fatalf("control: %v", err)
	}
	if err := ctl.Send(&pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Hello{Hello: hello}}); err != nil {
		f.t.Fatalf("control hello: %v", err)
	}
	f.mu.Lock()
	f.ctl = ctl
	f.mu.Unlock()
	go f.recvControl(ctl)
}

func (f *fakeShard) closeControl() {
	f.mu.Lock()
	f.ctlStop()
	f.ctl = nil
	f.mu.Unlock()
}

func (f *fakeShard) recvControl(ctl pb.Coordinator_ControlClient) {
	for {
		m, err := ctl.Recv()
		if err != nil {
			return
		}
		switch {
		case m.GetAssign() != nil:
			f.assign(m.GetAssign())
		case m.GetTombstones() != nil:
			f.mu.Lock()
			f.tombs = append(f.tombs, m.GetTombstones())
			ack := !f.noAck
			f.mu.Unlock()
			if ack {
				f.sendCtl(&pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Ack{Ack: &pb.Ack{AckId: m.GetTombstones().GetAckId()}}})
			}
		case m.GetHeartbeatReply() != nil:
			f.mu.Lock()
			f.replies = append(f.replies, m.GetHeartbeatReply())
			f.mu.Unlock()
		}
	}
}

func (f *fakeShard) sendCtl(m *pb.ShardToCoordinator) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctl != nil {
		f.ctl.Send(m)
	}
}

// assign opens the downstream stream or the Results stream, then reports
// READY.
func (f *fakeShard) assign(a *pb.Assign) {
	f.mu.Lock()
	f.assigns = append(f.assigns, a)
	hello := &pb.StreamHello{ShardId: f.shardID, NodeId: f.nodeID, Incarnation: f.inc, Epoch: f.epoch}
	f.mu.Unlock()
	if a.GetEndLayer() == a.GetFirstLayer() {
		f.sendCtl(&pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Status{Status: &pb.Status{State: pb.Status_IDLE, PlacementVersion: a.GetPlacementVersion()}}})
		return
	}
	// Once the test's body has ended, its cleanups stop the shards one by
	// one while the cluster still runs and re-places onto whatever it
	// believes alive: a peer that is already gone is then expected, not a
	// failure of the test.
	tearingDown := func() bool { return f.t.Context().Err() != nil }
	if a.GetHead() {
		res, err := f.client.Results(context.Background())
		if err == nil {
			err = res.Send(&pb.ResultMessage{Msg: &pb.ResultMessage_Hello{Hello: hello}})
		}
		if err != nil {
			if !tearingDown() {
				f.t.Errorf("results stream: %v", err)
			}
			return
		}
		f.mu.Lock()
		f.results = res
		if f.nextConn != nil { // a former middle stage, now the last
			f.nextConn.Close()
			f.next, f.nextConn = nil, nil
		}
		f.mu.Unlock()
	} else {
		cc, err := transport.Dial(a.GetNextAddr())
		if err != nil {
			if !tearingDown() {
				f.t.Errorf("dial next: %v", err)
			}
			return
		}
		next, err := pb.NewStageClient(cc).Stream(context.Background())
		if err != nil {
			if !tearingDown() {
				f.t.Errorf("next stream: %v", err)
			}
			return
		}
		f.mu.Lock()
		f.next, f.nextConn = next, cc
		f.mu.Unlock()
	}
	f.sendCtl(&pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Status{Status: &pb.Status{State: pb.Status_READY, PlacementVersion: a.GetPlacementVersion()}}})
}

func (f *fakeShard) heartbeat(live ...uint64) {
	f.sendCtl(&pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Heartbeat{Heartbeat: &pb.Heartbeat{
		Epoch: f.epoch, LiveSeqs: live, InvariantOk: true, Kv: &pb.KVStats{BlocksUsed: 3, BlocksTotal: 10, Sequences: uint64(len(live))},
	}}})
}

// breakStage ends the current stage stream from the shard's side.
func (f *fakeShard) breakStage() {
	f.mu.Lock()
	close(f.kill)
	f.kill = make(chan struct{})
	f.mu.Unlock()
}

func (f *fakeShard) snapshot() (assigns []*pb.Assign, tombs []*pb.Tombstones, replies []*pb.HeartbeatReply, batches []*pb.BatchHeader) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*pb.Assign(nil), f.assigns...), append([]*pb.Tombstones(nil), f.tombs...),
		append([]*pb.HeartbeatReply(nil), f.replies...), append([]*pb.BatchHeader(nil), f.batches...)
}

type fakeStage struct {
	pb.UnimplementedStageServer
	f *fakeShard
}

func (s fakeStage) Stream(stream pb.Stage_StreamServer) error {
	f := s.f
	f.mu.Lock()
	kill := f.kill
	f.streams++
	f.mu.Unlock()
	in := make(chan *transport.Batch)
	errc := make(chan error, 1)
	go func() {
		for {
			b, err := transport.RecvBatch(stream, 0)
			if err != nil {
				errc <- err
				return
			}
			select {
			case in <- b:
			case <-stream.Context().Done():
				return
			}
		}
	}()
	for {
		select {
		case <-kill:
			return errors.New("fake shard: stage stream broken")
		case err := <-errc:
			return err
		case b := <-in:
			f.process(b.Header)
		}
	}
}

func (f *fakeShard) process(h *pb.BatchHeader) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batches = append(f.batches, h)
	if f.hold {
		return
	}
	if f.next != nil {
		fwd := &pb.BatchHeader{Epoch: h.Epoch, PlacementVersion: h.PlacementVersion, BatchId: h.BatchId, Tombstones: h.Tombstones, Rows: h.Rows}
		transport.SendBatch(f.next, fwd, nil)
		return
	}
	if f.results == nil || h.GetBatchId() == 0 {
		return
	}
	r := &pb.BatchResult{Epoch: h.Epoch, BatchId: h.BatchId, PlacementVersion: h.PlacementVersion}
	for _, row := range h.Rows {
		if row.Sample {
			r.Samples = append(r.Samples, &pb.SampledToken{Seq: row.Seq, Token: row.Tokens[len(row.Tokens)-1] + 1, Pos: row.Pos + int32(len(row.Tokens))})
		}
	}
	f.results.Send(&pb.ResultMessage{Msg: &pb.ResultMessage_Result{Result: r}})
}
