package transport

import (
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/strata-llm/strata/transport/pb"
)

// DefaultMaxHiddenBytes bounds the hidden state one batch header may
// declare when the receiver passes no tighter limit: 256 MiB, e.g. 8,192
// tokens of an 8,192-wide model in f32. A receiver that knows its model
// should pass max_batch_tokens × hidden_dim × 4 instead.
const DefaultMaxHiddenBytes = 256 << 20

// ErrBadBatch is matched (errors.Is) by every BatchError.
var ErrBadBatch = errors.New("transport: bad batch")

// BatchError reports a malformed batch on a stage stream, which ends the
// stream. Its Reason goes into BatchFailed.reason by name.
type BatchError struct {
	// BatchID is the batch the header announced; 0 if no header was read.
	BatchID uint64
	// Reason is CodeBadHeader, CodeHiddenTooLarge or CodeBadChunks.
	Reason Code
	// Detail says what was wrong, with the numbers involved.
	Detail string
}

// Error implements error.
func (e *BatchError) Error() string {
	return fmt.Sprintf("transport: batch %d: %s: %s", e.BatchID, e.Reason, e.Detail)
}

// Is makes errors.Is(err, ErrBadBatch) true.
func (e *BatchError) Is(target error) bool { return target == ErrBadBatch }

// BatchFailed returns the report of e for the upstream hop: every row of
// the batch failed (Seqs empty), with e's reason, from shardID.
func (e *BatchError) BatchFailed(shardID string) *pb.BatchFailed {
	return &pb.BatchFailed{BatchId: e.BatchID, Reason: e.Reason.String(), ShardId: shardID}
}

func badBatch(id uint64, reason Code, format string, args ...any) *BatchError {
	return &BatchError{BatchID: id, Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// Batch is one micro-batch as it travels a stage stream.
type Batch struct {
	Header *pb.BatchHeader
	// Hidden holds Header.HiddenElems values, row by row and token by
	// token, HiddenDim values each; nil into stage 0.
	Hidden []float32
}

// BatchSender is the sending half of a stage stream; the generated
// pb.Stage_StreamClient satisfies it.
type BatchSender interface {
	Send(*pb.StageMessage) error
}

// BatchReceiver is the receiving half of a stage stream; the generated
// pb.Stage_StreamServer satisfies it.
type BatchReceiver interface {
	Recv() (*pb.StageMessage, error)
}

var (
	_ BatchSender   = (pb.Stage_StreamClient)(nil)
	_ BatchReceiver = (pb.Stage_StreamServer)(nil)
)

// SendBatch sends h followed by hidden, encoded as h.HiddenType and cut
// into chunks of at most MaxChunkBytes. It sets h.HiddenElems and
// h.HiddenChunks; the caller sets everything else, including HiddenDim
// when hidden is not empty. It checks the batch the way RecvBatch will, so
// a malformed batch is refused here (as a *BatchError) before any byte is
// sent. h and hidden must not be modified until SendBatch returns; h
// belongs to the stream afterwards (gRPC may read it lazily).
//
// SendBatch is not safe for concurrent use on one stream: batches must not
// interleave.
func SendBatch(s BatchSender, h *pb.BatchHeader, hidden []float32) error {
	chunks, err := EncodeHidden(hidden, h.GetHiddenType())
	if err != nil {
		return badBatch(h.GetBatchId(), CodeBadHeader, "%v", err)
	}
	h.HiddenElems = uint64(len(hidden))
	h.HiddenChunks = uint32(len(chunks))
	if err := checkHeader(h, math.MaxInt64); err != nil {
		return err
	}
	if err := s.Send(&pb.StageMessage{Msg: &pb.StageMessage_Header{Header: h}}); err != nil {
		return fmt.Errorf("send batch %d header: %w", h.GetBatchId(), err)
	}
	for i, c := range chunks {
		m := &pb.StageMessage{Msg: &pb.StageMessage_Chunk{Chunk: &pb.HiddenChunk{
			BatchId: h.GetBatchId(),
			Index:   uint32(i),
			Data:    c,
		}}}
		if err := s.Send(m); err != nil {
			return fmt.Errorf("send batch %d chunk %d of %d: %w", h.GetBatchId(), i, len(chunks), err)
		}
	}
	return nil
}

// RecvBatch receives one batch: a header and the chunks it announces. It
// returns io.EOF unwrapped when the stream ends cleanly before a header.
//
// Before allocating, it checks the header: a known hidden type;
// hidden_elems × element size <= maxHiddenBytes (DefaultMaxHiddenBytes
// when maxHiddenBytes <= 0); hidden_elems == hidden_dim × the rows' token
// count; hidden_chunks == 0 exactly when hidden_elems == 0, and no more
// chunks than bytes. Then each chunk must carry the header's batch_id, the
// next index, a whole number of elements and no more bytes than remain; the
// last must complete the declared size. A violation is a *BatchError
// (errors.Is ErrBadBatch) naming the batch and a reason for BatchFailed.
//
// Any error leaves the stream at an unknown point: the caller reports the
// batch failed and ends the stream, never reads on. RecvBatch never panics
// on input.
func RecvBatch(r BatchReceiver, maxHiddenBytes int64) (*Batch, error) {
	if maxHiddenBytes <= 0 {
		maxHiddenBytes = DefaultMaxHiddenBytes
	}
	m, err := r.Recv()
	if err == io.EOF {
		return nil, io.EOF
	}
	if err != nil {
		return nil, fmt.Errorf("receive batch header: %w", err)
	}
	h := m.GetHeader()
	if h == nil {
		if c := m.GetChunk(); c != nil {
			return nil, badBatch(0, CodeBadChunks, "chunk %d of batch %d where a header was due", c.GetIndex(), c.GetBatchId())
		}
		return nil, badBatch(0, CodeBadHeader, "empty stage message where a header was due")
	}
	if err := checkHeader(h, maxHiddenBytes); err != nil {
		return nil, err
	}
	b := &Batch{Header: h}
	if h.GetHiddenElems() == 0 {
		return b, nil
	}
	id := h.GetBatchId()
	size, _ := ElemSize(h.GetHiddenType()) // checked by checkHeader
	d := hiddenDecoder{typ: h.GetHiddenType(), size: size, dst: make([]float32, h.GetHiddenElems())}
	for i := range h.GetHiddenChunks() {
		m, err := r.Recv()
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return nil, fmt.Errorf("receive batch %d chunk %d of %d: %w", id, i, h.GetHiddenChunks(), err)
		}
		c := m.GetChunk()
		switch {
		case c == nil:
			return nil, badBatch(id, CodeBadChunks, "got a header or empty message where chunk %d of %d was due", i, h.GetHiddenChunks())
		case c.GetBatchId() != id:
			return nil, badBatch(id, CodeBadChunks, "chunk %d carries batch_id %d", i, c.GetBatchId())
		case c.GetIndex() != i:
			return nil, badBatch(id, CodeBadChunks, "chunk index %d where %d was due", c.GetIndex(), i)
		case len(c.GetData()) == 0:
			return nil, badBatch(id, CodeBadChunks, "chunk %d is empty", i)
		}
		if err := d.add(c.GetData()); err != nil {
			return nil, badBatch(id, CodeBadChunks, "chunk %d: %v", i, err)
		}
	}
	if d.off != len(d.dst) {
		return nil, badBatch(id, CodeBadChunks, "%d chunks carried %d of %d values", h.GetHiddenChunks(), d.off, len(d.dst))
	}
	b.Hidden = d.dst
	return b, nil
}

// checkHeader checks what can be checked of h before any chunk arrives.
func checkHeader(h *pb.BatchHeader, maxHiddenBytes int64) error {
	id := h.GetBatchId()
	size, err := ElemSize(h.GetHiddenType())
	if err != nil {
		return badBatch(id, CodeBadHeader, "%v", err)
	}
	elems, dim, chunks := h.GetHiddenElems(), uint64(h.GetHiddenDim()), uint64(h.GetHiddenChunks())
	if elems > uint64(maxHiddenBytes)/uint64(size) {
		return badBatch(id, CodeHiddenTooLarge, "hidden state of %d values × %d bytes exceeds the limit of %d bytes", elems, size, maxHiddenBytes)
	}
	if (elems == 0) != (chunks == 0) {
		return badBatch(id, CodeBadHeader, "hidden_elems %d with hidden_chunks %d", elems, chunks)
	}
	if chunks > elems*uint64(size) {
		return badBatch(id, CodeBadHeader, "hidden_chunks %d exceeds the %d bytes declared", chunks, elems*uint64(size))
	}
	if elems == 0 {
		return nil
	}
	var tokens uint64
	for _, r := range h.GetRows() {
		tokens += uint64(len(r.GetTokens()))
	}
	if dim == 0 || elems/dim != tokens || elems%dim != 0 {
		return badBatch(id, CodeBadHeader, "hidden_elems %d is not hidden_dim %d × %d tokens", elems, dim, tokens)
	}
	return nil
}
