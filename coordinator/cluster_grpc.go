package coordinator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/strata-llm/strata/model/gguf"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errStale marks a stream hello from another epoch or an unknown
// incarnation: the shard must register again.
var errStale = errors.New("stale stream")

// coordinatorService serves pb.CoordinatorServer for a Cluster. Handlers
// talk to the cluster's loop through events and to the pipeline through
// its methods; they never touch loop-owned state.
type coordinatorService struct {
	pb.UnimplementedCoordinatorServer
	c *Cluster
}

var _ pb.CoordinatorServer = (*coordinatorService)(nil)

var errStopping = status.Error(codes.Unavailable, "coordinator: stopping")

// Register implements pb.CoordinatorServer. The request is checked here
// (transport.CheckRegister: bounded strings and counts) before the loop
// sees it; the loop bounds the registry (maxShards).
func (s *coordinatorService) Register(ctx context.Context, req *pb.RegisterRequest) (*pb.RegisterReply, error) {
	if err := transport.CheckRegister(req); err != nil {
		s.c.refused.Count(err)
		return nil, status.Errorf(codes.InvalidArgument, "coordinator: register: %v", err)
	}
	if err := s.c.checkPeer(ctx, req.GetNodeId(), "", 0); err != nil {
		return nil, err
	}
	reply := make(chan registerReply, 1)
	if !s.c.post(ctx, evRegister{req: req, reply: reply}) {
		return nil, errStopping
	}
	r := <-reply
	switch {
	case errors.Is(r.err, errRegistryFull):
		return nil, status.Errorf(codes.ResourceExhausted, "coordinator: register %q: %v", req.GetNodeId(), r.err)
	case r.err != nil:
		return nil, status.Errorf(codes.InvalidArgument, "coordinator: register %q: %v", req.GetNodeId(), r.err)
	}
	return r.rep, nil
}

// Control implements pb.CoordinatorServer: hello first; then heartbeats
// (answered here with lease and unknown sequences), acks and status go to
// the loop, while a sender drains the shard's outbox.
func (s *coordinatorService) Control(stream pb.Coordinator_ControlServer) error {
	c := s.c
	ctx := stream.Context()
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	h := m.GetHello()
	if h == nil {
		c.refused.Add(transport.CodeBadField)
		return status.Error(codes.InvalidArgument, "coordinator: the first Control message must be hello")
	}
	if err := transport.CheckHello(h); err != nil {
		c.refused.Count(err)
		return status.Errorf(codes.InvalidArgument, "coordinator: %v", err)
	}
	if err := c.checkPeer(ctx, h.GetNodeId(), h.GetShardId(), h.GetIncarnation()); err != nil {
		return err
	}
	out := newOutbox()
	reply := make(chan error, 1)
	if !c.post(ctx, evCtlOpen{hello: h, out: out, reply: reply}) {
		return errStopping
	}
	if err := <-reply; err != nil {
		if errors.Is(err, errStale) {
			return status.Errorf(codes.FailedPrecondition, "coordinator: %v", err)
		}
		return status.Errorf(codes.InvalidArgument, "coordinator: %v", err)
	}
	id := h.GetShardId()
	// The receiver cannot be waited for here: Recv returns only once this
	// handler has returned (gRPC then cancels the stream). Run waits for it
	// through c.streams after the server has stopped.
	recvErr := make(chan error, 1) // the receiver's one result
	c.streams.Go(func() { recvErr <- s.recvControl(ctx, stream, id, out) })
	err = sendControl(ctx, stream, out, recvErr)
	out.close()
	c.post(context.Background(), evCtlClosed{shardID: id, out: out, err: err})
	return err
}

func (s *coordinatorService) recvControl(ctx context.Context, stream pb.Coordinator_ControlServer, id string, out *outbox) error {
	c := s.c
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		if err := transport.CheckFromShard(m, c.start.Epoch); err != nil {
			c.refused.Count(err)
			c.log.Warn("refused a control message", "shard_id", id, "err", err)
			continue
		}
		if !c.post(ctx, evCtlMsg{shardID: id, out: out, msg: m}) {
			return ctx.Err()
		}
	}
}

var errOutboxClosed = errors.New("control stream replaced or overflowing")

func sendControl(ctx context.Context, stream pb.Coordinator_ControlServer, out *outbox, recvErr <-chan error) error {
	for {
		msgs, ok := out.take()
		for _, m := range msgs {
			if err := stream.Send(m); err != nil {
				return err
			}
		}
		if !ok {
			return errOutboxClosed
		}
		select {
		case <-out.kick:
		case err := <-recvErr:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// outboxLimit bounds the messages waiting for one control stream: heartbeat
// replies come once a second and backstop tombstones at most once per
// engine step, so 4096 is a minute or more of a shard not reading. Past
// it the stream is ended; the shard reconnects and gets the unacked
// backstop again.
const outboxLimit = 4096

// outbox is one control stream's send queue: the loop and the receiver
// push without blocking, the stream's sender drains it. Methods are safe
// on a nil outbox (a shard without a stream), which drops what is pushed.
type outbox struct {
	kick chan struct{} // size 1: something was pushed or it closed

	mu     sync.Mutex
	msgs   []*pb.CoordinatorToShard
	closed bool
}

func newOutbox() *outbox { return &outbox{kick: make(chan struct{}, 1)} }

func (o *outbox) push(m *pb.CoordinatorToShard) {
	if o == nil {
		return
	}
	o.mu.Lock()
	if !o.closed {
		o.msgs = append(o.msgs, m)
		if len(o.msgs) > outboxLimit {
			o.closed = true
		}
	}
	o.mu.Unlock()
	o.notify()
}

func (o *outbox) close() {
	if o == nil {
		return
	}
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	o.notify()
}

func (o *outbox) notify() {
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// take returns what is queued and false once the outbox is closed.
func (o *outbox) take() ([]*pb.CoordinatorToShard, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.msgs
	o.msgs = nil
	if o.closed {
		return nil, false
	}
	return m, true
}

// Results implements pb.CoordinatorServer: the last stage's results and
// failures go to the pipeline, which answers each in-flight batch once.
// Each message is checked before use: a result or failure is taken only
// for a batch in flight whose placement names the hello's shard as its
// last stage (remote.deliver, remote.batchFailed); anything else is
// refused and counted, and the stream goes on.
func (s *coordinatorService) Results(stream pb.Coordinator_ResultsServer) error {
	c := s.c
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	h := m.GetHello()
	if err := transport.CheckHello(h); err != nil {
		c.refused.Count(err)
		return status.Errorf(codes.InvalidArgument, "coordinator: the first Results message must be a valid hello: %v", err)
	}
	if err := c.checkPeer(stream.Context(), h.GetNodeId(), h.GetShardId(), h.GetIncarnation()); err != nil {
		return err
	}
	if h.GetEpoch() != c.start.Epoch {
		c.refused.Add(transport.CodeStaleEpoch)
		return status.Error(codes.FailedPrecondition, "coordinator: a stream of another epoch: register again")
	}
	from := h.GetShardId()
	var n uint64
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return stream.SendAndClose(&pb.ResultsSummary{Results: n})
		}
		if err != nil {
			return err
		}
		switch {
		case m.GetResult() != nil:
			// Checked here, admitted on the loop; waiting for the loop to
			// take each answer is this stream's flow control.
			if r := c.pipe.checkResult(m.GetResult()); r != nil {
				if !c.post(stream.Context(), evAnswer{result: r, src: fromResults(from)}) {
					return stream.Context().Err()
				}
				n++
			}
		case m.GetFailed() != nil:
			if f := c.pipe.checkFailure(m.GetFailed()); f != nil {
				if !c.post(stream.Context(), evAnswer{failure: f, src: fromResults(from)}) {
					return stream.Context().Err()
				}
			}
		default:
			c.refused.Add(transport.CodeBadField)
		}
	}
}

// Weights implements pb.CoordinatorServer: the requested layer range's
// tensors (plus embedding and head when asked) from the coordinator's
// model file, in file order, each in chunks of at most
// transport.MaxChunkBytes with its SHA-256 on the last chunk. The first
// message carries the file's header (everything before the tensor data).
func (s *coordinatorService) Weights(req *pb.WeightsRequest, stream pb.Coordinator_WeightsServer) error {
	c := s.c
	switch {
	case c.cfg.ModelPath == "":
		return status.Error(codes.Unavailable, "coordinator: no model file to stream (built-in model): start the shard with --model")
	case req.GetModelSha256() != c.cfg.Shape.Model:
		return status.Error(codes.NotFound, "coordinator: the model asked for is not served here")
	case req.GetFirstLayer() > req.GetEndLayer() || int(req.GetEndLayer()) > c.cfg.Shape.Layers:
		return status.Errorf(codes.InvalidArgument, "coordinator: layers [%d, %d) outside the model's %d", req.GetFirstLayer(), req.GetEndLayer(), c.cfg.Shape.Layers)
	}
	f, err := gguf.Open(c.cfg.ModelPath)
	if err != nil {
		return status.Errorf(codes.Internal, "coordinator: open model: %v", err)
	}
	defer f.Close()
	header, err := readHeader(c.cfg.ModelPath, f.DataOffset)
	if err != nil {
		return status.Errorf(codes.Internal, "coordinator: %v", err)
	}
	_, noOutput := f.Tensor("output.weight")
	want := func(name string) bool {
		if strings.HasPrefix(name, "blk.") {
			var l uint32
			_, err := fmt.Sscanf(name, "blk.%d.", &l)
			return err == nil && l >= req.GetFirstLayer() && l < req.GetEndLayer()
		}
		switch {
		case strings.HasPrefix(name, "token_embd"):
			return req.GetEmbed() || (req.GetHead() && noOutput != nil)
		case strings.HasPrefix(name, "output"):
			return req.GetHead()
		}
		return false
	}
	for _, t := range f.Tensors {
		if !want(t.Name) {
			continue
		}
		if err := sendTensor(stream, t, &header); err != nil {
			return err
		}
	}
	return nil
}

// readHeader returns the first n bytes of the file (its GGUF header).
func readHeader(path string, n uint64) ([]byte, error) {
	if n > transport.MaxMessageBytes/2 {
		return nil, fmt.Errorf("model header of %d bytes exceeds half the message limit %d", n, transport.MaxMessageBytes)
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	b := make([]byte, n)
	if _, err := io.ReadFull(fh, b); err != nil {
		return nil, fmt.Errorf("read model header: %w", err)
	}
	return b, nil
}

// sendTensor streams t; *header rides on the first message sent and is
// then cleared.
func sendTensor(stream pb.Coordinator_WeightsServer, t *gguf.Tensor, header *[]byte) error {
	sum := sha256.Sum256(t.Data)
	info := &pb.TensorInfo{GgmlType: uint32(t.Type), Dims: t.Dims, Size: uint64(len(t.Data))}
	off := 0
	for first := true; first || off < len(t.Data); first = false {
		end := min(off+transport.MaxChunkBytes, len(t.Data))
		ch := &pb.WeightsChunk{Tensor: t.Name, Offset: uint64(off), Data: t.Data[off:end]}
		if first {
			ch.Info = info
		}
		if end == len(t.Data) {
			ch.Sha256 = hex.EncodeToString(sum[:])
		}
		if *header != nil {
			ch.GgufHeader, *header = *header, nil
		}
		if err := stream.Send(ch); err != nil {
			return err
		}
		off = end
	}
	return nil
}
