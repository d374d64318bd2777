package transport

import (
	"errors"
	"io"
	"math"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/strata-llm/strata/transport/pb"
)

// fakeStream records what is sent and replays it on Recv: a stage stream
// without gRPC.
type fakeStream struct {
	msgs []*pb.StageMessage
	err  error // returned by Send when set
}

func (s *fakeStream) Send(m *pb.StageMessage) error {
	if s.err != nil {
		return s.err
	}
	s.msgs = append(s.msgs, proto.Clone(m).(*pb.StageMessage))
	return nil
}

func (s *fakeStream) Recv() (*pb.StageMessage, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}

// testHeader returns a header of rows with the given token counts.
func testHeader(id uint64, dim uint32, tokens ...int) *pb.BatchHeader {
	h := &pb.BatchHeader{
		Epoch:            1700000000000,
		PlacementVersion: 3,
		BatchId:          id,
		HiddenDim:        dim,
		TtlMs:            5000,
		Tombstones: []*pb.Tombstone{
			{Epoch: 1700000000000, Seq: 4, Reason: pb.Tombstone_ABORTED},
		},
	}
	for i, n := range tokens {
		r := &pb.Row{Seq: uint64(10 + i), Pos: int32(i), Tokens: make([]int32, n), Blocks: []int32{int32(i)}, Sample: true}
		if i == 0 {
			r.First = true
			r.Params = &pb.SampleParams{Temperature: 0.7, TopK: 40, LogitBias: map[int32]float32{5: -1}, Seed: 9}
		}
		h.Rows = append(h.Rows, r)
	}
	return h
}

func TestSendRecvBatch(t *testing.T) {
	const dim = 512
	for _, tc := range []struct {
		name   string
		typ    HiddenType
		tokens []int
	}{
		{"tombstones only", F32, nil},
		{"stage 0 rows, no hidden", F32, []int{3, 1}},
		{"f32 many chunks", F32, []int{4000, 1, 1, 1120}}, // 10 MiB
		{"bf16", BF16, []int{100, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := testHeader(42, dim, tc.tokens...)
			h.HiddenType = tc.typ
			var hidden []float32
			if tc.name != "stage 0 rows, no hidden" {
				n := 0
				for _, k := range tc.tokens {
					n += k
				}
				hidden = randomHidden(n*dim, 3)
			}
			var s fakeStream
			if err := SendBatch(&s, h, hidden); err != nil {
				t.Fatal(err)
			}
			sent := proto.Clone(h).(*pb.BatchHeader)
			b, err := RecvBatch(&s, 0)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(b.Header, sent, protocmp.Transform()); diff != "" {
				t.Fatalf("header (-got +want):\n%s", diff)
			}
			if len(b.Hidden) != len(hidden) {
				t.Fatalf("got %d hidden values, want %d", len(b.Hidden), len(hidden))
			}
			for i := range hidden {
				want := hidden[i]
				if tc.typ == BF16 {
					want = BF16ToFloat(FloatToBF16(want))
				}
				if math.Float32bits(b.Hidden[i]) != math.Float32bits(want) {
					t.Fatalf("hidden[%d] = %v, want %v", i, b.Hidden[i], want)
				}
			}
			if _, err := RecvBatch(&s, 0); err != io.EOF {
				t.Fatalf("after the batch: got %v, want io.EOF", err)
			}
		})
	}
}

func TestSendBatchRefusesBadBatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		h      *pb.BatchHeader
		hidden []float32
	}{
		{"no dim", testHeader(1, 0, 2), make([]float32, 8)},
		{"wrong count", testHeader(1, 4, 2), make([]float32, 9)},
		{"unknown type", &pb.BatchHeader{BatchId: 1, HiddenType: 7}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s fakeStream
			err := SendBatch(&s, tc.h, tc.hidden)
			if !errors.Is(err, ErrBadBatch) {
				t.Fatalf("got %v, want ErrBadBatch", err)
			}
			if len(s.msgs) != 0 {
				t.Fatalf("%d messages sent for a refused batch", len(s.msgs))
			}
		})
	}
	s := fakeStream{err: errors.New("broken")}
	if err := SendBatch(&s, testHeader(1, 0), nil); err == nil {
		t.Fatal("send error not returned")
	}
}

// validBatch returns a fresh copy of the messages of a good 3-chunk batch
// (ID 7): header, chunks.
func validBatch(t *testing.T) []*pb.StageMessage {
	t.Helper()
	msgs, err := validBatchMsgs()
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 4 {
		t.Fatalf("valid batch has %d messages, want 4", len(msgs))
	}
	out := make([]*pb.StageMessage, len(msgs))
	for i, m := range msgs {
		out[i] = proto.Clone(m).(*pb.StageMessage)
	}
	return out
}

var validBatchMsgs = sync.OnceValues(func() ([]*pb.StageMessage, error) {
	const dim = 1024
	h := testHeader(7, dim, 2*MaxChunkBytes/4/dim+1) // just over two chunks
	var s fakeStream
	err := SendBatch(&s, h, randomHidden(dim*len(h.Rows[0].Tokens), 1))
	return s.msgs, err
})

func header(m []*pb.StageMessage) *pb.BatchHeader { return m[0].GetHeader() }
func chunk(m []*pb.StageMessage, i int) *pb.HiddenChunk {
	return m[1+i].GetChunk()
}

func TestRecvBatchCorrupt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(m []*pb.StageMessage) []*pb.StageMessage
		reason  string // "" means a stream error rather than a BatchError
		limit   int64
	}{
		{"chunk first", func(m []*pb.StageMessage) []*pb.StageMessage { return m[1:] }, "bad_chunks", 0},
		{"empty message", func(m []*pb.StageMessage) []*pb.StageMessage {
			return append([]*pb.StageMessage{{}}, m...)
		}, "bad_header", 0},
		{"missing chunk then next header", func(m []*pb.StageMessage) []*pb.StageMessage {
			return append(m[:2:2], m[0])
		}, "bad_chunks", 0},
		{"missing last chunk, stream ends", func(m []*pb.StageMessage) []*pb.StageMessage { return m[:3] }, "", 0},
		{"chunks swapped", func(m []*pb.StageMessage) []*pb.StageMessage {
			m[1], m[2] = m[2], m[1]
			return m
		}, "bad_chunks", 0},
		{"duplicate chunk", func(m []*pb.StageMessage) []*pb.StageMessage {
			m[2] = m[1]
			return m
		}, "bad_chunks", 0},
		{"other batch's chunk", func(m []*pb.StageMessage) []*pb.StageMessage {
			chunk(m, 1).BatchId++
			return m
		}, "bad_chunks", 0},
		{"short chunk", func(m []*pb.StageMessage) []*pb.StageMessage {
			chunk(m, 2).Data = chunk(m, 2).Data[:4]
			return m
		}, "bad_chunks", 0},
		{"long chunk", func(m []*pb.StageMessage) []*pb.StageMessage {
			chunk(m, 2).Data = append(chunk(m, 2).Data, 0, 0, 0, 0)
			return m
		}, "bad_chunks", 0},
		{"split element", func(m []*pb.StageMessage) []*pb.StageMessage {
			chunk(m, 0).Data = chunk(m, 0).Data[:len(chunk(m, 0).Data)-1]
			return m
		}, "bad_chunks", 0},
		{"empty chunk", func(m []*pb.StageMessage) []*pb.StageMessage {
			chunk(m, 0).Data = nil
			return m
		}, "bad_chunks", 0},
		{"fewer chunks declared", func(m []*pb.StageMessage) []*pb.StageMessage {
			header(m).HiddenChunks = 2
			return m
		}, "bad_chunks", 0},
		{"no chunks declared", func(m []*pb.StageMessage) []*pb.StageMessage {
			header(m).HiddenChunks = 0
			return m
		}, "bad_header", 0},
		{"more chunks than bytes", func(m []*pb.StageMessage) []*pb.StageMessage {
			header(m).HiddenChunks = math.MaxUint32
			header(m).HiddenElems = 16
			header(m).HiddenDim = 16
			header(m).Rows = header(m).Rows[:1]
			header(m).Rows[0].Tokens = []int32{1}
			return m
		}, "bad_header", 0},
		{"elems not dim × tokens", func(m []*pb.StageMessage) []*pb.StageMessage {
			header(m).HiddenDim++
			return m
		}, "bad_header", 0},
		{"zero dim", func(m []*pb.StageMessage) []*pb.StageMessage {
			header(m).HiddenDim = 0
			return m
		}, "bad_header", 0},
		{"unknown hidden type", func(m []*pb.StageMessage) []*pb.StageMessage {
			header(m).HiddenType = 3
			return m
		}, "bad_header", 0},
		{"over the caller's limit", func(m []*pb.StageMessage) []*pb.StageMessage { return m }, "hidden_too_large", MaxChunkBytes},
		{"huge declared size", func(m []*pb.StageMessage) []*pb.StageMessage {
			// A lying header must be refused before anything is allocated.
			header(m).HiddenElems = 1 << 62
			header(m).HiddenDim = 1
			return m
		}, "hidden_too_large", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fakeStream{msgs: tc.corrupt(validBatch(t))}
			b, err := RecvBatch(&s, tc.limit)
			if err == nil {
				t.Fatalf("got a batch of %d values and no error", len(b.Hidden))
			}
			var be *BatchError
			if tc.reason == "" {
				if errors.As(err, &be) || !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("got %v, want a wrapped io.ErrUnexpectedEOF", err)
				}
				return
			}
			if !errors.As(err, &be) || !errors.Is(err, ErrBadBatch) {
				t.Fatalf("got %v (%T), want a *BatchError", err, err)
			}
			if be.Reason.String() != tc.reason {
				t.Fatalf("reason %q, want %q (%v)", be.Reason.String(), tc.reason, err)
			}
			if tc.name != "chunk first" && tc.name != "empty message" && be.BatchID != 7 {
				t.Fatalf("BatchID %d, want 7", be.BatchID)
			}
		})
	}
}

func TestRecvBatchStreamError(t *testing.T) {
	broken := errors.New("connection reset")
	r := recvFunc(func() (*pb.StageMessage, error) { return nil, broken })
	if _, err := RecvBatch(r, 0); !errors.Is(err, broken) {
		t.Fatalf("got %v, want %v wrapped", err, broken)
	}
}

type recvFunc func() (*pb.StageMessage, error)

func (f recvFunc) Recv() (*pb.StageMessage, error) { return f() }

// FuzzRecvBatch feeds RecvBatch headers and chunk sequences built from
// fuzzed numbers and bytes: it must never panic, never allocate past its
// limit, and return exactly the declared values when it succeeds.
func FuzzRecvBatch(f *testing.F) {
	f.Add(uint64(8), uint32(4), uint32(1), int32(0), uint64(7), []byte("0123456789abcdef0123456789abcdef"), uint16(32), uint8(2))
	f.Add(uint64(8), uint32(4), uint32(2), int32(1), uint64(7), []byte("0123456789abcdef"), uint16(8), uint8(2))
	f.Add(uint64(0), uint32(0), uint32(0), int32(0), uint64(1), []byte{}, uint16(0), uint8(0))
	f.Add(uint64(1<<40), uint32(1), uint32(3), int32(0), uint64(1), []byte{1, 2, 3}, uint16(1), uint8(1))
	f.Fuzz(func(t *testing.T, elems uint64, dim, nchunks uint32, typ int32, id uint64, data []byte, cut uint16, tokens uint8) {
		h := &pb.BatchHeader{BatchId: 7, HiddenElems: elems, HiddenDim: dim, HiddenChunks: nchunks, HiddenType: HiddenType(typ)}
		h.Rows = []*pb.Row{{Seq: 1, Tokens: make([]int32, tokens)}}
		msgs := []*pb.StageMessage{{Msg: &pb.StageMessage_Header{Header: h}}}
		step := int(cut)%64 + 1
		for i := 0; len(data) > 0 && i < 64; i++ {
			n := min(step, len(data))
			msgs = append(msgs, &pb.StageMessage{Msg: &pb.StageMessage_Chunk{Chunk: &pb.HiddenChunk{BatchId: id, Index: uint32(i), Data: data[:n]}}})
			data = data[n:]
		}
		s := fakeStream{msgs: msgs}
		const limit = 1 << 16
		b, err := RecvBatch(&s, limit)
		if err != nil {
			return
		}
		if uint64(len(b.Hidden)) != elems || len(b.Hidden)*4 > limit {
			t.Fatalf("got %d values, header declared %d", len(b.Hidden), elems)
		}
	})
}
