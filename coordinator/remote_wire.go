package coordinator

import (
	"strings"

	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// This file converts between the data path's Go values (transport) and the
// wire (pb) on the coordinator's side.

// headerFromBatch returns b's header for stage 0 under placement version
// pv. Rows carry their full block tables (docs/cluster.md). Every first
// row asks for logprobs: the engine decides per request whether to pass
// them on, as it does with the in-process pipeline, which always reports
// the sampled token's.
func headerFromBatch(b *transport.MicroBatch, pv uint64, ttlMS int64) *pb.BatchHeader {
	h := &pb.BatchHeader{
		Epoch: b.Epoch, PlacementVersion: pv, BatchId: b.ID, TtlMs: ttlMS,
		HiddenType: pb.HiddenType_HIDDEN_TYPE_F32,
		Tombstones: tombstonesToPB(b.Tombstones),
		Rows:       make([]*pb.Row, len(b.Rows)),
	}
	for i, r := range b.Rows {
		pr := &pb.Row{Seq: r.Seq, Pos: int32(r.Pos), First: r.First, Tokens: r.Tokens, Blocks: r.Blocks, Sample: r.Sample}
		if r.First && r.Params != nil {
			pr.Params = paramsToPB(r.Params)
		}
		h.Rows[i] = pr
	}
	return h
}

func tombstonesToPB(ts []transport.Tombstone) []*pb.Tombstone {
	if len(ts) == 0 {
		return nil
	}
	out := make([]*pb.Tombstone, len(ts))
	for i, t := range ts {
		out[i] = &pb.Tombstone{Epoch: t.Epoch, Seq: t.Seq, Reason: reasonToPB(t.Reason)}
	}
	return out
}

// reasonToPB maps a wire reason name ("finished", ...) to its enum; an
// unknown name is FAILED, the reason that frees without judgement.
func reasonToPB(s string) pb.Tombstone_Reason {
	if v, ok := pb.Tombstone_Reason_value[strings.ToUpper(s)]; ok && v != 0 {
		return pb.Tombstone_Reason(v)
	}
	return pb.Tombstone_FAILED
}

func paramsToPB(p *sample.Params) *pb.SampleParams {
	return &pb.SampleParams{
		Temperature: p.Temperature, TopK: int32(p.TopK), TopP: p.TopP, MinP: p.MinP,
		RepetitionPenalty: p.RepetitionPenalty, FrequencyPenalty: p.FrequencyPenalty, PresencePenalty: p.PresencePenalty,
		LogitBias: p.LogitBias, Seed: p.Seed,
		Logprobs: true, TopLogprobs: int32(p.TopLogprobs),
	}
}

// resultFromPB converts the last stage's BatchResult; extra are rows
// dropped by earlier BatchFailed reports that named sequences.
func resultFromPB(r *pb.BatchResult, extra []transport.Dropped) *transport.BatchResult {
	out := &transport.BatchResult{Epoch: r.GetEpoch(), ID: r.GetBatchId()}
	if n := len(r.GetSamples()); n > 0 {
		out.Samples = make([]transport.Sampled, n)
		for i, s := range r.GetSamples() {
			sm := transport.Sampled{Seq: s.GetSeq(), Token: s.GetToken(), Logprob: s.GetLogprob()}
			for _, t := range s.GetTop() {
				sm.Top = append(sm.Top, sample.TokenLogprob{Token: t.GetToken(), Logprob: t.GetLogprob()})
			}
			out.Samples[i] = sm
		}
	}
	for _, d := range r.GetDropped() {
		out.Dropped = append(out.Dropped, transport.Dropped{Seq: d.GetSeq(), Reason: d.GetReason()})
	}
	out.Dropped = append(out.Dropped, extra...)
	return out
}
