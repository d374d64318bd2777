package control

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// speedShape is a uniform model of n layers of 1000 bytes (KV 10 bytes a
// block a layer) with an embedding and a head of head bytes.
func speedShape(n int, head int64) Shape {
	s := Shape{Model: "m", Layers: n, LayerBytes: make([]int64, n), EmbedBytes: 100, HeadBytes: head,
		KVBytesPerBlockLayer: 10, BlockSize: 16}
	for i := range s.LayerBytes {
		s.LayerBytes[i] = 1000
	}
	return s
}

func speed(ns time.Duration) *Speed {
	return &Speed{Layers: 2, Decode1: ns, Decode8: 2 * ns, Prefill: 20 * ns, PrefillTokens: 64}
}

func capOf(id string, mem int64, sp *Speed) Capacity {
	return Capacity{ShardID: id, NodeID: id, Addr: id + ":1", Memory: mem, Speed: sp}
}

// checkPlacement fails unless p's stages cover [0, Layers) in order, each
// with at least one layer and one KV block, embedding on the first and
// head on the last.
func checkPlacement(t *testing.T, shape Shape, p *Placement) {
	t.Helper()
	next := 0
	owners := map[string]bool{}
	for i, st := range p.Stages {
		if st.First != next || st.End <= st.First || st.Embed != (i == 0) || st.Head != (i == len(p.Stages)-1) || st.Blocks < 1 || owners[st.ShardID] {
			t.Fatalf("stage %d of %+v is not the next contiguous range with its embed/head flags, a block and its own shard", i, p.Stages)
		}
		owners[st.ShardID] = true
		next = st.End
	}
	if next != shape.Layers || p.Blocks < 1 {
		t.Fatalf("placement %+v covers [0, %d) of %d layers with %d blocks", p.Stages, next, shape.Layers, p.Blocks)
	}
}

func slowest(p *Placement) int64 {
	var m int64
	for _, st := range p.Stages {
		m = max(m, st.PredictedNs)
	}
	return m
}

func ranges(p *Placement) string {
	s := ""
	for _, st := range p.Stages {
		s += fmt.Sprintf("%s[%d,%d)", st.ShardID, st.First, st.End)
	}
	return s
}

func TestPlanForBySpeed(t *testing.T) {
	const mem = 1 << 20
	for _, tc := range []struct {
		name   string
		shape  Shape
		shards []Capacity
		mix    Mix
		want   string
	}{
		{"equal speeds split evenly", speedShape(12, 10), []Capacity{capOf("a", mem, speed(100)), capOf("b", mem, speed(100))}, MixBalanced, "a[0,6)b[6,12)"},
		{"twice as fast holds twice the layers", speedShape(12, 10), []Capacity{capOf("a", mem, speed(200)), capOf("b", mem, speed(100))}, MixBalanced, "a[0,4)b[4,12)"},
		{"the head goes to the fast shard whatever the order given", speedShape(12, 10), []Capacity{capOf("b", mem, speed(100)), capOf("a", mem, speed(200))}, MixBalanced, "a[0,4)b[4,12)"},
		{"a heavy head leaves the last stage fewer layers", speedShape(12, 4000), []Capacity{capOf("a", mem, speed(100)), capOf("b", mem, speed(100))}, MixDecode, "a[0,8)b[8,12)"},
		{"no calibration: memory only", speedShape(12, 10), []Capacity{capOf("a", mem, speed(200)), capOf("b", mem, nil)}, MixBalanced, "a[0,6)b[6,12)"},
		{"mix memory ignores calibrations", speedShape(12, 10), []Capacity{capOf("a", mem, speed(200)), capOf("b", mem, speed(100))}, MixMemory, "a[0,6)b[6,12)"},
		{"a very slow shard is left a spare", speedShape(12, 10), []Capacity{capOf("a", mem, speed(100)), capOf("b", mem, speed(100)), capOf("c", mem, speed(100000))}, MixBalanced, "a[0,6)b[6,12)"},
		// b is 4x as fast, and memory-only placement gives it 4 layers and
		// a pool of 2002 blocks; keeping 1001 blocks, its 84110 bytes hold
		// 7 layers (7000 + 10 + 7 x 10 x 1001), not the 10 its speed earns.
		{"memory bounds the fast shard", speedShape(12, 10), []Capacity{capOf("a", 200000, speed(400)), capOf("b", 4110+4*10*2000, speed(100))}, MixBalanced, "a[0,5)b[5,12)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := PlanFor(tc.shape, tc.shards, tc.mix, 3, 7)
			if err != nil {
				t.Fatal(err)
			}
			checkPlacement(t, tc.shape, p)
			if got := ranges(p); got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
			if p.Version != 3 || p.Epoch != 7 {
				t.Fatalf("version %d epoch %d, want 3 and 7", p.Version, p.Epoch)
			}
		})
	}
}

func TestPlanForMoELayersWeighActiveBytes(t *testing.T) {
	// Layers 0-3 read 3x the bytes of layers 4-11 per token: equal shards
	// cut where the active bytes halve, not the layer count.
	shape := speedShape(12, 10)
	shape.ActiveBytes = make([]int64, 12)
	for l := range shape.ActiveBytes {
		shape.ActiveBytes[l] = 1000
		if l < 4 {
			shape.ActiveBytes[l] = 3000
		}
	}
	p, err := PlanFor(shape, []Capacity{capOf("a", 1<<20, speed(100)), capOf("b", 1<<20, speed(100))}, MixPrefill, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	checkPlacement(t, shape, p)
	if got, want := ranges(p), "a[0,3)b[3,12)"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestPlanForKeepsHalfTheKVPool(t *testing.T) {
	shape := speedShape(12, 10)
	shards := []Capacity{capOf("a", 50000, speed(1000)), capOf("b", 50000, speed(100))}
	mem, err := Plan(shape, shards, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	p, err := PlanFor(shape, shards, MixBalanced, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	checkPlacement(t, shape, p)
	if p.Blocks < mem.Blocks/2 {
		t.Fatalf("speed placement %s holds %d KV blocks, memory-only %s %d: less than half", ranges(p), p.Blocks, ranges(mem), mem.Blocks)
	}
	if slowest(p) >= slowest(withPredictions(t, shape, mem, shards)) {
		t.Fatalf("speed placement %s is no faster than memory-only %s", ranges(p), ranges(mem))
	}
}

func withPredictions(t *testing.T, shape Shape, p *Placement, shards []Capacity) *Placement {
	t.Helper()
	speeds := map[string]*Speed{}
	for _, s := range shards {
		speeds[s.ShardID] = s.Speed
	}
	q := *p
	q.Stages = slices.Clone(p.Stages)
	for i, d := range Predict(shape, &q, speeds, MixBalanced) {
		q.Stages[i].PredictedNs = int64(d)
	}
	return &q
}

func TestPlanForNoFit(t *testing.T) {
	shape := speedShape(4, 10)
	_, err := PlanFor(shape, []Capacity{capOf("a", 1000, speed(100)), capOf("b", 1000, speed(100))}, MixBalanced, 1, 1)
	if !errors.Is(err, ErrNoFit) {
		t.Fatalf("got %v, want ErrNoFit", err)
	}
}

// TestPlanForIsOptimal compares the search with every split of every
// order of 2 and 3 shards of random speeds and memories.
func TestPlanForIsOptimal(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for it := range 200 {
		L := 2 + rng.IntN(9)
		shape := speedShape(L, int64(rng.IntN(3000)))
		n := 2 + rng.IntN(2)
		var shards []Capacity
		for i := range n {
			shards = append(shards, capOf(string(rune('a'+i)), int64(3000+rng.IntN(40000)), speed(time.Duration(50+rng.IntN(500)))))
		}
		p, err := PlanFor(shape, shards, MixBalanced, 1, 1)
		mem, memErr := Plan(shape, shards, 1, 1)
		minBlocks := 1
		if memErr == nil {
			minBlocks = max(1, int(float64(mem.Blocks)*kvKeep))
		}
		want := bruteForce(shape, shards, minBlocks)
		if math.IsInf(want, 1) {
			if err == nil && memErr != nil {
				t.Fatalf("case %d: nothing fits by brute force, yet PlanFor placed %s", it, ranges(p))
			}
			continue
		}
		if err != nil {
			t.Fatalf("case %d: %v; brute force finds %v", it, err, want)
		}
		checkPlacement(t, shape, p)
		if got := float64(slowest(p)); math.Abs(got-want) > 1+want*1e-9 {
			t.Fatalf("case %d: slowest stage %v (%s), brute force %v", it, got, ranges(p), want)
		}
	}
}

// bruteForce returns the smallest slowest-stage time over every order of
// shards and every assignment of a (possibly empty) contiguous range to
// each, as PlanFor's cost model counts it.
func bruteForce(shape Shape, shards []Capacity, minBlocks int) float64 {
	L := shape.Layers
	best := math.Inf(1)
	order := make([]int, len(shards))
	for i := range order {
		order[i] = i
	}
	var cuts func(k, a int, worst float64)
	cuts = func(k, a int, worst float64) {
		if k == len(order) {
			if a == L {
				best = min(best, worst)
			}
			return
		}
		for b := a; b <= L; b++ {
			if b == a {
				cuts(k+1, a, worst)
				continue
			}
			s := shards[order[k]]
			st := Stage{ShardID: s.ShardID, First: a, End: b, Embed: a == 0, Head: b == L}
			blocks, err := stageBlocks(shape, s, st)
			if err != nil || blocks < minBlocks {
				continue
			}
			lr, hr := s.Speed.rates(MixBalanced, meanOf(shape.LayerBytes[:s.Speed.Layers]))
			c := lr * float64(1000*(b-a))
			if st.Head {
				c += hr * float64(shape.HeadBytes)
			}
			cuts(k+1, b, max(worst, math.Floor(c)))
		}
	}
	permute(order, 0, func() { cuts(0, 0, 0) })
	return best
}

// TestPlanKVGroupsFitMoreBlocks: a model whose 12 layers are 2 global and
// 10 sliding in groups of 2 (model.KVGroups) needs 2 layer slots per block
// on one shard, not 12: the same memory holds 6 times the blocks, and
// split over two shards each stage sizes its pool by its own largest group.
func TestPlanKVGroupsFitMoreBlocks(t *testing.T) {
	flat := speedShape(12, 10)
	grouped := speedShape(12, 10)
	grouped.KVGroup = []int{1, 1, 2, 2, 3, 0, 3, 4, 4, 5, 5, 0}
	one := []Capacity{capOf("a", 100000, nil)}
	pf, err := Plan(flat, one, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	pg, err := Plan(grouped, one, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	// 100000 - 12000 weights - 110 embedding and head = 87890 bytes of KV.
	if pf.Blocks != 87890/(12*10) || pg.Blocks != 87890/(2*10) {
		t.Fatalf("one shard: %d blocks flat, %d grouped; want %d and %d", pf.Blocks, pg.Blocks, 87890/(12*10), 87890/(2*10))
	}
	st := Stage{First: 0, End: 5, Embed: true}
	n, err := stageBlocks(grouped, capOf("b", 100000, nil), st)
	if err != nil {
		t.Fatal(err)
	}
	// Layers 0-4: groups 1, 1, 2, 2, 3: two slots.
	if want := int((100000 - 5000 - 100) / (2 * 10)); n != want {
		t.Fatalf("layers [0, 5): %d blocks, want %d", n, want)
	}
	if b := grouped.stageBytes(st, 7); b != 7*2*10+5000+100 {
		t.Fatalf("layers [0, 5) with 7 blocks: %d bytes", b)
	}
	grouped.KVGroup = grouped.KVGroup[:11]
	if grouped.Validate() == nil {
		t.Fatal("a KVGroup shorter than the layers was accepted")
	}
}
