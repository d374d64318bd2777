package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-llm/strata/control"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/membership"
	"github.com/strata-llm/strata/transport/pb"
	"github.com/strata-llm/strata/transport/trust"
	"google.golang.org/grpc"
)

// ClusterConfig configures the coordinator's side of a cluster.
type ClusterConfig struct {
	// GossipAddr is the memberlist address (host:port, e.g. ":7946"); empty
	// runs without membership (streams are then the only failure signal,
	// confirmed by LossConfirm).
	GossipAddr string
	// Gossip, when set, replaces the membership configuration built from
	// GossipAddr (tests pass a memberlist.MockNetwork transport); the
	// cluster fills in Meta.
	Gossip *membership.Config
	// GRPCAddr is where service Coordinator listens (e.g. ":7070").
	GRPCAddr string
	// GRPCAdvertise is the gRPC address put in membership metadata, which
	// shards dial; empty means GRPCAddr's port on the gossip node's
	// address (or the listener's address without membership).
	GRPCAdvertise string
	// DataDir holds coordinator.db (bbolt).
	DataDir string
	// MinShards holds the first placement until this many shards are
	// connected. It gates nothing after that: a loss re-places at once onto
	// the shards left, however few, when they can hold the model.
	MinShards int
	// ModelPath is the GGUF file Weights streams from; empty disables
	// Weights (every shard must have the file).
	ModelPath string
	// Shape describes the model for placement (ShapeFromModel).
	Shape ModelShape
	// KVMemory caps each shard's KV pool in bytes (--kv-memory); 0 means
	// what each shard offers.
	KVMemory int64
	// PlacementMix is the load placement balances the stages for, from
	// the shards' calibrations (--placement-mix); empty means MixBalanced.
	PlacementMix Mix
	// Heartbeat is how often shards send heartbeats.
	Heartbeat time.Duration
	// Lease is the sequence lease each heartbeat reply renews on a shard.
	Lease time.Duration
	// LossConfirm is how long stage 0 may stay without a stage stream
	// while its control stream is up before it is declared lost, how long
	// a restarted coordinator waits for the shards of its restored
	// placement, and how recent a shard's last heartbeat (or stream open)
	// must be for its control stream to outweigh a gossip death or leave.
	// A placed shard whose control stream breaks is lost at once.
	LossConfirm time.Duration
	// PlacementWait is how long the cluster may stay without a pipeline
	// before Ready reports it as an outage (ErrNoPipeline).
	PlacementWait time.Duration
	// RegisterGrace is how long a shard registered without ever sending a
	// heartbeat is kept; 0 means registerGrace (30 s).
	RegisterGrace time.Duration
	// LeaveTimeout bounds the graceful gossip leave when Run ends; 0 skips
	// it (a cluster no process outside this one can be part of).
	LeaveTimeout time.Duration
	// ServerOptions are added to service Coordinator's gRPC server and
	// StageDialOptions to the stage-0 link's connection: interceptors
	// (tests use them to lose or delay control-stream and batch messages).
	ServerOptions    []grpc.ServerOption
	StageDialOptions []grpc.DialOption
	// Secure turns on the cluster's trust (join.go): a CA and the
	// coordinator's certificate under DataDir/trust, mutual TLS on every
	// gRPC call but Join, identities bound to certificates, and gossip
	// encrypted and labelled with the cluster ID. Off: plaintext, for a
	// trusted network (serve --insecure) and tests of other things.
	Secure bool
	Log    *slog.Logger
}

// DefaultClusterConfig returns the defaults of `coordinator serve`.
func DefaultClusterConfig() ClusterConfig {
	return ClusterConfig{
		GossipAddr: ":7946", // memberlist's usual port
		GRPCAddr:   ":7070",
		DataDir:    "strata-data",
		MinShards:  1,
		// 1 s: docs/cluster.md's heartbeat; cheap, and leases renew often.
		Heartbeat: time.Second,
		// 15 s: many missed heartbeats before a shard frees on its own,
		// longer than LossConfirm so a short partition frees nothing.
		Lease: 15 * time.Second,
		// 10 s: ten missed heartbeats, so a shard whose heartbeats wait
		// behind a long forward pass still counts as answering; and within
		// memberlist's 5–25 s LAN death detection.
		LossConfirm: 10 * time.Second,
		// 60 s: the engine's default queue timeout; after it waiting
		// requests cannot be served in time anyway.
		PlacementWait: 60 * time.Second,
		// 1 s: long enough for the leave to reach a cluster of some
		// shards, short enough not to hold up a shutdown.
		LeaveTimeout: time.Second,
		Log:          slog.New(slog.DiscardHandler),
	}
}

// Validate names the first field that is wrong.
func (c ClusterConfig) Validate() error {
	switch {
	case c.GRPCAddr == "":
		return errors.New("coordinator: ClusterConfig.GRPCAddr is empty")
	case c.DataDir == "":
		return errors.New("coordinator: ClusterConfig.DataDir is empty")
	case c.MinShards < 1:
		return fmt.Errorf("coordinator: ClusterConfig.MinShards must be >= 1, got %d", c.MinShards)
	case c.KVMemory < 0:
		return fmt.Errorf("coordinator: ClusterConfig.KVMemory must be >= 0, got %d", c.KVMemory)
	case c.Heartbeat <= 0 || c.Lease <= c.Heartbeat:
		return fmt.Errorf("coordinator: ClusterConfig.Lease (%v) must exceed Heartbeat (%v) > 0", c.Lease, c.Heartbeat)
	case c.LossConfirm <= 0 || c.PlacementWait <= 0:
		return fmt.Errorf("coordinator: ClusterConfig.LossConfirm (%v) and PlacementWait (%v) must be > 0", c.LossConfirm, c.PlacementWait)
	case c.LeaveTimeout < 0:
		return fmt.Errorf("coordinator: ClusterConfig.LeaveTimeout must be >= 0, got %v", c.LeaveTimeout)
	}
	if c.PlacementMix != "" {
		if _, err := ParseMix(string(c.PlacementMix)); err != nil {
			return fmt.Errorf("coordinator: ClusterConfig.PlacementMix: %w", err)
		}
	}
	return c.Shape.Validate()
}

// Errors Ready wraps.
var (
	// ErrNoPipeline: no pipeline has been ready for longer than
	// PlacementWait; the engine fails every request and refuses new ones.
	ErrNoPipeline = errors.New("coordinator: no pipeline")
	// ErrPipelineDown: a pipeline formed before is down (re-placing,
	// loading, or nothing left can hold the model); requests are still
	// admitted and wait, up to their queue timeout, for the next one.
	// With it, Ready wraps ErrNoFit when the shards left cannot hold the
	// model: the engine then fails the requests it had dispatched.
	ErrPipelineDown = errors.New("coordinator: pipeline down")
)

// notReadyError is Ready's answer before PlacementWait: the reason as
// published, wrapping the sentinels that say what the engine and the API
// make of it.
type notReadyError struct {
	why   string
	kinds []error
}

func (e *notReadyError) Error() string   { return e.why }
func (e *notReadyError) Unwrap() []error { return e.kinds }

// readiness is what the engine makes of Ready's answer; a change of it is
// signalled (DynamicPipeline.Changed).
type readiness struct {
	version                    uint64
	ready, down, noFit, failed bool
}

func readinessOf(version uint64, err error) readiness {
	return readiness{version: version, ready: err == nil, down: errors.Is(err, ErrPipelineDown),
		noFit: errors.Is(err, ErrNoFit), failed: errors.Is(err, ErrNoPipeline)}
}

// seqReserve is how far ahead of the highest dispatched sequence ID the
// persisted high-water mark is kept: the next start begins above it even
// after a crash, as long as the engine does not hand out more than this
// many IDs between two of the loop's checks (a second).
const seqReserve = 1 << 20

// maxUnacked bounds the backstop tombstones kept per shard. A shard that
// stops acking but keeps its control stream would otherwise grow it without
// end; past the bound the oldest messages are dropped (counted), and the
// shard's lease frees what they named.
const maxUnacked = 1 << 16

// Cluster is the coordinator's side of a strata cluster: the bbolt store,
// membership, the gRPC service shards talk to, and the remote Pipeline the
// engine drives. It is the shell of the control core (control.Core), which
// decides membership, loss and placement: one goroutine (the loop) turns
// gRPC, link and membership happenings into the core's events and carries
// out the actions it returns (streams, the pipeline, bbolt, logs). gRPC
// handlers, links and membership send the loop events and never lock it.
// The loop runs on Run's goroutine until an engine over the cluster's
// Pipeline adopts it (Engine.Run): then the engine's goroutine owns both
// the scheduler and the control core, until it stops and gives it back.
type Cluster struct {
	cfg   ClusterConfig
	log   *slog.Logger
	store *Store
	start StartState
	pipe  *remote
	ln    net.Listener
	srv   *grpc.Server
	node  *membership.Node // nil without membership
	auth  *trust.Authority // nil: plaintext (ClusterConfig.Secure off)

	ev         chan any      // events to the loop; unbuffered, the loop never blocks
	stopped    chan struct{} // closed when the loop ends
	firstReady chan struct{} // closed when a pipeline is first ready
	readyOnce  sync.Once
	view       atomic.Pointer[ClusterView]
	streams    sync.WaitGroup // control-stream receivers (see Control)
	wg         sync.WaitGroup // links; waited by Run
	lent       atomic.Bool    // an engine runs the loop in its goroutine (Engine.Run)
	// refused counts the shards' messages refused before use (out of
	// range, over a limit, outside an enum, from the wrong stream; a
	// recovered panic): strata_wire_refused_total.
	refused transport.Refusals

	// Loop-owned.
	core   *control.Core          // membership, loss and placement decisions
	shards map[string]*shardState // by shard ID: the I/O side of each shard the core knows
	// active is the placement the pipeline carries: the core's latest
	// ActActivate, carried out (the same, unchanging value as
	// core.Active()).
	active    *Placement
	opening   *link     // link being dialed (the core's ActOpenLink)
	told      readiness // what the engine was last signalled (publish)
	replans   uint64    // make-before-break re-placements started (ActReplan)
	switching bool      // the active placement replaced another: resume sends a switch batch
	reserved  uint64    // persisted sequence-ID high-water mark
	rotatedAt time.Time
	// ledger is the scheduler's record of batches in flight and live
	// sequences (engineLedger) while an engine runs the loop; nil
	// otherwise (nothing in flight, nothing live).
	ledger ledger
}

// shardState is the loop's I/O record of one registered shard process:
// its registration, control stream, heartbeat and backstop. Whether it is
// lost, failed or READY is the core's (control.ShardState).
type shardState struct {
	rec     ShardRecord
	ctl     *outbox // nil while its control stream is down
	hb      *pb.Heartbeat
	hbAt    time.Time
	nextAck uint64
	unacked []*pb.Tombstones // ack_id ascending
	dropped uint64           // backstop messages dropped past maxUnacked
	speed   *Speed           // its calibration on the served model; nil: none
}

func (s *shardState) connected() bool { return s.ctl != nil }

func (s *shardState) unackedCount() int {
	n := 0
	for _, t := range s.unacked {
		n += len(t.Tombstones)
	}
	return n
}

// NewCluster opens the store (starting a new epoch), listens on
// cfg.GRPCAddr and starts gossiping on cfg.GossipAddr, so that GRPCAddr and
// GossipAddr are known before Run. Run serves; call it (it closes the
// store, the listener and the gossip member).
func NewCluster(cfg ClusterConfig) (*Cluster, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	now := time.Now()
	store, st, err := OpenStore(cfg.DataDir, now)
	if err != nil {
		return nil, err
	}
	restored, err := store.LatestPlacement()
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("coordinator: reload placement: %w", err)
	}
	reserved := st.SeqHWM + seqReserve
	if err := store.RaiseSeqHWM(reserved); err != nil {
		store.Close()
		return nil, fmt.Errorf("coordinator: reserve sequence IDs: %w", err)
	}
	ln, err := transport.Listen(cfg.GRPCAddr)
	if err != nil {
		store.Close()
		return nil, err
	}
	core, err := control.New(control.Config{Shape: cfg.Shape.Shape, MinShards: cfg.MinShards, KVMemory: cfg.KVMemory,
		Mix: cfg.PlacementMix, LossConfirm: cfg.LossConfirm, Epoch: st.Epoch, Restored: (*control.Placement)(restored), Start: now})
	if err != nil {
		ln.Close()
		store.Close()
		return nil, err
	}
	c := &Cluster{
		cfg: cfg, log: cfg.Log.With("component", "cluster"), store: store, start: st, ln: ln,
		ev: make(chan any), stopped: make(chan struct{}), firstReady: make(chan struct{}),
		core: core, shards: map[string]*shardState{}, reserved: reserved,
	}
	c.pipe = newRemote(st.Epoch, cfg.Shape.Vocab, &c.refused)
	var restoredVersion uint64
	if restored != nil {
		restoredVersion = restored.Version
	}
	if err := c.openTrust(now); err != nil {
		ln.Close()
		store.Close()
		return nil, err
	}
	if c.node, err = c.startMembership(); err != nil {
		ln.Close()
		store.Close()
		return nil, err
	}
	opts := append(transport.RecoverOptions(c.log, &c.refused), grpc.WaitForHandlers(true))
	opts = append(opts, c.trustServerOptions()...)
	c.srv = transport.NewServer(append(opts, cfg.ServerOptions...)...)
	pb.RegisterCoordinatorServer(c.srv, &coordinatorService{c: c})
	c.publish()
	c.log.Info("cluster store opened", "cluster_id", st.ClusterID, "epoch", st.Epoch, "prev_epoch", st.PrevEpoch,
		"first_seq", c.FirstSeq(), "restored_placement", restoredVersion)
	return c, nil
}

// Pipeline returns the remote pipeline the engine drives. Its shape
// (Stages, Blocks) is the current placement's: zero until WaitReady.
func (c *Cluster) Pipeline() Pipeline { return clusterPipeline{c.pipe, c} }

// clusterPipeline is the remote pipeline as the engine sees it: it pauses
// while no placement is ready and changes shape with each placement.
type clusterPipeline struct {
	*remote
	c *Cluster
}

var _ DynamicPipeline = clusterPipeline{}

// Ready implements DynamicPipeline. Besides the published view it reads
// the link itself: the view lags a pause by one turn of the cluster's loop,
// and a batch the engine formed in that window would fail at Dispatch and
// cost its requests a retry though nothing was lost.
func (p clusterPipeline) Ready() error {
	if err := p.c.Ready(); err != nil {
		return err
	}
	if !p.remote.ready() {
		return ErrNotReady
	}
	return nil
}

// Version implements DynamicPipeline.
func (p clusterPipeline) Version() uint64 { return p.c.PlacementVersion() }

// Changed implements DynamicPipeline: the link's moves signal at once
// (remote), and the loop signals a change of what Ready answers
// (publish).
func (p clusterPipeline) Changed() <-chan struct{} { return p.remote.changed }

// Epoch returns this start's epoch (EngineConfig.Epoch).
func (c *Cluster) Epoch() uint64 { return c.start.Epoch }

// FirstSeq returns the first sequence ID this start may hand out
// (sched.Config.FirstSeq): above every ID of earlier starts.
func (c *Cluster) FirstSeq() uint64 { return c.start.SeqHWM + 1 }

// PlacementVersion returns the placement version batches are stamped
// with now (0 before the first placement). When it changes, every
// sequence of the old version is gone on the shards and Stages/Blocks may
// differ (see the engine notes in the cluster report).
func (c *Cluster) PlacementVersion() uint64 {
	c.pipe.mu.Lock()
	defer c.pipe.mu.Unlock()
	return c.pipe.version
}

// GRPCAddr returns the address service Coordinator listens on.
func (c *Cluster) GRPCAddr() string { return c.ln.Addr().String() }

// GossipAddr returns the gossip address shards join (`shard join
// --coordinator`): the host and port memberlist advertises, "" without
// membership.
func (c *Cluster) GossipAddr() string {
	if c.node == nil {
		return ""
	}
	return c.node.Local().Addr
}

// Ready reports nil when a full pipeline is loaded and dispatching, else
// why not; past PlacementWait without one the error wraps ErrNoPipeline.
// Before that, once a pipeline has formed, it wraps ErrPipelineDown, and
// ErrNoFit too when the shards left cannot hold the model.
func (c *Cluster) Ready() error {
	v := c.view.Load()
	if v.Ready {
		return nil
	}
	if time.Since(v.NotReadySince) > c.cfg.PlacementWait {
		return fmt.Errorf("%w for %v: %s", ErrNoPipeline, time.Since(v.NotReadySince).Round(time.Second), v.NotReadyReason)
	}
	e := &notReadyError{why: v.NotReadyReason}
	if v.Placement != 0 {
		e.kinds = append(e.kinds, ErrPipelineDown)
		if v.CannotPlace {
			e.kinds = append(e.kinds, ErrNoFit)
		}
	}
	return e
}

// WaitReady blocks until a pipeline is first ready or ctx ends. serve
// calls it before NewEngine, which reads the pipeline's shape once.
func (c *Cluster) WaitReady(ctx context.Context) error {
	select {
	case <-c.firstReady:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("coordinator: waiting for a pipeline: %w (%v)", ctx.Err(), c.Ready())
	case <-c.stopped:
		return errors.New("coordinator: cluster stopped")
	}
}

// Run serves until ctx ends: gRPC, membership, the loop (lent to an engine
// that asks, and taken back when it stops). It returns after every
// goroutine it started has exited, with the store closed; an engine that
// runs the loop when ctx ends gives it back first.
func (c *Cluster) Run(ctx context.Context) error {
	defer c.store.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	node := c.node
	serveErr := make(chan error, 1) // Serve's one result
	c.wg.Go(func() { serveErr <- c.srv.Serve(c.ln) })
	var events <-chan membership.Event
	if node != nil {
		events = node.Events()
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	err := c.loop(&clusterLoop{c: c, ctx: ctx, stop: cancel, members: events, tick: tick.C}, serveErr)
	close(c.stopped)
	cancel()
	if l := c.pipe.pause("coordinator stopping", c.ledger); l != nil {
		l.cancel()
	}
	c.srv.Stop() // waits for handlers (WaitForHandlers)
	c.streams.Wait()
	c.wg.Wait()
	if node != nil {
		if c.cfg.LeaveTimeout > 0 {
			if err := node.Leave(c.cfg.LeaveTimeout); err != nil {
				c.log.Warn("gossip leave", "err", err)
			}
		}
		node.Shutdown()
	}
	if err := c.store.RaiseSeqHWM(c.pipe.highestSeq()); err != nil {
		c.log.Warn("persist sequence high-water mark", "err", err)
	}
	return err
}

func (c *Cluster) startMembership() (*membership.Node, error) {
	if c.cfg.Gossip == nil && c.cfg.GossipAddr == "" {
		if c.cfg.GRPCAdvertise == "" {
			c.cfg.GRPCAdvertise = c.ln.Addr().String()
		}
		return nil, nil
	}
	var mc membership.Config
	if c.cfg.Gossip != nil {
		mc = *c.cfg.Gossip
	} else {
		mc = membership.DefaultConfig()
		host, port, err := net.SplitHostPort(c.cfg.GossipAddr)
		if err != nil {
			return nil, fmt.Errorf("coordinator: gossip address %q: %w", c.cfg.GossipAddr, err)
		}
		if host != "" {
			mc.BindAddr = host
		}
		if mc.BindPort, err = strconv.Atoi(port); err != nil {
			return nil, fmt.Errorf("coordinator: gossip address %q: %w", c.cfg.GossipAddr, err)
		}
	}
	mc.Logger = c.cfg.Log
	c.gossipTrust(&mc)
	mc.Meta = membership.Meta{Role: membership.RoleCoordinator, NodeID: "coordinator-" + c.start.ClusterID,
		Incarnation: c.start.Epoch, Protocol: transport.ProtocolVersion, GRPCAddr: c.cfg.GRPCAdvertise}
	if mc.Meta.GRPCAddr == "" {
		mc.Meta.GRPCAddr = c.ln.Addr().String() // fixed below once the gossip address is known
	}
	node, err := membership.New(mc)
	if err != nil {
		return nil, err
	}
	if c.cfg.GRPCAdvertise == "" {
		// Advertise the gRPC port on the host other members reach us at.
		ghost, _, _ := net.SplitHostPort(node.Local().Addr)
		_, gport, _ := net.SplitHostPort(c.ln.Addr().String())
		m := mc.Meta
		m.GRPCAddr = net.JoinHostPort(ghost, gport)
		c.cfg.GRPCAdvertise = m.GRPCAddr
		if err := node.SetMeta(m, time.Second); err != nil {
			node.Shutdown()
			return nil, err
		}
	}
	return node, nil
}

// post hands e to the loop, giving up when ctx ends or the loop stopped.
func (c *Cluster) post(ctx context.Context, e any) bool {
	select {
	case c.ev <- e:
		return true
	case <-ctx.Done():
	case <-c.stopped:
	}
	return false
}

// Events to the loop.
type (
	evRegister struct {
		req   *pb.RegisterRequest
		reply chan<- registerReply // size 1
	}
	registerReply struct {
		rep *pb.RegisterReply
		err error
	}
	evCtlOpen struct {
		hello *pb.StreamHello
		out   *outbox
		reply chan<- error // size 1
	}
	evCtlClosed struct {
		shardID string
		out     *outbox
		err     error
	}
	evCtlMsg struct {
		shardID string
		out     *outbox
		msg     *pb.ShardToCoordinator
	}
	evLink struct {
		l   *link
		up  bool
		err error
	}
	// evAnswer: a checked result or failure of a batch and where it came
	// from (the Results stream, the stage-0 link), for the loop to admit
	// against the ledger. A control stream's failures are admitted where
	// the loop handles its message (ctlMsg).
	evAnswer struct {
		result  *transport.BatchResult
		failure *transport.Failure
		src     source
	}
	// evFailOwn: the stage-0 link's sender could not send batch id.
	evFailOwn struct {
		id   uint64
		code transport.Code
	}
	// evLedger: a ledger for a loop no engine runs (the cluster's own
	// tests); done is closed once it is in place.
	evLedger struct {
		led  ledger
		done chan struct{}
	}
)

// downstreamDown reports whether a stage's BatchFailed reason says the
// pipeline beyond it is broken, rather than something about the batch.
func downstreamDown(reason transport.Code) bool {
	return reason == transport.CodeDownstreamUnavailable || reason == transport.CodeResultsUnavailable
}

// clusterLoop is what the cluster's loop waits on besides its events,
// and how it handles each: the loop of Run's goroutine until an engine
// adopts it (Engine.Run), so that one goroutine owns both cores.
type clusterLoop struct {
	c       *Cluster
	ctx     context.Context // Run's: links live under it
	stop    context.CancelFunc
	members <-chan membership.Event
	tick    <-chan time.Time
}

// Loop wake-ups that carry no event of their own.
type (
	evTombKick struct{} // backstop tombstones were dispatched
	evTick     struct{} // the loop's ticker
)

// evAdopt: an engine asks to run the loop in its own goroutine. The loop
// hands itself over on taken (size 1) and waits until back is closed.
type evAdopt struct {
	taken chan<- *clusterLoop
	back  <-chan struct{}
}

// loop runs the cluster's loop on Run's goroutine until ctx ends or the
// gRPC server fails, lending it to an engine that asks (evAdopt).
func (c *Cluster) loop(l *clusterLoop, serveErr <-chan error) error {
	for {
		var e any
		select {
		case <-l.ctx.Done():
			return nil
		case err := <-serveErr:
			return fmt.Errorf("coordinator: grpc server: %w", err)
		case e = <-c.ev:
		case m := <-l.members:
			e = m
		case <-c.pipe.tombKick:
			e = evTombKick{}
		case <-l.tick:
			e = evTick{}
		}
		if a, ok := e.(evAdopt); ok {
			// Nothing here touches the loop's state until the engine
			// gives it back: when ctx ends (the engine sees it too, and
			// gives back), or the engine stops.
			c.lent.Store(true)
			a.taken <- l
			select {
			case <-a.back:
				c.lent.Store(false)
				continue
			case err := <-serveErr:
				l.stop()
				<-a.back
				return fmt.Errorf("coordinator: grpc server: %w", err)
			case <-l.ctx.Done():
				<-a.back
				return nil
			}
		}
		l.turn(e)
	}
}

// turn handles one wake-up of the loop (an event of c.ev, a membership
// event, evTombKick or evTick), then asks the core what the clock and the
// progress clock move, and publishes the view. A batch's result, the one
// event per batch, only moves the progress clock: what the clock alone
// decides and the view wait for the next tick (100 ms) or event. Only the
// goroutine running the loop calls it.
func (l *clusterLoop) turn(e any) {
	c := l.c
	if a, ok := e.(evAnswer); ok && a.result != nil {
		c.pipe.takeResult(a.result, a.src, c.ledger)
		busySince, tokens := c.pipe.progress(c.ledger)
		c.apply(c.core.Progress(busySince, tokens, time.Now()))
		return
	}
	now := time.Now()
	switch e := e.(type) {
	case membership.Event:
		c.member(e, now)
	case evTombKick:
		c.fanOut(c.pipe.takeBackstop())
	case evTick:
		c.persistSeqHWM()
		c.expireShards(now)
		if now.Sub(c.rotatedAt) >= 5*c.cfg.Heartbeat {
			c.pipe.rotateEnded()
			c.rotatedAt = now
		}
	case evAdopt:
		e.taken <- nil // one engine runs the loop; a second runs without it
	default:
		c.handle(l.ctx, e, now)
	}
	now = time.Now()
	busySince, tokens := c.pipe.progress(c.ledger)
	c.apply(c.core.Progress(busySince, tokens, now))
	c.reconcile(l.ctx, now)
	c.publish()
}

// The loop's channels for an engine's select; nil (never ready) for a nil
// loop, so that an engine without one selects on nothing of it.
func (l *clusterLoop) events() <-chan any {
	if l == nil {
		return nil
	}
	return l.c.ev
}

func (l *clusterLoop) memberEvents() <-chan membership.Event {
	if l == nil {
		return nil
	}
	return l.members
}

func (l *clusterLoop) tombKick() <-chan struct{} {
	if l == nil {
		return nil
	}
	return l.c.pipe.tombKick
}

func (l *clusterLoop) ticks() <-chan time.Time {
	if l == nil {
		return nil
	}
	return l.tick
}

func (l *clusterLoop) done() <-chan struct{} {
	if l == nil {
		return nil
	}
	return l.ctx.Done()
}

func (c *Cluster) handle(ctx context.Context, e any, now time.Time) {
	switch e := e.(type) {
	case evRegister:
		rep, err := c.register(e.req, now)
		e.reply <- registerReply{rep, err}
	case evCtlOpen:
		err := c.ctlOpen(e.hello, e.out)
		if err == nil {
			c.apply(c.core.StreamUp(e.hello.GetShardId(), now))
		}
		e.reply <- err
	case evCtlClosed:
		s := c.shards[e.shardID]
		if s == nil || s.ctl != e.out {
			return
		}
		s.ctl = nil
		c.log.Warn("control stream closed", "shard_id", e.shardID, "err", e.err)
		c.apply(c.core.StreamDown(e.shardID, e.err, now))
	case evCtlMsg:
		s := c.shards[e.shardID]
		if s == nil || s.ctl != e.out {
			return
		}
		c.ctlMsg(s, e.msg, now)
	case evLink:
		c.linkEvent(e, now)
	case evAnswer:
		c.answer(e, now)
	case evFailOwn:
		c.pipe.failOwn(e.id, e.code, c.ledger)
	case evLedger:
		c.ledger = e.led
		close(e.done)
	}
}

// answer admits a failure against the ledger (remote.takeFailure), which
// takes it (results are admitted in turn, before any other work). A stage
// that failed a whole batch because the stage after it, or the
// coordinator's Results, is unreachable tells the core the pipeline beyond
// it is down.
func (c *Cluster) answer(e evAnswer, now time.Time) {
	f := e.failure
	if c.pipe.takeFailure(f, e.src, c.ledger) == nil && e.src.link != nil && len(f.Seqs) == 0 && downstreamDown(f.Code) {
		c.apply(c.core.Downstream(e.src.link.version, f.Shard, f.Code.String(), now))
	}
}

// register records a shard process. A new incarnation under a known node
// ID is the loss of the old process plus a new shard.
func (c *Cluster) register(req *pb.RegisterRequest, now time.Time) (*pb.RegisterReply, error) {
	switch {
	case req.GetProtocolVersion() != transport.ProtocolVersion:
		return nil, fmt.Errorf("protocol version %d, coordinator speaks %d", req.GetProtocolVersion(), transport.ProtocolVersion)
	case req.GetNodeId() == "":
		return nil, errors.New("node_id is empty")
	case req.GetGrpcAddr() == "":
		return nil, errors.New("grpc_addr is empty")
	case req.GetDevices().GetMemoryBytes() == 0:
		return nil, errors.New("devices.memory_bytes is 0")
	}
	id := fmt.Sprintf("%s-%016x", req.GetNodeId(), req.GetIncarnation())
	for _, old := range c.shards {
		if old.rec.NodeID == req.GetNodeId() && old.rec.ShardID != id {
			c.apply(c.core.Forget(old.rec.ShardID, "new incarnation registered", now))
			delete(c.shards, old.rec.ShardID)
		}
	}
	rec := ShardRecord{
		NodeID: req.GetNodeId(), ShardID: id, Name: shardName(req.GetName()), Incarnation: req.GetIncarnation(), GRPCAddr: req.GetGrpcAddr(),
		Device: req.GetDevices().GetDevice(), CPUCores: req.GetDevices().GetCpuCores(),
		MemoryBytes: req.GetDevices().GetMemoryBytes(), KVMemory: req.GetKvMemoryBytes(), Registered: now,
	}
	for _, m := range req.GetModels() {
		rec.Models = append(rec.Models, m.GetSha256())
	}
	s := c.shards[id]
	if s == nil && len(c.shards) >= maxShards {
		c.expireShards(now)
		if len(c.shards) >= maxShards {
			c.refused.Add(transport.CodeRegistryFull)
			return nil, fmt.Errorf("%w: the registry holds its limit of %d shards", errRegistryFull, maxShards)
		}
	}
	if s == nil {
		s = &shardState{}
		c.shards[id] = s
		c.log.Info("shard registered", "shard_id", id, "name", rec.Name, "addr", rec.GRPCAddr, "device", rec.Device, "memory", rec.MemoryBytes)
	} else {
		rec.Registered = s.rec.Registered
	}
	s.rec = rec
	s.speed = SpeedFromWire(req.GetCalibration(), c.cfg.Shape.Model, c.cfg.Shape.Layers)
	c.apply(c.core.Register(control.ShardInfo{ID: id, NodeID: rec.NodeID, Incarnation: rec.Incarnation, Addr: rec.GRPCAddr,
		Memory: int64(rec.MemoryBytes), KVMemory: int64(rec.KVMemory), Speed: s.speed, Registered: rec.Registered}, now))
	if err := c.store.PutShard(rec); err != nil {
		c.log.Warn("persist shard", "shard_id", id, "err", err)
	}
	return &pb.RegisterReply{Epoch: c.start.Epoch, ShardId: id, ProtocolVersion: transport.ProtocolVersion,
		HeartbeatMs: c.cfg.Heartbeat.Milliseconds(), LeaseMs: c.cfg.Lease.Milliseconds()}, nil
}

// ctlOpen attaches a control stream to its shard and resends the unacked
// backstop; the core's StreamUp then decides what else the shard is sent
// (its Assign again, or a spare Assign).
func (c *Cluster) ctlOpen(h *pb.StreamHello, out *outbox) error {
	s := c.shards[h.GetShardId()]
	switch {
	case h.GetEpoch() != c.start.Epoch:
		return fmt.Errorf("%w: another epoch's stream: register again", errStale)
	case s == nil || s.rec.Incarnation != h.GetIncarnation():
		return fmt.Errorf("%w: shard %q (incarnation %d) is not registered", errStale, h.GetShardId(), h.GetIncarnation())
	}
	if s.ctl != nil {
		s.ctl.close()
	}
	s.ctl = out
	for _, t := range s.unacked {
		out.push(&pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_Tombstones{Tombstones: t}})
	}
	c.log.Info("control stream open", "shard_id", s.rec.ShardID, "unacked", len(s.unacked))
	return nil
}

func (c *Cluster) ctlMsg(s *shardState, m *pb.ShardToCoordinator, now time.Time) {
	sid := s.rec.ShardID
	switch {
	case m.GetHeartbeat() != nil:
		hb := m.GetHeartbeat()
		if prev := s.hb; prev != nil {
			// The mean time per batch since the previous heartbeat: the
			// stage's measured time, which stretches the progress
			// deadline when above the prediction.
			cur, old := hb.GetCounters(), prev.GetCounters()
			if cur.GetBatches() > old.GetBatches() && cur.GetBusyNs() > old.GetBusyNs() {
				mean := (cur.GetBusyNs() - old.GetBusyNs()) / (cur.GetBatches() - old.GetBatches())
				c.apply(c.core.StageTime(sid, time.Duration(min(mean, math.MaxInt64))))
			}
		}
		s.hb, s.hbAt = hb, now
		s.ctl.push(&pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_HeartbeatReply{HeartbeatReply: &pb.HeartbeatReply{
			Epoch: c.start.Epoch, LeaseMs: c.cfg.Lease.Milliseconds(), UnknownSeqs: c.pipe.unknown(hb.GetLiveSeqs(), c.ledger),
		}}})
		c.apply(c.core.Heartbeat(sid, now))
	case m.GetAck() != nil:
		id := m.GetAck().GetAckId()
		s.unacked = slices.DeleteFunc(s.unacked, func(t *pb.Tombstones) bool { return t.GetAckId() == id })
	case m.GetStatus() != nil:
		st := m.GetStatus()
		switch st.GetState() {
		case pb.Status_READY:
			c.apply(c.core.Loaded(sid, st.GetPlacementVersion(), now))
		case pb.Status_FAILED:
			c.apply(c.core.LoadFailed(sid, st.GetPlacementVersion(), st.GetError(), now))
		}
	case m.GetFailed() != nil:
		if f := c.pipe.checkFailure(m.GetFailed()); f != nil {
			c.pipe.takeFailure(f, fromControl(sid), c.ledger)
		}
	}
}

func (c *Cluster) linkEvent(e evLink, now time.Time) {
	if e.up {
		if c.opening != e.l {
			e.l.cancel()
			return
		}
		acts := c.core.LinkUp(e.l.version, now)
		if len(acts) == 0 {
			e.l.cancel()
			return
		}
		c.apply(acts)
		return
	}
	if c.opening == e.l {
		c.opening = nil
	} else if !c.pipe.current(e.l) {
		return // a link already dropped
	}
	c.log.Warn("stage-0 link down", "placement", e.l.version, "shard_id", e.l.shardID, "err", e.err)
	c.apply(c.core.LinkDown(e.l.shardID, e.err, now))
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// reconcile is the core's Tick, carried out: it confirms what waits on the
// clock, places, and asks for the stage-0 link once every stage is READY,
// which only reconcile opens (it has the loop's ctx).
func (c *Cluster) reconcile(ctx context.Context, now time.Time) {
	acts := c.core.Tick(now)
	for _, a := range acts {
		if a.Kind == control.ActOpenLink {
			c.openLink(ctx, (*Placement)(a.Placement))
		}
	}
	c.apply(acts)
}

// openLink dials stage 0 of p; the link reports back with evLink.
func (c *Cluster) openLink(ctx context.Context, p *Placement) {
	st0 := p.Stages[0]
	lctx, cancel := context.WithCancel(ctx)
	l := &link{version: p.Version, shardID: st0.ShardID, addr: st0.Addr, queue: make(chan *pb.BatchHeader, linkQueue), cancel: cancel}
	c.opening = l
	c.wg.Go(func() { c.runLink(ctx, lctx, l) })
}

// fanOut queues ts on every placed shard's control stream with a new
// ack_id, and keeps them until acked.
func (c *Cluster) fanOut(ts []transport.Tombstone) {
	if len(ts) == 0 || c.active == nil {
		return
	}
	if len(ts) > transport.MaxBatchTombstones { // more than one message may carry
		c.fanOut(ts[:transport.MaxBatchTombstones])
		c.fanOut(ts[transport.MaxBatchTombstones:])
		return
	}
	pts, err := transport.TombstonesToWire(ts)
	if err != nil {
		c.log.Error("backstop tombstones not sent", "err", err) // a bug: the engine emits the coordinator's reasons only
		return
	}
	for _, st := range c.active.Stages {
		// Also a shard whose stream is down, which is lost: should it come
		// back to this placement (nothing else could hold the model), the
		// resend on reconnect reaches it.
		s := c.shards[st.ShardID]
		if s == nil {
			continue
		}
		s.nextAck++
		msg := &pb.Tombstones{Tombstones: pts, AckId: s.nextAck}
		s.unacked = append(s.unacked, msg)
		for s.unackedCount() > maxUnacked && len(s.unacked) > 1 {
			s.unacked = s.unacked[1:]
			s.dropped++
		}
		s.ctl.push(&pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_Tombstones{Tombstones: msg}})
	}
}

// persistSeqHWM keeps the persisted high-water mark seqReserve ahead of
// the highest dispatched sequence ID.
func (c *Cluster) persistSeqHWM() {
	if hi := c.pipe.highestSeq(); hi+seqReserve/2 > c.reserved {
		r := hi + seqReserve
		if err := c.store.RaiseSeqHWM(r); err != nil {
			c.log.Warn("persist sequence high-water mark", "err", err)
			return
		}
		c.reserved = r
	}
}
