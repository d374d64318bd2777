package membership

import (
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// EventBuffer is the capacity of the Events channel. Each member's state
// change makes one event, and a join's push/pull reports every existing
// member at once, so 1024 holds a whole cluster of hundreds of nodes
// changing together while the coordinator's loop (which drains it every
// iteration and never blocks) is busy. When it is full, events are dropped
// and counted (Dropped); the consumer then resyncs from Members().
const EventBuffer = 1024

// Config configures a Node.
type Config struct {
	// Name is the member's unique name in the cluster. Empty means
	// NodeID-Incarnation (16 hex digits), unique per process, so memberlist
	// never has to reclaim a name from a dead process.
	Name string
	// BindAddr and BindPort are where gossip listens (UDP and TCP, same
	// port). Port 0 picks a free port.
	BindAddr string
	BindPort int
	// AdvertiseAddr and AdvertisePort are what the other members dial;
	// empty and 0 mean the bound address and port (for BindAddr 0.0.0.0,
	// memberlist picks a private IP, and fails if the host has none).
	AdvertiseAddr string
	AdvertisePort int
	// Meta is gossiped to every member; it must encode to at most
	// MaxMetaBytes.
	Meta Meta
	// Logger receives memberlist's logs, scoped with component=membership;
	// nil discards them.
	Logger *slog.Logger
	// Transport replaces memberlist's UDP/TCP transport (tests use an
	// in-memory memberlist.MockNetwork); nil uses BindAddr and BindPort.
	// With a Transport, the member's Name must be the one the transport
	// was created under.
	Transport memberlist.Transport
	// SecretKey, when set, encrypts and authenticates every gossip message
	// (memberlist's keyring; 16, 24 or 32 bytes for AES-128/192/256), and
	// messages without it are refused both ways. Empty: plaintext.
	SecretKey []byte
	// Label is put on every packet and stream (the cluster ID) and checked
	// on every one received: a member of another cluster, or one without
	// the label, cannot join. Empty: no label.
	Label string

	// ProbeInterval is how often a random member is probed.
	ProbeInterval time.Duration
	// ProbeTimeout is how long to wait for a probe's ack before trying
	// indirect probes.
	ProbeTimeout time.Duration
	// SuspicionMult scales how long a suspected member has to refute
	// before it is declared dead: SuspicionMult × log10(members) ×
	// ProbeInterval, at least.
	SuspicionMult int
	// GossipInterval is how often queued state changes are gossiped.
	GossipInterval time.Duration
	// PushPullInterval is how often full state is exchanged with a random
	// member (anti-entropy for missed gossip).
	PushPullInterval time.Duration
}

// DefaultConfig returns memberlist's LAN defaults. strata's nodes share a
// data-centre network, and membership is only the confirmation of a
// failure: a broken gRPC stream is the fast signal. LAN timing declares a
// silent node dead in about 5–25 s with little gossip traffic, and a
// partition of the WAN profile's length would only delay recovery.
func DefaultConfig() Config {
	lan := memberlist.DefaultLANConfig()
	return Config{
		BindAddr: "0.0.0.0", // every interface, as `--gossip :7946` means
		BindPort: 7946,      // memberlist's (and serf's) usual gossip port
		// 1 s: a failure check per second across the cluster.
		ProbeInterval: lan.ProbeInterval,
		// 500 ms: a LAN round trip is far below this even under load.
		ProbeTimeout: lan.ProbeTimeout,
		// 4: with ProbeInterval 1 s, a suspect has 4 s × log10(N) (up to
		// 6× that without confirmations) to refute before it is dead.
		SuspicionMult: lan.SuspicionMult,
		// 200 ms: state changes spread within a few hundred milliseconds.
		GossipInterval: lan.GossipInterval,
		// 30 s: full-state anti-entropy is cheap at this rate.
		PushPullInterval: lan.PushPullInterval,
	}
}

// Validate names the first field that is wrong and why.
func (c Config) Validate() error {
	if _, err := c.Meta.Encode(); err != nil {
		return fmt.Errorf("membership: Meta: %w", err)
	}
	switch {
	case c.BindPort < 0 || c.BindPort > 65535:
		return fmt.Errorf("membership: BindPort must be in [0, 65535], got %d", c.BindPort)
	case c.AdvertisePort < 0 || c.AdvertisePort > 65535:
		return fmt.Errorf("membership: AdvertisePort must be in [0, 65535], got %d", c.AdvertisePort)
	case c.ProbeInterval <= 0:
		return fmt.Errorf("membership: ProbeInterval must be > 0, got %v", c.ProbeInterval)
	case c.ProbeTimeout <= 0 || c.ProbeTimeout > c.ProbeInterval:
		return fmt.Errorf("membership: ProbeTimeout must be in (0, ProbeInterval %v], got %v", c.ProbeInterval, c.ProbeTimeout)
	case c.SuspicionMult < 1:
		return fmt.Errorf("membership: SuspicionMult must be >= 1, got %d", c.SuspicionMult)
	case c.GossipInterval <= 0:
		return fmt.Errorf("membership: GossipInterval must be > 0, got %v", c.GossipInterval)
	case c.PushPullInterval <= 0:
		return fmt.Errorf("membership: PushPullInterval must be > 0, got %v", c.PushPullInterval)
	case len(c.SecretKey) != 0 && len(c.SecretKey) != 16 && len(c.SecretKey) != 24 && len(c.SecretKey) != 32:
		return fmt.Errorf("membership: SecretKey must be 16, 24 or 32 bytes, got %d", len(c.SecretKey))
	case len(c.Label) > 255:
		return fmt.Errorf("membership: Label must be at most 255 bytes, got %d", len(c.Label))
	}
	return nil
}

// EventKind is what happened to a member.
type EventKind uint8

// Event kinds.
const (
	// EventJoin: a member appeared (including, at New, the local node).
	EventJoin EventKind = iota + 1
	// EventLeave: a member left gracefully (it called Leave).
	EventLeave
	// EventUpdate: a member's metadata changed.
	EventUpdate
	// EventDead: a member stopped answering and was declared dead.
	EventDead
)

// String returns "join", "leave", "update", "dead" or "event(N)".
func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventLeave:
		return "leave"
	case EventUpdate:
		return "update"
	case EventDead:
		return "dead"
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// Member is a snapshot of one member; it shares nothing with memberlist.
type Member struct {
	Name string
	// Addr is the member's gossip address, host:port.
	Addr string
	Meta Meta
	// MetaErr is set when the member's metadata could not be decoded (a
	// process that is not strata, or a newer format); Meta is then zero.
	MetaErr error
	// Leaving is set once the member has announced a graceful leave: it
	// will be gone soon, and its disappearance will be an EventLeave.
	Leaving bool
}

// Event is one change in membership.
type Event struct {
	Kind   EventKind
	Member Member
}

// ErrShutdown is returned by Leave and SetMeta after Shutdown.
var ErrShutdown = errors.New("membership: node is shut down")

// Node is this process's membership in the gossip cluster.
type Node struct {
	ml      *memberlist.Memberlist
	events  chan Event
	dropped atomic.Uint64
	logger  *slog.Logger
	encoded atomic.Pointer[[]byte] // what NodeMeta returns; replaced, never mutated

	// life serialises Leave, SetMeta and Shutdown: memberlist panics on a
	// Leave after Shutdown, so Shutdown waits for a Leave in progress (at
	// most its timeout) and later calls see down. It also guards the
	// metadata pair below.
	life    sync.Mutex
	down    bool
	meta    Meta
	leaving bool

	// view holds a copy of every live member, kept by the event delegate.
	// memberlist's own Node structs are updated in place under its lock, so
	// reading them from outside a callback is a data race; copies taken
	// inside the callbacks (which run under that lock) are not.
	vmu  sync.Mutex
	view map[string]Member
	name string // the local member's name
}

// New validates cfg, starts gossiping on its address (or Transport) and
// returns the node, alone until Join. The local node's own EventJoin is
// the first event.
func New(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	meta, _ := cfg.Meta.Encode() // checked by Validate
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "membership")
	n := &Node{
		events: make(chan Event, EventBuffer),
		logger: logger,
		meta:   cfg.Meta,
		view:   map[string]Member{},
	}
	n.encoded.Store(&meta)

	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Name
	if mc.Name == "" {
		mc.Name = fmt.Sprintf("%s-%016x", cfg.Meta.NodeID, cfg.Meta.Incarnation)
	}
	n.name = mc.Name
	mc.BindAddr, mc.BindPort = cfg.BindAddr, cfg.BindPort
	mc.AdvertiseAddr, mc.AdvertisePort = cfg.AdvertiseAddr, cfg.AdvertisePort
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = cfg.BindPort
	}
	mc.ProbeInterval, mc.ProbeTimeout = cfg.ProbeInterval, cfg.ProbeTimeout
	mc.SuspicionMult = cfg.SuspicionMult
	mc.GossipInterval, mc.PushPullInterval = cfg.GossipInterval, cfg.PushPullInterval
	mc.Transport = cfg.Transport
	if len(cfg.SecretKey) > 0 {
		mc.SecretKey = slices.Clone(cfg.SecretKey)
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	mc.Label = cfg.Label
	mc.Delegate = delegate{n}
	mc.Events = eventDelegate{n}
	mc.Logger = log.New(logWriter{logger}, "", 0)
	mc.LogOutput = nil

	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("membership: start %s on %s: %w", mc.Name, net.JoinHostPort(cfg.BindAddr, strconv.Itoa(cfg.BindPort)), err)
	}
	n.ml = ml
	logger.Info("gossip started", "node", mc.Name, "addr", memberAddr(ml.LocalNode()))
	return n, nil
}

// Join contacts each of addrs (host:port of any members) and merges state
// with those that answer. It returns how many answered; the error is
// non-nil only when none did.
func (n *Node) Join(addrs []string) (int, error) {
	k, err := n.ml.Join(addrs)
	if err != nil && k == 0 {
		return 0, fmt.Errorf("membership: join %v: %w", addrs, err)
	}
	return k, nil
}

// Leave tells the cluster this member is leaving gracefully, so the others
// report EventLeave rather than EventDead; call Shutdown afterwards. It
// takes up to timeout (> 0): it first gossips the intent in the metadata
// (the others see EventUpdate with Member.Leaving), then memberlist's leave
// message, and waits for each to go out.
//
// memberlist's leave message alone cannot be told from a death on the
// receiving side (NotifyLeave reports both, and the node's State is not
// filled in), hence the announcement. A member that missed it (lost
// packets) reports EventDead: the safe reading.
func (n *Node) Leave(timeout time.Duration) error {
	if timeout <= 0 {
		return fmt.Errorf("membership: Leave timeout must be > 0, got %v", timeout)
	}
	deadline := time.Now().Add(timeout)
	n.life.Lock()
	defer n.life.Unlock()
	if n.down {
		return ErrShutdown
	}
	n.leaving = true
	if err := n.storeMetaLocked(); err != nil {
		return err
	}
	if err := n.ml.UpdateNode(timeout / 2); err != nil {
		// Leave anyway: the others will at worst report a death.
		n.logger.Warn("leave announcement not confirmed", "err", err)
	}
	if err := n.ml.Leave(max(time.Until(deadline), time.Millisecond)); err != nil {
		return fmt.Errorf("membership: leave: %w", err)
	}
	return nil
}

// Shutdown stops gossiping and closes the sockets. Without a Leave first,
// the others declare this member dead once probes fail. Safe to call more
// than once. Events is not closed; stop reading it after Shutdown.
func (n *Node) Shutdown() error {
	n.life.Lock()
	defer n.life.Unlock()
	n.down = true
	if err := n.ml.Shutdown(); err != nil {
		return fmt.Errorf("membership: shutdown: %w", err)
	}
	return nil
}

// SetMeta replaces the local metadata and gossips it, waiting up to timeout
// for the update to go out; the others see EventUpdate.
func (n *Node) SetMeta(m Meta, timeout time.Duration) error {
	if _, err := m.Encode(); err != nil {
		return err
	}
	n.life.Lock()
	defer n.life.Unlock()
	if n.down {
		return ErrShutdown
	}
	n.meta = m
	if err := n.storeMetaLocked(); err != nil {
		return err
	}
	if err := n.ml.UpdateNode(timeout); err != nil {
		return fmt.Errorf("membership: update metadata: %w", err)
	}
	return nil
}

// storeMetaLocked encodes meta and leaving for NodeMeta.
func (n *Node) storeMetaLocked() error {
	var flags byte
	if n.leaving {
		flags |= flagLeaving
	}
	b, err := n.meta.encode(flags)
	if err != nil {
		return err
	}
	n.encoded.Store(&b)
	return nil
}

// Members returns the members currently alive or suspected, the local node
// included, sorted by name. The slice is the caller's.
func (n *Node) Members() []Member {
	n.vmu.Lock()
	out := make([]Member, 0, len(n.view))
	for _, m := range n.view {
		out = append(out, m)
	}
	n.vmu.Unlock()
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Local returns the local member.
func (n *Node) Local() Member {
	n.vmu.Lock()
	m, ok := n.view[n.name]
	n.vmu.Unlock()
	if ok {
		return m
	}
	return Member{Name: n.name, Meta: n.localMeta()}
}

// localMeta returns the local metadata as last set.
func (n *Node) localMeta() Meta {
	n.life.Lock()
	defer n.life.Unlock()
	return n.meta
}

// track records a member's latest state for Members; gone removes it.
func (n *Node) track(m Member, gone bool) {
	n.vmu.Lock()
	defer n.vmu.Unlock()
	if gone {
		delete(n.view, m.Name)
		return
	}
	n.view[m.Name] = m
}

// Events returns the channel of membership changes, buffered EventBuffer
// deep. Read it from one goroutine (the coordinator's loop); it is never
// closed.
func (n *Node) Events() <-chan Event { return n.events }

// Dropped returns how many events were dropped because Events was full.
// When it grows, the reader should resync from Members().
func (n *Node) Dropped() uint64 { return n.dropped.Load() }

// emit hands e to Events without blocking; memberlist calls it with its
// state lock held.
func (n *Node) emit(e Event) {
	select {
	case n.events <- e:
	default:
		// Log the 1st, 2nd, 4th, 8th... drop: a full channel must not
		// become a flood of log lines written under memberlist's lock.
		if d := n.dropped.Add(1); d&(d-1) == 0 {
			n.logger.Warn("membership events dropped: channel full", "dropped", d, "buffer", EventBuffer, "node", e.Member.Name, "event", e.Kind.String())
		}
	}
}

func memberAddr(nd *memberlist.Node) string {
	return net.JoinHostPort(nd.Addr.String(), strconv.Itoa(int(nd.Port)))
}

// toMember copies nd: it decodes Meta into fresh strings and keeps nothing
// of memberlist's.
func toMember(nd *memberlist.Node) Member {
	m := Member{Name: nd.Name, Addr: memberAddr(nd)}
	var flags byte
	m.Meta, flags, m.MetaErr = decodeMeta(nd.Meta)
	m.Leaving = flags&flagLeaving != 0
	return m
}

// delegate gives memberlist the local metadata; strata sends no user
// messages through gossip (tombstones travel over gRPC).
type delegate struct{ n *Node }

var _ memberlist.Delegate = delegate{}

func (d delegate) NodeMeta(limit int) []byte {
	b := *d.n.encoded.Load()
	if len(b) > limit { // cannot happen: Encode checked MaxMetaBytes
		return nil
	}
	return b
}

func (delegate) NotifyMsg([]byte)                           {}
func (delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (delegate) LocalState(join bool) []byte                { return nil }
func (delegate) MergeRemoteState(buf []byte, join bool)     {}

// eventDelegate turns memberlist's callbacks into Events. It must not
// block: memberlist holds its state lock while calling it.
type eventDelegate struct{ n *Node }

var _ memberlist.EventDelegate = eventDelegate{}

func (d eventDelegate) NotifyJoin(nd *memberlist.Node) {
	m := toMember(nd)
	d.n.track(m, false)
	d.n.emit(Event{Kind: EventJoin, Member: m})
}

// NotifyLeave fires for a graceful leave and for a death alike. memberlist
// marks a leave StateLeft in its own table but (v0.7.0) not in the Node it
// passes here, so the leave announced in the metadata decides; State is
// honoured too, should memberlist start filling it in.
func (d eventDelegate) NotifyLeave(nd *memberlist.Node) {
	m := toMember(nd)
	kind := EventDead
	if m.Leaving || nd.State == memberlist.StateLeft {
		kind = EventLeave
	}
	d.n.track(m, true)
	d.n.emit(Event{Kind: kind, Member: m})
}

func (d eventDelegate) NotifyUpdate(nd *memberlist.Node) {
	m := toMember(nd)
	d.n.track(m, false)
	d.n.emit(Event{Kind: EventUpdate, Member: m})
}
