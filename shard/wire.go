package shard

import (
	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// This file is the only place where the shard converts between wire types
// (package pb) and its own (Batch, Row, Tombstone, Result).

// reasonFromPB maps a wire tombstone reason to a Reason; an unknown or
// unspecified one counts as Failed (the sequence ends either way).
func reasonFromPB(r pb.Tombstone_Reason) Reason {
	switch r {
	case pb.Tombstone_FINISHED:
		return Finished
	case pb.Tombstone_ABORTED:
		return Aborted
	case pb.Tombstone_TIMEOUT:
		return Timeout
	case pb.Tombstone_PREEMPTED:
		return Preempted
	case pb.Tombstone_LEASE:
		return Lease
	case pb.Tombstone_EPOCH:
		return Epoch
	case pb.Tombstone_RECONCILE:
		return Reconcile
	}
	return Failed
}

// tombstonesFromPB converts wire tombstones.
func tombstonesFromPB(ts []*pb.Tombstone) []Tombstone {
	if len(ts) == 0 {
		return nil
	}
	out := make([]Tombstone, len(ts))
	for i, t := range ts {
		out[i] = Tombstone{Seq: t.GetSeq(), Reason: reasonFromPB(t.GetReason())}
	}
	return out
}

// paramsFromPB converts a first row's sampling settings; nil stays nil (the
// runner then samples greedily).
func paramsFromPB(p *pb.SampleParams) *sample.Params {
	if p == nil {
		return nil
	}
	out := sample.DefaultParams()
	out.Temperature = p.GetTemperature()
	out.TopK = int(p.GetTopK())
	if tp := p.GetTopP(); tp > 0 {
		out.TopP = tp
	}
	out.MinP = p.GetMinP()
	if rp := p.GetRepetitionPenalty(); rp > 0 {
		out.RepetitionPenalty = rp
	}
	out.FrequencyPenalty = p.GetFrequencyPenalty()
	out.PresencePenalty = p.GetPresencePenalty()
	if len(p.GetLogitBias()) > 0 {
		out.LogitBias = make(map[int32]float32, len(p.GetLogitBias()))
		for k, v := range p.GetLogitBias() {
			out.LogitBias[k] = v
		}
	}
	out.Seed = p.GetSeed()
	out.TopLogprobs = int(p.GetTopLogprobs())
	return &out
}

// wantsLogprobs reports whether a first row asked for logprobs.
func wantsLogprobs(p *pb.SampleParams) bool {
	return p.GetLogprobs() || p.GetTopLogprobs() > 0
}

// batchFromPB converts a received batch to the runner's form. Rows share
// the header's token and block slices.
func batchFromPB(b *transport.Batch) *Batch {
	h := b.Header
	out := &Batch{Epoch: h.GetEpoch(), ID: h.GetBatchId(), Tombstones: tombstonesFromPB(h.GetTombstones()), Hidden: b.Hidden}
	out.Rows = make([]Row, len(h.GetRows()))
	for i, r := range h.GetRows() {
		out.Rows[i] = Row{
			Seq: r.GetSeq(), Pos: int(r.GetPos()), First: r.GetFirst(),
			Tokens: r.GetTokens(), Blocks: r.GetBlocks(), Sample: r.GetSample(),
			Params: paramsFromPB(r.GetParams()),
		}
	}
	return out
}

// keptRowsPB returns the wire rows of in that the runner kept, in order:
// kept is an ordered subsequence of in's rows (Runner.Process only drops).
func keptRowsPB(in []*pb.Row, kept []Row) []*pb.Row {
	out := make([]*pb.Row, 0, len(kept))
	j := 0
	for _, r := range in {
		if j < len(kept) && kept[j].Seq == r.GetSeq() && kept[j].Pos == int(r.GetPos()) {
			out = append(out, r)
			j++
		}
	}
	return out
}

// droppedToPB converts a stage's refused rows, naming this shard.
func droppedToPB(ds []Dropped, shardID string) []*pb.DroppedRow {
	out := make([]*pb.DroppedRow, len(ds))
	for i, d := range ds {
		out[i] = &pb.DroppedRow{Seq: d.Seq, Reason: d.Code, ShardId: shardID}
	}
	return out
}

// samplesToPB converts the last stage's samples; logprobs are filled only
// for sequences that asked (logprobs reports that).
func samplesToPB(ss []Sampled, rows []Row, logprobs func(seq uint64) bool) []*pb.SampledToken {
	pos := make(map[uint64]int32, len(rows))
	for _, r := range rows {
		if r.Sample {
			pos[r.Seq] = int32(r.Pos + len(r.Tokens))
		}
	}
	out := make([]*pb.SampledToken, len(ss))
	for i, s := range ss {
		t := &pb.SampledToken{Seq: s.Seq, Token: s.Result.Token, Pos: pos[s.Seq]}
		if logprobs(s.Seq) {
			t.Logprob = s.Result.Logprob
			for _, alt := range s.Result.Top {
				t.Top = append(t.Top, &pb.TokenLogprob{Token: alt.Token, Logprob: alt.Logprob})
			}
		}
		out[i] = t
	}
	return out
}

// tombstoneReasonPB maps a Reason to its wire name's enum.
func tombstoneReasonPB(r Reason) pb.Tombstone_Reason {
	switch r {
	case Finished:
		return pb.Tombstone_FINISHED
	case Aborted:
		return pb.Tombstone_ABORTED
	case Timeout:
		return pb.Tombstone_TIMEOUT
	case Preempted:
		return pb.Tombstone_PREEMPTED
	case Failed:
		return pb.Tombstone_FAILED
	case Lease:
		return pb.Tombstone_LEASE
	case Epoch:
		return pb.Tombstone_EPOCH
	case Reconcile:
		return pb.Tombstone_RECONCILE
	}
	return pb.Tombstone_REASON_UNSPECIFIED
}

// devicesToPB converts the probed devices for Register.
func devicesToPB(d Devices, device string) *pb.Devices {
	out := &pb.Devices{CpuCores: uint32(d.CPUCores), MemoryBytes: d.MemoryBytes, Device: device}
	for _, g := range d.GPUs {
		out.Gpus = append(out.Gpus, &pb.Gpu{Index: uint32(g.Index), Name: g.Name, MemoryTotal: g.MemoryTotal, MemoryFree: g.MemoryFree})
	}
	return out
}
