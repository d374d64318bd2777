package shard

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/transport/pb"
)

// Calibration bounds. A shard measures a few layers of the model it has,
// once per process, before it registers: the coordinator places layers by
// these times (DESIGN.md, Membership and placement).
const (
	// calibrationLayers is how many layers are measured (fewer when the
	// model has fewer): enough to average over, few enough to be quick.
	calibrationLayers = 2
	// calibrationDecodeRows is the larger decode batch measured, beside
	// one row: a typical batch under load.
	calibrationDecodeRows = 8
	// calibrationContext is the position decode rows are at: attention
	// reads this many keys, a short conversation's worth.
	calibrationContext = 64
	// calibrationChunk is the prefill chunk measured, in tokens.
	calibrationChunk = 64
	// calibrationRuns is the runs of each kind that are enough: a small
	// model is done in milliseconds.
	calibrationRuns = 5
	// CalibrationBudget bounds the measuring, after one warm-up run of
	// each kind: runs are made (each kind at least once, at most
	// calibrationRuns times) until it is spent, and the fastest of each
	// kind is reported: on a machine that other work shares, the slower
	// runs measure the other work's bursts, not this shard's speed.
	CalibrationBudget = time.Second
)

// Calibrate measures m's layers [0, min(2, Layers)) on pool: the time per
// layer of a decode batch of 1 and of 8 rows at position 64 and of one
// 64-token prefill chunk, each the fastest of up to 5 runs that fit in
// budget (at least one of each after a warm-up). The KV cache has the model's
// shapes (f16) and lives only for the measurement. sha names the model
// in the report. It stops early, with ctx's error, when ctx ends.
func Calibrate(ctx context.Context, m *model.Model, sha string, pool *cpu.Pool, budget time.Duration) (*pb.Calibration, error) {
	layers := min(calibrationLayers, m.Layers)
	bs := cpu.DefaultBlockSize
	perRow := (max(calibrationContext+1, calibrationChunk) + bs - 1) / bs
	rowsN := calibrationDecodeRows + 1 // the decode rows, and the prefill row
	kv, err := cpu.NewKV(cpu.KVConfig{Layers: layers, Blocks: rowsN * perRow, BlockSize: bs,
		Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: ggml.F16})
	if err != nil {
		return nil, fmt.Errorf("calibrate: %w", err)
	}
	st, err := model.NewStage(m, 0, layers, cpu.NewBackend(pool), kv)
	if err != nil {
		return nil, fmt.Errorf("calibrate: %w", err)
	}
	blocks := func(r int) []int32 {
		b := make([]int32, perRow)
		for i := range b {
			b[i] = int32(r*perRow + i)
		}
		return b
	}
	token := func(i int) int32 { return int32((i*7919 + 1) % m.Vocab) }
	decode := make([]model.Row, calibrationDecodeRows)
	for r := range decode {
		decode[r] = model.Row{Seq: uint64(r + 1), Pos: calibrationContext, Tokens: []int32{token(r)}, Blocks: blocks(r)}
	}
	chunk := make([]int32, calibrationChunk)
	for i := range chunk {
		chunk[i] = token(i + 100)
	}
	prefill := []model.Row{{Seq: uint64(rowsN), First: true, Tokens: chunk, Blocks: blocks(rowsN - 1)}}
	kinds := [][]model.Row{decode[:1], decode, prefill}
	times := make([][]time.Duration, len(kinds))
	run := func(k int) error {
		t0 := time.Now()
		if _, err := st.Forward(kinds[k], nil); err != nil {
			return fmt.Errorf("calibrate: %w", err)
		}
		times[k] = append(times[k], time.Since(t0))
		return nil
	}
	for k := range kinds { // warm-up: scratch buffers, caches, repacking
		if err := run(k); err != nil {
			return nil, err
		}
		times[k] = times[k][:0]
	}
	start := time.Now()
	for i := 0; i == 0 || i < calibrationRuns && time.Since(start) < budget; i++ {
		for k := range kinds {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if err := run(k); err != nil {
				return nil, err
			}
		}
	}
	perLayer := func(ts []time.Duration) uint64 {
		return max(1, uint64(slices.Min(ts))/uint64(layers))
	}
	return &pb.Calibration{ModelSha256: sha, Layers: uint32(layers),
		Decode1Ns: perLayer(times[0]), Decode8Ns: perLayer(times[1]),
		PrefillNs: perLayer(times[2]), PrefillTokens: calibrationChunk}, nil
}

// SharedCalibration lets shards that compute on one pool (in-process
// shards) calibrate once: the first node to ask measures, the others
// reuse its result. Safe for concurrent use.
type SharedCalibration struct {
	mu  sync.Mutex
	sha string
	cal *pb.Calibration
}

// get returns the calibration for sha, measuring it with measure the first
// time (or when a different model is asked for).
func (s *SharedCalibration) get(sha string, measure func() (*pb.Calibration, error)) (*pb.Calibration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cal != nil && s.sha == sha {
		return s.cal, nil
	}
	cal, err := measure()
	if err != nil {
		return nil, err
	}
	s.sha, s.cal = sha, cal
	return cal, nil
}

// calibrate measures the local model for Register (nil without one). A
// failure is logged and leaves the shard uncalibrated: placement then
// counts its memory only.
func (n *Node) calibrate(ctx context.Context) *pb.Calibration {
	if n.cfg.Model == "" || n.localSHA == "" || n.cfg.CalibrationBudget < 0 {
		return nil
	}
	measure := func() (*pb.Calibration, error) {
		lm, err := openModel(n.cfg.Model, n.localSHA)
		if err != nil {
			return nil, err
		}
		defer lm.file.Close()
		return Calibrate(ctx, lm.m, n.localSHA, n.pool, n.cfg.CalibrationBudget)
	}
	var cal *pb.Calibration
	var err error
	if n.cfg.SharedCalibration != nil {
		cal, err = n.cfg.SharedCalibration.get(n.localSHA, measure)
	} else {
		cal, err = measure()
	}
	if err != nil {
		if ctx.Err() == nil {
			n.log.Warn("calibrate: placement will count this shard's memory only", "err", err)
		}
		return nil
	}
	n.log.Info("calibrated", "layers", cal.GetLayers(), "decode1_ns", cal.GetDecode1Ns(),
		"decode8_ns", cal.GetDecode8Ns(), "prefill_ns", cal.GetPrefillNs(), "prefill_tokens", cal.GetPrefillTokens())
	return cal
}
