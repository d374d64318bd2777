package control

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Shape is what placement needs to know about the served model: sizes in
// bytes, no weights.
type Shape struct {
	// Model names the model (its file's SHA-256, lower-case hex).
	Model  string
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
	// KVGroup is each layer's KV group (model.KVGroups; len Layers), or nil
	// when every layer is in group 0. A block ID holds one group's layers,
	// so a stage needs, per block, as many layer slots as it has layers of
	// its largest group (KVSlots), not one per layer: a model whose
	// sliding layers release their blocks fits more blocks.
	KVGroup []int
	// BlockSize is positions per KV block.
	BlockSize int
}

// Validate names the first field that is wrong.
func (s Shape) Validate() error {
	switch {
	case s.Layers < 1:
		return fmt.Errorf("control: Shape.Layers must be >= 1, got %d", s.Layers)
	case len(s.LayerBytes) != s.Layers:
		return fmt.Errorf("control: Shape.LayerBytes has %d entries for %d layers", len(s.LayerBytes), s.Layers)
	case s.KVGroup != nil && len(s.KVGroup) != s.Layers:
		return fmt.Errorf("control: Shape.KVGroup has %d entries for %d layers", len(s.KVGroup), s.Layers)
	case s.ActiveBytes != nil && len(s.ActiveBytes) != s.Layers:
		return fmt.Errorf("control: Shape.ActiveBytes has %d entries for %d layers", len(s.ActiveBytes), s.Layers)
	case s.KVBytesPerBlockLayer < 1:
		return fmt.Errorf("control: Shape.KVBytesPerBlockLayer must be >= 1, got %d", s.KVBytesPerBlockLayer)
	case s.BlockSize < 1:
		return fmt.Errorf("control: Shape.BlockSize must be >= 1, got %d", s.BlockSize)
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
var ErrNoFit = errors.New("control: the shards cannot hold the model")

// Plan places shape on shards, in their order, as contiguous layer ranges:
// sizes proportional to each shard's memory (at least one layer each, at
// most Layers shards used), embedding on the first, head on the last. Each
// stage's KV capacity is what its memory holds after its weights, capped by
// its KVMemory; the pool is the smallest stage's. It fails (wrapping
// ErrNoFit) when some stage's weights do not fit or the pool holds no
// block.
func Plan(shape Shape, shards []Capacity, version, epoch uint64) (*Placement, error) {
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
	p := &Placement{Version: version, Epoch: epoch, Model: shape.Model, BlockSize: shape.BlockSize, Blocks: -1}
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

// Mix is the load placement balances the stages for (--placement-mix).
type Mix string

// The load mixes. MixMemory places by memory only, ignoring calibrations:
// what placement did before shards measured their speed, kept for
// comparisons.
const (
	MixDecode   Mix = "decode"
	MixPrefill  Mix = "prefill"
	MixBalanced Mix = "balanced"
	MixMemory   Mix = "memory"
)

// ParseMix reads a --placement-mix value.
func ParseMix(s string) (Mix, error) {
	switch m := Mix(s); m {
	case MixDecode, MixPrefill, MixBalanced, MixMemory:
		return m, nil
	}
	return "", fmt.Errorf("--placement-mix must be decode, prefill, balanced or memory, got %q", s)
}

// Speed is a shard's calibration as placement reads it: its time per
// layer, measured on layers [0, Layers) of the served model.
type Speed struct {
	Layers int `json:"layers"`
	// Decode1 and Decode8 are a decode batch of 1 and of 8 rows; Prefill
	// one chunk of PrefillTokens tokens. Nanoseconds in JSON.
	Decode1       time.Duration `json:"decode1_ns"`
	Decode8       time.Duration `json:"decode8_ns"`
	Prefill       time.Duration `json:"prefill_ns"`
	PrefillTokens int           `json:"prefill_tokens"`
}

// rates returns the shard's nanoseconds per active byte of a layer and of
// the head under mix: a layer's time is what a batch of the mix takes in
// it (8 decode rows; a prefill chunk; both in one batch), the head's what
// it takes for the rows that want logits (8 decode rows; the chunk's one
// row). meanBytes is the mean active bytes of the measured layers.
func (s *Speed) rates(mix Mix, meanBytes float64) (layer, head float64) {
	d1, d8, p := float64(s.Decode1), float64(s.Decode8), float64(s.Prefill)
	switch mix {
	case MixDecode:
		return d8 / meanBytes, d8 / meanBytes
	case MixPrefill:
		return p / meanBytes, d1 / meanBytes
	default:
		return (d8 + p) / meanBytes, d8 / meanBytes
	}
}

// activeBytes returns shape's per-layer active bytes (LayerBytes when the
// shape has none).
func (s Shape) activeBytes() []int64 {
	if len(s.ActiveBytes) == s.Layers {
		return s.ActiveBytes
	}
	return s.LayerBytes
}

// Predict returns the time each stage of p takes for a batch of mix, from
// its shard's speed (zero for a stage whose shard has none).
func Predict(shape Shape, p *Placement, speeds map[string]*Speed, mix Mix) []time.Duration {
	act := shape.activeBytes()
	out := make([]time.Duration, len(p.Stages))
	for i, st := range p.Stages {
		sp := speeds[st.ShardID]
		if sp == nil || sp.Layers > shape.Layers {
			continue
		}
		lr, hr := sp.rates(mix, meanOf(act[:sp.Layers]))
		var b int64
		for l := st.First; l < st.End; l++ {
			b += act[l]
		}
		t := lr * float64(b)
		if st.Head {
			t += hr * float64(shape.HeadBytes)
		}
		out[i] = time.Duration(t)
	}
	return out
}

func meanOf(b []int64) float64 {
	var s int64
	for _, v := range b {
		s += v
	}
	return max(1, float64(s)/float64(len(b)))
}

// kvKeep is the share of the memory-only placement's KV pool a placement
// by speed must keep: moving layers to a fast shard with less memory may
// shrink the pool, but not below half.
const kvKeep = 0.5

// maxPermuted is the most shards whose every order is tried: 5! = 120
// orders of an O(shards × layers²) search each.
const maxPermuted = 5

// PlanFor places shape on shards for mix. When every shard has a Speed
// (and mix is not MixMemory) it minimises the slowest stage's predicted
// time (planSpeed); otherwise, or when that finds nothing that fits, it
// places by memory (Plan). Each stage's PredictedNs is set where speeds
// are known.
func PlanFor(shape Shape, shards []Capacity, mix Mix, version, epoch uint64) (*Placement, error) {
	mem, memErr := Plan(shape, shards, version, epoch)
	speeds := map[string]*Speed{}
	for _, s := range shards {
		if s.Speed != nil && s.Speed.Layers <= shape.Layers && s.Speed.Layers > 0 {
			speeds[s.ShardID] = s.Speed
		}
	}
	p := mem
	if mix != MixMemory && len(speeds) == len(shards) {
		minBlocks := 1
		if memErr == nil {
			minBlocks = max(1, int(float64(mem.Blocks)*kvKeep))
		}
		if sp := planSpeed(shape, shards, mix, minBlocks, version, epoch); sp != nil {
			p = sp
		}
	}
	if p == nil {
		return nil, memErr
	}
	if mix == MixMemory {
		mix = MixBalanced // predicted for the balanced mix
	}
	p.Mix = string(mix)
	for i, t := range Predict(shape, p, speeds, mix) {
		p.Stages[i].PredictedNs = int64(t)
	}
	return p, nil
}

// planSpeed searches, for each order of shards (every order up to
// maxPermuted shards, else the given one), the contiguous ranges that
// minimise the slowest stage's predicted time, a shard taking no layer
// being left a spare, subject to each stage's memory holding its weights
// and minBlocks KV blocks of its layers. It returns nil when nothing fits.
func planSpeed(shape Shape, shards []Capacity, mix Mix, minBlocks int, version, epoch uint64) *Placement {
	L := shape.Layers
	act := shape.activeBytes()
	prefAct := make([]float64, L+1)
	prefW := make([]int64, L+1)
	for l := range L {
		prefAct[l+1] = prefAct[l] + float64(act[l])
		prefW[l+1] = prefW[l] + shape.LayerBytes[l]
	}
	type rate struct{ layer, head float64 }
	rates := make([]rate, len(shards))
	for i, s := range shards {
		lr, hr := s.Speed.rates(mix, meanOf(act[:s.Speed.Layers]))
		rates[i] = rate{lr, hr}
	}
	// cost of shard i holding [a, b); +Inf when it cannot.
	cost := func(i, a, b int) float64 {
		s := shards[i]
		w := prefW[b] - prefW[a]
		t := rates[i].layer * (prefAct[b] - prefAct[a])
		if a == 0 {
			w += shape.EmbedBytes
		}
		if b == L {
			w += shape.HeadBytes
			t += rates[i].head * float64(shape.HeadBytes)
		}
		free := s.Memory - w
		if s.KVMemory > 0 {
			free = min(free, s.KVMemory)
		}
		if free < int64(minBlocks)*int64(shape.KVSlots(a, b))*shape.KVBytesPerBlockLayer {
			return math.Inf(1)
		}
		return t
	}
	n := len(shards)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	best := math.Inf(1)
	var bestCuts []int // bestCuts[k] is where shard bestOrder[k]'s range ends
	var bestOrder []int
	f := make([][]float64, n+1) // f[k][l]: the slowest stage placing [0, l) on order[:k]
	from := make([][]int, n+1)
	for k := range f {
		f[k] = make([]float64, L+1)
		from[k] = make([]int, L+1)
	}
	try := func() {
		for l := range L + 1 {
			f[0][l] = math.Inf(1)
		}
		f[0][0] = 0
		for k := 1; k <= n; k++ {
			for b := 0; b <= L; b++ {
				f[k][b], from[k][b] = f[k-1][b], b // shard order[k-1] a spare
				for a := 0; a < b; a++ {
					if math.IsInf(f[k-1][a], 1) {
						continue
					}
					if v := max(f[k-1][a], cost(order[k-1], a, b)); v < f[k][b] {
						f[k][b], from[k][b] = v, a
					}
				}
			}
		}
		// Strictly better only: the first order (the given one) wins ties.
		if v := f[n][L]; v < best*(1-1e-9) {
			best = v
			bestOrder = append(bestOrder[:0], order...)
			bestCuts = make([]int, n)
			for k, b := n, L; k >= 1; k-- {
				bestCuts[k-1] = b
				b = from[k][b]
			}
		}
	}
	if n <= maxPermuted {
		permute(order, 0, try)
	} else {
		try()
	}
	if bestOrder == nil {
		return nil
	}
	p := &Placement{Version: version, Epoch: epoch, Model: shape.Model, BlockSize: shape.BlockSize, Blocks: -1}
	first := 0
	for k, i := range bestOrder {
		end := bestCuts[k]
		if end == first {
			continue // a spare
		}
		s := shards[i]
		st := Stage{ShardID: s.ShardID, NodeID: s.NodeID, Incarnation: s.Incarnation, Addr: s.Addr,
			First: first, End: end, Embed: first == 0, Head: end == L}
		blocks, err := stageBlocks(shape, s, st)
		if err != nil {
			return nil // cost said it fits; a broken invariant, but placing by memory is safe
		}
		st.Blocks = blocks
		if p.Blocks < 0 || blocks < p.Blocks {
			p.Blocks = blocks
		}
		p.Stages = append(p.Stages, st)
		first = end
	}
	if p.Blocks < 1 {
		return nil
	}
	return p
}

// permute calls fn for every order of a[k:], in lexicographic order of
// positions from the given one, restoring a afterwards.
func permute(a []int, k int, fn func()) {
	if k == len(a) {
		fn()
		return
	}
	for i := k; i < len(a); i++ {
		a[k], a[i] = a[i], a[k]
		permute(a, k+1, fn)
		a[k], a[i] = a[i], a[k]
	}
}

// stageBytes returns what st's shard holds for it in a placement whose
// KV pool is blocks: its weights and its layers' share of the pool.
func (s Shape) stageBytes(st Stage, blocks int) int64 {
	b := int64(blocks) * int64(s.KVSlots(st.First, st.End)) * s.KVBytesPerBlockLayer
	for l := st.First; l < st.End; l++ {
		b += s.LayerBytes[l]
	}
	if st.Embed {
		b += s.EmbedBytes
	}
	if st.Head {
		b += s.HeadBytes
	}
	return b
}

// stageBlocks returns the KV blocks st's shard holds after st's weights,
// capped by its KVMemory, or an error wrapping ErrNoFit when the weights
// do not fit.
func stageBlocks(shape Shape, s Capacity, st Stage) (int, error) {
	var weights int64
	for l := st.First; l < st.End; l++ {
		weights += shape.LayerBytes[l]
	}
	if st.Embed {
		weights += shape.EmbedBytes
	}
	if st.Head {
		weights += shape.HeadBytes
	}
	free := s.Memory - weights
	if free <= 0 {
		return 0, fmt.Errorf("%w: shard %s: layers %d-%d need %d bytes of weights, memory is %d", ErrNoFit, s.ShardID, st.First, st.End, weights, s.Memory)
	}
	if s.KVMemory > 0 {
		free = min(free, s.KVMemory)
	}
	return int(free / (int64(shape.KVSlots(st.First, st.End)) * shape.KVBytesPerBlockLayer)), nil
}

// KVSlots is the layer slots one KV block needs on a stage of layers
// [first, end): the most of them in one KV group (model.KVGroups.Slots),
// end-first when the model has one group.
func (s Shape) KVSlots(first, end int) int {
	if s.KVGroup == nil {
		return end - first
	}
	count := map[int]int{}
	most := 0
	for _, g := range s.KVGroup[first:end] {
		count[g]++
		most = max(most, count[g])
	}
	return most
}
