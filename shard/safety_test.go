package shard

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// The tests of this file prove the shard's safety rules without the shared
// model files: runners compute on a small random-weight model, and the
// node's control logic runs behind fakes. scripts/mutate keeps a mutation
// of each rule they check.

// randomModel is a two-layer random-weight Llama, small enough to build in
// memory in milliseconds.
func randomModel(t testing.TB) *model.Model {
	t.Helper()
	f, err := model.RandomFile(model.RandomSpec{Layers: 2, Embd: 32, Heads: 4, HeadsKV: 2, FF: 64, Vocab: 300, Context: 256, Type: ggml.F32, Seed: 19})
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// randomPipe is a chain of runners over m's layers cut at cuts, each with a
// pool of 16 blocks, computing on one thread (a pool of one starts no
// goroutine, so it may live in a synctest bubble).
func randomPipe(t testing.TB, m *model.Model, cuts ...int) pipe {
	t.Helper()
	pool := cpu.NewPool(1)
	t.Cleanup(pool.Close)
	bounds := append(append([]int{0}, cuts...), m.Layers)
	var p pipe
	for i := 0; i+1 < len(bounds); i++ {
		kv, err := cpu.NewKV(cpu.KVConfig{Layers: bounds[i+1] - bounds[i], Blocks: 16, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: ggml.F32})
		if err != nil {
			t.Fatal(err)
		}
		st, err := model.NewStage(m, bounds[i], bounds[i+1], cpu.NewBackend(pool), kv)
		if err != nil {
			t.Fatal(err)
		}
		p = append(p, NewRunner(st, 16, kv.BlockSize()))
	}
	return p
}

// checkTable fails t unless tb holds exactly the sequences live, refused
// nothing it should not, and is consistent.
func checkTable(t *testing.T, what string, tb *Table, live ...uint64) {
	t.Helper()
	if got := tb.Live(); !slices.Equal(got, live) {
		t.Fatalf("%s: live %v, want %v", what, got, live)
	}
	if err := tb.CheckInvariants(16); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestTableCreateAtHighWaterMark: a first row for an ID equal to the
// high-water mark is refused whether that sequence is live (a duplicate
// create) or ended (a late create, which would resurrect it), and nothing
// is allocated either way; so are block IDs outside the pool at its
// edges; and a new epoch forgets the old epoch's early tombstones.
func TestTableCreateAtHighWaterMark(t *testing.T) {
	now := time.Unix(100, 0)
	tb := NewTable(8)
	tb.SetEpoch(1)
	place := func(seq uint64, pos int, first bool, n int, blocks ...int32) string {
		return code(tb.Place(seq, pos, first, n, blocks, 0, nil, 4, now))
	}
	if c := place(5, 0, true, 3, 0); c != "" {
		t.Fatalf("create 5: %s", c)
	}
	// A second first row for the live 5, naming other blocks.
	if c := place(5, 0, true, 6, 2, 3); c != "stale_create" {
		t.Fatalf("second create of the live 5 at the mark: %q, want stale_create", c)
	}
	if got := tb.BlocksOf(5); !slices.Equal(got, []int32{0}) || tb.BlocksUsed() != 1 {
		t.Fatalf("the refused create changed 5's table to %v (%d blocks used)", got, tb.BlocksUsed())
	}
	if c := place(5, 3, false, 1, 0); c != "" {
		t.Fatalf("5 continues at position 3: %s", c)
	}
	checkTable(t, "after the duplicate create", tb, 5)

	// 5 ends; a late or duplicate first row for it must not bring it back.
	if !tb.Tombstone(5, Finished) {
		t.Fatal("the tombstone freed nothing")
	}
	if c := place(5, 0, true, 1, 4); c != "stale_create" {
		t.Fatalf("create of the ended 5 at the mark: %q, want stale_create", c)
	}
	if tb.Has(5) || tb.BlocksUsed() != 0 || tb.Sequences() != 0 {
		t.Fatalf("5 resurrected: has=%v, %d blocks used", tb.Has(5), tb.BlocksUsed())
	}
	checkTable(t, "after the late create", tb)

	// Block IDs just outside [0, pool) are refused.
	for _, b := range []int32{8, -1} {
		if c := place(6, 0, true, 1, b); c != "bad_blocks" {
			t.Fatalf("block %d in a pool of 8: %q, want bad_blocks", b, c)
		}
	}
	if c := place(6, 0, true, 1, 7); c != "" {
		t.Fatalf("block 7, the pool's last: %s", c)
	}
	checkTable(t, "after the bounds", tb, 6)
	if got := tb.Refused(transport.CodeStaleCreate); got != 2 {
		t.Fatalf("%d stale creates counted, want 2", got)
	}

	// A tombstone that overtook its create in epoch 1 names an epoch-1
	// sequence: epoch 2's own 9 is created.
	tb.Tombstone(9, Aborted)
	if c := place(9, 0, true, 1, 1); c != "stale_create" {
		t.Fatalf("create of 9 behind its tombstone: %q", c)
	}
	tb.SetEpoch(2)
	if c := place(9, 0, true, 1, 1); c != "" {
		t.Fatalf("create of epoch 2's 9: %s", c)
	}
	checkTable(t, "in epoch 2", tb, 9)
}

// TestTableEarlyTombstoneLimit: tombstones for sequences not yet created
// are kept up to MaxEarlyTombstones; before any create wherever they
// point, and from the first create on only within the limit above the
// high-water mark (that create drops the farther ones). A kept one still
// refuses its create; the others are refused and counted. A row at a
// negative position is refused (bad_position), never a panic.
func TestTableEarlyTombstoneLimit(t *testing.T) {
	now := time.Unix(100, 0)
	tb := NewTable(8)
	tb.SetEpoch(1)
	for i := range MaxEarlyTombstones + 100 {
		tb.Tombstone(uint64(1<<40+i), Aborted)
	}
	if tb.Early() != MaxEarlyTombstones || tb.EarlyRefused() != 100 {
		t.Fatalf("before any create: %d kept, %d refused; want %d and 100", tb.Early(), tb.EarlyRefused(), MaxEarlyTombstones)
	}
	checkTable(t, "full of early tombstones", tb)
	if c := code(tb.Place(10, 0, true, 1, []int32{0}, 0, nil, 16, now)); c != "" {
		t.Fatalf("create of 10: %s", c)
	}
	if tb.Early() != 0 || tb.EarlyRefused() != MaxEarlyTombstones+100 {
		t.Fatalf("after the first create: %d kept, %d refused; want 0 and %d", tb.Early(), tb.EarlyRefused(), MaxEarlyTombstones+100)
	}
	edge := uint64(10 + MaxEarlyTombstones)
	tb.Tombstone(edge, Aborted)
	tb.Tombstone(edge+1, Aborted)
	tb.Tombstone(1<<62, Aborted)
	if tb.Early() != 1 || tb.EarlyRefused() != MaxEarlyTombstones+102 {
		t.Fatalf("at the edge: %d kept, %d refused; want 1 and %d", tb.Early(), tb.EarlyRefused(), MaxEarlyTombstones+102)
	}
	if c := code(tb.Place(edge, 0, true, 1, []int32{1}, 0, nil, 16, now)); c != "stale_create" {
		t.Fatalf("create behind a kept early tombstone: %q, want stale_create", c)
	}
	checkTable(t, "after the edge", tb, 10)
	for _, first := range []bool{true, false} {
		if c := code(tb.Place(10, -100, first, 1, []int32{2}, 0, nil, 16, now)); c != "bad_position" {
			t.Fatalf("row at position -100 (first %v): %q, want bad_position", first, c)
		}
	}
	checkTable(t, "after the negative positions", tb, 10)
}

// TestRunnerTombstonesBeforeRows: in one batch, its tombstones reach each
// stage before its rows, so a late row of a sequence tombstoned in the
// same batch is dropped (unknown_sequence), never computed, and a create
// of a sequence whose tombstone rides in the same batch is refused
// (stale_create); later stages never see either row, and the last stage
// keeps no sampler state for them.
func TestRunnerTombstonesBeforeRows(t *testing.T) {
	m := randomModel(t)
	p := randomPipe(t, m, 1)
	a, b, c := []int32{0}, []int32{1}, []int32{2}
	step := func(batch Batch) (drops [][]Dropped, last *Result) {
		t.Helper()
		for i := range p {
			var res *Result
			batch, res = p.stageStep(t, i, batch)
			drops, last = append(drops, res.Dropped), res
		}
		return drops, last
	}
	sampled := func(res *Result) []uint64 {
		var out []uint64
		for _, s := range res.Samples {
			out = append(out, s.Seq)
		}
		return out
	}
	_, res := step(Batch{Epoch: 1, ID: 1, Rows: []Row{
		{Seq: 1, First: true, Tokens: []int32{1, 50, 60, 70}, Blocks: a, Sample: true},
		{Seq: 2, First: true, Tokens: []int32{1, 80, 90}, Blocks: b, Sample: true},
	}})
	if got := sampled(res); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("first batch sampled %v", got)
	}
	tokA := res.Samples[0].Result.Token

	drops, res := step(Batch{Epoch: 1, ID: 2,
		Tombstones: []Tombstone{{Seq: 2, Reason: Aborted}, {Seq: 3, Reason: Aborted}},
		Rows: []Row{
			{Seq: 1, Pos: 4, Tokens: []int32{tokA}, Blocks: a, Sample: true},
			{Seq: 2, Pos: 3, Tokens: []int32{91}, Blocks: b, Sample: true},               // late row of the tombstoned 2
			{Seq: 3, First: true, Tokens: []int32{1, 100, 110}, Blocks: c, Sample: true}, // create of the tombstoned 3
		}})
	want := [][]Dropped{{{Seq: 2, Code: transport.CodeUnknownSequence}, {Seq: 3, Code: transport.CodeStaleCreate}}, nil}
	if diff := cmp.Diff(drops, want); diff != "" {
		t.Fatalf("rows dropped per stage (-got +want):\n%s", diff)
	}
	if got := sampled(res); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("second batch sampled %v, want 1 alone", got)
	}
	for i, r := range p {
		checkTable(t, "after the tombstones", r.Table(), 1)
		if got := r.Table().Freed(Aborted); got != 1 {
			t.Fatalf("stage %d freed %d sequences by abort, want 1 (2; 3 never existed)", i, got)
		}
		if err := r.CheckInvariants(); err != nil {
			t.Fatalf("stage %d: %v", i, err)
		}
	}

	// A duplicate of 2's first row arrives late, at the high-water mark.
	drops, _ = step(Batch{Epoch: 1, ID: 3, Rows: []Row{{Seq: 2, First: true, Tokens: []int32{1, 80, 90}, Blocks: b, Sample: true}}})
	if diff := cmp.Diff(drops, [][]Dropped{{{Seq: 2, Code: transport.CodeStaleCreate}}, nil}); diff != "" {
		t.Fatalf("late create of 2 (-got +want):\n%s", diff)
	}
	// 1 ends: nothing is left anywhere.
	step(Batch{Epoch: 1, ID: 4, Tombstones: []Tombstone{{Seq: 1, Reason: Finished}}})
	for i, r := range p {
		checkTable(t, "after the drain", r.Table())
		if err := r.CheckInvariants(); err != nil {
			t.Fatalf("stage %d: %v", i, err)
		}
	}
}

// TestRunnerRefusals: a batch of an older epoch is refused whole and
// changes nothing; so is a batch of a newer epoch, which is never adopted
// (only the control stream moves the epoch: SetEpoch); a row whose token is
// outside the vocabulary is dropped and its sequence freed, beside a row
// that is computed.
func TestRunnerRefusals(t *testing.T) {
	m := randomModel(t)
	r := randomPipe(t, m)[0]
	r.SetEpoch(5)
	if _, err := r.Process(&Batch{Epoch: 5, ID: 1, Rows: []Row{{Seq: 1, First: true, Tokens: []int32{1, 2}, Blocks: []int32{0}, Sample: true}}}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	_, err := r.Process(&Batch{Epoch: 4, ID: 2, Rows: []Row{{Seq: 7, First: true, Tokens: []int32{1}, Blocks: []int32{1}, Sample: true}}}, time.Time{})
	if !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("batch of an older epoch: %v, want ErrStaleEpoch", err)
	}
	checkTable(t, "after the stale batch", r.Table(), 1)
	_, err = r.Process(&Batch{Epoch: 1 << 62, ID: 2, Rows: []Row{{Seq: 8, First: true, Tokens: []int32{1}, Blocks: []int32{1}, Sample: true}}}, time.Time{})
	if !errors.Is(err, ErrFutureEpoch) {
		t.Fatalf("batch of epoch 2^62: %v, want ErrFutureEpoch", err)
	}
	if r.Table().Epoch() != 5 {
		t.Fatalf("a batch moved the runner to epoch %d", r.Table().Epoch())
	}
	checkTable(t, "after the future batch", r.Table(), 1)
	res, err := r.Process(&Batch{Epoch: 5, ID: 3, Rows: []Row{
		{Seq: 2, First: true, Tokens: []int32{1, int32(m.Vocab)}, Blocks: []int32{2}, Sample: true},
		{Seq: 3, First: true, Tokens: []int32{1, 5}, Blocks: []int32{3}, Sample: true},
	}}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Dropped) != 1 || res.Dropped[0] != (Dropped{Seq: 2, Code: transport.CodeBadToken}) || len(res.Samples) != 1 || res.Samples[0].Seq != 3 {
		t.Fatalf("dropped %v, sampled %v", res.Dropped, res.Samples)
	}
	checkTable(t, "after the bad token", r.Table(), 1, 3)
	if err := r.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// testNode is a Node reduced to its control logic: no listeners, no
// gossip, a placement that is r, registered at epoch, a 10 s lease until a
// heartbeat reply says otherwise, and heartbeats only at session start.
func testNode(r *Runner, epoch uint64) *Node {
	n := &Node{
		cfg:         Config{LeaseTick: 100 * time.Millisecond},
		log:         slog.New(slog.DiscardHandler),
		nodeID:      "node-test",
		incarnation: 1,
		baseRefused: map[transport.Code]uint64{},
		status:      &pb.Status{State: pb.Status_READY, PlacementVersion: 1},
		statusCh:    make(chan struct{}, 1),
		ctlOut:      make(chan *pb.BatchFailed, 64),
		p:           &placement{version: 1, runner: r, last: true},
		epoch:       epoch,
		shardID:     "shard-test",
		regEpoch:    epoch,
	}
	n.lease.Store(int64(10 * time.Second))
	n.heartbeatEvery.Store(int64(time.Hour))
	r.SetEpoch(epoch)
	return n
}

// createSeqs creates sequences seqs on n's runner (one block each) at now.
func createSeqs(t *testing.T, n *Node, epoch uint64, now time.Time, seqs ...uint64) {
	t.Helper()
	b := &Batch{Epoch: epoch, ID: 1}
	for _, s := range seqs {
		b.Rows = append(b.Rows, Row{Seq: s, First: true, Tokens: []int32{1, int32(s)}, Blocks: []int32{int32(s)}, Sample: true})
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	res, err := n.p.runner.Process(b, now)
	if err != nil || len(res.Dropped) != 0 {
		t.Fatalf("create %v: %v, dropped %v", seqs, err, res.Dropped)
	}
}

// ctlCoord is a coordinator's control service reduced to two channels:
// what the shard sent, and what to send it.
type ctlCoord struct {
	pb.UnimplementedCoordinatorServer
	in  chan *pb.ShardToCoordinator
	out chan *pb.CoordinatorToShard
}

func (c *ctlCoord) Control(s pb.Coordinator_ControlServer) error {
	go func() { // ends when the stream does
		for {
			m, err := s.Recv()
			if err != nil {
				return
			}
			select {
			case c.in <- m:
			case <-s.Context().Done():
				return
			}
		}
	}()
	for {
		select {
		case m := <-c.out:
			if err := s.Send(m); err != nil {
				return err
			}
		case <-s.Context().Done():
			return nil
		}
	}
}

// controlSession serves coord in process (bufconn) and runs n's control
// session against it; the channel reports how the session ended.
func controlSession(t *testing.T, n *Node, coord *ctlCoord) <-chan error {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := transport.NewServer()
	pb.RegisterCoordinatorServer(srv, coord)
	go srv.Serve(lis) // ended by Stop below
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient("passthrough:///coordinator",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done, exited := make(chan error, 1), make(chan struct{})
	go func() { // waited for below
		defer close(exited)
		_, err := n.session(ctx, cc)
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		<-exited
		cc.Close()
	})
	return done
}

// TestControlReconcileAndBackstop drives a shard's control session with a
// fake coordinator: the heartbeat reply's unknown sequences are freed
// (reason reconcile) and the rest kept; backstop tombstones are applied
// before they are acked, one of an older epoch is ignored, one of a newer
// epoch first drops every older sequence; and a reply of a newer epoch
// drops the older sequences at once and ends the session to register
// again. Each backstop ack fences what came before it on the stream.
func TestControlReconcileAndBackstop(t *testing.T) {
	m := randomModel(t)
	r := randomPipe(t, m)[0]
	n := testNode(r, 100)
	createSeqs(t, n, 100, time.Now(), 1, 2, 3, 4, 5)
	coord := &ctlCoord{in: make(chan *pb.ShardToCoordinator, 16), out: make(chan *pb.CoordinatorToShard, 16)}
	done := controlSession(t, n, coord)
	recv := func() *pb.ShardToCoordinator {
		t.Helper()
		select {
		case m := <-coord.in:
			return m
		case err := <-done:
			t.Fatalf("control session ended: %v", err)
		case <-time.After(20 * time.Second): // a watchdog, not a wait
			t.Fatal("the shard sent nothing for 20 s")
		}
		return nil
	}
	// backstop sends tombstones ts (none: a pure fence) with ack id and
	// waits for the ack.
	backstop := func(id uint64, ts ...*pb.Tombstone) {
		t.Helper()
		coord.out <- &pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_Tombstones{Tombstones: &pb.Tombstones{AckId: id, Tombstones: ts}}}
		for {
			if a := recv().GetAck(); a != nil {
				if a.GetAckId() != id {
					t.Fatalf("ack %d, want %d", a.GetAckId(), id)
				}
				return
			}
		}
	}
	check := func(what string, live ...uint64) {
		t.Helper()
		n.mu.Lock()
		defer n.mu.Unlock()
		checkTable(t, what, r.Table(), live...)
		if err := r.CheckInvariants(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	if recv().GetHello().GetShardId() != "shard-test" || recv().GetStatus() == nil {
		t.Fatal("the session does not open with hello and status")
	}
	if hb := recv().GetHeartbeat(); !slices.Equal(hb.GetLiveSeqs(), []uint64{1, 2, 3, 4, 5}) {
		t.Fatalf("first heartbeat lists %v", hb.GetLiveSeqs())
	}
	coord.out <- &pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_HeartbeatReply{HeartbeatReply: &pb.HeartbeatReply{
		Epoch: 100, LeaseMs: 1500, UnknownSeqs: []uint64{2, 4, 42}}}}
	backstop(1)
	check("after the reply naming 2 and 4", 1, 3, 5)
	if got := n.heartbeat(100).GetCounters().GetFreedReconcile(); got != 2 {
		t.Fatalf("heartbeat counts %d freed by reconcile, want 2", got)
	}
	if got := time.Duration(n.lease.Load()); got != 1500*time.Millisecond {
		t.Fatalf("lease %v after a reply of 1.5 s", got)
	}

	backstop(2, &pb.Tombstone{Epoch: 100, Seq: 3, Reason: pb.Tombstone_ABORTED})
	check("after the backstop tombstone of 3", 1, 5)
	backstop(3, &pb.Tombstone{Epoch: 99, Seq: 5, Reason: pb.Tombstone_ABORTED})
	check("after a tombstone of epoch 99", 1, 5)
	backstop(4, &pb.Tombstone{Epoch: 101, Seq: 9, Reason: pb.Tombstone_ABORTED})
	check("after a tombstone of epoch 101")
	n.mu.Lock()
	freedEpoch, freedAborted, epoch := r.Table().Freed(Epoch), r.Table().Freed(Aborted), r.Table().Epoch()
	n.mu.Unlock()
	if freedEpoch != 2 || freedAborted != 1 || epoch != 101 {
		t.Fatalf("freed by epoch %d (want 2), by abort %d (want 1), table at epoch %d (want 101)", freedEpoch, freedAborted, epoch)
	}

	// Epoch 101's sequences, then a reply of a newer epoch.
	createSeqs(t, n, 101, time.Now(), 1, 2)
	coord.out <- &pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_HeartbeatReply{HeartbeatReply: &pb.HeartbeatReply{Epoch: 102}}}
	for {
		select {
		case <-coord.in:
			continue
		case err := <-done:
			if !errors.Is(err, errReregister) {
				t.Fatalf("session ended with %v, want errReregister", err)
			}
		case <-time.After(20 * time.Second): // a watchdog, not a wait
			t.Fatal("the session outlived a reply of a newer epoch")
		}
		break
	}
	check("after a reply of epoch 102")
	n.mu.Lock()
	defer n.mu.Unlock()
	if r.Table().Epoch() != 102 || n.epoch != 102 {
		t.Fatalf("table at epoch %d, node at %d, want 102", r.Table().Epoch(), n.epoch)
	}
}

// TestNodeLeaseExpiresMany runs the node's lease clock in a synctest
// bubble: while heartbeat replies renew them, eight sequences outlive
// their lease many times over; once replies stop, every one of them is
// freed (reason lease) within a tick of the lease, none before, with
// their sampler states, and the heartbeat counts them.
func TestNodeLeaseExpiresMany(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := randomModel(t)
		r := randomPipe(t, m)[0]
		n := testNode(r, 100) // lease 10 s until a reply
		seqs := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
		createSeqs(t, n, 100, time.Now(), seqs...)
		ctx, cancel := context.WithCancel(context.Background())
		stopped := make(chan struct{})
		go func() { // waited for below, also when the test fails
			n.leaseLoop(ctx)
			close(stopped)
		}()
		defer func() {
			cancel()
			<-stopped
		}()
		reply := func() {
			t.Helper()
			rep := &pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_HeartbeatReply{HeartbeatReply: &pb.HeartbeatReply{Epoch: 100, LeaseMs: 1000}}}
			if _, err := n.handleControl(ctx, rep, 100); err != nil {
				t.Fatal(err)
			}
		}
		live := func(what string, want ...uint64) {
			t.Helper()
			synctest.Wait() // the lease loop has acted on this instant
			n.mu.Lock()
			defer n.mu.Unlock()
			checkTable(t, what, r.Table(), want...)
			if err := r.CheckInvariants(); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		reply()
		for range 6 {
			time.Sleep(350 * time.Millisecond)
			reply()
		}
		live("while replies renew the lease (2.1 s)", seqs...)
		time.Sleep(950 * time.Millisecond)
		live("0.95 s after the last reply", seqs...)
		time.Sleep(200 * time.Millisecond)
		live("1.15 s after the last reply")
		hb := n.heartbeat(100)
		if got := hb.GetCounters().GetFreedLease(); got != uint64(len(seqs)) {
			t.Fatalf("heartbeat counts %d freed by lease, want %d", got, len(seqs))
		}
		if hb.GetKv().GetBlocksUsed() != 0 || len(hb.GetLiveSeqs()) != 0 {
			t.Fatalf("heartbeat: %d blocks used, live %v", hb.GetKv().GetBlocksUsed(), hb.GetLiveSeqs())
		}
	})
}
