package shard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/membership"
	"github.com/strata-llm/strata/transport/pb"
)

// errReregister ends a control session whose registration is stale (the
// coordinator's epoch moved on).
var errReregister = errors.New("shard: coordinator epoch changed")

// ProtocolError reports a coordinator that speaks another protocol version;
// it stops the node.
type ProtocolError struct{ Coordinator, Shard uint32 }

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("coordinator speaks protocol %d, this shard speaks %d: upgrade one of them", e.Coordinator, e.Shard)
}

// backoff is a bounded exponential wait.
type backoff struct {
	cur, max time.Duration
}

const minBackoff = 100 * time.Millisecond

func (b *backoff) reset() { b.cur = 0 }

// wait sleeps for the next interval; false means ctx ended.
func (b *backoff) wait(ctx context.Context) bool {
	b.cur = min(max(2*b.cur, minBackoff), b.max)
	t := time.NewTimer(b.cur)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// findCoordinator returns a live coordinator member, preferring one whose
// incarnation is not avoid (the one whose stream just failed: after a
// restart, the old member lingers until memberlist declares it dead).
func findCoordinator(ml *membership.Node, avoid uint64) (membership.Member, bool) {
	var found membership.Member
	ok := false
	for _, m := range ml.Members() {
		if m.MetaErr != nil || m.Meta.Role != membership.RoleCoordinator || m.Leaving || m.Meta.GRPCAddr == "" {
			continue
		}
		if !ok || found.Meta.Incarnation == avoid {
			found, ok = m, true
		}
	}
	return found, ok
}

// controlLoop joins the gossip cluster, registers with the coordinator and
// keeps a control stream open, reconnecting with bounded backoff and
// registering again when the coordinator changed (new incarnation or
// address) or refused the stream. It returns nil when ctx ends and an error
// only for what retrying cannot fix.
func (n *Node) controlLoop(ctx context.Context, ml *membership.Node, local *pb.ModelFile) error {
	var cc *grpc.ClientConn
	ccAddr := ""
	defer func() {
		if cc != nil {
			cc.Close()
		}
	}()
	bo := backoff{max: n.cfg.MaxBackoff}
	registered, joined := false, false
	var regInc, avoid uint64
	for ctx.Err() == nil {
		if !joined {
			if _, err := ml.Join([]string{n.cfg.Coordinator}); err != nil {
				n.log.Warn("join gossip cluster", "coordinator", n.cfg.Coordinator, "err", err, "hint", n.gossipHint())
				bo.wait(ctx)
				continue
			}
			joined = true
		}
		coord, ok := findCoordinator(ml, avoid)
		if !ok {
			n.log.Debug("no coordinator member yet", "coordinator", n.cfg.Coordinator)
			joined = false // join again: the coordinator may have restarted alone
			bo.wait(ctx)
			continue
		}
		if cc == nil || ccAddr != coord.Meta.GRPCAddr {
			if cc != nil {
				cc.Close()
			}
			var err error
			if cc, err = transport.Dial(coord.Meta.GRPCAddr, n.coordDial...); err != nil {
				return err
			}
			ccAddr, registered = coord.Meta.GRPCAddr, false
		}
		if !registered || regInc != coord.Meta.Incarnation {
			if err := n.register(ctx, cc, coord.Meta.GRPCAddr, local); err != nil {
				if pe, ok := errors.AsType[*ProtocolError](err); ok {
					return pe
				}
				if ctx.Err() == nil {
					n.log.Warn("register with coordinator", "coordinator", coord.Meta.GRPCAddr, "err", err)
				}
				avoid, joined = coord.Meta.Incarnation, false
				bo.wait(ctx)
				continue
			}
			registered, regInc, avoid = true, coord.Meta.Incarnation, 0
		}
		got, err := n.session(ctx, cc)
		if ctx.Err() != nil {
			break
		}
		if got {
			bo.reset()
		}
		switch status.Code(err) {
		case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded:
			// Transport trouble: the same registration may still hold.
		default:
			registered = false
		}
		if errors.Is(err, errReregister) {
			registered = false
		}
		avoid, joined = coord.Meta.Incarnation, false
		n.log.Warn("control stream ended; reconnecting", "coordinator", coord.Meta.GRPCAddr, "err", err)
		bo.wait(ctx)
	}
	return nil
}

// register calls Register and records the reply: shard ID, epoch (a newer
// one frees every older sequence), heartbeat period and lease.
func (n *Node) register(ctx context.Context, cc *grpc.ClientConn, addr string, local *pb.ModelFile) error {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req := &pb.RegisterRequest{
		NodeId:          n.nodeID,
		Name:            n.name,
		Incarnation:     n.incarnation,
		GrpcAddr:        n.grpcAddr,
		ProtocolVersion: transport.ProtocolVersion,
		Devices:         devicesToPB(n.devices, n.cfg.Device),
		KvMemoryBytes:   uint64(n.cfg.KVMemory),
	}
	if local != nil {
		req.Models = []*pb.ModelFile{local}
		req.Calibration = n.calibration
	}
	rep, err := pb.NewCoordinatorClient(cc).Register(rctx, req)
	if err != nil {
		return err
	}
	if v := rep.GetProtocolVersion(); v != 0 && v != transport.ProtocolVersion {
		return &ProtocolError{Coordinator: v, Shard: transport.ProtocolVersion}
	}
	if rep.GetLeaseMs() > 0 {
		n.lease.Store(int64(time.Duration(rep.GetLeaseMs()) * time.Millisecond))
	}
	n.regMu.Lock()
	n.shardID, n.coordAddr, n.regEpoch = rep.GetShardId(), addr, rep.GetEpoch()
	n.regMu.Unlock()
	n.heartbeatEvery.Store(int64(heartbeatPeriod(rep.GetHeartbeatMs())))
	n.setEpoch(rep.GetEpoch())
	n.log.Info("registered", "shard_id", rep.GetShardId(), "epoch", rep.GetEpoch(), "coordinator", addr,
		"heartbeat_ms", rep.GetHeartbeatMs(), "lease_ms", rep.GetLeaseMs())
	return nil
}

// devicesToPB converts the probed devices for Register, inside the limits
// the coordinator checks (transport.CheckRegister).
func devicesToPB(d Devices, device string) *pb.Devices {
	out := &pb.Devices{CpuCores: uint32(d.CPUCores), MemoryBytes: d.MemoryBytes, Device: device}
	for _, g := range d.GPUs[:min(len(d.GPUs), transport.MaxGPUs)] {
		out.Gpus = append(out.Gpus, &pb.Gpu{Index: uint32(g.Index), Name: transport.Truncate(g.Name, transport.MaxNameLen), MemoryTotal: g.MemoryTotal, MemoryFree: g.MemoryFree})
	}
	return out
}

// heartbeatPeriod is the coordinator's heartbeat_ms, or 1 s when unset.
func heartbeatPeriod(ms int64) time.Duration {
	if ms <= 0 {
		return time.Second
	}
	return time.Duration(ms) * time.Millisecond
}

// setEpoch moves to the coordinator's epoch e: a newer one frees every
// older sequence at once and makes older batches refused.
func (n *Node) setEpoch(e uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if e > n.epoch {
		n.epoch = e
	}
	if n.p != nil {
		n.p.runner.SetEpoch(n.epoch)
	}
}

// session runs one control stream until it breaks or ctx ends. got reports
// whether the coordinator sent anything (the stream was accepted).
func (n *Node) session(ctx context.Context, cc *grpc.ClientConn) (got bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := pb.NewCoordinatorClient(cc).Control(sctx)
	if err != nil {
		return false, err
	}
	_, epoch, shardID := n.coordinator()
	hello := &pb.StreamHello{ShardId: shardID, NodeId: n.nodeID, Incarnation: n.incarnation, Epoch: epoch}
	for _, m := range []*pb.ShardToCoordinator{
		{Msg: &pb.ShardToCoordinator_Hello{Hello: hello}},
		{Msg: &pb.ShardToCoordinator_Status{Status: n.currentStatus()}},
		{Msg: &pb.ShardToCoordinator_Heartbeat{Heartbeat: n.heartbeat(epoch)}},
	} {
		if err := stream.Send(m); err != nil {
			return false, err
		}
	}
	in := make(chan *pb.CoordinatorToShard)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case in <- m:
			case <-sctx.Done():
				return
			}
		}
	})
	defer func() {
		cancel()
		wg.Wait()
	}()
	hb := time.NewTicker(time.Duration(n.heartbeatEvery.Load()))
	defer hb.Stop()
	for {
		var out *pb.ShardToCoordinator
		select {
		case <-ctx.Done():
			_ = stream.CloseSend()
			return got, ctx.Err()
		case err := <-errc:
			return got, err
		case m := <-in:
			got = true
			if err := transport.CheckFromCoordinator(m); err != nil {
				n.refused.Count(err)
				n.log.Warn("refused a control message", "err", err)
				continue
			}
			reply, err := n.handleControl(ctx, m, epoch)
			if err != nil {
				return got, err
			}
			out = reply
		case <-hb.C:
			out = &pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Heartbeat{Heartbeat: n.heartbeat(epoch)}}
		case <-n.statusCh:
			out = &pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Status{Status: n.currentStatus()}}
		case f := <-n.ctlOut:
			out = &pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Failed{Failed: f}}
		}
		if out != nil {
			if err := stream.Send(out); err != nil {
				return got, err
			}
		}
	}
}

// handleControl applies one message from the coordinator and returns what
// to answer, if anything.
func (n *Node) handleControl(ctx context.Context, m *pb.CoordinatorToShard, epoch uint64) (*pb.ShardToCoordinator, error) {
	switch {
	case m.GetAssign() != nil:
		n.assign(ctx, m.GetAssign())
	case m.GetTombstones() != nil:
		ts := m.GetTombstones()
		n.applyTombstones(ts.GetTombstones())
		return &pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Ack{Ack: &pb.Ack{AckId: ts.GetAckId()}}}, nil
	case m.GetHeartbeatReply() != nil:
		r := m.GetHeartbeatReply()
		if r.GetEpoch() > epoch {
			n.setEpoch(r.GetEpoch())
			return nil, fmt.Errorf("%w: %d -> %d", errReregister, epoch, r.GetEpoch())
		}
		if r.GetLeaseMs() > 0 {
			n.lease.Store(int64(time.Duration(r.GetLeaseMs()) * time.Millisecond))
		}
		n.mu.Lock()
		if n.p != nil {
			n.p.runner.Renew(r.GetUnknownSeqs(), time.Now())
		}
		n.mu.Unlock()
	}
	return nil, nil
}

// applyTombstones applies the control stream's backstop tombstones
// (checked by transport.CheckFromCoordinator): one of a newer epoch first
// moves the runner there (freeing everything older) — the control stream
// is the one place a newer epoch is adopted from — and one of an older
// epoch names a sequence that epoch change already freed.
func (n *Node) applyTombstones(wire []*pb.Tombstone) {
	ts, err := transport.TombstonesFromWire(wire)
	if err != nil {
		n.refused.Count(err)
		n.log.Warn("refused backstop tombstones", "err", err)
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.p == nil {
		return
	}
	r := n.p.runner
	for _, t := range ts {
		e := t.Epoch
		switch cur := r.Epoch(); {
		case e > cur:
			r.SetEpoch(e)
		case e != 0 && e < cur:
			continue
		}
		r.Tombstone(t)
	}
}

// heartbeat builds a Heartbeat for the coordinator epoch epoch.
func (n *Node) heartbeat(epoch uint64) *pb.Heartbeat {
	s := n.stats(true)
	cs := n.counters.snapshot()
	c := &pb.Counters{
		TombstonesApplied:   map[string]uint64{},
		UnknownSequenceRows: s.Refused[transport.CodeUnknownSequence],
		FreedLease:          s.Freed[Lease],
		FreedReconcile:      s.Freed[Reconcile],
		FreedEpoch:          s.Freed[Epoch],
		Batches:             cs.batches,
		Tokens:              cs.tokens,
		BusyNs:              uint64(cs.busy),
	}
	for _, r := range []Reason{Finished, Aborted, Timeout, Preempted, Failed} {
		if v := s.Freed[r]; v > 0 {
			c.TombstonesApplied[r.String()] = v
		}
	}
	for _, v := range cs.failed {
		c.BatchesFailed += v
	}
	return &pb.Heartbeat{
		Epoch:            epoch,
		PlacementVersion: s.Placement,
		Kv:               &pb.KVStats{BlocksUsed: uint64(s.BlocksUsed), BlocksTotal: uint64(s.BlocksTotal), Sequences: uint64(s.Sequences)},
		LiveSeqs:         s.Live,
		Counters:         c,
		InvariantOk:      s.InvariantOK,
	}
}

// isSpare reports whether a makes this shard a spare (no range).
func isSpare(a *pb.Assign) bool {
	return a.GetEndLayer() == a.GetFirstLayer() && !a.GetEmbed() && !a.GetHead()
}

// assign starts applying a: a spare Assign drops the range at once; an
// Assign equal to the one served (a resend after a reconnect) is answered
// READY again; any other loads in the background (LOADING, then READY or
// FAILED), replacing a load in progress.
func (n *Node) assign(ctx context.Context, a *pb.Assign) {
	v := a.GetPlacementVersion()
	if isSpare(a) {
		n.stopLoader()
		n.dropPlacement()
		n.setStatus(pb.Status_IDLE, v, "")
		n.log.Info("assigned as spare", "placement", v)
		return
	}
	n.mu.Lock()
	same := n.p != nil && proto.Equal(n.p.assign, a) || n.staged != nil && proto.Equal(n.staged.assign, a)
	n.mu.Unlock()
	if same {
		if n.loading != nil { // a staged load superseded by a resend of the served range
			n.stopLoader()
		}
		n.dropStaged(a)
		n.setStatus(pb.Status_READY, v, "")
		return
	}
	if n.loading != nil && proto.Equal(n.loading, a) {
		return // already loading exactly this
	}
	n.stopLoader()
	n.dropStaged(nil)
	n.setStatus(pb.Status_LOADING, v, "")
	n.log.Info("assigned", "placement", v, "layers", fmt.Sprintf("%d-%d", a.GetFirstLayer(), a.GetEndLayer()),
		"stage", a.GetStage(), "stages", a.GetStages(), "next", a.GetNextAddr(), "blocks", a.GetKvBlocks())
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	n.loadCancel, n.loadDone, n.loading = cancel, done, proto.Clone(a).(*pb.Assign)
	n.wg.Go(func() {
		defer close(done)
		n.load(ctx, lctx, a)
	})
}

// stopLoader cancels a load in progress and waits for it.
func (n *Node) stopLoader() {
	if n.loadCancel == nil {
		return
	}
	n.loadCancel()
	<-n.loadDone
	n.loadCancel, n.loadDone, n.loading = nil, nil, nil
}

// load builds the placement for a and installs it. runCtx bounds the
// placement's link; lctx the load itself.
func (n *Node) load(runCtx, lctx context.Context, a *pb.Assign) {
	v := a.GetPlacementVersion()
	p, err := n.newPlacement(runCtx, lctx, a)
	if err != nil {
		if lctx.Err() != nil {
			return // superseded or shutting down
		}
		n.log.Error("load assigned range", "placement", v, "err", err)
		n.setStatus(pb.Status_FAILED, v, transport.Truncate(err.Error(), transport.MaxTextLen))
		return
	}
	if lctx.Err() != nil {
		p.close()
		return
	}
	n.swapMu.Lock()
	defer n.swapMu.Unlock()
	n.mu.Lock()
	serving := n.p != nil
	if serving {
		// Make before break: the range served keeps serving (the
		// coordinator may still be dispatching on it) until a batch of
		// this version arrives (promote).
		n.staged = p
	}
	n.mu.Unlock()
	if serving {
		n.setStatus(pb.Status_READY, v, "")
		n.log.Info("ready; serving the current range until a batch of this placement arrives", "placement", v,
			"layers", fmt.Sprintf("%d-%d", a.GetFirstLayer(), a.GetEndLayer()))
		return
	}
	old := n.endRunner()
	n.mu.Lock()
	n.retireLocked(old)
	n.p = p
	p.runner.SetEpoch(n.epoch)
	n.mu.Unlock()
	if old != nil {
		old.close()
	}
	n.setStatus(pb.Status_READY, v, "")
	n.log.Info("ready", "placement", v, "layers", fmt.Sprintf("%d-%d", a.GetFirstLayer(), a.GetEndLayer()))
}

// endRunner closes the current placement's runner, outside mu (Close
// waits for a batch in progress): its sequences end (reason Epoch) and
// later batches are refused, so that its counts are final when the caller
// retires it. Only the goroutine that replaces the placement calls it.
func (n *Node) endRunner() *placement {
	n.mu.Lock()
	p := n.p
	n.mu.Unlock()
	if p != nil {
		p.runner.Close()
	}
	return p
}

// dropStaged closes the staged placement unless it is keep's.
func (n *Node) dropStaged(keep *pb.Assign) {
	n.swapMu.Lock()
	defer n.swapMu.Unlock()
	n.mu.Lock()
	st := n.staged
	if st != nil && keep != nil && proto.Equal(st.assign, keep) {
		st = nil
	} else {
		n.staged = nil
	}
	n.mu.Unlock()
	if st != nil {
		st.close()
	}
}

// promote makes the staged placement of version the served one, when
// there is one: the first batch of its version arrived, so the old
// placement's pipeline is no longer fed (the coordinator switched at a
// batch boundary; its sequences end, reason Epoch, as on any placement
// change).
func (n *Node) promote(version uint64) {
	n.swapMu.Lock()
	defer n.swapMu.Unlock()
	n.mu.Lock()
	st := n.staged
	if st == nil || st.version != version {
		n.mu.Unlock()
		return
	}
	n.staged = nil
	n.mu.Unlock()
	old := n.endRunner()
	n.mu.Lock()
	n.retireLocked(old)
	n.p = st
	st.runner.SetEpoch(n.epoch)
	n.mu.Unlock()
	if old != nil {
		old.close()
	}
	n.log.Info("switched to the staged placement", "placement", version)
}

// dropPlacement removes the served range, its KV and its link (and a
// staged one).
func (n *Node) dropPlacement() {
	n.dropStaged(nil)
	n.swapMu.Lock()
	defer n.swapMu.Unlock()
	old := n.endRunner()
	n.mu.Lock()
	n.retireLocked(old)
	n.p = nil
	n.mu.Unlock()
	if old != nil {
		old.close()
	}
}
