package transport

import (
	"fmt"
	"math"

	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/transport/pb"
)

// This file is the one converter between the data path's Go values
// (message.go) and their protobuf form (package pb), for both sides: the
// coordinator builds stage 0's headers with HeaderToWire and reads results
// with ResultFromWire and FailedFromWire; a stage reads batches with
// BatchFromWire, forwards them with HeaderToWire and answers with
// ResultToWire and FailedToWire.
//
// Converting from the wire checks every field against a named limit or the
// receiver's state before anything uses it, and returns a *RefusedError
// naming the first violation; it never panics on any input. Converting to
// the wire checks what the receiver would refuse, so a sender's bug is
// found at the sender. Converted values share the slices (tokens, blocks,
// hidden states) of what they were converted from.

// BatchLimits is what a stage knows that bounds a batch: the epoch and
// placement it serves, and its model's and KV pool's shapes.
type BatchLimits struct {
	// Epoch is the epoch the stage adopted from the coordinator's control
	// stream: a batch of an older one is stale, one of a newer one is
	// refused (never adopted: only the control stream moves the epoch).
	Epoch uint64
	// Placement is the placement version the stage serves.
	Placement uint64
	// Context is the model's context: a row's positions lie in
	// [0, Context).
	Context int
	// Vocab is the model's vocabulary: token IDs lie in [0, Vocab).
	Vocab int
	// Blocks is the stage's KV pool (block IDs lie in [0, Blocks)), and
	// BlockSize its positions per block: a row names at most
	// ceil(Context / BlockSize) blocks, and enough to cover its positions.
	Blocks    int
	BlockSize int
	// Hidden is the hidden-state width a batch brings: 0 into the first
	// stage, the model's embedding width into the others.
	Hidden int
	// MaxTokens bounds a batch's tokens (the Assign's max_batch_tokens);
	// 0 means MaxBatchTokens.
	MaxTokens int
	// Groups is the block tables a sequence has (model.KVGroups): at most
	// 1, rows carry no sliding tables; above, each row carries Groups-1 of
	// them (Row.Slides). Window is the sliding layers' window in
	// positions: a row at position p reads from position
	// max(0, p-Window+1), so its sliding tables may not have released
	// that position's block. A Window of 0 with Groups above 1 allows no
	// release.
	Groups int
	Window int
}

// ResultLimits is what the coordinator knows that bounds a result.
type ResultLimits struct {
	Epoch uint64 // this coordinator start's epoch
	Vocab int    // the model's vocabulary: sampled token IDs lie in [0, Vocab)
}

// HeaderToWire returns b's header for SendBatch(s, h, b.Hidden): hidden
// states of type typ, HiddenDim derived from len(b.Hidden) and the rows'
// token count. Params (with the Logprobs flag) travel on first rows only.
// It refuses (a *RefusedError) a batch a receiver would refuse for its
// shape: counts above the limits, positions outside int32, sliding tables
// that do not divide into groups of one width, reasons outside their
// enums. The header shares Tokens, Blocks and Slides slices with b.
func HeaderToWire(b *MicroBatch, typ pb.HiddenType) (*pb.BatchHeader, error) {
	switch {
	case len(b.Rows) > MaxBatchRows || len(b.Dropped) > MaxBatchRows:
		return nil, refuse(CodeTooLarge, "batch %d: %d rows and %d dropped rows, limit %d", b.ID, len(b.Rows), len(b.Dropped), MaxBatchRows)
	case b.TTL < 0:
		return nil, refuse(CodeBadField, "batch %d: ttl %d ms", b.ID, b.TTL)
	}
	ts, err := TombstonesToWire(b.Tombstones)
	if err != nil {
		return nil, fmt.Errorf("batch %d: %w", b.ID, err)
	}
	h := &pb.BatchHeader{Epoch: b.Epoch, PlacementVersion: b.Placement, BatchId: b.ID, TtlMs: b.TTL, HiddenType: typ, Tombstones: ts}
	tokens := 0
	if len(b.Rows) > 0 {
		h.Rows = make([]*pb.Row, len(b.Rows))
	}
	for i, r := range b.Rows {
		if r.Pos < 0 || r.Pos > math.MaxInt32-len(r.Tokens) {
			return nil, refuse(CodeBadPosition, "batch %d: sequence %d: positions from %d for %d tokens out of int32 range", b.ID, r.Seq, r.Pos, len(r.Tokens))
		}
		// The sliding tables: Groups-1 of the same width, or none.
		if width := len(r.Blocks) - r.SlideFrom; r.SlideFrom < 0 || width < 0 || (width == 0 && len(r.Slides) > 0) || (width > 0 && len(r.Slides)%width != 0) {
			return nil, refuse(CodeBadBlocks, "batch %d: sequence %d: %d sliding entries from block %d of %d", b.ID, r.Seq, len(r.Slides), r.SlideFrom, len(r.Blocks))
		}
		w := &pb.Row{Seq: r.Seq, Pos: int32(r.Pos), First: r.First, Tokens: r.Tokens, Blocks: r.Blocks, Sample: r.Sample, SlideFrom: int32(r.SlideFrom), Slides: r.Slides}
		if r.First && (r.Params != nil || r.Logprobs) {
			p := r.Params
			if p == nil {
				d := sample.DefaultParams()
				p = &d
			}
			if w.Params, err = ParamsToWire(p, r.Logprobs); err != nil {
				return nil, fmt.Errorf("batch %d: sequence %d: %w", b.ID, r.Seq, err)
			}
		}
		h.Rows[i] = w
		tokens += len(r.Tokens)
	}
	for _, d := range b.Dropped {
		if !d.Reason.Row() {
			return nil, refuse(CodeBadReason, "batch %d: sequence %d dropped for %v, not a row code", b.ID, d.Seq, d.Reason)
		}
		h.Dropped = append(h.Dropped, &pb.DroppedRow{Seq: d.Seq, Reason: d.Reason.String(), ShardId: d.Shard})
	}
	if len(b.Hidden) > 0 {
		if tokens == 0 || len(b.Hidden)%tokens != 0 || len(b.Hidden)/tokens > math.MaxUint32 {
			return nil, refuse(CodeBadHeader, "batch %d: %d hidden values do not divide into %d tokens", b.ID, len(b.Hidden), tokens)
		}
		h.HiddenDim = uint32(len(b.Hidden) / tokens)
	}
	return h, nil
}

// BatchFromWire returns the MicroBatch that b (from RecvBatch) carries,
// after checking every field of it against lim: the epoch and placement
// version equal to the stage's; at most MaxBatchRows rows and dropped rows,
// MaxBatchTombstones tombstones and lim's tokens; each row's positions in
// [0, Context), its tokens inside the vocabulary, its blocks inside the
// pool, no more of them than the context needs and enough for its
// positions, its sliding tables as lim.Groups and lim.Window allow
// (checkSlides), its sampling parameters (first rows) valid for the
// vocabulary; tombstones of the batch's epoch with a coordinator's reason;
// dropped rows with row codes and bounded shard IDs; a hidden state of
// lim.Hidden values per token. The first violation is a *RefusedError; a
// refused batch is failed whole (its code is the BatchFailed reason), so a
// stage never applies, computes or forwards any part of it.
//
// The MicroBatch shares b's slices. BatchFromWire never panics.
func BatchFromWire(b *Batch, lim BatchLimits) (*MicroBatch, error) {
	h := b.Header
	id := h.GetBatchId()
	switch {
	case h.GetEpoch() < lim.Epoch:
		return nil, refuse(CodeStaleEpoch, "batch %d of epoch %d, older than the stage's", id, h.GetEpoch())
	case h.GetEpoch() > lim.Epoch:
		return nil, refuse(CodeFutureEpoch, "batch %d of epoch %d, newer than the coordinator's control stream announced", id, h.GetEpoch())
	case h.GetPlacementVersion() != lim.Placement:
		return nil, refuse(CodeStalePlacement, "batch %d of placement %d, not the one served", id, h.GetPlacementVersion())
	case len(h.GetRows()) > MaxBatchRows || len(h.GetDropped()) > MaxBatchRows:
		return nil, refuse(CodeTooLarge, "batch %d: %d rows and %d dropped rows, limit %d", id, len(h.GetRows()), len(h.GetDropped()), MaxBatchRows)
	case h.GetTtlMs() < 0:
		return nil, refuse(CodeBadField, "batch %d: ttl %d ms", id, h.GetTtlMs())
	}
	ts, err := TombstonesFromWire(h.GetTombstones())
	if err != nil {
		return nil, fmt.Errorf("batch %d: %w", id, err)
	}
	for _, t := range ts {
		if t.Epoch != 0 && t.Epoch != h.GetEpoch() {
			return nil, refuse(CodeStaleEpoch, "batch %d: tombstone of sequence %d from epoch %d, not the batch's", id, t.Seq, t.Epoch)
		}
	}
	maxTokens := lim.MaxTokens
	if maxTokens <= 0 {
		maxTokens = MaxBatchTokens
	}
	context := lim.Context
	if context <= 0 {
		context = math.MaxInt32
	}
	bs := max(lim.BlockSize, 1)
	maxBlocks := (context-1)/bs + 1
	m := &MicroBatch{Epoch: h.GetEpoch(), Placement: h.GetPlacementVersion(), ID: id, TTL: h.GetTtlMs(), Tombstones: ts, Hidden: b.Hidden}
	if len(h.GetRows()) > 0 {
		m.Rows = make([]Row, len(h.GetRows()))
	}
	tokens := 0
	for i, r := range h.GetRows() {
		seq, pos, n := r.GetSeq(), int(r.GetPos()), len(r.GetTokens())
		tokens += n
		switch {
		case tokens > maxTokens:
			return nil, refuse(CodeTooLarge, "batch %d: more than %d tokens", id, maxTokens)
		case n == 0:
			return nil, refuse(CodeBadField, "batch %d: sequence %d: a row without tokens", id, seq)
		case pos < 0 || pos > context-n:
			return nil, refuse(CodeBadPosition, "batch %d: sequence %d: positions [%d, %d) outside the context [0, %d)", id, seq, pos, pos+n, context)
		case len(r.GetBlocks()) > maxBlocks:
			return nil, refuse(CodeBadBlocks, "batch %d: sequence %d: %d blocks, the context needs at most %d", id, seq, len(r.GetBlocks()), maxBlocks)
		case len(r.GetBlocks()) < (pos+n-1)/bs+1:
			return nil, refuse(CodeBadBlocks, "batch %d: sequence %d: %d blocks do not cover positions [0, %d)", id, seq, len(r.GetBlocks()), pos+n)
		}
		for _, blk := range r.GetBlocks() {
			if blk < 0 || int(blk) >= lim.Blocks {
				return nil, refuse(CodeBadBlocks, "batch %d: sequence %d: block %d outside the pool of %d", id, seq, blk, lim.Blocks)
			}
		}
		if err := checkSlides(id, r, lim, bs); err != nil {
			return nil, err
		}
		for _, tok := range r.GetTokens() {
			if tok < 0 || int(tok) >= lim.Vocab {
				return nil, refuse(CodeBadToken, "batch %d: sequence %d: token %d outside the vocabulary of %d", id, seq, tok, lim.Vocab)
			}
		}
		m.Rows[i] = Row{Seq: seq, Pos: pos, First: r.GetFirst(), Tokens: r.GetTokens(), Blocks: r.GetBlocks(), Sample: r.GetSample(),
			SlideFrom: int(r.GetSlideFrom()), Slides: r.GetSlides()}
		if r.GetFirst() && r.GetParams() != nil {
			p, err := ParamsFromWire(r.GetParams(), lim.Vocab)
			if err != nil {
				return nil, fmt.Errorf("batch %d: sequence %d: %w", id, seq, err)
			}
			// A constrained sequence's output starts inside the context, and
			// the output it carries precedes the row.
			if p.OutputStart >= context || len(p.Output) > max(0, pos-p.OutputStart) {
				return nil, refuse(CodeBadParams, "batch %d: sequence %d: output_start %d and %d output tokens for a first row at %d (context %d)", id, seq, p.OutputStart, len(p.Output), pos, context)
			}
			m.Rows[i].Params, m.Rows[i].Logprobs = p, r.GetParams().GetLogprobs() || p.TopLogprobs > 0
		}
	}
	if len(b.Hidden) != lim.Hidden*tokens {
		return nil, refuse(CodeBadHeader, "batch %d: %d hidden values for %d tokens of width %d", id, len(b.Hidden), tokens, lim.Hidden)
	}
	if m.Dropped, err = droppedFromWire(h.GetDropped()); err != nil {
		return nil, fmt.Errorf("batch %d: %w", id, err)
	}
	return m, nil
}

// checkSlides checks the sliding tables of r (a row of batch id, its
// position and blocks already checked, bs the block size) against lim:
// none unless lim.Groups > 1;
// else Groups-1 tables of the same width, from a slide_from no later than
// the block of the first position r reads in a sliding layer (an earlier
// block was released, and reading it would read another sequence's KV),
// with every entry inside the pool.
func checkSlides(id uint64, r *pb.Row, lim BatchLimits, bs int) error {
	seq, from, slides := r.GetSeq(), int(r.GetSlideFrom()), r.GetSlides()
	if lim.Groups <= 1 {
		if from != 0 || len(slides) > 0 {
			return refuse(CodeBadBlocks, "batch %d: sequence %d: slide_from %d and %d sliding entries for a model without sliding tables", id, seq, from, len(slides))
		}
		return nil
	}
	lo := 0 // the first position the row reads in a sliding layer; a Window of 0 releases nothing
	if lim.Window > 0 {
		lo = max(0, int(r.GetPos())-lim.Window+1)
	}
	if from < 0 || from > lo/bs {
		return refuse(CodeBadBlocks, "batch %d: sequence %d: slide_from %d, and the row reads position %d in block %d", id, seq, from, lo, lo/bs)
	}
	if w := len(r.GetBlocks()) - from; len(slides) != (lim.Groups-1)*w {
		return refuse(CodeBadBlocks, "batch %d: sequence %d: %d sliding entries, want %d tables of %d (blocks %d to %d)", id, seq, len(slides), lim.Groups-1, w, from, len(r.GetBlocks()))
	}
	for _, sb := range slides {
		if sb < 0 || int(sb) >= lim.Blocks {
			return refuse(CodeBadBlocks, "batch %d: sequence %d: sliding block %d outside the pool of %d", id, seq, sb, lim.Blocks)
		}
	}
	return nil
}

// TombstonesToWire converts ts, refusing more than MaxBatchTombstones and a
// reason the coordinator does not decide.
func TombstonesToWire(ts []Tombstone) ([]*pb.Tombstone, error) {
	if len(ts) > MaxBatchTombstones {
		return nil, refuse(CodeTooLarge, "%d tombstones, limit %d", len(ts), MaxBatchTombstones)
	}
	if len(ts) == 0 {
		return nil, nil
	}
	out := make([]*pb.Tombstone, len(ts))
	for i, t := range ts {
		if !t.Reason.Coordinator() {
			return nil, refuse(CodeBadReason, "sequence %d: tombstone reason %v", t.Seq, t.Reason)
		}
		out[i] = &pb.Tombstone{Epoch: t.Epoch, Seq: t.Seq, Reason: t.Reason.wire()}
	}
	return out, nil
}

// TombstonesFromWire converts ts (a batch header's or a backstop
// message's), refusing more than MaxBatchTombstones and a reason other than
// the coordinator's five. Epochs are the caller's to judge.
func TombstonesFromWire(ts []*pb.Tombstone) ([]Tombstone, error) {
	if len(ts) > MaxBatchTombstones {
		return nil, refuse(CodeTooLarge, "%d tombstones, limit %d", len(ts), MaxBatchTombstones)
	}
	if len(ts) == 0 {
		return nil, nil
	}
	out := make([]Tombstone, len(ts))
	for i, t := range ts {
		w := t.GetReason()
		if w < 0 || w > math.MaxUint8 || !Reason(w).Coordinator() {
			return nil, refuse(CodeBadReason, "sequence %d: tombstone reason %d", t.GetSeq(), int32(w))
		}
		out[i] = Tombstone{Epoch: t.GetEpoch(), Seq: t.GetSeq(), Reason: Reason(w)}
	}
	return out, nil
}

// ParamsToWire converts p; logprobs records that the client asked for
// log-probabilities.
func ParamsToWire(p *sample.Params, logprobs bool) (*pb.SampleParams, error) {
	if p.TopK < 0 || p.TopK > math.MaxInt32 || p.TopLogprobs < 0 || p.TopLogprobs > sample.MaxTopLogprobs {
		return nil, refuse(CodeBadParams, "top_k %d or top_logprobs %d out of range", p.TopK, p.TopLogprobs)
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
		Logprobs:          logprobs,
		TopLogprobs:       int32(p.TopLogprobs),
		Constraint:        p.Constraint,
		Output:            p.Output,
	}
	if len(p.Constraint) > sample.MaxConstraint || p.OutputStart < 0 || p.OutputStart > math.MaxInt32 || len(p.Output) > math.MaxInt32 || p.OutputEnd < 0 || p.OutputEnd > math.MaxInt32 {
		return nil, refuse(CodeBadParams, "constraint of %d bytes (limit %d), output_start %d, output_end %d or %d output tokens out of range", len(p.Constraint), sample.MaxConstraint, p.OutputStart, p.OutputEnd, len(p.Output))
	}
	w.OutputStart, w.OutputEnd = int32(p.OutputStart), int32(p.OutputEnd)
	if len(p.LogitBias) > 0 {
		w.LogitBias = make(map[int32]float32, len(p.LogitBias))
		for k, v := range p.LogitBias {
			w.LogitBias[k] = v
		}
	}
	return w, nil
}

// ParamsFromWire converts p for a model of vocab tokens: a top_p or
// repetition_penalty of 0 (protobuf's unset) means off, and the result
// must pass sample.Params.Validate(vocab): logit bias keyed inside the
// vocabulary, at most one entry per token, penalties and top_logprobs
// within their limits.
func ParamsFromWire(p *pb.SampleParams, vocab int) (*sample.Params, error) {
	if len(p.GetLogitBias()) > vocab {
		return nil, refuse(CodeBadParams, "%d logit_bias entries for a vocabulary of %d", len(p.GetLogitBias()), vocab)
	}
	out := sample.DefaultParams()
	out.Temperature = p.GetTemperature()
	out.TopK = int(p.GetTopK())
	if tp := p.GetTopP(); tp != 0 {
		out.TopP = tp
	}
	out.MinP = p.GetMinP()
	if rp := p.GetRepetitionPenalty(); rp != 0 {
		out.RepetitionPenalty = rp
	}
	out.FrequencyPenalty = p.GetFrequencyPenalty()
	out.PresencePenalty = p.GetPresencePenalty()
	out.Seed = p.GetSeed()
	out.TopLogprobs = int(p.GetTopLogprobs())
	out.NoLogprob = !p.GetLogprobs() && out.TopLogprobs == 0
	if len(p.GetConstraint()) > sample.MaxConstraint {
		return nil, refuse(CodeBadParams, "constraint of %d bytes, limit %d", len(p.GetConstraint()), sample.MaxConstraint)
	}
	if len(p.GetConstraint()) > 0 {
		out.Constraint = p.GetConstraint()
	}
	out.OutputStart = int(p.GetOutputStart())
	out.Output = p.GetOutput()
	out.OutputEnd = int(p.GetOutputEnd())
	if len(p.GetLogitBias()) > 0 {
		out.LogitBias = make(map[int32]float32, len(p.GetLogitBias()))
		for k, v := range p.GetLogitBias() {
			out.LogitBias[k] = v
		}
	}
	if err := out.Validate(vocab); err != nil {
		return nil, refuse(CodeBadParams, "%v", err)
	}
	return &out, nil
}

// ResultToWire converts the last stage's result r for Coordinator.Results.
// Samples carry Logprob and Top as r has them: the stage leaves them zero
// for sequences that did not ask.
func ResultToWire(r *BatchResult) *pb.ResultMessage {
	w := &pb.BatchResult{Epoch: r.Epoch, BatchId: r.ID, PlacementVersion: r.Placement}
	if len(r.Samples) > 0 {
		w.Samples = make([]*pb.SampledToken, len(r.Samples))
	}
	for i, s := range r.Samples {
		t := &pb.SampledToken{Seq: s.Seq, Token: s.Token, Pos: int32(min(s.Pos, math.MaxInt32)), Logprob: s.Logprob}
		for _, a := range s.Top {
			t.Top = append(t.Top, &pb.TokenLogprob{Token: a.Token, Logprob: a.Logprob})
		}
		w.Samples[i] = t
	}
	for _, d := range r.Dropped {
		w.Dropped = append(w.Dropped, &pb.DroppedRow{Seq: d.Seq, Reason: d.Reason.String(), ShardId: d.Shard})
	}
	return &pb.ResultMessage{Msg: &pb.ResultMessage_Result{Result: w}}
}

// ResultFromWire converts a BatchResult from the last stage after checking
// it against lim: its epoch; at most MaxBatchRows samples and dropped rows;
// sampled tokens (and their alternatives, at most sample.MaxTopLogprobs)
// inside the vocabulary at non-negative positions; dropped rows with row
// codes and bounded shard IDs. Whether its sequences belong to the batch is
// the caller's to check (it knows the batch's rows).
func ResultFromWire(w *pb.BatchResult, lim ResultLimits) (*BatchResult, error) {
	id := w.GetBatchId()
	switch {
	case w.GetEpoch() < lim.Epoch:
		return nil, refuse(CodeStaleEpoch, "result of batch %d from epoch %d, older than this coordinator's", id, w.GetEpoch())
	case w.GetEpoch() > lim.Epoch:
		return nil, refuse(CodeFutureEpoch, "result of batch %d from epoch %d, newer than this coordinator's", id, w.GetEpoch())
	case len(w.GetSamples()) > MaxBatchRows || len(w.GetDropped()) > MaxBatchRows:
		return nil, refuse(CodeTooLarge, "result of batch %d: %d samples and %d dropped rows, limit %d", id, len(w.GetSamples()), len(w.GetDropped()), MaxBatchRows)
	}
	r := &BatchResult{Epoch: w.GetEpoch(), Placement: w.GetPlacementVersion(), ID: id}
	inVocab := func(tok int32) bool { return tok >= 0 && int(tok) < lim.Vocab }
	if n := len(w.GetSamples()); n > 0 {
		r.Samples = make([]Sampled, n)
	}
	for i, s := range w.GetSamples() {
		switch {
		case !inVocab(s.GetToken()):
			return nil, refuse(CodeBadToken, "result of batch %d: sequence %d: token %d outside the vocabulary of %d", id, s.GetSeq(), s.GetToken(), lim.Vocab)
		case s.GetPos() < 0:
			return nil, refuse(CodeBadPosition, "result of batch %d: sequence %d: position %d", id, s.GetSeq(), s.GetPos())
		case len(s.GetTop()) > sample.MaxTopLogprobs:
			return nil, refuse(CodeTooLarge, "result of batch %d: sequence %d: %d alternatives, limit %d", id, s.GetSeq(), len(s.GetTop()), sample.MaxTopLogprobs)
		}
		g := Sampled{Seq: s.GetSeq(), Pos: int(s.GetPos()), Token: s.GetToken(), Logprob: s.GetLogprob()}
		for _, a := range s.GetTop() {
			if !inVocab(a.GetToken()) {
				return nil, refuse(CodeBadToken, "result of batch %d: sequence %d: alternative %d outside the vocabulary of %d", id, s.GetSeq(), a.GetToken(), lim.Vocab)
			}
			g.Top = append(g.Top, sample.TokenLogprob{Token: a.GetToken(), Logprob: a.GetLogprob()})
		}
		r.Samples[i] = g
	}
	var err error
	if r.Dropped, err = droppedFromWire(w.GetDropped()); err != nil {
		return nil, fmt.Errorf("result of batch %d: %w", id, err)
	}
	return r, nil
}

// droppedFromWire converts dropped rows: row codes, bounded shard IDs.
func droppedFromWire(ds []*pb.DroppedRow) ([]Dropped, error) {
	if len(ds) > MaxBatchRows {
		return nil, refuse(CodeTooLarge, "%d dropped rows, limit %d", len(ds), MaxBatchRows)
	}
	if len(ds) == 0 {
		return nil, nil
	}
	out := make([]Dropped, len(ds))
	for i, d := range ds {
		c, ok := ParseCode(d.GetReason())
		if !ok || !c.Row() {
			return nil, refuse(CodeBadReason, "sequence %d dropped for an unknown reason", d.GetSeq())
		}
		if err := checkOptionalID("shard_id", d.GetShardId()); err != nil {
			return nil, err
		}
		out[i] = Dropped{Seq: d.GetSeq(), Reason: c, Shard: d.GetShardId()}
	}
	return out, nil
}

// FailedToWire converts f for a StageReply, Results or Control.
func FailedToWire(f *Failure) *pb.BatchFailed {
	return &pb.BatchFailed{BatchId: f.Batch, Seqs: f.Seqs, Reason: f.Code.String(), ShardId: f.Shard, Epoch: f.Epoch}
}

// FailedFromWire converts a BatchFailed (from a StageReply, Results or
// Control) after checking it: its epoch, when set, equal to epoch; at most
// MaxBatchRows sequences; its reason a Code; its shard ID bounded. Whether
// the batch is in flight where the report came from is the caller's to
// check.
func FailedFromWire(f *pb.BatchFailed, epoch uint64) (*Failure, error) {
	id := f.GetBatchId()
	switch e := f.GetEpoch(); {
	case e != 0 && e < epoch:
		return nil, refuse(CodeStaleEpoch, "failure of batch %d from epoch %d, older than this coordinator's", id, e)
	case e > epoch:
		return nil, refuse(CodeFutureEpoch, "failure of batch %d from epoch %d, newer than this coordinator's", id, e)
	case len(f.GetSeqs()) > MaxBatchRows:
		return nil, refuse(CodeTooLarge, "failure of batch %d names %d sequences, limit %d", id, len(f.GetSeqs()), MaxBatchRows)
	}
	c, ok := ParseCode(f.GetReason())
	if !ok {
		return nil, refuse(CodeBadReason, "failure of batch %d for an unknown reason", id)
	}
	if err := checkOptionalID("shard_id", f.GetShardId()); err != nil {
		return nil, err
	}
	return &Failure{Epoch: f.GetEpoch(), Batch: id, Seqs: f.GetSeqs(), Code: c, Shard: f.GetShardId()}, nil
}
