package coordinator

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/strata-llm/strata/control"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// The tests of this file check the coordinator's side of the tombstone
// rules without a network: the remote pipeline's bookkeeping (what is live,
// what was tombstoned, what reconcile may name, which tombstones ride in
// which batch) and the loop's acked backstop. scripts/mutate keeps a
// mutation of each rule they check.

// readyRemote is a remote pipeline of epoch 7 on placement 1, dispatching
// to a link whose queue holds depth batches.
func readyRemote(t *testing.T, depth int) (*remote, *link) {
	t.Helper()
	p := newRemote(7, 0, &transport.Refusals{})
	p.setPlacement(&Placement{Version: 1, Stages: []Stage{{ShardID: "a"}}, Blocks: 16, BlockSize: 16})
	l := &link{version: 1, queue: make(chan *pb.BatchHeader, depth)}
	if !p.resume(l) {
		t.Fatal("link of the current placement refused")
	}
	return p, l
}

func creates(seqs ...uint64) []transport.Row {
	var rows []transport.Row
	for _, s := range seqs {
		rows = append(rows, transport.Row{Seq: s, First: true, Tokens: []int32{1}, Blocks: []int32{int32(s)}, Sample: true})
	}
	return rows
}

func tombs(seqs ...uint64) []transport.Tombstone {
	var ts []transport.Tombstone
	for _, s := range seqs {
		ts = append(ts, transport.Tombstone{Epoch: 7, Seq: s, Reason: transport.ReasonAborted})
	}
	return ts
}

// headerTombs returns the sequences a batch header tombstones.
func headerTombs(h *pb.BatchHeader) []uint64 {
	var out []uint64
	for _, t := range h.GetTombstones() {
		out = append(out, t.GetSeq())
	}
	return out
}

// TestRemoteUnknownAndRotation: reconcile names exactly the sequences a
// shard lists that the coordinator never created or tombstoned two
// rotations ago: never a live one, and not one tombstoned so recently that
// its tombstone may still be on its way. A dispatched tombstone also goes
// to the backstop.
func TestRemoteUnknownAndRotation(t *testing.T) {
	p, l := readyRemote(t, 8)
	led := newDirectPipeline(p)
	if err := led.Dispatch(&transport.MicroBatch{Epoch: 7, ID: 1, Rows: creates(1, 2, 3)}); err != nil {
		t.Fatal(err)
	}
	if got := p.unknown([]uint64{1, 2, 3, 99}, led); !slices.Equal(got, []uint64{99}) {
		t.Fatalf("unknown = %v with 1, 2, 3 live, want [99]", got)
	}
	if err := led.Dispatch(&transport.MicroBatch{Epoch: 7, Tombstones: tombs(2)}); err != nil {
		t.Fatal(err)
	}
	<-l.queue
	if h := <-l.queue; !slices.Equal(headerTombs(h), []uint64{2}) {
		t.Fatalf("in-band tombstones %v, want [2]", headerTombs(h))
	}
	if got := p.takeBackstop(); !slices.Equal(got, tombs(2)) {
		t.Fatalf("backstop %v, want 2's tombstone", got)
	}
	if n := len(led.running(nil)); n != 2 {
		t.Fatalf("%d live after 2's tombstone, want 2", n)
	}
	shard := []uint64{1, 2, 3} // a heartbeat taken before 2's tombstone arrived
	for i, want := range [][]uint64{nil, nil, {2}, {2}} {
		if got := p.unknown(shard, led); !slices.Equal(got, want) {
			t.Fatalf("after %d rotations: unknown = %v, want %v", i, got, want)
		}
		p.rotateEnded()
	}
}

// TestRemotePendingTombstones: tombstones dispatched while no link can
// take them — the pipeline paused, or its queue full — ride, in order, in
// the next batch that goes.
func TestRemotePendingTombstones(t *testing.T) {
	p, l := readyRemote(t, 1)
	led := newDirectPipeline(p)
	if err := led.Dispatch(&transport.MicroBatch{Epoch: 7, ID: 1, Rows: creates(1, 2, 3, 4)}); err != nil {
		t.Fatal(err)
	}
	<-l.queue
	p.pause("shard lost", led)
	if err := led.Dispatch(&transport.MicroBatch{Epoch: 7, Tombstones: tombs(1)}); err != nil {
		t.Fatalf("tombstone-only batch while paused: %v", err)
	}
	if err := led.Dispatch(&transport.MicroBatch{Epoch: 7, ID: 2, Tombstones: tombs(2)}); !errors.Is(err, ErrNotReady) {
		t.Fatalf("batch while paused: %v, want ErrNotReady", err)
	}
	l2 := &link{version: 1, queue: make(chan *pb.BatchHeader, 1)}
	if !p.resume(l2) {
		t.Fatal("resume refused")
	}
	if err := led.Dispatch(&transport.MicroBatch{Epoch: 7, ID: 3, Tombstones: tombs(3)}); err != nil {
		t.Fatal(err)
	}
	if err := led.Dispatch(&transport.MicroBatch{Epoch: 7, ID: 4, Tombstones: tombs(4)}); !errors.Is(err, ErrLinkFull) {
		t.Fatalf("batch on a full link: %v, want ErrLinkFull", err)
	}
	if h := <-l2.queue; !slices.Equal(headerTombs(h), []uint64{1, 2, 3}) {
		t.Fatalf("first batch after the pause carries tombstones %v, want [1 2 3]", headerTombs(h))
	}
	if err := led.Dispatch(&transport.MicroBatch{Epoch: 7}); err != nil {
		t.Fatal(err)
	}
	if h := <-l2.queue; !slices.Equal(headerTombs(h), []uint64{4}) {
		t.Fatalf("the batch after the full link carries tombstones %v, want [4]", headerTombs(h))
	}
	if n := len(led.running(nil)); n != 0 {
		t.Fatalf("%d live after every tombstone", n)
	}
}

// loopCluster is a Cluster reduced to its loop-owned state: shards a and b
// placed in placement 1 of epoch 7, with no network. Its control core
// knows no shard: what these tests do (streams, acks, fan-out) asks it
// for no decision.
func loopCluster() *Cluster {
	c := &Cluster{
		log:     slog.New(slog.DiscardHandler),
		start:   StartState{Epoch: 7},
		pipe:    newRemote(7, 0, &transport.Refusals{}),
		shards:  map[string]*shardState{},
		active:  &Placement{Version: 1, Stages: []Stage{{ShardID: "a"}, {ShardID: "b"}}},
		ev:      make(chan any),
		stopped: make(chan struct{}),
	}
	c.cfg.Lease = 3 * time.Second
	c.core, _ = control.New(control.Config{MinShards: 1, LossConfirm: time.Second, Epoch: 7,
		Shape: control.Shape{Layers: 1, LayerBytes: []int64{1}, KVBytesPerBlockLayer: 1, BlockSize: 1}})
	for _, id := range []string{"a", "b"} {
		c.shards[id] = &shardState{rec: ShardRecord{ShardID: id, NodeID: "node-" + id, Incarnation: 1}}
	}
	return c
}

// backstopIn returns the backstop messages queued on out, as ack ID →
// sequences, in order.
func backstopIn(t *testing.T, out *outbox) [][2]uint64 {
	t.Helper()
	msgs, ok := out.take()
	if !ok {
		t.Fatal("outbox closed")
	}
	var got [][2]uint64
	for _, m := range msgs {
		ts := m.GetTombstones()
		if ts == nil {
			continue
		}
		for _, tb := range ts.GetTombstones() {
			got = append(got, [2]uint64{ts.GetAckId(), tb.GetSeq()})
		}
	}
	return got
}

// TestBackstopResendOnReconnect: every placed shard gets each tombstone on
// its control stream, also while that stream is down, and keeps it until
// acked; a reconnected stream gets what is unacked again, in order; an
// ack forgets its own message and no other.
func TestBackstopResendOnReconnect(t *testing.T) {
	c := loopCluster()
	a, b := c.shards["a"], c.shards["b"]
	open := func(id string) *outbox {
		t.Helper()
		out := newOutbox()
		if err := c.ctlOpen(&pb.StreamHello{ShardId: id, Incarnation: 1, Epoch: 7}, out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	ack := func(s *shardState, id uint64) {
		c.ctlMsg(s, &pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Ack{Ack: &pb.Ack{AckId: id}}}, time.Now())
	}
	outA, outB := open("a"), open("b")
	c.fanOut(tombs(3))
	for name, out := range map[string]*outbox{"a": outA, "b": outB} {
		if diff := cmp.Diff(backstopIn(t, out), [][2]uint64{{1, 3}}); diff != "" {
			t.Fatalf("shard %s's backstop (-got +want):\n%s", name, diff)
		}
	}
	ack(b, 1)
	// a's control stream breaks; a tombstone is fanned out meanwhile.
	c.handle(context.Background(), evCtlClosed{shardID: "a", out: outA, err: io.EOF}, time.Now())
	if a.connected() {
		t.Fatal("a still connected")
	}
	c.fanOut(tombs(4, 5))
	if diff := cmp.Diff(backstopIn(t, outB), [][2]uint64{{2, 4}, {2, 5}}); diff != "" {
		t.Fatalf("shard b's backstop (-got +want):\n%s", diff)
	}
	outA = open("a")
	if diff := cmp.Diff(backstopIn(t, outA), [][2]uint64{{1, 3}, {2, 4}, {2, 5}}); diff != "" {
		t.Fatalf("a's backstop resent on reconnect (-got +want):\n%s", diff)
	}
	ack(a, 1)
	if got := a.unackedCount(); got != 2 {
		t.Fatalf("a has %d tombstones unacked after acking the first message, want 2", got)
	}
	outA = open("a")
	if diff := cmp.Diff(backstopIn(t, outA), [][2]uint64{{2, 4}, {2, 5}}); diff != "" {
		t.Fatalf("a's backstop after the ack of 1 (-got +want):\n%s", diff)
	}
	ack(a, 2)
	ack(b, 2)
	if a.unackedCount() != 0 || b.unackedCount() != 0 {
		t.Fatalf("unacked after every ack: a %d, b %d", a.unackedCount(), b.unackedCount())
	}
	if outA = open("a"); len(backstopIn(t, outA)) != 0 {
		t.Fatal("acked tombstones resent")
	}
}

// TestBackstopHeartbeatReplyNamesUnknown: the reply to a shard's heartbeat
// carries the coordinator's epoch and lease and names the listed sequences
// it does not know, so the shard frees them (reason reconcile).
func TestBackstopHeartbeatReplyNamesUnknown(t *testing.T) {
	c := loopCluster()
	p, _ := readyRemote(t, 8)
	led := newDirectPipeline(p)
	c.pipe, c.ledger = p, led
	if err := led.Dispatch(&transport.MicroBatch{Epoch: 7, ID: 1, Rows: creates(1)}); err != nil {
		t.Fatal(err)
	}
	out := newOutbox()
	if err := c.ctlOpen(&pb.StreamHello{ShardId: "a", Incarnation: 1, Epoch: 7}, out); err != nil {
		t.Fatal(err)
	}
	c.ctlMsg(c.shards["a"], &pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Heartbeat{Heartbeat: &pb.Heartbeat{Epoch: 7, LiveSeqs: []uint64{1, 9}}}}, time.Now())
	msgs, _ := out.take()
	if len(msgs) != 1 || msgs[0].GetHeartbeatReply() == nil {
		t.Fatalf("control replies %v, want one heartbeat reply", msgs)
	}
	rep := msgs[0].GetHeartbeatReply()
	if rep.GetEpoch() != 7 || rep.GetLeaseMs() != 3000 || !slices.Equal(rep.GetUnknownSeqs(), []uint64{9}) {
		t.Fatalf("heartbeat reply %v, want epoch 7, lease 3000 ms, unknown [9]", rep)
	}
}

// TestRemoteProgressClock: the control core's progress clock
// (control.Core.Progress) starts when a batch enters an idle pipeline,
// moves on each answer while others are in flight, stops when none is,
// and neither a tombstone-only batch nor a batch the link could not take
// starts it.
func TestRemoteProgressClock(t *testing.T) {
	p, l := readyRemote(t, 2)
	led := newDirectPipeline(p)
	clock := func() time.Time { c, _ := p.progress(led); return c }
	if !clock().IsZero() {
		t.Fatal("progress clock running with nothing in flight")
	}
	if err := led.Dispatch(&transport.MicroBatch{Epoch: 7}); err != nil {
		t.Fatal(err)
	}
	<-l.queue
	if !clock().IsZero() {
		t.Fatal("a tombstone-only batch (no answer due) started the progress clock")
	}
	before := time.Now()
	for id := uint64(1); id <= 2; id++ {
		rows := creates(id)
		if id == 2 {
			rows[0].Tokens = []int32{1, 2, 3, 4, 5} // a prefill chunk
		}
		if err := led.Dispatch(&transport.MicroBatch{Epoch: 7, ID: id, Rows: rows}); err != nil {
			t.Fatal(err)
		}
	}
	started := clock()
	if _, tokens := p.progress(led); tokens != 6 {
		t.Fatalf("tokens in flight %d, want 6 (1 + a 5-token chunk)", tokens)
	}
	if started.Before(before) {
		t.Fatalf("progress clock %v, want it started at the first dispatch (after %v)", started, before)
	}
	if err := led.Dispatch(&transport.MicroBatch{Epoch: 7, ID: 3, Rows: creates(3)}); !errors.Is(err, ErrLinkFull) {
		t.Fatalf("third batch on a link of 2: %v, want ErrLinkFull", err)
	}
	if got := clock(); !got.Equal(started) && !got.After(started) {
		t.Fatalf("progress clock %v went back from %v", got, started)
	}
	src := fromResults("a")
	if err := p.takeResult(&transport.BatchResult{Epoch: 7, Placement: 1, ID: 1, Samples: []transport.Sampled{{Seq: 1, Token: 1}}}, src, led); err != nil {
		t.Fatal(err)
	}
	if got := clock(); got.IsZero() || got.Before(started) {
		t.Fatalf("after an answer with one batch still in flight: clock %v, want running from the answer", got)
	}
	if _, tokens := p.progress(led); tokens != 5 {
		t.Fatalf("tokens in flight %d after batch 1's answer, want batch 2's 5", tokens)
	}
	if err := p.takeResult(&transport.BatchResult{Epoch: 7, Placement: 1, ID: 2, Samples: []transport.Sampled{{Seq: 2, Token: 1}}}, src, led); err != nil {
		t.Fatal(err)
	}
	if got := clock(); !got.IsZero() {
		t.Fatalf("progress clock %v with nothing in flight, want stopped", got)
	}
	<-l.queue // batches 1 and 2 left for stage 0
	<-l.queue
	if err := led.Dispatch(&transport.MicroBatch{Epoch: 7, ID: 4, Rows: creates(4)}); err != nil {
		t.Fatal(err)
	}
	p.pause("test", led)
	if got := clock(); !got.IsZero() {
		t.Fatalf("progress clock %v after a pause failed every batch, want stopped", got)
	}
}
