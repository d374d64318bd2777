package shard

import (
	"errors"
	"github.com/strata-llm/strata/transport"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

func loadStories(t *testing.T) *model.Model {
	t.Helper()
	const path = "../../shared/models/stories260K.gguf"
	if _, err := os.Stat(path); err != nil {
		sharedAbsent(t, path, err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// pipe is a chain of runners over consecutive layer ranges.
type pipe []*Runner

func newPipe(t *testing.T, m *model.Model, cuts ...int) pipe {
	t.Helper()
	pool := cpu.NewPool(2)
	t.Cleanup(pool.Close)
	bounds := append(append([]int{0}, cuts...), m.Layers)
	var p pipe
	for i := 0; i+1 < len(bounds); i++ {
		kv, err := cpu.NewKV(cpu.KVConfig{Layers: bounds[i+1] - bounds[i], Blocks: 32, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: ggml.F16})
		if err != nil {
			t.Fatal(err)
		}
		st, err := model.NewStage(m, bounds[i], bounds[i+1], cpu.NewBackend(pool), kv)
		if err != nil {
			t.Fatal(err)
		}
		p = append(p, NewRunner(st, 32, kv.BlockSize()))
	}
	return p
}

// run sends a batch through every stage and returns the last stage's result
// and every stage's dropped rows.
func (p pipe) run(t *testing.T, b Batch) (*Result, []Dropped) {
	t.Helper()
	var dropped []Dropped
	var res *Result
	for i, r := range p {
		var err error
		announce(r, b.Epoch)
		res, err = r.Process(&b, time.Unix(0, 0))
		if err != nil {
			t.Fatalf("stage %d: %v", i, err)
		}
		dropped = append(dropped, res.Dropped...)
		b = Batch{Epoch: b.Epoch, ID: b.ID, Tombstones: b.Tombstones, Rows: slices.Clone(res.Rows), Hidden: slices.Clone(res.Hidden)}
	}
	return res, dropped
}

var prompt = []int32{1, 403, 407, 261, 378}

// announce moves r to epoch e if it is newer, as the coordinator's control
// stream does before it sends batches of e (Process never adopts one).
func announce(r *Runner, e uint64) {
	if e > r.Table().Epoch() {
		r.SetEpoch(e)
	}
}

// greedyA decodes sequence A for n tokens, with B riding along until it is
// tombstoned after cancelAt steps (never when cancelAt < 0); at cancel time a
// late row of B is also sent behind the tombstone.
func greedyA(t *testing.T, p pipe, n, cancelAt int) ([]int32, []Dropped) {
	t.Helper()
	blocksA, blocksB := []int32{0, 1, 2, 3, 4}, []int32{10, 11, 12, 13, 14}
	rows := []Row{{Seq: 1, First: true, Tokens: prompt, Blocks: blocksA, Sample: true}}
	if cancelAt >= 0 {
		rows = append(rows, Row{Seq: 2, First: true, Tokens: []int32{1, 500, 20}, Blocks: blocksB, Sample: true})
	}
	posA, posB := len(prompt), 3
	var out []int32
	var allDropped []Dropped
	var tombs []Tombstone
	for step := 0; len(out) < n; step++ {
		res, dropped := p.run(t, Batch{Epoch: 1, ID: uint64(step), Tombstones: tombs, Rows: rows})
		allDropped = append(allDropped, dropped...)
		tombs = nil
		var tokA, tokB int32 = -1, -1
		for _, s := range res.Samples {
			switch s.Seq {
			case 1:
				tokA = s.Result.Token
			case 2:
				tokB = s.Result.Token
			}
		}
		out = append(out, tokA)
		rows = []Row{{Seq: 1, Pos: posA, Tokens: []int32{tokA}, Blocks: blocksA, Sample: true}}
		posA++
		switch {
		case cancelAt >= 0 && step < cancelAt:
			rows = append(rows, Row{Seq: 2, Pos: posB, Tokens: []int32{tokB}, Blocks: blocksB, Sample: true})
			posB++
		case step == cancelAt:
			tombs = []Tombstone{{Seq: 2, Reason: Aborted}}
			// A late row of B behind its tombstone: must be dropped, not computed.
			rows = append(rows, Row{Seq: 2, Pos: posB, Tokens: []int32{tokB}, Blocks: blocksB, Sample: true})
		}
	}
	return out, allDropped
}

func TestRunnerCancelDoesNotChangeOthers(t *testing.T) {
	m := loadStories(t)
	alone, _ := greedyA(t, newPipe(t, m), 24, -1)
	for _, cuts := range [][]int{nil, {2}, {1, 3}} {
		p := newPipe(t, m, cuts...)
		got, dropped := greedyA(t, p, 24, 7)
		if !slices.Equal(got, alone) {
			t.Errorf("cuts %v: tokens with a cancelled neighbour %v, alone %v", cuts, got, alone)
		}
		// Only the first stage sees the late row: it drops it, so later
		// stages never receive it.
		if len(dropped) != 1 || dropped[0] != (Dropped{Seq: 2, Code: transport.CodeUnknownSequence}) {
			t.Errorf("cuts %v: dropped %v, want one unknown_sequence for 2", cuts, dropped)
		}
		for i, r := range p {
			if r.Table().Has(2) || r.Table().Freed(Aborted) != 1 {
				t.Errorf("cuts %v stage %d: sequence 2 live=%v, freed by abort %d", cuts, i, r.Table().Has(2), r.Table().Freed(Aborted))
			}
			if got, want := r.Table().BlocksUsed(), 5; got > want {
				t.Errorf("cuts %v stage %d: %d blocks used, want at most %d (A only)", cuts, i, got, want)
			}
		}
		if _, ok := p[len(p)-1].states[2]; ok {
			t.Errorf("cuts %v: sampler state of the cancelled sequence kept", cuts)
		}
	}
}

func TestRunnerStaleEpochAndBadHidden(t *testing.T) {
	m := loadStories(t)
	p := newPipe(t, m, 2)
	announce(p[0], 5)
	announce(p[1], 5)
	if _, err := p[0].Process(&Batch{Epoch: 5, Rows: []Row{{Seq: 1, First: true, Tokens: prompt, Blocks: []int32{0}}}}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p[0].Process(&Batch{Epoch: 4}, time.Time{}); err == nil {
		t.Fatal("batch of an older epoch accepted")
	}
	if _, err := p[1].Process(&Batch{Epoch: 5, Rows: []Row{{Seq: 1, First: true, Tokens: prompt, Blocks: []int32{0}}}, Hidden: make([]float32, 3)}, time.Time{}); err == nil {
		t.Fatal("hidden states of the wrong size accepted")
	}
	// A batch of a newer epoch is refused, not adopted.
	if _, err := p[0].Process(&Batch{Epoch: 6}, time.Time{}); !errors.Is(err, ErrFutureEpoch) {
		t.Fatalf("batch of a newer epoch: %v, want ErrFutureEpoch", err)
	}
	if p[0].Table().Sequences() != 1 {
		t.Fatal("a batch of a newer epoch freed the older sequences")
	}
	// A newer epoch from the control stream frees everything older.
	p[0].SetEpoch(6)
	if p[0].Table().Sequences() != 0 || p[0].Table().Freed(Epoch) != 1 {
		t.Fatalf("after a newer epoch: %d live, %d freed by epoch", p[0].Table().Sequences(), p[0].Table().Freed(Epoch))
	}
}

func TestRunnerBadTokenDropsRow(t *testing.T) {
	m := loadStories(t)
	p := newPipe(t, m)
	res, dropped := p.run(t, Batch{Epoch: 1, Rows: []Row{
		{Seq: 1, First: true, Tokens: []int32{1, 9999}, Blocks: []int32{0}, Sample: true},
		{Seq: 2, First: true, Tokens: prompt, Blocks: []int32{1}, Sample: true},
	}})
	if len(dropped) != 1 || dropped[0].Code != transport.CodeBadToken || len(res.Samples) != 1 || res.Samples[0].Seq != 2 {
		t.Fatalf("dropped %v, samples %v", dropped, res.Samples)
	}
	if p[0].Table().Has(1) {
		t.Fatal("sequence with a bad token kept its blocks")
	}
}
