package shard

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// fuzzNode is a Node serving runner r of m at epoch 100, placement 1, on a
// pool of 16 blocks, as the first stage when first (no hidden state in) and
// the last when last (sampling); its link's queue is drained by the caller.
func fuzzNode(tb testing.TB, m *model.Model, r *Runner, first, last bool) *Node {
	tb.Helper()
	n := testNode(r, 100)
	n.p.last = last
	n.collector = newCollector(n)
	n.p.link = &link{queue: make(chan *outMsg, 64), done: make(chan struct{}), cancel: func() {}}
	n.p.limits = transport.BatchLimits{Placement: 1, Context: m.Context, Vocab: m.Vocab, Blocks: 16, BlockSize: r.bs, MaxTokens: 512}
	if !first {
		n.p.limits.Hidden = m.Embd
	}
	return n
}

// step runs one batch through n's batch path (transport.BatchFromWire, the
// table, the model, the sampler, the outgoing conversion) and checks the
// replica table afterwards; it keeps the table small.
func (n *Node) fuzzStep(t *testing.T, b *transport.Batch) {
	t.Helper()
	_, _ = n.process(b, time.Unix(0, 0))
	for {
		select {
		case <-n.p.link.queue:
			continue
		default:
		}
		break
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	r := n.p.runner
	if err := r.CheckInvariants(); err != nil {
		t.Fatalf("after batch %d: %v", b.Header.GetBatchId(), err)
	}
	if r.Table().Sequences() > 32 {
		for _, s := range r.Table().Live() {
			r.Tombstone(Tombstone{Seq: s, Reason: Aborted})
		}
	}
}

// FuzzStageBatch feeds a stage's whole batch path with batches built from
// fuzzed numbers and with raw protobuf headers: a first-and-last stage of a
// small random model (embedding, every layer, head and sampler) and a later
// stage fed fuzzed hidden states. Nothing may panic, and the replica
// tables must stay consistent whatever was refused, dropped or computed.
func FuzzStageBatch(f *testing.F) {
	m := randomModel(f)
	whole := fuzzNode(f, m, randomPipe(f, m)[0], true, true)
	tail := fuzzNode(f, m, randomPipe(f, m, 1)[1], false, true)
	sm := slidingModel(f)
	slid := fuzzNode(f, sm, slidingRunner(f, sm), true, true)
	slid.p.limits.Groups, slid.p.limits.Window = sm.KVGroups().Groups, sm.SlidingWindow
	valid, _ := proto.Marshal(&pb.BatchHeader{Epoch: 100, PlacementVersion: 1, BatchId: 9,
		Rows: []*pb.Row{{Seq: 40, First: true, Tokens: []int32{1, 2}, Blocks: []int32{3}, Sample: true, Params: &pb.SampleParams{Temperature: 0.7, TopK: 5, Seed: 1}}}})
	f.Add(valid, uint64(1), int32(0), true, []byte{1, 20, 30}, []byte{2, 3}, int8(0), uint64(0), int32(0), "", []byte{})
	f.Add([]byte{}, uint64(1), int32(3), false, []byte{40}, []byte{2, 3}, int8(0), uint64(0), int32(0), "", []byte{})
	f.Add([]byte{}, uint64(2), int32(-100), false, []byte{1}, []byte{2}, int8(0), uint64(1), int32(2), "", []byte{})
	f.Add([]byte{}, uint64(3), int32(0), true, []byte{1}, []byte{2}, int8(127), uint64(1<<40), int32(6), "stale_create", []byte{0, 0, 0xc0, 0x7f})
	f.Add([]byte{}, uint64(4), int32(250), true, []byte{255, 255}, []byte{19, 18, 17}, int8(-1), uint64(5), int32(42), "gremlins", []byte{1, 2, 3, 4, 5})
	f.Add([]byte{}, uint64(7), int32(0), true, []byte{20, 30}, []byte{5}, int8(0), uint64(5), int32(1), "", []byte{}) // a valid sliding row
	f.Fuzz(func(t *testing.T, raw []byte, seq uint64, pos int32, first bool, toks, blocks []byte, epochOff int8, tomb uint64, reason int32, drop string, hidden []byte) {
		h := &pb.BatchHeader{Epoch: uint64(100 + int64(epochOff)), PlacementVersion: 1, BatchId: uint64(len(raw)) + 1}
		if epochOff == 127 {
			h.Epoch = 1 << 62
		}
		if len(toks) > 0 {
			row := &pb.Row{Seq: seq % 64, Pos: pos, First: first, Sample: true}
			for _, b := range toks {
				row.Tokens = append(row.Tokens, int32(b)-8)
			}
			for _, b := range blocks {
				row.Blocks = append(row.Blocks, int32(b%20)-2)
			}
			h.Rows = []*pb.Row{row}
		}
		if tomb != 0 {
			h.Tombstones = []*pb.Tombstone{{Epoch: h.Epoch, Seq: tomb, Reason: pb.Tombstone_Reason(reason)}}
		}
		if drop != "" {
			h.Dropped = []*pb.DroppedRow{{Seq: seq, Reason: drop}}
		}
		whole.fuzzStep(t, &transport.Batch{Header: h})
		tokens := 0
		for _, r := range h.GetRows() {
			tokens += len(r.GetTokens())
		}
		tail.fuzzStep(t, &transport.Batch{Header: h, Hidden: fuzzHidden(hidden, tokens*m.Embd)})
		if len(h.Rows) > 0 {
			// The same row with sliding tables cut from its blocks, on a
			// stage of a model with sliding layers.
			r := proto.Clone(h.Rows[0]).(*pb.Row)
			r.SlideFrom = int32(tomb%4) - 1
			for g := 1; g < slid.p.limits.Groups; g++ {
				for _, b := range r.Blocks[min(max(0, int(r.SlideFrom)), len(r.Blocks)):] {
					r.Slides = append(r.Slides, (b+int32(g)*int32(reason))%20)
				}
			}
			slid.fuzzStep(t, &transport.Batch{Header: &pb.BatchHeader{Epoch: h.Epoch, PlacementVersion: 1, BatchId: h.BatchId, Tombstones: h.Tombstones, Rows: []*pb.Row{r}}})
		}

		var w pb.BatchHeader
		if len(raw) == 0 || proto.Unmarshal(raw, &w) != nil {
			return
		}
		if epochOff%2 == 0 {
			w.Epoch, w.PlacementVersion = 100, 1
		}
		whole.fuzzStep(t, &transport.Batch{Header: &w})
		slid.fuzzStep(t, &transport.Batch{Header: &w})
		tokens = 0
		for _, r := range w.GetRows() {
			tokens += len(r.GetTokens())
		}
		if tokens <= 512 {
			tail.fuzzStep(t, &transport.Batch{Header: &w, Hidden: fuzzHidden(hidden, tokens*m.Embd)})
		}
	})
}

// fuzzHidden returns n float32 values read cyclically from b (NaNs and
// infinities included), or, when b's length is 1 mod 3, a hidden state of
// the wrong size.
func fuzzHidden(b []byte, n int) []float32 {
	if len(b)%3 == 1 {
		return make([]float32, len(b))
	}
	out := make([]float32, n)
	if len(b) < 4 {
		return out
	}
	for i := range out {
		j := (4 * i) % (len(b) - len(b)%4)
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[j:]))
	}
	return out
}
