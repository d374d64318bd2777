package shard

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/cuda"
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
	// CalibrationBudget bounds the measuring, after one warm-up run of
	// each kind: each kind runs back to back for its share of the budget
	// (at least once), and its time is the window's elapsed time over the
	// runs made — a rate, not the fastest run. A shard under a CPU quota
	// (a container's cpu.max, a burstable VM) runs short bursts at full
	// speed and is then held back for the rest of the quota's period
	// (100 ms by default): only a window spanning a few periods sees the
	// speed it will serve at. The fastest of a few short runs, measured
	// before, ranked a shard held to half a core as fast as an unheld one.
	CalibrationBudget = time.Second
)

// Calibrate measures m's layers [0, min(2, Layers)) on pool: the time per
// layer of a decode batch of 1 and of 8 rows at position 64 and of one
// 64-token prefill chunk, each the mean over back-to-back runs filling a
// third of budget (at least one run of each, after a warm-up). The KV cache has the model's
// shapes (f16) and lives only for the measurement. sha names the model
// in the report. It stops early, with ctx's error, when ctx ends.
func Calibrate(ctx context.Context, m *model.Model, sha string, pool *cpu.Pool, budget time.Duration) (*pb.Calibration, error) {
	layers, bs, blocks := calibrationShape(m)
	kv, err := cpu.NewKV(cpu.KVConfig{Layers: layers, Blocks: blocks, BlockSize: bs,
		Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: ggml.F16})
	if err != nil {
		return nil, fmt.Errorf("calibrate: %w", err)
	}
	st, err := model.NewStage(m, 0, layers, cpu.NewBackend(pool), kv)
	if err != nil {
		return nil, fmt.Errorf("calibrate: %w", err)
	}
	return measureStage(ctx, st.Forward, m, sha, budget)
}

// CalibrateGPU is Calibrate on a GPU: the same batches through the same
// layers loaded on dev (weights and a KV pool of the same blocks in device
// memory, freed after), so that placement gives a GPU shard the layers its
// speed earns.
func CalibrateGPU(ctx context.Context, m *model.Model, sha string, dev *cuda.Device, budget time.Duration) (*pb.Calibration, error) {
	layers, bs, blocks := calibrationShape(m)
	st, err := cuda.NewStage(dev, m, 0, layers, blocks, bs)
	if err != nil {
		return nil, fmt.Errorf("calibrate: %w", err)
	}
	defer st.Close()
	return measureStage(ctx, st.Forward, m, sha, budget)
}

// calibrationShape is the measured layers, the block size and the pool's
// blocks: each decode row's and the prefill row's positions.
func calibrationShape(m *model.Model) (layers, bs, blocks int) {
	layers = min(calibrationLayers, m.Layers)
	bs = cpu.DefaultBlockSize
	perRow := (max(calibrationContext+1, calibrationChunk) + bs - 1) / bs
	return layers, bs, (calibrationDecodeRows + 1) * perRow
}

// measureStage times forward, a stage of calibrationShape's layers and
// pool, on Calibrate's batches.
func measureStage(ctx context.Context, forward func([]model.Row, []float32) ([]float32, error), m *model.Model, sha string, budget time.Duration) (*pb.Calibration, error) {
	layers, bs, _ := calibrationShape(m)
	perRow := (max(calibrationContext+1, calibrationChunk) + bs - 1) / bs
	rowsN := calibrationDecodeRows + 1 // the decode rows, and the prefill row
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
	run := func(k int) error {
		if _, err := forward(kinds[k], nil); err != nil {
			return fmt.Errorf("calibrate: %w", err)
		}
		return nil
	}
	for k := range kinds { // warm-up: scratch buffers, caches, repacking
		if err := run(k); err != nil {
			return nil, err
		}
	}
	window := budget / time.Duration(len(kinds))
	rate := make([]time.Duration, len(kinds))
	for k := range kinds {
		d, err := meanOver(ctx, window, time.Now, func() error { return run(k) })
		if err != nil {
			return nil, err
		}
		rate[k] = d
	}
	perLayer := func(d time.Duration) uint64 { return max(1, uint64(d)/uint64(layers)) }
	return &pb.Calibration{ModelSha256: sha, Layers: uint32(layers),
		Decode1Ns: perLayer(rate[0]), Decode8Ns: perLayer(rate[1]),
		PrefillNs: perLayer(rate[2]), PrefillTokens: calibrationChunk}, nil
}

// meanOver calls run back to back until window has passed on now's clock
// (at least once) and returns the elapsed time over the calls made: the
// rate at which the shard computes, pauses for a CPU quota included. It
// stops with ctx's error when ctx ends.
func meanOver(ctx context.Context, window time.Duration, now func() time.Time, run func() error) (time.Duration, error) {
	start, n := now(), 0
	for n == 0 || now().Sub(start) < window {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if err := run(); err != nil {
			return 0, err
		}
		n++
	}
	return now().Sub(start) / time.Duration(n), nil
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
		if n.gpu != nil {
			return CalibrateGPU(ctx, lm.m, n.localSHA, n.gpu, n.cfg.CalibrationBudget)
		}
		return Calibrate(ctx, lm.m, n.localSHA, n.pool, n.cfg.CalibrationBudget)
	}
	var cal *pb.Calibration
	var err error
	if n.cfg.SharedCalibration != nil && n.gpu == nil { // shared by the shards of one CPU pool, not a GPU's
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
