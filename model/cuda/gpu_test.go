package cuda

// Tests that need an NVIDIA GPU. Without a driver they skip; with one,
// every failure is real (a missing NVRTC fails, it does not skip).
// scripts/gpu-check.sh runs them on the GPU machine.

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/cpu/bench"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

var testDevice *Device

func gpuForTest(t testing.TB) *Device {
	t.Helper()
	if testDevice != nil {
		return testDevice
	}
	if _, err := LoadDriver(); errors.Is(err, ErrNoDriver) {
		t.Skipf("no GPU: %v", err)
	}
	var dirs []string
	if d := os.Getenv("STRATA_CUDA_LIB_DIR"); d != "" {
		dirs = append(dirs, d)
	}
	cache := os.Getenv("STRATA_CUDA_CACHE")
	if cache == "" {
		cache = filepath.Join(os.TempDir(), "strata-cuda-kernels")
	}
	d, err := OpenDevice(DeviceConfig{Ordinal: 0, LibDirs: dirs, CacheDir: cache})
	if err != nil {
		t.Fatalf("open cuda:0: %v", err)
	}
	t.Logf("device %s (sm_%d%d, %d MiB, %d SMs, peak %.0f GB/s), kernels %s",
		d.Ctx.Info.Name, d.Ctx.Info.Major, d.Ctx.Info.Minor, d.Ctx.Info.TotalMemory>>20, d.Ctx.Info.Multiprocessors, d.Ctx.Info.PeakBandwidth()/1e9, d.Kernels.Image.Arch)
	testDevice = d
	return d
}

func randWeight(r *rand.Rand, typ ggml.Type, rows, cols int) *model.Weight {
	f := make([]float32, cols)
	rb, _ := typ.RowBytes(cols)
	w := &model.Weight{Name: "w", Type: typ, Rows: rows, Cols: cols, Data: make([]byte, rows*rb)}
	for o := range rows {
		for i := range f {
			f[i] = float32(r.NormFloat64()) * 0.5
		}
		if err := ggml.QuantizeRow(typ, f, w.Data[o*rb:(o+1)*rb]); err != nil {
			panic(err)
		}
	}
	return w
}

// TestGPUMatMul compares each matrix kernel with the CPU backend on random
// inputs, and checks that a row's outputs are bit-identical computed alone
// or in a batch of 17.
func TestGPUMatMul(t *testing.T) {
	dev := gpuForTest(t)
	pool := cpu.NewPool(2)
	defer pool.Close()
	be := cpu.NewBackend(pool)
	r := rand.New(rand.NewPCG(1, 2))
	const N, K, R = 300, 512, 17
	for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.Q8_0, ggml.Q4_0, ggml.Q4_K} {
		w := randWeight(r, typ, N, K)
		x := make([]float32, R*K)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		want := make([]float32, R*N)
		be.MatMul(w, x, R, want)
		s := &Stage{dev: dev, m: &model.Model{Config: model.Config{Layers: 1, Embd: K, FF: K, Heads: 1, HeadsKV: 1, HeadDim: K}}, last: 0, weights: map[*model.Weight]*devWeight{}, norms: map[*float32]Ptr{}}
		var got, alone []float32
		err := dev.Ctx.Do(func() error {
			defer func() {
				for _, a := range s.allocs {
					dev.Ctx.Free(a.p, a.n)
				}
			}()
			if err := s.upload(w); err != nil {
				return err
			}
			if err := s.grow(R, 1); err != nil {
				return err
			}
			if err := up(dev.Ctx, s.h, x); err != nil {
				return err
			}
			run := func(rows int) ([]float32, error) {
				if err := s.matmul(s.weights[w], s.h, rows, s.out, false); err != nil {
					return nil, err
				}
				o := make([]float32, rows*N)
				return o, dev.Ctx.Download(unsafe.Pointer(&o[0]), s.out, 4*len(o))
			}
			var err error
			if got, err = run(R); err != nil {
				return err
			}
			if alone, err = run(1); err != nil {
				return err
			}
			// accumulate adds the product to what out holds: 2× exactly.
			if err := s.matmul(s.weights[w], s.h, 1, s.out, true); err != nil {
				return err
			}
			twice := make([]float32, N)
			if err := dev.Ctx.Download(unsafe.Pointer(&twice[0]), s.out, 4*N); err != nil {
				return err
			}
			for o := range N {
				if twice[o] != 2*alone[o] {
					return fmt.Errorf("accumulate: output %d is %v, want 2×%v", o, twice[o], alone[o])
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%v: %v", typ, err)
		}
		var maxRel float64
		for i := range want {
			d := math.Abs(float64(got[i]-want[i])) / (1 + math.Abs(float64(want[i])))
			maxRel = max(maxRel, d)
		}
		t.Logf("%v (device %v): max |gpu-cpu|/(1+|cpu|) = %.2e over %d×%d×%d", typ, s.weights[w].typ, maxRel, R, N, K)
		tol := 1e-4
		if typ != ggml.F32 && typ != ggml.F16 && typ != ggml.Q8_0 {
			tol = 5e-2 // dequantized to f16 at load against the CPU's 8-bit activations
		}
		if maxRel > tol {
			t.Errorf("%v: GPU and CPU differ by %.2e > %.0e", typ, maxRel, tol)
		}
		for o := range N {
			if math.Float32bits(alone[o]) != math.Float32bits(got[o]) {
				t.Fatalf("%v: output %d of row 0 is %v alone, %v in a batch of %d", typ, o, alone[o], got[o], R)
			}
		}
	}
}

// pair is a model loaded on the CPU backend and on the GPU, with one pool
// of blocks each.
type pair struct {
	m   *model.Model
	cpu *model.Stage
	gpu *Stage
	bs  int
}

func newPair(t testing.TB, m *model.Model, blocks int) *pair {
	t.Helper()
	dev := gpuForTest(t)
	pool := cpu.NewPool(0)
	t.Cleanup(pool.Close)
	kv, err := cpu.NewKV(cpu.KVConfig{Layers: m.Layers, Blocks: blocks, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: ggml.F16})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := model.NewStage(m, 0, m.Layers, cpu.NewBackend(pool), kv)
	if err != nil {
		t.Fatal(err)
	}
	gs, err := NewStage(dev, m, 0, m.Layers, blocks, cpu.DefaultBlockSize)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gs.Close() })
	return &pair{m: m, cpu: cs, gpu: gs, bs: cpu.DefaultBlockSize}
}

func argmax(x []float32) int {
	b := 0
	for i, v := range x {
		if v > x[b] {
			b = i
		}
	}
	return b
}

func logSoftmax(x []float32) []float64 {
	mx := float64(x[argmax(x)])
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - mx)
	}
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - mx - math.Log(s)
	}
	return out
}

// agreement runs a prompt and n greedy steps through both stages, the CPU
// choosing each next token (teacher forcing, so one near-tie does not send
// the two down different texts), and returns: steps where the argmaxes
// differ although the CPU's top two differ by more than margin, the
// largest difference of a top-10 log-probability, and the CPU's tokens.
func (p *pair) agreement(t *testing.T, prompt []int32, n int, margin float64) (disagree int, maxLP float64, toks []int32) {
	t.Helper()
	blocks := make([]int32, (len(prompt)+n+p.bs-1)/p.bs)
	for i := range blocks {
		blocks[i] = int32(len(blocks) - 1 - i) // not in order: tables must be read
	}
	row := model.Row{Seq: 1, Pos: 0, First: true, Tokens: prompt, Blocks: blocks, Logits: true}
	for step := 0; step <= n; step++ {
		cl, err := p.cpu.Forward([]model.Row{row}, nil)
		if err != nil {
			t.Fatal(err)
		}
		gl, err := p.gpu.Forward([]model.Row{row}, nil)
		if err != nil {
			t.Fatal(err)
		}
		cb, gb := argmax(cl), argmax(gl)
		sorted := append([]float32(nil), cl...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] > sorted[j] })
		if cb != gb && float64(sorted[0]-sorted[1]) > margin {
			disagree++
		}
		clp, glp := logSoftmax(cl), logSoftmax(gl)
		idx := make([]int, len(cl))
		for i := range idx {
			idx[i] = i
		}
		sort.Slice(idx, func(i, j int) bool { return cl[idx[i]] > cl[idx[j]] })
		for _, i := range idx[:10] {
			maxLP = max(maxLP, math.Abs(clp[i]-glp[i]))
		}
		toks = append(toks, int32(cb))
		row = model.Row{Seq: 1, Pos: row.Pos + len(row.Tokens), Tokens: []int32{int32(cb)}, Blocks: blocks, Logits: true}
	}
	return disagree, maxLP, toks
}

// The promise across devices (DESIGN.md "Devices"): greedy tokens agree
// wherever the CPU's top two logits are more than agreeMargin apart, and
// top-10 log-probabilities differ by at most lpTolerance.
const (
	agreeMargin = 0.05
	lpTolerance = 0.05
)

func TestGPUAgreesWithCPU(t *testing.T) {
	cases := []struct {
		name string
		m    func(t *testing.T) *model.Model
	}{
		{"stories260K", func(t *testing.T) *model.Model { return loadShared(t, "stories260K.gguf") }},
		{"stories260K-F16", func(t *testing.T) *model.Model { return loadShared(t, "stories260K-F16.gguf") }},
		{"stories260K-Q8_0", func(t *testing.T) *model.Model { return loadShared(t, "stories260K-Q8_0.gguf") }},
		{"demo-F32", func(t *testing.T) *model.Model { return randomModel(t, model.DemoSpec()) }},
		{"110M-F16", func(t *testing.T) *model.Model { return randomModel(t, bench.Spec110M(ggml.F16)) }},
		{"110M-Q8_0", func(t *testing.T) *model.Model { return randomModel(t, bench.Spec110M(ggml.Q8_0)) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gpuForTest(t)
			m := c.m(t)
			p := newPair(t, m, 64)
			prompt := []int32{1, 403, 407, 360, 426, 261, 448, 419, 261, 290, 500}
			for i := range prompt {
				prompt[i] %= int32(m.Vocab)
			}
			dis, lp, toks := p.agreement(t, prompt, 40, agreeMargin)
			t.Logf("%s: %d disagreements past margin %.2f in 41 steps, max top-10 logprob diff %.3g; CPU tokens %v", c.name, dis, agreeMargin, lp, toks)
			if dis > 0 || lp > lpTolerance {
				t.Errorf("%s: %d greedy disagreements, top-10 logprob diff %.3g (tolerance %.2g)", c.name, dis, lp, lpTolerance)
			}
		})
	}
}

func loadShared(t *testing.T, name string) *model.Model {
	t.Helper()
	var path string
	for _, dir := range []string{"../../../shared/models", "../../shared/models", os.Getenv("STRATA_MODELS")} {
		if dir == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			path = filepath.Join(dir, name)
			break
		}
	}
	if path == "" {
		t.Fatalf("%s not found in ../shared/models, shared/models or $STRATA_MODELS", name)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestGPUBatchInvariance: a sequence's logits are bit-identical alone, in
// a batch with others, and with its prompt chunked differently.
func TestGPUBatchInvariance(t *testing.T) {
	for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.Q8_0} {
		spec := model.DemoSpec()
		spec.Type = typ
		m := randomModel(t, spec)
		p := newPair(t, m, 64)
		prompt := make([]int32, 37)
		for i := range prompt {
			prompt[i] = int32((i*131 + 7) % m.Vocab)
		}
		run := func(chunks []int, others bool) [][]float32 {
			var out [][]float32
			blocks := []int32{10, 3, 7}
			oblocks := [][]int32{{20, 21, 22}, {30, 31, 32}}
			pos := 0
			for _, c := range chunks {
				rows := []model.Row{}
				if others {
					for i, ob := range oblocks {
						toks := make([]int32, 5+i*3)
						for j := range toks {
							toks[j] = int32((j*17 + i) % m.Vocab)
						}
						rows = append(rows, model.Row{Seq: uint64(10 + i), Pos: 0, First: true, Tokens: toks, Blocks: ob, Logits: true})
					}
				}
				rows = append(rows, model.Row{Seq: 1, Pos: pos, First: pos == 0, Tokens: prompt[pos : pos+c], Blocks: blocks, Logits: true})
				lg, err := p.gpu.Forward(rows, nil)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, append([]float32(nil), lg[len(lg)-m.Vocab:]...))
				pos += c
			}
			return out
		}
		a := run([]int{37}, false)
		b := run([]int{20, 17}, true)
		c := run([]int{1, 9, 27}, true)
		if on, err := p.gpu.Graphs(); !on {
			t.Errorf("%v: CUDA graphs off: %v", typ, err)
		}
		p.gpu.SetGraphs(false) // launched one by one: the same bits
		d := run([]int{1, 9, 27}, true)
		p.gpu.SetGraphs(true)
		for _, o := range [][][]float32{b, c, d} {
			last := o[len(o)-1]
			for i := range last {
				if math.Float32bits(last[i]) != math.Float32bits(a[0][i]) {
					t.Fatalf("%v: logit %d is %v alone in one chunk, %v chunked in a batch", typ, i, a[0][i], last[i])
				}
			}
		}
	}
}

// TestGPUDecodeSpeed measures decode and prefill of a ~1B model (F16 and
// Q8_0) and the fraction of the device's memory bandwidth decode reaches.
// It runs only with STRATA_GPU_BENCH=1 (scripts/gpu-check.sh sets it).
func TestGPUDecodeSpeed(t *testing.T) {
	if os.Getenv("STRATA_GPU_BENCH") != "1" {
		t.Skip("set STRATA_GPU_BENCH=1")
	}
	dev := gpuForTest(t)
	t0 := time.Now()
	f16 := randomModel(t, bench.Spec1B(ggml.F16))
	t.Logf("1B F16 written and loaded in %v", time.Since(t0).Round(time.Millisecond))
	for _, typ := range []ggml.Type{ggml.F16, ggml.Q8_0} {
		m := f16
		if typ != ggml.F16 { // the same weights requantized: faster than writing another file
			t0 := time.Now()
			m = requantize(t, f16, typ)
			t.Logf("1B %v made in %v", typ, time.Since(t0).Round(time.Millisecond))
		}
		const blocks = 512 // 512-token prompt + 2×128 decode steps + 1
		s, err := NewStage(dev, m, 0, m.Layers, blocks, 16)
		if err != nil {
			t.Fatal(err)
		}
		var wbytes int64
		for _, w := range s.weights {
			if w != s.weights[m.Embed] || m.Output == m.Embed {
				wbytes += int64(w.bytes)
			}
		}
		prompt := make([]int32, 512)
		for i := range prompt {
			prompt[i] = int32(i*7%m.Vocab) + 1
		}
		table := make([]int32, blocks)
		for i := range table {
			table[i] = int32(i)
		}
		var lg []float32
		var prefill time.Duration
		for range 2 { // the first run grows the scratch; the second is timed
			t1 := time.Now()
			lg, err = s.Forward([]model.Row{{Seq: 1, First: true, Tokens: prompt, Blocks: table, Logits: true}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			prefill = time.Since(t1)
		}
		pos, tok := len(prompt), int32(argmax(lg))
		const steps = 128
		if lg, err = s.Forward([]model.Row{{Seq: 1, Pos: pos, Tokens: []int32{tok}, Blocks: table, Logits: true}}, nil); err != nil {
			t.Fatal(err) // an untimed first decode step
		}
		pos++
		tok = int32(argmax(lg))
		decode := func() time.Duration {
			t2 := time.Now()
			for range steps {
				lg, err = s.Forward([]model.Row{{Seq: 1, Pos: pos, Tokens: []int32{tok}, Blocks: table, Logits: true}}, nil)
				if err != nil {
					t.Fatal(err)
				}
				pos++
				tok = int32(argmax(lg))
			}
			return time.Since(t2)
		}
		s.SetGraphs(false)
		plain := decode()
		s.SetGraphs(true)
		dec := decode()
		if on, err := s.Graphs(); !on {
			t.Errorf("CUDA graphs off: %v", err)
		}
		t.Logf("1B %v decode without graphs: %.3f ms/token; with: %.3f ms/token", typ, plain.Seconds()/steps*1e3, dec.Seconds()/steps*1e3)
		perTok := dec.Seconds() / steps
		peak := dev.Ctx.Info.PeakBandwidth()
		if v, err := strconv.ParseFloat(os.Getenv("STRATA_GPU_PEAK_GBPS"), 64); peak == 0 && err == nil && v > 0 {
			peak = v * 1e9 // the datasheet's figure, where the driver reports no memory clock
			t.Logf("peak bandwidth from STRATA_GPU_PEAK_GBPS: %.0f GB/s", v)
		}
		if peak == 0 {
			t.Fatal("the driver reports no memory clock: set STRATA_GPU_PEAK_GBPS to the device's peak bandwidth")
		}
		frac := float64(wbytes) / perTok / peak
		t.Logf("1B %v on %s: weights %.2f GB; prefill %d tokens %.1f tok/s; decode %.1f tok/s (%.3f ms/token), %.0f GB/s = %.0f%% of peak %.0f GB/s",
			typ, dev.Ctx.Info.Name, float64(wbytes)/1e9, len(prompt), float64(len(prompt))/prefill.Seconds(), 1/perTok, perTok*1e3,
			float64(wbytes)/perTok/1e9, 100*frac, peak/1e9)
		if typ == ggml.F16 && frac < 0.5 {
			t.Errorf("decode of the 1B F16 model reaches %.0f%% of the memory bandwidth, want >= 50%%", 100*frac)
		}
		s.Close()
	}
}

// TestWriteRandomModel is gpu-check.sh's model writer (the GPU machine has
// no Go): STRATA_WRITE_MODEL=SIZE-TYPE:PATH writes bench's random model of
// that shape (110M or 1B; F16 or Q8_0) to PATH. Skipped otherwise.
func TestWriteRandomModel(t *testing.T) {
	arg := os.Getenv("STRATA_WRITE_MODEL")
	if arg == "" {
		t.Skip("set STRATA_WRITE_MODEL=SIZE-TYPE:PATH")
	}
	name, path, ok := strings.Cut(arg, ":")
	specs := map[string]model.RandomSpec{
		"110M-F16": bench.Spec110M(ggml.F16), "110M-Q8_0": bench.Spec110M(ggml.Q8_0),
		"1B-F16": bench.Spec1B(ggml.F16), "1B-Q8_0": bench.Spec1B(ggml.Q8_0),
	}
	spec, known := specs[name]
	if !ok || !known {
		t.Fatalf("STRATA_WRITE_MODEL=%q: want SIZE-TYPE:PATH with SIZE-TYPE one of 110M-F16, 110M-Q8_0, 1B-F16, 1B-Q8_0", arg)
	}
	if err := model.WriteRandomFile(path, spec); err != nil {
		t.Fatal(err)
	}
}

// requantize returns m with every matrix converted to typ (rows in
// parallel); norms and the rest are shared.
func requantize(t *testing.T, m *model.Model, typ ggml.Type) *model.Model {
	t.Helper()
	done := map[*model.Weight]*model.Weight{}
	conv := func(w *model.Weight) *model.Weight {
		if w == nil {
			return nil
		}
		if c, ok := done[w]; ok {
			return c
		}
		rb, err := typ.RowBytes(w.Cols)
		if err != nil {
			t.Fatal(err)
		}
		c := &model.Weight{Name: w.Name, Type: typ, Rows: w.Rows, Cols: w.Cols, Data: make([]byte, w.Rows*rb)}
		var wg sync.WaitGroup
		workers := runtime.NumCPU()
		for k := range workers {
			wg.Go(func() {
				f := make([]float32, w.Cols)
				for r := k; r < w.Rows; r += workers {
					if err := ggml.DequantizeRow(w.Type, w.Row(r), f); err != nil {
						panic(err)
					}
					if err := ggml.QuantizeRow(typ, f, c.Data[r*rb:(r+1)*rb]); err != nil {
						panic(err)
					}
				}
			})
		}
		wg.Wait()
		done[w] = c
		return c
	}
	out := *m
	out.Embed, out.Output = conv(m.Embed), conv(m.Output)
	out.LayerWeights = make([]model.Layer, len(m.LayerWeights))
	for i, L := range m.LayerWeights {
		L.Q, L.K, L.V, L.O = conv(L.Q), conv(L.K), conv(L.V), conv(L.O)
		L.Gate, L.Up, L.Down = conv(L.Gate), conv(L.Up), conv(L.Down)
		out.LayerWeights[i] = L
	}
	return &out
}
