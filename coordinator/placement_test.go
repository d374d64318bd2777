package coordinator

import (
	"errors"
	"testing"
)

func TestPlacementPlan(t *testing.T) {
	shape := testShape() // 4 layers of 1000 bytes, embed 500, head 500, 100 bytes per block-layer
	tests := []struct {
		name   string
		mems   []int64
		kvMem  int64
		ranges [][2]int
		blocks int
		err    error
	}{
		{"one shard", []int64{10000}, 0, [][2]int{{0, 4}}, (10000 - 5000) / 400, nil},
		{"equal pair", []int64{10000, 10000}, 0, [][2]int{{0, 2}, {2, 4}}, (10000 - 2500) / 200, nil},
		{"weighted", []int64{10000, 30000}, 0, [][2]int{{0, 1}, {1, 4}}, (10000 - 1500) / 100, nil},
		{"kv cap", []int64{10000, 10000}, 1000, [][2]int{{0, 2}, {2, 4}}, 1000 / 200, nil},
		{"more shards than layers", []int64{9000, 9000, 9000, 9000, 9000}, 0, [][2]int{{0, 1}, {1, 2}, {2, 3}, {3, 4}}, (9000 - 1500) / 100, nil},
		{"weights do not fit", []int64{4000}, 0, nil, 0, ErrNoFit},
		{"no block fits", []int64{5100}, 0, nil, 0, ErrNoFit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var caps []Capacity
			for i, m := range tt.mems {
				caps = append(caps, Capacity{ShardID: string(rune('a' + i)), Memory: m, KVMemory: tt.kvMem})
			}
			p, err := Plan(shape, caps, 7, 1)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Stages) != len(tt.ranges) {
				t.Fatalf("%d stages, want %d", len(p.Stages), len(tt.ranges))
			}
			for i, st := range p.Stages {
				if got := [2]int{st.First, st.End}; got != tt.ranges[i] {
					t.Errorf("stage %d = %v, want %v", i, got, tt.ranges[i])
				}
				if st.Embed != (i == 0) || st.Head != (i == len(p.Stages)-1) {
					t.Errorf("stage %d embed %v head %v", i, st.Embed, st.Head)
				}
			}
			if p.Blocks != tt.blocks || p.Version != 7 || p.BlockSize != 16 {
				t.Fatalf("blocks %d (want %d) version %d bs %d", p.Blocks, tt.blocks, p.Version, p.BlockSize)
			}
			a := p.Assign(0, shape)
			if a.GetStages() != uint32(len(p.Stages)) || a.GetKvBlocks() != uint32(p.Blocks) || (len(p.Stages) > 1 && a.GetNextAddr() != p.Stages[1].Addr) {
				t.Fatalf("assign = %v", a)
			}
		})
	}
}
