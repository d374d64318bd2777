package transport

import (
	"fmt"
	"math"
	"strings"

	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/transport/pb"
)

// This file converts between the data path's Go values (message.go) and
// their protobuf form (package pb). Converting to the wire checks ranges
// (int to int32) and names; converting from it checks what a peer could
// have got wrong, and copies nothing it can share: the caller owns both.

// MicroBatchToWire returns b's header for SendBatch(s, h, b.Hidden): f32
// hidden states, HiddenDim derived from len(b.Hidden) and the rows' token
// count. The caller may then set HiddenType, TtlMs and Dropped. The header
// shares Tokens and Blocks slices with b.
func MicroBatchToWire(b *MicroBatch) (*pb.BatchHeader, error) {
	h := &pb.BatchHeader{Epoch: b.Epoch, PlacementVersion: b.Placement, BatchId: b.ID}
	for _, t := range b.Tombstones {
		w, err := TombstoneToWire(t)
		if err != nil {
			return nil, fmt.Errorf("batch %d: %w", b.ID, err)
		}
		h.Tombstones = append(h.Tombstones, w)
	}
	tokens := 0
	for _, r := range b.Rows {
		if r.Pos < 0 || r.Pos > math.MaxInt32 {
			return nil, fmt.Errorf("batch %d: sequence %d: position %d out of int32 range", b.ID, r.Seq, r.Pos)
		}
		w := &pb.Row{Seq: r.Seq, Pos: int32(r.Pos), First: r.First, Tokens: r.Tokens, Blocks: r.Blocks, Sample: r.Sample}
		if r.Params != nil {
			p, err := ParamsToWire(r.Params)
			if err != nil {
				return nil, fmt.Errorf("batch %d: sequence %d: %w", b.ID, r.Seq, err)
			}
			w.Params = p
		}
		h.Rows = append(h.Rows, w)
		tokens += len(r.Tokens)
	}
	if len(b.Hidden) > 0 {
		if tokens == 0 || len(b.Hidden)%tokens != 0 || len(b.Hidden)/tokens > math.MaxUint32 {
			return nil, fmt.Errorf("batch %d: %d hidden values do not divide into %d tokens", b.ID, len(b.Hidden), tokens)
		}
		h.HiddenDim = uint32(len(b.Hidden) / tokens)
	}
	return h, nil
}

// MicroBatchFromWire returns the MicroBatch that b (from RecvBatch)
// carries; it shares b's slices. Header fields without a MicroBatch
// counterpart (TtlMs, Dropped, HiddenType) stay in b.Header.
func MicroBatchFromWire(b *Batch) (*MicroBatch, error) {
	h := b.Header
	m := &MicroBatch{Epoch: h.GetEpoch(), Placement: h.GetPlacementVersion(), ID: h.GetBatchId(), Hidden: b.Hidden}
	for _, t := range h.GetTombstones() {
		g, err := TombstoneFromWire(t)
		if err != nil {
			return nil, badBatch(h.GetBatchId(), "bad_header", "%v", err)
		}
		m.Tombstones = append(m.Tombstones, g)
	}
	if len(h.GetRows()) > 0 {
		m.Rows = make([]Row, len(h.GetRows()))
	}
	for i, r := range h.GetRows() {
		if r.GetPos() < 0 {
			return nil, badBatch(h.GetBatchId(), "bad_header", "sequence %d: negative position %d", r.GetSeq(), r.GetPos())
		}
		m.Rows[i] = Row{Seq: r.GetSeq(), Pos: int(r.GetPos()), First: r.GetFirst(), Tokens: r.GetTokens(), Blocks: r.GetBlocks(), Sample: r.GetSample()}
		if r.GetParams() != nil {
			m.Rows[i].Params = ParamsFromWire(r.GetParams())
		}
	}
	return m, nil
}

// TombstoneToWire converts t; its Reason must be a Tombstone_Reason's
// lower-case name (ReasonLabel).
func TombstoneToWire(t Tombstone) (*pb.Tombstone, error) {
	r, ok := pb.Tombstone_Reason_value[strings.ToUpper(t.Reason)]
	if !ok || r == int32(pb.Tombstone_REASON_UNSPECIFIED) {
		return nil, fmt.Errorf("transport: sequence %d: unknown tombstone reason %q", t.Seq, t.Reason)
	}
	return &pb.Tombstone{Epoch: t.Epoch, Seq: t.Seq, Reason: pb.Tombstone_Reason(r)}, nil
}

// TombstoneFromWire converts t, refusing a reason this build does not know.
func TombstoneFromWire(t *pb.Tombstone) (Tombstone, error) {
	if _, ok := pb.Tombstone_Reason_name[int32(t.GetReason())]; !ok || t.GetReason() == pb.Tombstone_REASON_UNSPECIFIED {
		return Tombstone{}, fmt.Errorf("transport: sequence %d: unknown tombstone reason %d", t.GetSeq(), int32(t.GetReason()))
	}
	return Tombstone{Epoch: t.GetEpoch(), Seq: t.GetSeq(), Reason: ReasonLabel(t.GetReason())}, nil
}

// ParamsToWire converts p.
func ParamsToWire(p *sample.Params) (*pb.SampleParams, error) {
	if p.TopK < 0 || p.TopK > math.MaxInt32 || p.TopLogprobs < 0 || p.TopLogprobs > math.MaxInt32 {
		return nil, fmt.Errorf("transport: sample params: top_k %d or top_logprobs %d out of range", p.TopK, p.TopLogprobs)
	}
	w := &pb.SampleParams{
		Temperature:       p.Temperature,
		TopK:              int32(p.TopK),
		TopP:              p.TopP,
		MinP:              p.MinP,
		RepetitionPenalty: p.RepetitionPenalty,
		FrequencyPenalty:  p.FrequencyPenalty,
		PresencePenalty:   p.PresencePenalty,
		Seed:              p.Seed,
		TopLogprobs:       int32(p.TopLogprobs),
	}
	if len(p.LogitBias) > 0 {
		w.LogitBias = make(map[int32]float32, len(p.LogitBias))
		for k, v := range p.LogitBias {
			w.LogitBias[k] = v
		}
	}
	return w, nil
}

// ParamsFromWire converts p. Negative top_k or top_logprobs become 0 (off).
func ParamsFromWire(p *pb.SampleParams) *sample.Params {
	g := &sample.Params{
		Temperature:       p.GetTemperature(),
		TopK:              max(0, int(p.GetTopK())),
		TopP:              p.GetTopP(),
		MinP:              p.GetMinP(),
		RepetitionPenalty: p.GetRepetitionPenalty(),
		FrequencyPenalty:  p.GetFrequencyPenalty(),
		PresencePenalty:   p.GetPresencePenalty(),
		Seed:              p.GetSeed(),
		TopLogprobs:       max(0, int(p.GetTopLogprobs())),
	}
	if len(p.GetLogitBias()) > 0 {
		g.LogitBias = make(map[int32]float32, len(p.GetLogitBias()))
		for k, v := range p.GetLogitBias() {
			g.LogitBias[k] = v
		}
	}
	return g
}

// ResultToWire converts r for Coordinator.Results: a BatchFailed when r.Lost,
// else a BatchResult.
func ResultToWire(r *BatchResult) *pb.ResultMessage {
	if r.Lost {
		return &pb.ResultMessage{Msg: &pb.ResultMessage_Failed{Failed: &pb.BatchFailed{BatchId: r.ID, Epoch: r.Epoch, Reason: r.Reason}}}
	}
	w := &pb.BatchResult{Epoch: r.Epoch, BatchId: r.ID}
	for _, s := range r.Samples {
		t := &pb.SampledToken{Seq: s.Seq, Token: s.Token, Logprob: s.Logprob}
		for _, a := range s.Top {
			t.Top = append(t.Top, &pb.TokenLogprob{Token: a.Token, Logprob: a.Logprob})
		}
		w.Samples = append(w.Samples, t)
	}
	for _, d := range r.Dropped {
		w.Dropped = append(w.Dropped, &pb.DroppedRow{Seq: d.Seq, Reason: d.Reason})
	}
	return &pb.ResultMessage{Msg: &pb.ResultMessage_Result{Result: w}}
}

// ResultFromWire converts a BatchResult from the last stage.
func ResultFromWire(w *pb.BatchResult) *BatchResult {
	r := &BatchResult{Epoch: w.GetEpoch(), ID: w.GetBatchId()}
	for _, s := range w.GetSamples() {
		g := Sampled{Seq: s.GetSeq(), Token: s.GetToken(), Logprob: s.GetLogprob()}
		for _, a := range s.GetTop() {
			g.Top = append(g.Top, sample.TokenLogprob{Token: a.GetToken(), Logprob: a.GetLogprob()})
		}
		r.Samples = append(r.Samples, g)
	}
	for _, d := range w.GetDropped() {
		r.Dropped = append(r.Dropped, Dropped{Seq: d.GetSeq(), Reason: d.GetReason()})
	}
	return r
}

// FailedFromWire converts a BatchFailed (from a StageReply, Results or
// Control) into a lost BatchResult; its Reason names the shard when known.
func FailedFromWire(f *pb.BatchFailed) *BatchResult {
	reason := f.GetReason()
	if f.GetShardId() != "" {
		reason = "shard " + f.GetShardId() + ": " + reason
	}
	return &BatchResult{Epoch: f.GetEpoch(), ID: f.GetBatchId(), Lost: true, Reason: reason}
}
