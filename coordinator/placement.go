package coordinator

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
	"github.com/strata-llm/strata/transport/pb"
)

// ModelShape is what placement needs to know about the served model: sizes
// in bytes, no weights.
type ModelShape struct {
	// SHA256 is the model file's lower-case hex SHA-256 (Assign.model_sha256).
	SHA256 string
	Layers int
	// LayerBytes are each transformer layer's weight bytes (len Layers).
	LayerBytes []int64
	// ActiveBytes are the bytes of each layer a token's pass reads (len
	// Layers, or nil for LayerBytes): a mixture-of-experts layer's expert
	// tensors count ExpertsUsed/Experts of their bytes. Placement by speed
	// weighs layers by them.
	ActiveBytes []int64
	// EmbedBytes are the token embedding's bytes (stage 0); HeadBytes the
	// final norm's and output head's (the last stage; the embedding again
	// when the head is tied to it).
	EmbedBytes int64
	HeadBytes  int64
	// KVBytesPerBlockLayer is one KV block's K and V bytes for one layer.
	KVBytesPerBlockLayer int64
	// BlockSize is positions per KV block.
	BlockSize int
	KVType    pb.KVType
	// HiddenDim is the model's embedding width.
	HiddenDim int
	// MaxBatchTokens bounds one batch's tokens (Assign.max_batch_tokens).
	MaxBatchTokens int
	// Vocab is the model's vocabulary: a token the last stage samples
	// outside [0, Vocab) is refused. 0 checks none.
	Vocab int
}

// FileSHA256 returns the lower-case hex SHA-256 of the file at path
// (ModelShape.SHA256 and the shards' RegisterRequest.models).
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("coordinator: hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ShapeFromModel measures m (read from f) for placement; kvType is the KV
// cache's storage (ggml.F16 or ggml.F32) and blockSize its positions per
// block.
func ShapeFromModel(f *gguf.File, m *model.Model, sha string, kvType ggml.Type, blockSize, maxBatchTokens int) (ModelShape, error) {
	if kvType != ggml.F16 && kvType != ggml.F32 {
		return ModelShape{}, fmt.Errorf("coordinator: KV type must be f16 or f32, got %v", kvType)
	}
	s := ModelShape{
		SHA256: sha, Layers: m.Layers, LayerBytes: make([]int64, m.Layers), ActiveBytes: make([]int64, m.Layers),
		KVBytesPerBlockLayer: 2 * int64(blockSize) * int64(m.HeadsKV*m.HeadDim) * int64(kvType.TypeSize()),
		BlockSize:            blockSize, HiddenDim: m.Embd, MaxBatchTokens: maxBatchTokens, Vocab: m.Vocab,
	}
	if kvType == ggml.F32 {
		s.KVType = pb.KVType_KV_TYPE_F32
	}
	_, noOutput := f.Tensor("output.weight") // absent: the head is tied to token_embd
	for _, t := range f.Tensors {
		n := int64(len(t.Data))
		switch {
		case strings.HasPrefix(t.Name, "blk."):
			var i int
			if _, err := fmt.Sscanf(t.Name, "blk.%d.", &i); err == nil && i >= 0 && i < m.Layers {
				s.LayerBytes[i] += n
				if strings.Contains(t.Name, "_exps.") && m.Experts > 0 {
					s.ActiveBytes[i] += n * int64(m.ExpertsUsed) / int64(m.Experts)
				} else {
					s.ActiveBytes[i] += n
				}
			}
		case strings.HasPrefix(t.Name, "token_embd"):
			s.EmbedBytes += n
			if noOutput != nil {
				s.HeadBytes += n
			}
		case strings.HasPrefix(t.Name, "output"):
			s.HeadBytes += n
		}
	}
	return s, s.Validate()
}

// Validate names the first field that is wrong.
func (s ModelShape) Validate() error {
	switch {
	case s.Layers < 1:
		return fmt.Errorf("coordinator: ModelShape.Layers must be >= 1, got %d", s.Layers)
	case len(s.LayerBytes) != s.Layers:
		return fmt.Errorf("coordinator: ModelShape.LayerBytes has %d entries for %d layers", len(s.LayerBytes), s.Layers)
	case s.ActiveBytes != nil && len(s.ActiveBytes) != s.Layers:
		return fmt.Errorf("coordinator: ModelShape.ActiveBytes has %d entries for %d layers", len(s.ActiveBytes), s.Layers)
	case s.KVBytesPerBlockLayer < 1:
		return fmt.Errorf("coordinator: ModelShape.KVBytesPerBlockLayer must be >= 1, got %d", s.KVBytesPerBlockLayer)
	case s.BlockSize < 1:
		return fmt.Errorf("coordinator: ModelShape.BlockSize must be >= 1, got %d", s.BlockSize)
	}
	return nil
}

// Stage is one shard's place in a Placement: layers [First, End).
type Stage struct {
	ShardID     string `json:"shard_id"`
	NodeID      string `json:"node_id"`
	Incarnation uint64 `json:"incarnation"`
	Addr        string `json:"addr"` // the shard's stage endpoint
	First       int    `json:"first"`
	End         int    `json:"end"`
	Embed       bool   `json:"embed"`
	Head        bool   `json:"head"`
	// Blocks is the KV blocks this stage could hold; the pool is the
	// smallest.
	Blocks int `json:"blocks"`
	// PredictedNs is the time the stage was predicted to take for one
	// batch of the placement's Mix, from its shard's calibration; 0
	// without one.
	PredictedNs int64 `json:"predicted_ns,omitempty"`
}

// Placement is one version of which shard holds which layer range.
type Placement struct {
	Version   uint64  `json:"version"`
	Epoch     uint64  `json:"epoch"` // the epoch that made it
	Model     string  `json:"model_sha256"`
	Stages    []Stage `json:"stages"`
	Blocks    int     `json:"blocks"` // the KV pool: the smallest stage's capacity
	BlockSize int     `json:"block_size"`
	// Mix is the load mix the stages' PredictedNs are for (PlanFor).
	Mix string `json:"mix,omitempty"`
}

// Assign returns stage i's Assign message.
func (p *Placement) Assign(i int, shape ModelShape) *pb.Assign {
	st := p.Stages[i]
	a := &pb.Assign{
		PlacementVersion: p.Version,
		FirstLayer:       uint32(st.First), EndLayer: uint32(st.End),
		Embed: st.Embed, Head: st.Head,
		Stage: uint32(i), Stages: uint32(len(p.Stages)),
		ModelSha256: p.Model,
		KvBlocks:    uint32(p.Blocks), BlockSize: uint32(p.BlockSize),
		KvType: shape.KVType, HiddenType: pb.HiddenType_HIDDEN_TYPE_F32,
		MaxBatchTokens: uint32(shape.MaxBatchTokens),
	}
	if i+1 < len(p.Stages) {
		a.NextAddr = p.Stages[i+1].Addr
	}
	return a
}

// stageOf returns the index of shardID in p, or -1.
func (p *Placement) stageOf(shardID string) int {
	if p == nil {
		return -1
	}
	for i, s := range p.Stages {
		if s.ShardID == shardID {
			return i
		}
	}
	return -1
}

// Capacity is what a shard offers to placement.
type Capacity struct {
	ShardID     string
	NodeID      string
	Incarnation uint64
	Addr        string
	// Memory is the bytes the shard may use for weights and KV.
	Memory int64
	// KVMemory caps its KV pool in bytes; 0 means what fits after weights.
	KVMemory int64
	// Speed is the shard's calibration on the served model; nil: none
	// (PlanFor then places by memory).
	Speed *Speed
}

// ErrNoFit is wrapped by Plan when the shards cannot hold the model.
var ErrNoFit = errors.New("coordinator: the shards cannot hold the model")

// Plan places shape on shards, in their order, as contiguous layer ranges:
// sizes proportional to each shard's memory (at least one layer each, at
// most Layers shards used), embedding on the first, head on the last. Each
// stage's KV capacity is what its memory holds after its weights, capped by
// its KVMemory; the pool is the smallest stage's. It fails (wrapping
// ErrNoFit) when some stage's weights do not fit or the pool holds no
// block.
func Plan(shape ModelShape, shards []Capacity, version, epoch uint64) (*Placement, error) {
	if err := shape.Validate(); err != nil {
		return nil, err
	}
	if len(shards) == 0 {
		return nil, fmt.Errorf("%w: no shards", ErrNoFit)
	}
	shards = shards[:min(len(shards), shape.Layers)]
	var total int64
	for _, s := range shards {
		if s.Memory <= 0 {
			return nil, fmt.Errorf("%w: shard %s reports no memory", ErrNoFit, s.ShardID)
		}
		total += s.Memory
	}
	// Split Layers by memory: each shard's exact share rounded down (at
	// least one layer), then the layers left to the largest shortfalls (or
	// taken back from the largest excesses).
	n := len(shards)
	sizes := make([]int, n)
	exact := make([]float64, n)
	sum := 0
	for i, s := range shards {
		exact[i] = float64(shape.Layers) * float64(s.Memory) / float64(total)
		sizes[i] = max(1, int(exact[i]))
		sum += sizes[i]
	}
	for sum != shape.Layers {
		best := -1
		for i := range sizes {
			d := exact[i] - float64(sizes[i])
			switch {
			case sum < shape.Layers && (best < 0 || d > exact[best]-float64(sizes[best])):
				best = i
			case sum > shape.Layers && sizes[i] > 1 && (best < 0 || d < exact[best]-float64(sizes[best])):
				best = i
			}
		}
		if sum < shape.Layers {
			sizes[best]++
			sum++
		} else {
			sizes[best]--
			sum--
		}
	}
	p := &Placement{Version: version, Epoch: epoch, Model: shape.SHA256, BlockSize: shape.BlockSize, Blocks: -1}
	first := 0
	for i, s := range shards {
		st := Stage{ShardID: s.ShardID, NodeID: s.NodeID, Incarnation: s.Incarnation, Addr: s.Addr,
			First: first, End: first + sizes[i], Embed: i == 0, Head: i == n-1}
		first = st.End
		var err error
		if st.Blocks, err = stageBlocks(shape, s, st); err != nil {
			return nil, err
		}
		if p.Blocks < 0 || st.Blocks < p.Blocks {
			p.Blocks = st.Blocks
		}
		p.Stages = append(p.Stages, st)
	}
	if p.Blocks < 1 {
		return nil, fmt.Errorf("%w: the smallest stage holds no %d-position KV block", ErrNoFit, shape.BlockSize)
	}
	return p, nil
}
