package cuda

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

func TestNoDriverError(t *testing.T) {
	_, err := loadDriver([]string{"libcuda-strata-absent.so.1"})
	if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "libcuda-strata-absent.so.1") {
		t.Fatalf("got %v, want ErrNoDriver naming the library tried", err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Fatalf("error spans lines: %q", err)
	}
	// On this machine: either a driver loads, or the error is ErrNoDriver.
	if _, err := LoadDriver(); err != nil && !errors.Is(err, ErrNoDriver) {
		t.Fatalf("LoadDriver: %v is not ErrNoDriver", err)
	}
}

func TestNoNVRTCError(t *testing.T) {
	old := nvrtcSONames
	nvrtcSONames = []string{"libnvrtc-strata-absent.so.13"}
	defer func() { nvrtcSONames = old }()
	_, err := LoadNVRTC([]string{t.TempDir()})
	if !errors.Is(err, ErrNoNVRTC) || !strings.Contains(err.Error(), "--cuda-lib-dir") {
		t.Fatalf("got %v, want ErrNoNVRTC pointing at --cuda-lib-dir", err)
	}
}

func TestParseDevice(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		ok   bool
	}{{"cuda:0", 0, true}, {"cuda:7", 7, true}, {"cuda:", 0, false}, {"cpu", 0, false}, {"cuda:-1", 0, false}, {"cuda:1x", 0, false}, {"cuda:99999999999", 0, false}} {
		got, err := ParseDevice(c.in)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("ParseDevice(%q) = %d, %v; want %d ok=%v", c.in, got, err, c.want, c.ok)
		}
	}
}

func TestChooseArch(t *testing.T) {
	sup := []int{50, 60, 70, 75, 80, 86, 89, 90}
	for _, c := range []struct {
		cc   int
		want string
		ok   bool
	}{{90, "sm_90", true}, {86, "sm_86", true}, {100, "compute_90", true}, {87, "compute_86", true}, {35, "", false}} {
		got, err := ChooseArch(c.cc, sup)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ChooseArch(%d) = %q, %v; want %q ok=%v", c.cc, got, err, c.want, c.ok)
		}
	}
}

func TestCacheKey(t *testing.T) {
	a := CacheKey("src", []string{"-a"}, "sm_90")
	for _, b := range []string{CacheKey("src ", []string{"-a"}, "sm_90"), CacheKey("src", []string{"-b"}, "sm_90"), CacheKey("src", []string{"-a"}, "sm_80")} {
		if a == b {
			t.Errorf("distinct inputs share key %s", a)
		}
	}
	if !strings.HasSuffix(a, "-sm_90.cubin") || !strings.HasSuffix(CacheKey("src", nil, "compute_90"), "-compute_90.ptx") {
		t.Errorf("key %s does not say arch and format", a)
	}
}

func TestKernelSourceEmbedded(t *testing.T) {
	for _, k := range KernelNames {
		if !strings.Contains(KernelSource(), `extern "C" __global__ void `+k+"(") {
			t.Errorf("kernels.cu has no kernel %s", k)
		}
	}
	if strings.Contains(KernelSource(), "#include") {
		t.Error("kernels.cu includes a header; NVRTC before 12.8 has none built in")
	}
}

func TestDeviceType(t *testing.T) {
	for _, c := range []struct {
		t        ggml.Type
		cols     int
		overflow bool
		want     ggml.Type
	}{
		{ggml.F32, 64, false, ggml.F32}, {ggml.F16, 64, false, ggml.F16}, {ggml.F16, 172, false, ggml.F32},
		{ggml.Q8_0, 64, false, ggml.Q8_0}, {ggml.Q4_0, 64, false, ggml.F16}, {ggml.BF16, 64, true, ggml.F32},
		{ggml.Q4_K, 256, false, ggml.F16},
	} {
		if got := DeviceType(c.t, c.cols, c.overflow); got != c.want {
			t.Errorf("DeviceType(%v, %d, %v) = %v, want %v", c.t, c.cols, c.overflow, got, c.want)
		}
	}
}

func randomModel(t *testing.T, spec model.RandomSpec) *model.Model {
	t.Helper()
	f, err := model.RandomFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestStageMemory(t *testing.T) {
	spec := model.DemoSpec()
	spec.Type = ggml.Q8_0
	m := randomModel(t, spec)
	mem, err := StageMemory(m, 0, m.Layers, 16, 8)
	if err != nil {
		t.Fatal(err)
	}
	// By hand: per layer Q,O (128×128), K,V (64×128), gate, up (384×128),
	// down (128×384), Q8_0 at 34 bytes per 32; norms 2×128 f32.
	q8 := func(rows, cols int) int64 { return int64(rows * cols / 32 * 34) }
	layer := 2*q8(128, 128) + 2*q8(64, 128) + 2*q8(384, 128) + q8(128, 384) + 2*128*4
	want := 4*layer + q8(1024, 128) /*embed*/ + q8(1024, 128) /*output*/ + 128*4
	if mem.Weights != want {
		t.Errorf("weights %d bytes, want %d", mem.Weights, want)
	}
	if wantKV := int64(2 * 4 * 16 * 64 * 2); mem.PerBlock != wantKV {
		t.Errorf("per block %d bytes, want %d", mem.PerBlock, wantKV)
	}
	half, _ := StageMemory(m, 0, 2, 16, 8)
	if half.PerBlock*2 != mem.PerBlock || half.Weights >= mem.Weights {
		t.Errorf("half the layers: %+v vs %+v", half, mem)
	}
	if got := KVBlocks(mem, mem.Weights+mem.Scratch+DefaultMargin+10*mem.PerBlock+1, DefaultMargin); got != 10 {
		t.Errorf("KVBlocks = %d, want 10", got)
	}
	if got := KVBlocks(mem, mem.Weights, DefaultMargin); got != 0 {
		t.Errorf("KVBlocks with no room = %d, want 0", got)
	}
}

func TestSupported(t *testing.T) {
	if err := Supported(randomModel(t, model.DemoSpec()), 0, 4); err != nil {
		t.Fatalf("llama: %v", err)
	}
	for _, arch := range []string{"qwen2", "qwen3", "phi3", "gemma3"} {
		spec := model.DemoSpec()
		spec.Arch = arch
		m := randomModel(t, spec)
		if err := Supported(m, 0, m.Layers); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), arch) {
			t.Errorf("%s: got %v, want ErrUnsupported naming it", arch, err)
		}
	}
}

func TestKVLayoutMatchesCPU(t *testing.T) {
	l := KVLayout{Layers: 2, Blocks: 10, BlockSize: 16, HeadsKV: 4, HeadDim: 8}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	blocks := []int32{7, 2, 9}
	// The CPU pool's offset (model/cpu kv.go) in bytes, per value here:
	// (block*bs*kvh + pos%bs) * hd.
	for pos := 0; pos < 48; pos++ {
		want := int64((int(blocks[pos/16])*16*4 + pos%16) * 8)
		if got := l.Slot(blocks, pos); got != want {
			t.Fatalf("slot of pos %d = %d, want %d", pos, got, want)
		}
	}
	if l.Bytes() != 2*2*10*16*4*8*2 {
		t.Errorf("bytes %d", l.Bytes())
	}
	// The kernels' offsets are 64-bit: a layer past 2^31 values is fine
	// (16 GiB of K a layer here), block IDs past int32 are not.
	big := KVLayout{Layers: 1, Blocks: 1 << 20, BlockSize: 16, HeadsKV: 8, HeadDim: 128}
	if err := big.Validate(); err != nil {
		t.Errorf("a layer past 2^31 values: %v", err)
	}
	if got, want := big.Slot([]int32{1<<20 - 1}, 15), int64(1<<20-1)*16*8*128+15*128; got != want {
		t.Errorf("slot past 2^31 = %d, want %d", got, want)
	}
	if err := (KVLayout{Layers: 1, Blocks: 1 << 31, BlockSize: 1, HeadsKV: 1, HeadDim: 1}).Validate(); err == nil {
		t.Error("2^31 blocks validated")
	}
}

func TestBatchMeta(t *testing.T) {
	m := randomModel(t, model.DemoSpec())
	l := KVLayout{Layers: 4, Blocks: 8, BlockSize: 4, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim}
	rows := []model.Row{
		{Seq: 1, Pos: 0, First: true, Tokens: []int32{5, 6, 7, 8, 9}, Blocks: []int32{3, 1}, Logits: true},
		{Seq: 2, Pos: 6, Tokens: []int32{11}, Blocks: []int32{0, 5, 6}},
		{Seq: 3, Pos: 2, Tokens: []int32{12, 13}, Blocks: []int32{4, 7}, Logits: true},
	}
	T, err := checkBatch(m, true, l.Blocks, l.BlockSize, rows, nil)
	if err != nil || T != 8 {
		t.Fatalf("checkBatch = %d, %v", T, err)
	}
	var meta batchMeta
	meta.fill(l, rows)
	got := []any{meta.tok, meta.pos, meta.tbl, meta.tables, meta.logitRows}
	want := []any{
		[]int32{5, 6, 7, 8, 9, 11, 12, 13},
		[]int32{0, 1, 2, 3, 4, 6, 2, 3},
		[]int32{0, 0, 0, 0, 0, 2, 4, 4},
		[]int32{3, 1, 0, 5, 4}, // row 3 needs only block 0 for positions 2..3
		[]int32{4, 7},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("meta (-want +got):\n%s", d)
	}
	// kv_store and attend find a token's place through tables[tbl[t]:]:
	// the same offset as the row's own block table gives.
	for i, p := range meta.pos {
		r := map[int]int{0: 0, 1: 0, 2: 0, 3: 0, 4: 0, 5: 1, 6: 2, 7: 2}[i]
		if got, want := l.Slot(meta.tables[meta.tbl[i]:], int(p)), l.Slot(rows[r].Blocks, int(p)); got != want {
			t.Errorf("token %d: offset %d through tables, %d through its row", i, got, want)
		}
	}
	for _, bad := range []struct {
		row  model.Row
		want string
	}{
		{model.Row{Seq: 9, Pos: 0, First: true, Tokens: []int32{1}, Blocks: []int32{8}}, "pool has 8"},
		{model.Row{Seq: 9, Pos: 0, First: true, Tokens: []int32{1024}, Blocks: []int32{1}}, "outside vocabulary"},
		{model.Row{Seq: 9, Pos: 3, Tokens: []int32{1, 2}, Blocks: []int32{1}}, "reaches position 4"},
		{model.Row{Seq: 9, Pos: 0, Tokens: []int32{1}, Blocks: []int32{1}}, "first=false"},
		{model.Row{Seq: 9, Pos: 0, First: true, Blocks: []int32{1}}, "no tokens"},
	} {
		_, err := checkBatch(m, true, l.Blocks, l.BlockSize, []model.Row{bad.row}, nil)
		if !errors.Is(err, model.ErrBadBatch) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: got %v, want ErrBadBatch with %q", bad.row, err, bad.want)
		}
	}
	if _, err := checkBatch(m, false, l.Blocks, l.BlockSize, rows[:1], make([]float32, 3)); !errors.Is(err, model.ErrBadBatch) {
		t.Errorf("short hidden states: %v", err)
	}
}

// TestAttendWarps: every head width the backend runs gets at least two
// warps and fits the 48 KiB of shared memory a block has without an
// opt-in; the block's shared memory matches kernels.cu's ATT_FIXED plus 32
// keys' values a warp.
func TestAttendWarps(t *testing.T) {
	if !strings.Contains(KernelSource(), "#define ATT_FIXED ((256 + 2 * ATT_WARPS_MAX + ATT_WARPS_MAX * 256) * 4)") || !strings.Contains(KernelSource(), "#define ATT_WARPS_MAX 8") {
		t.Fatal("kernels.cu's attend shared-memory layout changed: update attendWarps")
	}
	for hd := 1; hd <= 256; hd++ {
		w, shared := attendWarps(hd)
		if w < 2 || w > 8 || shared > 48<<10 || shared != (256+16+8*256)*4+w*32*hd*2 {
			t.Errorf("hd %d: %d warps, %d bytes", hd, w, shared)
		}
	}
	for hd, want := range map[int]int{8: 8, 64: 8, 128: 4, 256: 2} {
		if w, _ := attendWarps(hd); w != want {
			t.Errorf("hd %d: %d warps, want %d", hd, w, want)
		}
	}
}
