package coordinator

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/membership"
	"github.com/strata-llm/strata/transport/pb"
)

// The tests in this file drive the cluster's loop by hand, event by event,
// on an injected clock: register, control streams opening and closing,
// membership events, reconcile. No loop goroutine, no shard, no waiting.

// handCluster is a Cluster whose loop the test turns (Run is never
// called), with the time of each event in now.
type handCluster struct {
	*Cluster
	t   *testing.T
	now time.Time
	out map[string]*outbox // each shard's current control stream
}

func newHandCluster(t *testing.T, minShards int) *handCluster {
	t.Helper()
	cfg := DefaultClusterConfig()
	cfg.GossipAddr, cfg.GRPCAddr, cfg.DataDir = "", "127.0.0.1:0", t.TempDir()
	cfg.MinShards, cfg.Shape = minShards, testShape()
	c, err := NewCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.ln.Close(); c.store.Close() })
	return &handCluster{Cluster: c, t: t, now: time.Now(), out: map[string]*outbox{}}
}

// turn handles e as the loop would: the event, then reconcile and publish.
func (h *handCluster) turn(e any) {
	h.handle(context.Background(), e, h.now)
	h.step()
}

// step is a loop turn without an event (the loop's ticker).
func (h *handCluster) step() {
	h.reconcile(context.Background(), h.now)
	h.publish()
}

// join registers a shard of node id with mem bytes and opens its control
// stream; it returns the shard ID.
func (h *handCluster) join(node string, inc, mem uint64) string {
	h.t.Helper()
	reply := make(chan registerReply, 1)
	h.turn(evRegister{req: &pb.RegisterRequest{NodeId: node, Incarnation: inc, GrpcAddr: "127.0.0.1:1",
		ProtocolVersion: transport.ProtocolVersion, Devices: &pb.Devices{CpuCores: 2, MemoryBytes: mem, Device: "cpu"}}, reply: reply})
	r := <-reply
	if r.err != nil {
		h.t.Fatal(r.err)
	}
	id := r.rep.GetShardId()
	h.open(id, inc)
	return id
}

// open opens a (new) control stream for shard id.
func (h *handCluster) open(id string, inc uint64) {
	h.t.Helper()
	out := newOutbox()
	errc := make(chan error, 1)
	h.turn(evCtlOpen{hello: &pb.StreamHello{ShardId: id, Incarnation: inc, Epoch: h.Epoch()}, out: out, reply: errc})
	if err := <-errc; err != nil {
		h.t.Fatal(err)
	}
	h.out[id] = out
}

// closeStream breaks shard id's control stream.
func (h *handCluster) closeStream(id string) {
	h.out[id].close()
	h.turn(evCtlClosed{shardID: id, out: h.out[id], err: io.EOF})
}

// assigns returns the Assigns queued on shard id's stream since the last
// call.
func (h *handCluster) assigns(id string) []*pb.Assign {
	msgs, _ := h.out[id].take()
	var as []*pb.Assign
	for _, m := range msgs {
		if a := m.GetAssign(); a != nil {
			as = append(as, a)
		}
	}
	return as
}

func (h *handCluster) state(id string) string {
	for _, s := range h.View().Shards {
		if s.ShardID == id {
			return s.State
		}
	}
	return "absent"
}

// TestLossBelowMinShardsReplacesAtOnce: --min-shards gates the first
// formation only. After it, a placed shard whose control stream breaks is
// lost at once — no confirmation wait on the clock — and the model is
// re-placed, in the same turn of the loop, onto the one survivor, below
// --min-shards. Requests keep being admitted meanwhile (ErrPipelineDown,
// not ErrNoFit). The lost shard's stream coming back is a rejoin: a spare
// that drops its old range.
func TestLossBelowMinShardsReplacesAtOnce(t *testing.T) {
	h := newHandCluster(t, 2)
	a := h.join("node-a", 1, 1<<20)
	if h.active != nil {
		t.Fatalf("placed with 1 of --min-shards 2: %+v", h.active)
	}
	if err := h.Ready(); err == nil || errors.Is(err, ErrPipelineDown) || !strings.Contains(err.Error(), "1 of --min-shards 2") {
		t.Fatalf("Ready before the first formation = %v, want the min-shards wait, not ErrPipelineDown", err)
	}
	b := h.join("node-b", 2, 1<<20)
	if h.active == nil || len(h.active.Stages) != 2 || h.active.Version != 1 {
		t.Fatalf("first placement = %+v, want 2 stages", h.active)
	}
	h.assigns(a)
	h.assigns(b)

	h.closeStream(b)
	if got := h.state(b); got != "lost" {
		t.Fatalf("b is %q right after its control stream broke, want lost (no confirmation wait)", got)
	}
	p := h.active
	if p.Version != 2 || len(p.Stages) != 1 || p.Stages[0].ShardID != a || p.Stages[0].First != 0 || p.Stages[0].End != 4 ||
		!p.Stages[0].Embed || !p.Stages[0].Head {
		t.Fatalf("placement after the loss = %+v, want version 2: a alone, layers [0,4), embed and head", p)
	}
	as := h.assigns(a)
	if len(as) != 1 || as[0].GetPlacementVersion() != 2 || as[0].GetEndLayer() != 4 || !as[0].GetHead() || as[0].GetNextAddr() != "" {
		t.Fatalf("survivor's assigns = %v, want version 2 with every layer and the head", as)
	}
	err := h.Ready()
	if !errors.Is(err, ErrPipelineDown) || errors.Is(err, ErrNoFit) {
		t.Fatalf("Ready while the survivor loads = %v, want ErrPipelineDown without ErrNoFit", err)
	}

	// b's stream comes back: a rejoin, as a spare of placement 2.
	h.open(b, 2)
	if got := h.state(b); got != "idle" {
		t.Fatalf("b is %q after its stream returned, want idle (a spare)", got)
	}
	if as := h.assigns(b); len(as) != 1 || !isSpareAssign(as[0]) || as[0].GetPlacementVersion() != 2 {
		t.Fatalf("returning shard's assigns = %v, want one spare Assign of version 2", as)
	}
	if h.active.Version != 2 {
		t.Fatalf("placement %d after the rejoin, want 2 kept", h.active.Version)
	}
}

func isSpareAssign(a *pb.Assign) bool {
	return a.GetFirstLayer() == a.GetEndLayer() && !a.GetEmbed() && !a.GetHead()
}

// TestLossNothingCanHoldTheModel: two shards that hold the model only
// together; one is lost. Ready then wraps ErrPipelineDown and ErrNoFit at
// once, saying which shard was lost and why the rest cannot hold the model,
// so the engine fails what it had dispatched (see
// TestEngineFailsDispatchedWhenNothingCanHold) while new requests wait. A
// shard that can hold it heals the cluster.
func TestLossNothingCanHoldTheModel(t *testing.T) {
	h := newHandCluster(t, 2)
	// The weights are 5000 bytes: 3000 each holds half, not all.
	a := h.join("node-a", 1, 3000)
	b := h.join("node-b", 2, 3000)
	if h.active == nil || len(h.active.Stages) != 2 {
		t.Fatalf("first placement = %+v", h.active)
	}
	h.closeStream(b)
	err := h.Ready()
	if !errors.Is(err, ErrPipelineDown) || !errors.Is(err, ErrNoFit) {
		t.Fatalf("Ready = %v, want ErrPipelineDown and ErrNoFit", err)
	}
	for _, want := range []string{"shard " + b + " lost: control stream closed", "cannot place the model on the shards left (1)", "need 5000 bytes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Ready's reason %q does not say %q", err, want)
		}
	}
	if v := h.View(); !v.CannotPlace || v.Placement != 1 {
		t.Fatalf("view: cannot_place %v, placement %d; want true, 1", v.CannotPlace, v.Placement)
	}
	_ = a

	// A big enough shard joins: placed onto at once (below --min-shards).
	c := h.join("node-c", 3, 1<<20)
	if h.active.Version != 2 || h.active.stageOf(c) < 0 {
		t.Fatalf("placement after a big shard joined = %+v", h.active)
	}
	if err := h.Ready(); errors.Is(err, ErrNoFit) || h.View().CannotPlace {
		t.Fatalf("Ready after the heal = %v, still ErrNoFit", err)
	}
}

// TestMembershipIsAHint: a gossip leave or death of a shard whose control
// stream is alive and answering is no loss (the placement stands, the
// overrule is counted) — whoever gossips it, the shard itself or an
// impostor claiming its node ID. Only once its stream has been silent for
// LossConfirm does a gossip death count: the shard is lost, its stream cut
// (a return is a rejoin) and the model re-placed.
func TestMembershipIsAHint(t *testing.T) {
	h := newHandCluster(t, 2)
	a := h.join("node-a", 1, 1<<20)
	b := h.join("node-b", 2, 1<<20)
	ev := func(k membership.EventKind, node string, inc uint64) membership.Event {
		return membership.Event{Kind: k, Member: membership.Member{Name: "impostor", Addr: "10.0.0.9:7946",
			Meta: membership.Meta{Role: membership.RoleShard, NodeID: node, Incarnation: inc}}}
	}
	for _, k := range []membership.EventKind{membership.EventLeave, membership.EventDead} {
		h.member(ev(k, "node-b", 2), h.now)
		h.step()
		if got := h.state(b); got == "lost" || h.active.Version != 1 {
			t.Fatalf("after a gossip %v of b with its stream alive: b %q, placement %d; want not lost, placement 1", k, got, h.active.Version)
		}
	}
	if got := h.View().MembershipOverruled; got != 2 {
		t.Fatalf("membership_overruled = %d, want 2", got)
	}

	// A heartbeat keeps the stream answering past LossConfirm from its
	// opening.
	h.now = h.now.Add(h.cfg.LossConfirm - time.Second)
	h.turn(evCtlMsg{shardID: b, out: h.out[b], msg: &pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Heartbeat{Heartbeat: &pb.Heartbeat{Epoch: h.Epoch()}}}})
	h.now = h.now.Add(h.cfg.LossConfirm - time.Second)
	h.member(ev(membership.EventDead, "node-b", 2), h.now)
	h.step()
	if got := h.state(b); got == "lost" {
		t.Fatal("b lost on a gossip death though it heartbeat within LossConfirm")
	}

	// Silent for LossConfirm, then declared dead: lost, cut, re-placed.
	h.now = h.now.Add(2 * time.Second)
	h.member(ev(membership.EventDead, "node-b", 2), h.now)
	h.step()
	if got := h.state(b); got != "lost" {
		t.Fatalf("b is %q after a gossip death and %v of silence, want lost", got, h.cfg.LossConfirm+time.Second)
	}
	if _, ok := h.out[b].take(); ok {
		t.Fatal("the silent shard's control stream was not cut")
	}
	if h.active.Version != 2 || len(h.active.Stages) != 1 || h.active.Stages[0].ShardID != a {
		t.Fatalf("placement after b's loss = %+v, want a alone", h.active)
	}
}
