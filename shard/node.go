package shard

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/cuda"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/membership"
	"github.com/strata-llm/strata/transport/pb"
	"github.com/strata-llm/strata/transport/trust"
)

// Config configures a shard node: what `shard join` runs.
type Config struct {
	// Coordinator is the coordinator's gossip address, host:port.
	Coordinator string
	// Name is what people call this shard (the status page's title for
	// it), at most MaxNameLen bytes of printable UTF-8; empty means the
	// host name and a short ID.
	Name string
	// Model is a local GGUF file; empty means stream the assigned range
	// from the coordinator (Coordinator.Weights) and cache it in DataDir.
	Model string
	// ModelSHA256 is Model's SHA-256 (lower-case hex) when the caller has
	// already hashed the file — a coordinator running the node in its own
	// process; empty means the node hashes Model itself.
	ModelSHA256 string
	// Device is what the shard computes on: "cpu", or "cuda:N" (NVIDIA GPU
	// N: weights and KV in device memory, model/cuda).
	Device string
	// CUDALibDir is searched first for NVRTC (libnvrtc.so.13 or .12) with
	// --device cuda:N, e.g. pip's site-packages/nvidia/cu13/lib.
	CUDALibDir string
	// Gossip is the address memberlist binds (UDP and TCP), host:port; an
	// empty host means every interface.
	Gossip string
	// GRPC is the address the stage endpoint (service Stage) binds.
	GRPC string
	// Advertise is the host other nodes dial for this shard's gossip and
	// gRPC ports; empty derives it (the bound host, or else the local
	// address of the route to the coordinator).
	Advertise string
	// Metrics is the address of the /metrics HTTP server; empty: none.
	Metrics string
	// DataDir holds the node identity (bbolt) and cached weights.
	DataDir string
	// Threads is the worker count of the compute pool; 0 means all CPUs.
	// Ignored when Pool is set.
	Threads int
	// Pool, when set, is a compute pool shared with other in-process shards
	// (the caller closes it); nil makes one of Threads workers.
	Pool *cpu.Pool
	// KVMemory is the KV pool budget in bytes offered to the coordinator; an
	// Assign whose pool exceeds it fails. 0: no budget of its own.
	KVMemory int64
	// QueueDepth bounds each downstream link's queue, in batches.
	QueueDepth int
	// LeaveTimeout bounds the graceful memberlist leave at shutdown; 0
	// skips it, for a shard that stops together with its coordinator (in
	// the coordinator's process), when there is nobody left to tell.
	LeaveTimeout time.Duration
	// MaxBackoff caps the wait between attempts to join, register and
	// reopen the control stream.
	MaxBackoff time.Duration
	// LeaseTick is how often lapsed leases are looked for.
	LeaseTick time.Duration
	// Insecure runs plaintext: gRPC without TLS, gossip without the key
	// (--insecure, for a trusted network). The coordinator must agree.
	Insecure bool
	// Token is a join token (strata-<CA fingerprint>.<secret>), needed only
	// until the node holds a certificate under DataDir/trust: Run then
	// joins with it (node_trust.go).
	Token string
	// JoinAddr is the coordinator's gRPC address the token is presented
	// to; empty means Coordinator's host with port 7070.
	JoinAddr string
	// Issuer, when set, gives the node its certificate directly: a shard
	// in the coordinator's own process.
	Issuer Issuer
	// CalibrationBudget bounds the measuring of the local model's speed
	// before Register (Calibrate); < 0 skips it (placement then counts
	// this shard's memory only).
	CalibrationBudget time.Duration
	// SharedCalibration, when set, is shared by shards computing on one
	// Pool, so that one of them measures for all.
	SharedCalibration *SharedCalibration
	// Logger receives the node's logs; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults of `shard join`.
func DefaultConfig() Config {
	return Config{
		Device: "cpu",
		// 7947/7071: one above the coordinator's 7946/7070, so a shard and a
		// coordinator run side by side on one host without flags.
		Gossip:  ":7947",
		GRPC:    ":7071",
		DataDir: "strata-shard",
		// The scheduler keeps about P+1 batches in flight, so a link rarely
		// holds more than a few; 16 absorbs a slow downstream for a moment
		// and bounds memory at 16 batches' hidden states. When it is full the
		// batch is failed upstream (BatchFailed downstream_queue_full).
		QueueDepth: 16,
		// 5 s: memberlist needs a gossip round or two to spread the leave.
		LeaveTimeout: 5 * time.Second,
		// 5 s: a restarted coordinator is found again within seconds without
		// hammering one that is down.
		MaxBackoff: 5 * time.Second,
		// 100 ms: leases are seconds long, so a lapse is acted on within a
		// small fraction of one; scanning the live table this often is cheap.
		LeaseTick: 100 * time.Millisecond,
		// 1 s: a few runs of each kind on two layers, once per process.
		CalibrationBudget: CalibrationBudget,
	}
}

// Validate names the first field that is wrong.
func (c Config) Validate() error {
	switch {
	case c.Coordinator == "":
		return errors.New("--coordinator is required: the coordinator's gossip address, HOST:PORT")
	case c.Device != "cpu" && !strings.HasPrefix(c.Device, "cuda:"):
		return fmt.Errorf("--device must be cpu or cuda:N, got %q", c.Device)
	case c.DataDir == "":
		return errors.New("--data-dir must not be empty")
	case c.Threads < 0:
		return fmt.Errorf("--threads must be >= 0, got %d", c.Threads)
	case c.KVMemory < 0:
		return fmt.Errorf("--kv-memory must be >= 0, got %d", c.KVMemory)
	case c.QueueDepth < 1:
		return fmt.Errorf("QueueDepth must be >= 1, got %d", c.QueueDepth)
	case c.LeaveTimeout < 0:
		return fmt.Errorf("LeaveTimeout must be >= 0, got %v", c.LeaveTimeout)
	case c.MaxBackoff <= 0 || c.LeaseTick <= 0:
		return errors.New("MaxBackoff and LeaseTick must be > 0")
	}
	if err := checkName(c.Name); err != nil {
		return err
	}
	if _, _, err := splitHostPort("--coordinator", c.Coordinator); err != nil {
		return err
	}
	if _, _, err := splitHostPort("--gossip", c.Gossip); err != nil {
		return err
	}
	if _, _, err := splitHostPort("--grpc", c.GRPC); err != nil {
		return err
	}
	if c.Token != "" {
		if _, err := trust.ParseToken(c.Token); err != nil {
			return fmt.Errorf("--token: %w", err)
		}
	}
	if c.JoinAddr != "" {
		if _, _, err := splitHostPort("--coordinator-grpc", c.JoinAddr); err != nil {
			return err
		}
	}
	if c.Model != "" {
		st, err := os.Stat(c.Model)
		if err != nil {
			return fmt.Errorf("--model: %w", err)
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("--model %s is not a regular file", c.Model)
		}
	}
	return nil
}

func splitHostPort(flag, addr string) (string, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%s must be HOST:PORT or :PORT, got %q", flag, addr)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", 0, fmt.Errorf("%s port must be in 0..65535, got %q", flag, port)
	}
	return host, p, nil
}

// Node is a running shard: a gossip member, a stage endpoint, a control
// stream to the coordinator, and at most one placement (a loaded layer
// range, its KV pool, its Runner and its downstream link).
//
// Ownership: mu guards the current placement, the epoch and the counts of
// retired runners. The Runner guards its own sequence state: the stage
// stream's goroutine computes batches outside mu, while the control
// goroutine (tombstones, heartbeat replies, epochs, placement swaps), the
// lease goroutine and metrics scrapes reach the Runner briefly, never
// waiting for a forward pass. Nothing sends on a channel or calls the
// network while holding mu.
type Node struct {
	cfg         Config
	log         *slog.Logger
	store       *store
	nodeID      string
	name        string // Config.Name, or the default from the node ID
	incarnation uint64
	devices     Devices
	localSHA    string          // SHA-256 of --model, set by Run before the control loop starts
	calibration *pb.Calibration // the local model's, set by Run before the control loop starts

	grpcLn    net.Listener
	grpcAddr  string       // advertised stage endpoint
	grpcSrv   *grpc.Server // made once the identity is known (newStageServer)
	metricsLn net.Listener
	registry  *prometheus.Registry
	collector *collector
	pool      *cpu.Pool
	ownPool   bool
	gpu       *cuda.Device // --device cuda:N; nil on the CPU

	// id is the node's certificate and the cluster's secrets (nil with
	// Insecure, and until Run has joined); shardDial and coordDial are the
	// dial options of links to other shards and to the coordinator.
	id                   *trust.Identity
	shardDial, coordDial []grpc.DialOption

	counters counters
	// refused counts the messages this node refused (transport's checks,
	// recovered panics): strata_wire_refused_total.
	refused transport.Refusals

	mu sync.Mutex // guards the fields below
	p  *placement
	// staged is a placement loaded while p serves (make-before-break): it
	// replaces p when the first batch of its version arrives (promote).
	staged *placement
	// swapMu serializes replacing p or staged (a load, a spare, a
	// promotion), which closes runners outside mu.
	swapMu      sync.Mutex
	epoch       uint64 // the coordinator epoch of the current registration
	baseFreed   [transport.NumReasons]uint64
	baseRefused map[transport.Code]uint64
	baseEarly   uint64 // early tombstones refused by replaced runners

	regMu     sync.Mutex // guards the registration
	shardID   string
	coordAddr string // coordinator gRPC address
	regEpoch  uint64 // the epoch Register returned (mirrors epoch)

	lease          atomic.Int64 // current lease, nanoseconds
	heartbeatEvery atomic.Int64 // heartbeat period, nanoseconds

	stMu     sync.Mutex
	status   *pb.Status
	statusCh chan struct{} // size 1: status changed

	// ctlOut carries batch failures that found no upstream stream to the
	// control stream. Bound 64: failures come one per batch and the
	// scheduler keeps a handful in flight; when full the report is dropped
	// and counted (the coordinator's reclaim deadline fails the batch).
	ctlOut chan *pb.BatchFailed

	upMu sync.Mutex
	up   *upstream

	// Loader state, used only by the control goroutine.
	loadCancel context.CancelFunc
	loadDone   chan struct{}
	loading    *pb.Assign
	models     modelCache

	wg sync.WaitGroup // loaders and links
}

// New validates cfg, opens the data dir's store (node identity) and binds
// the gRPC and metrics listeners; Run serves them. A Node that was not Run
// must be closed with Run on a cancelled context.
func New(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	gpu, err := openGPU(cfg)
	if err != nil {
		return nil, err
	}
	var offer uint64
	if gpu != nil {
		free := gpuFree(gpu)
		if offer = gpuOffer(free); offer == 0 {
			gpu.Close()
			return nil, fmt.Errorf("--device %s: %d MiB of device memory free, not more than the %d MiB kept free beside a stage", cfg.Device, free>>20, cuda.DefaultMargin>>20)
		}
	}
	n, err := newNode(cfg)
	if err != nil {
		if gpu != nil {
			gpu.Close()
		}
		return nil, err
	}
	if gpu != nil {
		n.gpu = gpu
		n.devices.MemoryBytes = offer // what placement sizes this shard by
		if len(n.devices.GPUs) == 0 { // no NVML in this build: the driver says
			n.devices.GPUs = []GPU{{Index: gpu.Ctx.Info.Ordinal, Name: gpu.Ctx.Info.Name, MemoryTotal: gpu.Ctx.Info.TotalMemory, MemoryFree: n.devices.MemoryBytes}}
		}
	}
	return n, nil
}

func newNode(cfg Config) (*Node, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &Node{
		cfg:         cfg,
		devices:     ProbeDevices(),
		baseRefused: map[transport.Code]uint64{},
		status:      &pb.Status{State: pb.Status_IDLE},
		statusCh:    make(chan struct{}, 1),
		ctlOut:      make(chan *pb.BatchFailed, 64),
	}
	var raw [8]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails
	n.incarnation = binary.LittleEndian.Uint64(raw[:])
	n.lease.Store(int64(10 * time.Second))
	n.heartbeatEvery.Store(int64(time.Second))
	var err error
	if n.store, err = openStore(cfg.DataDir); err != nil {
		return nil, err
	}
	if n.nodeID, err = n.store.NodeID(); err != nil {
		n.store.Close()
		return nil, err
	}
	if n.name = cfg.Name; n.name == "" {
		n.name = defaultName(n.nodeID)
	}
	n.log = log.With("component", "shard", "node", n.nodeID)
	if err := n.loadIdentity(); err != nil {
		n.store.Close()
		return nil, err
	}
	if n.grpcLn, err = transport.Listen(cfg.GRPC); err != nil {
		n.store.Close()
		return nil, fmt.Errorf("--grpc: %w", err)
	}
	host, err := n.advertiseHost(cfg.GRPC)
	if err != nil {
		n.grpcLn.Close()
		n.store.Close()
		return nil, err
	}
	n.grpcAddr = net.JoinHostPort(host, strconv.Itoa(n.grpcLn.Addr().(*net.TCPAddr).Port))
	if cfg.Metrics != "" {
		if n.metricsLn, err = net.Listen("tcp", cfg.Metrics); err != nil {
			n.grpcLn.Close()
			n.store.Close()
			return nil, fmt.Errorf("--metrics: %w", err)
		}
	}
	if n.id != nil || cfg.Insecure {
		n.newStageServer()
	}
	n.registry = prometheus.NewRegistry()
	n.collector = newCollector(n)
	n.registry.MustRegister(n.collector)
	if cfg.Pool != nil {
		n.pool = cfg.Pool
		n.devices.CPUCores = cfg.Pool.Workers() // what this shard computes on, shared
	} else {
		n.pool, n.ownPool = cpu.NewPool(cfg.Threads), true
	}
	return n, nil
}

// advertiseHost is the host other nodes dial: --advertise, else the bound
// host of bind when it names one, else the local address of the route to
// the coordinator.
func (n *Node) advertiseHost(bind string) (string, error) {
	if n.cfg.Advertise != "" {
		return n.cfg.Advertise, nil
	}
	host, _, _ := net.SplitHostPort(bind)
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return host, nil
	}
	c, err := net.Dial("udp", n.cfg.Coordinator) // sends nothing: picks the route
	if err != nil {
		return "", fmt.Errorf("derive the address to advertise (set --advertise): %w", err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}

// NodeID returns the node's persistent identity.
func (n *Node) NodeID() string { return n.nodeID }

// Name returns the name the node registers under (Config.Name or its
// default).
func (n *Node) Name() string { return n.name }

// Incarnation returns this process's random incarnation.
func (n *Node) Incarnation() uint64 { return n.incarnation }

// GRPCAddr returns the advertised stage endpoint, host:port.
func (n *Node) GRPCAddr() string { return n.grpcAddr }

// MetricsAddr returns the bound /metrics address, or "" without one.
func (n *Node) MetricsAddr() string {
	if n.metricsLn == nil {
		return ""
	}
	return n.metricsLn.Addr().String()
}

// Registry returns the node's Prometheus registry (what /metrics serves).
func (n *Node) Registry() *prometheus.Registry { return n.registry }

// ShardID returns the coordinator's name for this shard, "" before Register.
func (n *Node) ShardID() string {
	n.regMu.Lock()
	defer n.regMu.Unlock()
	return n.shardID
}

func (n *Node) shardLabel() string {
	if id := n.ShardID(); id != "" {
		return id
	}
	return n.nodeID
}

func (n *Node) coordinator() (addr string, epoch uint64, shardID string) {
	n.regMu.Lock()
	defer n.regMu.Unlock()
	return n.coordAddr, n.regEpoch, n.shardID
}

// Run joins the cluster and serves until ctx ends, then leaves gracefully:
// memberlist Leave, streams closed, every goroutine exited. It returns nil
// after a cancelled ctx, or the error that stopped the node.
func (n *Node) Run(ctx context.Context) error {
	defer n.store.Close()
	if n.gpu != nil {
		defer n.gpu.Close()
	}
	if n.ownPool {
		defer n.pool.Close()
	}
	if n.metricsLn != nil {
		defer n.metricsLn.Close()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if ctx.Err() != nil {
		n.grpcLn.Close()
		return nil
	}
	local, err := n.localModelFile(ctx)
	if err != nil {
		n.grpcLn.Close()
		return err
	}
	n.calibration = n.calibrate(ctx)
	if n.grpcSrv == nil { // not joined yet: Config.Token
		if err := n.join(ctx); err != nil {
			n.grpcLn.Close()
			return err
		}
		n.newStageServer()
	} else if err := n.probeCoordinator(ctx); err != nil {
		n.grpcLn.Close()
		return err
	}
	ml, err := n.startGossip()
	if err != nil {
		n.grpcLn.Close()
		return err
	}
	n.log.Info("shard started", "grpc", n.grpcAddr, "gossip", ml.Local().Addr, "incarnation", fmt.Sprintf("%016x", n.incarnation),
		"cpu_cores", n.devices.CPUCores, "memory_bytes", n.devices.MemoryBytes, "gpus", len(n.devices.GPUs))

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := n.grpcSrv.Serve(n.grpcLn); err != nil {
			return fmt.Errorf("stage endpoint %s: %w", n.grpcAddr, err)
		}
		return nil
	})
	var hs *http.Server
	if n.metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(n.registry, promhttp.HandlerOpts{}))
		hs = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error {
			if err := hs.Serve(n.metricsLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("metrics %s: %w", n.metricsLn.Addr(), err)
			}
			return nil
		})
	}
	g.Go(func() error { n.drainEvents(gctx, ml); return nil })
	g.Go(func() error { n.leaseLoop(gctx); return nil })
	g.Go(func() error { return n.controlLoop(gctx, ml, local) })
	g.Go(func() error {
		<-gctx.Done()
		// Leave first, so the coordinator sees a graceful leave before the
		// streams break; then close the servers.
		if n.cfg.LeaveTimeout > 0 {
			if err := ml.Leave(n.cfg.LeaveTimeout); err != nil {
				n.log.Warn("gossip leave", "err", err)
			}
		}
		if err := ml.Shutdown(); err != nil {
			n.log.Warn("gossip shutdown", "err", err)
		}
		stopGRPC(n.grpcSrv, time.Second)
		if hs != nil {
			sctx, scancel := context.WithTimeout(context.Background(), time.Second)
			_ = hs.Shutdown(sctx)
			scancel()
		}
		return nil
	})
	err = g.Wait()
	n.stopLoader()
	n.dropPlacement()
	n.wg.Wait()
	n.models.release()
	if err != nil && ctx.Err() == nil {
		return err
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	n.log.Info("shard stopped")
	return nil
}

// stopGRPC stops srv gracefully, cutting open streams after grace: an
// upstream hop keeps its stage stream open for as long as it lives.
func stopGRPC(srv *grpc.Server, grace time.Duration) {
	done := make(chan struct{})
	go func() { // owned here: waited for below
		srv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
		srv.Stop()
		<-done
	}
}

// startGossip starts the memberlist member and joins the coordinator,
// retrying with backoff only inside controlLoop (Join here is best effort).
func (n *Node) startGossip() (*membership.Node, error) {
	host, port, _ := splitHostPort("--gossip", n.cfg.Gossip)
	mc := membership.DefaultConfig()
	if host != "" {
		mc.BindAddr = host
	}
	mc.BindPort = port
	if n.cfg.Advertise != "" {
		mc.AdvertiseAddr = n.cfg.Advertise
	} else if ip := net.ParseIP(mc.BindAddr); ip != nil && ip.IsUnspecified() && port != 0 {
		adv, err := n.advertiseHost(n.cfg.Gossip)
		if err != nil {
			return nil, err
		}
		mc.AdvertiseAddr = adv
	}
	mc.Meta = membership.Meta{
		Role:        membership.RoleShard,
		NodeID:      n.nodeID,
		Incarnation: n.incarnation,
		GRPCAddr:    n.grpcAddr,
		Protocol:    transport.ProtocolVersion,
	}
	mc.Logger = n.cfg.Logger // membership adds its own component
	n.gossipTrust(&mc)
	ml, err := membership.New(mc)
	if err != nil {
		return nil, fmt.Errorf("--gossip: %w", err)
	}
	return ml, nil
}

// drainEvents reads membership events so the channel never fills; the
// control loop reads Members() when it needs the coordinator.
func (n *Node) drainEvents(ctx context.Context, ml *membership.Node) {
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-ml.Events():
			if e.Member.Meta.Role == membership.RoleCoordinator {
				n.log.Info("coordinator membership", "event", e.Kind.String(), "member", e.Member.Name, "grpc", e.Member.Meta.GRPCAddr)
			}
		}
	}
}

// leaseLoop frees sequences whose lease lapsed, on the monotonic clock.
func (n *Node) leaseLoop(ctx context.Context) {
	t := time.NewTicker(n.cfg.LeaseTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		lease := time.Duration(n.lease.Load())
		n.mu.Lock()
		freed := 0
		if n.p != nil {
			freed = n.p.runner.Expire(time.Now(), lease)
		}
		n.mu.Unlock()
		if freed > 0 {
			n.log.Warn("sequences freed: lease lapsed", "sequences", freed, "lease", lease)
		}
	}
}

// setStatus records the state reported on the control stream and wakes the
// control goroutine to send it.
func (n *Node) setStatus(state pb.Status_State, version uint64, errMsg string) {
	n.stMu.Lock()
	n.status = &pb.Status{State: state, PlacementVersion: version, Error: errMsg}
	if state == pb.Status_READY {
		n.status.Progress = 1
	}
	n.stMu.Unlock()
	select {
	case n.statusCh <- struct{}{}:
	default:
	}
}

func (n *Node) currentStatus() *pb.Status {
	n.stMu.Lock()
	defer n.stMu.Unlock()
	return n.status
}

// nodeStats is a consistent snapshot of the KV replica and the counts of
// every runner this process has had.
type nodeStats struct {
	Placement   uint64
	Ready       bool
	BlocksUsed  int
	BlocksTotal int
	Sequences   int
	InvariantOK bool
	Live        []uint64
	Freed       [transport.NumReasons]uint64
	Refused     map[transport.Code]uint64
	// Early is the current table's tombstones above its high-water mark;
	// EarlyRefused those refused past MaxEarlyTombstones, by every runner.
	Early        int
	EarlyRefused uint64
}

// stats snapshots the replica; live also lists live sequences (for
// heartbeats). It holds mu, never waiting for a forward pass.
func (n *Node) stats(live bool) nodeStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := nodeStats{Freed: n.baseFreed, Refused: make(map[transport.Code]uint64, len(n.baseRefused)), InvariantOK: true, EarlyRefused: n.baseEarly}
	for k, v := range n.baseRefused {
		s.Refused[k] = v
	}
	p := n.p
	if p == nil {
		return s
	}
	rs := p.runner.Stats(live) // does not wait for a forward pass
	s.Placement, s.Ready = p.version, true
	s.BlocksUsed, s.BlocksTotal, s.Sequences = rs.BlocksUsed, rs.BlocksTotal, rs.Sequences
	if rs.Invariant != nil {
		s.InvariantOK = false
		n.log.Error("replica table invariant broken", "err", rs.Invariant)
	}
	for _, r := range Reasons() {
		s.Freed[r] += rs.Freed[r]
	}
	for k, v := range rs.Refused {
		s.Refused[k] += v
	}
	s.Early, s.EarlyRefused = rs.Early, s.EarlyRefused+rs.EarlyRefused
	s.Live = rs.Live
	return s
}

// Stats is a snapshot of a node's KV replica and stage counts, for a
// coordinator that runs the node in its own process and reads it directly
// rather than from its last heartbeat.
type Stats struct {
	// ShardID is the coordinator's name for the node, "" before Register.
	ShardID     string
	BlocksUsed  int  // distinct blocks named by live replica tables
	BlocksTotal int  // the KV pool, 0 without a range
	Sequences   int  // live sequences
	InvariantOK bool // the replica tables are consistent (Table.CheckInvariants)
	// Freed counts sequences freed, by reason: a coordinator tombstone's,
	// or the node's own (lease, epoch, reconcile).
	Freed map[string]uint64
	// Batches and Busy are the batches this stage processed and the time it
	// spent on them.
	Batches uint64
	Busy    time.Duration
}

// Stats returns a snapshot of the current placement's replica, and of the
// counters (Freed, Batches, Busy) over every placement the node has served.
// Safe for concurrent use.
func (n *Node) Stats() Stats {
	st := n.stats(false)
	cs := n.counters.snapshot()
	out := Stats{
		ShardID:    n.ShardID(),
		BlocksUsed: st.BlocksUsed, BlocksTotal: st.BlocksTotal, Sequences: st.Sequences, InvariantOK: st.InvariantOK,
		Freed: make(map[string]uint64, transport.NumReasons), Batches: cs.batches, Busy: cs.busy,
	}
	for _, r := range Reasons() {
		out.Freed[r.String()] = st.Freed[r]
	}
	return out
}

// retireLocked folds a replaced runner's counts into the base; its live
// sequences leave with it and count as freed by reason Epoch (a placement
// change drops them like an epoch).
func (n *Node) retireLocked(p *placement) {
	if p == nil {
		return
	}
	rs := p.runner.Stats(false)
	for _, r := range Reasons() {
		n.baseFreed[r] += rs.Freed[r]
	}
	n.baseFreed[Epoch] += uint64(rs.Sequences) // none once the runner is closed
	for k, v := range rs.Refused {
		n.baseRefused[k] += v
	}
	n.baseEarly += rs.EarlyRefused
}
