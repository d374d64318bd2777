package transport

import "github.com/strata-llm/strata/model/sample"

// The types in this file are the data path's messages as Go values: what the
// coordinator sends to the first stage, what stages pass on, and what comes
// back. The coordinator and the shards share them (they never import each
// other); the gRPC streams carry them as protobuf (package pb).

// Tombstone ends a sequence on every stage. Its Reason is one the
// coordinator decides (Reason.Coordinator) when it travels; a shard's own
// frees (lease, epoch, reconcile) never travel.
type Tombstone struct {
	Epoch  uint64
	Seq    uint64
	Reason Reason
}

// Row is one sequence's part of a micro-batch.
type Row struct {
	Seq    uint64
	Pos    int     // position of Tokens[0]
	First  bool    // the sequence's first row: stages create it
	Tokens []int32 // token IDs (stage 0 embeds them; the last stage keeps them as sampling history)
	Blocks []int32 // block table covering positions [0, Pos+len(Tokens))
	Sample bool    // the last stage samples a token after this row
	// Params are the sequence's sampling settings, on first rows only; the
	// last stage keeps them until the sequence's tombstone. Logprobs (first
	// rows only) says the client asked for log-probabilities.
	Params   *sample.Params
	Logprobs bool
	// SlideFrom and Slides are the sequence's sliding-window block tables,
	// for a model whose KV has sliding groups (model.KVGroups; zero and nil
	// for every other model): entries [SlideFrom, len(Blocks)) of each
	// sliding group's table, group g's (g >= 1) at Slides[(g-1)*w:g*w] for
	// w = len(Blocks)-SlideFrom. The entries before SlideFrom were
	// released: no position the row reads in a sliding layer lies in them.
	SlideFrom int
	Slides    []int32
}

// MicroBatch is one micro-batch. Stages apply Tombstones before touching
// Rows. Hidden holds the previous stage's output (Tokens × Embd float32); it
// is nil for the first stage. A batch with ID 0 carries only tombstones.
// Dropped are rows earlier stages removed (the last stage reports them);
// TTL is the coordinator's relative deadline in milliseconds (0: none).
type MicroBatch struct {
	Epoch      uint64
	Placement  uint64
	ID         uint64
	TTL        int64
	Tombstones []Tombstone
	Rows       []Row
	Dropped    []Dropped
	Hidden     []float32
}

// Sampled is one token the last stage chose for a row; Pos is the
// position it will occupy.
type Sampled struct {
	Seq     uint64
	Pos     int
	Token   int32
	Logprob float32
	Top     []sample.TokenLogprob
}

// Dropped is a row the stage Shard refused (Reason is a row code,
// Code.Row); the coordinator tombstones the sequence and recomputes its
// request.
type Dropped struct {
	Seq    uint64
	Reason Code
	Shard  string
}

// BatchResult is a batch's outcome as the coordinator receives it: the last
// stage's samples and every stage's dropped rows, or, with Lost, the whole
// batch failed on the way (Reason says where and why, for logs: a code's
// name and the shard that reported it).
type BatchResult struct {
	Epoch     uint64
	Placement uint64
	ID        uint64
	Samples   []Sampled
	Dropped   []Dropped
	Lost      bool
	Reason    string
}

// Failure is a BatchFailed: the stage Shard failed batch Batch for Code,
// every row of it when Seqs is empty, else the rows of those sequences.
type Failure struct {
	Epoch uint64
	Batch uint64
	Seqs  []uint64
	Code  Code
	Shard string
}
