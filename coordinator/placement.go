package coordinator

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/strata-llm/strata/control"
	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
	"github.com/strata-llm/strata/transport/pb"
)

// ModelShape is what placement needs to know about the served model
// (control.Shape: sizes in bytes, no weights; its Model is the file's
// lower-case hex SHA-256, Assign.model_sha256), and what the coordinator
// adds for the wire.
type ModelShape struct {
	control.Shape
	KVType pb.KVType
	// HiddenDim is the model's embedding width.
	HiddenDim int
	// MaxBatchTokens bounds one batch's tokens (Assign.max_batch_tokens).
	MaxBatchTokens int
	// Vocab is the model's vocabulary: a token the last stage samples
	// outside [0, Vocab) is refused. 0 checks none.
	Vocab int
}

// FileSHA256 returns the lower-case hex SHA-256 of the file at path
// (ModelShape.Model and the shards' RegisterRequest.models).
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
		Shape: control.Shape{Model: sha, Layers: m.Layers, LayerBytes: make([]int64, m.Layers), ActiveBytes: make([]int64, m.Layers),
			KVBytesPerBlockLayer: 2 * int64(blockSize) * int64(m.HeadsKV*m.HeadDim) * int64(kvType.TypeSize()),
			BlockSize:            blockSize},
		HiddenDim: m.Embd, MaxBatchTokens: maxBatchTokens, Vocab: m.Vocab,
	}
	if kvType == ggml.F32 {
		s.KVType = pb.KVType_KV_TYPE_F32
	}
	if g := m.KVGroups(); g.Groups > 1 { // the shards group their KV: docs/sliding-window-kv.md
		s.KVGroup = make([]int, m.Layers)
		for l := range s.KVGroup {
			s.KVGroup[l] = g.Group(l)
		}
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

// The placement types are the control core's (package control); the
// coordinator adds the wire messages a placement becomes.
type (
	Stage    = control.Stage
	Capacity = control.Capacity
	Speed    = control.Speed
	Mix      = control.Mix
)

// Placement is one version of which shard holds which layer range
// (control.Placement, with the coordinator's methods).
type Placement control.Placement

// The load mixes of --placement-mix (control.Mix).
const (
	MixDecode   = control.MixDecode
	MixPrefill  = control.MixPrefill
	MixBalanced = control.MixBalanced
	MixMemory   = control.MixMemory
)

// ErrNoFit is wrapped by Plan when the shards cannot hold the model.
var ErrNoFit = control.ErrNoFit

// ParseMix reads a --placement-mix value.
func ParseMix(s string) (Mix, error) { return control.ParseMix(s) }

// Plan places shape on shards by memory (control.Plan).
func Plan(shape ModelShape, shards []Capacity, version, epoch uint64) (*Placement, error) {
	if err := shape.Validate(); err != nil {
		return nil, err
	}
	p, err := control.Plan(shape.Shape, shards, version, epoch)
	return (*Placement)(p), err
}

// PlanFor places shape on shards for mix, by measured speed when every
// shard has one, else by memory (control.PlanFor).
func PlanFor(shape ModelShape, shards []Capacity, mix Mix, version, epoch uint64) (*Placement, error) {
	if err := shape.Validate(); err != nil {
		return nil, err
	}
	p, err := control.PlanFor(shape.Shape, shards, mix, version, epoch)
	return (*Placement)(p), err
}

// Predict returns the time each stage of p takes for a batch of mix
// (control.Predict).
func Predict(shape ModelShape, p *Placement, speeds map[string]*Speed, mix Mix) []time.Duration {
	return control.Predict(shape.Shape, (*control.Placement)(p), speeds, mix)
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
	if i > 0 {
		a.UpstreamNodeId = p.Stages[i-1].NodeID
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
