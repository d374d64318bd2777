package shard

import (
	"github.com/strata-llm/strata/transport"
	"slices"
	"testing"
	"time"
)

// stageStep runs b through stage i of p and returns what stage i+1 gets.
func (p pipe) stageStep(t *testing.T, i int, b Batch) (Batch, *Result) {
	t.Helper()
	announce(p[i], b.Epoch)
	res, err := p[i].Process(&b, time.Unix(0, 0))
	if err != nil {
		t.Fatalf("stage %d batch %d: %v", i, b.ID, err)
	}
	next := Batch{Epoch: b.Epoch, ID: b.ID, Tombstones: b.Tombstones, Rows: slices.Clone(res.Rows), Hidden: slices.Clone(res.Hidden)}
	return next, res
}

// TestRunnerTombstoneBetweenStages: a tombstone that reaches stage k (by
// the control-stream backstop) while the sequence's batch is still on stage
// k−1, or already on stage k+1. The late rows are dropped where the
// sequence is gone (never computed, never re-created), the batch keeps its
// shape, the other sequence's tokens are those of a run without B, and once
// the in-band tombstone has passed every stage no stage holds anything.
func TestRunnerTombstoneBetweenStages(t *testing.T) {
	m := loadStories(t)
	const n = 6
	want, _ := greedyA(t, newPipe(t, m, 2, 4), n, -1)
	const k = 1 // the middle stage of three
	blocksA, blocksB := []int32{0, 1, 2, 3, 4}, []int32{10, 11, 12, 13, 14}

	for _, tc := range []struct {
		name string
		// bFirstAt is the step whose batch carries B's first row (its
		// create) — the step the tombstone races.
		bFirstAt int
		// ahead: the batch has passed stage k when the tombstone gets
		// there (it is on k+1); otherwise it is still on k−1.
		ahead bool
		// dropCode is the code stage k reports for B's late row (0
		// when stage k never sees it).
		dropCode transport.Code
	}{
		{name: "decode row on stage k-1", bFirstAt: 0, dropCode: transport.CodeUnknownSequence},
		{name: "create row on stage k-1", bFirstAt: 2, dropCode: transport.CodeStaleCreate},
		{name: "decode row on stage k+1", bFirstAt: 0, ahead: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPipe(t, m, 2, 4)
			const raceAt = 2
			rows := []Row{{Seq: 1, First: true, Tokens: prompt, Blocks: blocksA, Sample: true}}
			posA, posB := len(prompt), 0
			var tokB int32
			var got []int32
			var tombs []Tombstone
			for step := 0; len(got) < n; step++ {
				if step == tc.bFirstAt {
					rows = append(rows, Row{Seq: 2, First: true, Tokens: []int32{1, 500, 20}, Blocks: blocksB, Sample: true})
				} else if step > tc.bFirstAt && step <= raceAt {
					rows = append(rows, Row{Seq: 2, Pos: posB, Tokens: []int32{tokB}, Blocks: blocksB, Sample: true})
				}
				b := Batch{Epoch: 1, ID: uint64(step + 1), Tombstones: tombs, Rows: rows}
				tombs = nil
				var res *Result
				for i := range p {
					if step == raceAt && i == k+1 && tc.ahead || step == raceAt && i == k && !tc.ahead {
						// The backstop reaches stage k now, out of band.
						p[k].Tombstone(Tombstone{Seq: 2, Reason: Aborted})
						if p[k].Table().Has(2) {
							t.Fatal("stage k still holds B after its tombstone")
						}
					}
					before := p[i].Table().BlocksUsed()
					b, res = p.stageStep(t, i, b)
					if step == raceAt && i == k && tc.dropCode != 0 {
						if len(res.Dropped) != 1 || res.Dropped[0] != (Dropped{Seq: 2, Code: tc.dropCode}) {
							t.Fatalf("stage k dropped %v, want B with %s", res.Dropped, tc.dropCode)
						}
						if p[k].Table().Has(2) || p[k].Table().BlocksUsed() > before {
							t.Fatalf("stage k re-allocated for B: has=%v blocks %d -> %d", p[k].Table().Has(2), before, p[k].Table().BlocksUsed())
						}
						if len(b.Rows) != 1 || b.Rows[0].Seq != 1 || len(b.Hidden) != len(b.Rows[0].Tokens)*m.Embd {
							t.Fatalf("stage k forwards %d rows and %d hidden values, want A's alone", len(b.Rows), len(b.Hidden))
						}
					} else if len(res.Dropped) != 0 {
						t.Fatalf("step %d stage %d dropped %v", step, i, res.Dropped)
					}
				}
				tokA := int32(-1)
				for _, s := range res.Samples {
					switch s.Seq {
					case 1:
						tokA = s.Result.Token
					case 2:
						tokB = s.Result.Token
					}
				}
				got = append(got, tokA)
				rows = []Row{{Seq: 1, Pos: posA, Tokens: []int32{tokA}, Blocks: blocksA, Sample: true}}
				posA++
				if step == tc.bFirstAt {
					posB = 3
				} else if step > tc.bFirstAt {
					posB++
				}
				if step == raceAt {
					// The in-band tombstone follows in the next batch and
					// reaches every stage before its rows.
					tombs = []Tombstone{{Seq: 2, Reason: Aborted}}
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("A's tokens %v, without B %v", got, want)
			}
			// A ends too: nothing is left anywhere.
			b := Batch{Epoch: 1, ID: 100, Tombstones: []Tombstone{{Seq: 1, Reason: Finished}}}
			for i := range p {
				b, _ = p.stageStep(t, i, b)
			}
			for i, r := range p {
				tb := r.Table()
				if tb.BlocksUsed() != 0 || tb.Sequences() != 0 {
					t.Errorf("stage %d holds %d blocks of %d sequences", i, tb.BlocksUsed(), tb.Sequences())
				}
				if err := r.CheckInvariants(); err != nil {
					t.Errorf("stage %d: %v", i, err)
				}
				if tb.Freed(Aborted) > 1 {
					t.Errorf("stage %d freed B %d times", i, tb.Freed(Aborted))
				}
			}
			if tc.dropCode != 0 {
				if got := p[k].Table().Refused(tc.dropCode); got != 1 {
					t.Errorf("stage k refused %d rows as %s, want 1", got, tc.dropCode)
				}
			}
		})
	}
}
