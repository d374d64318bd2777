package cpu_test

import (
	"cmp"
	"encoding/binary"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/tokenizer"
)

// recorder keeps copies of a stage's intermediate tensors, by llama.cpp's
// names ("attn_norm-0", "Qcur-0", ...): one row per token, in token order.
type recorder struct {
	mu    sync.Mutex
	T     int // tokens of the batch
	layer int // the layer the next MatMul belongs to
	calls int // MatMuls seen in this layer
	rows  map[string][][]float32
	order []string
}

func (r *recorder) put(name string, t int, x []float32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rs, ok := r.rows[name]
	if !ok {
		r.order = append(r.order, name)
		rs = make([][]float32, r.T)
		r.rows[name] = rs
	}
	if t < len(rs) {
		rs[t] = append([]float32(nil), x...)
	}
}

// recBackend is a model.Backend that records each MatMul's input and output
// under the names llama.cpp's llama graph gives them; the order of the
// stage's products names them (a dense llama layer: Q, K, V, O, gate, up,
// down; then the output head).
type recBackend struct {
	model.Backend
	r      *recorder
	layers int
}

var denseMatMuls = [][2]string{
	{"attn_norm", "Qcur"}, {"", "Kcur"}, {"", "Vcur"}, {"kqv_out", "attn_out"},
	{"ffn_norm", "ffn_gate"}, {"", "ffn_up"}, {"ffn_swiglu", "ffn_out"},
}

func (b *recBackend) MatMul(w *model.Weight, x []float32, rows int, out []float32) {
	b.Backend.MatMul(w, x, rows, out)
	r := b.r
	var in, res string
	if r.layer >= b.layers {
		in, res = "result_norm", "result_output"
	} else {
		n := denseMatMuls[r.calls]
		in, res = n[0], n[1]
		if in != "" {
			in += "-" + strconv.Itoa(r.layer)
		}
		res += "-" + strconv.Itoa(r.layer)
		if r.calls++; r.calls == len(denseMatMuls) {
			r.calls, r.layer = 0, r.layer+1
		}
	}
	cols, n := len(x)/rows, len(out)/rows
	first := r.T - rows // the head sees the last token only
	for t := range rows {
		if in != "" {
			r.put(in, first+t, x[t*cols:(t+1)*cols])
		}
		r.put(res, first+t, out[t*n:(t+1)*n])
	}
}

// recKV records the keys and values stored and the queries attended with
// (after RoPE), per layer and position.
type recKV struct {
	model.KV
	r *recorder
}

func (k *recKV) Store(layer int, blocks []int32, pos int, kk, v []float32) {
	k.KV.Store(layer, blocks, pos, kk, v)
	k.r.put("Kcur-rope-"+strconv.Itoa(layer), pos, kk)
}

func (k *recKV) Attend(layer int, blocks []int32, lo, pos, h0, h1 int, scale float32, q, out, scratch []float32) {
	if h0 == 0 { // the first of the token's head groups: q is the whole query
		k.r.put("Qcur-rope-"+strconv.Itoa(layer), pos, q)
	}
	k.KV.Attend(layer, blocks, lo, pos, h0, h1, scale, q, out, scratch)
}

// writeDumpModel writes TestDumpVsLlamaCpp's random file: STRATA_DUMP_ARCH's
// spec of llamaArchSpecs (default llama) in STRATA_DUMP_TYPE (F32 or Q8_0,
// default Q8_0), as TestRandomArchsMatchLlamaCppServer writes it.
func writeDumpModel(t *testing.T, path string) {
	t.Helper()
	arch := cmp.Or(os.Getenv("STRATA_DUMP_ARCH"), "llama")
	var spec model.RandomSpec
	for _, s := range llamaArchSpecs {
		if s.Arch == arch {
			spec = s
		}
	}
	if spec.Arch == "" || spec.Experts > 0 {
		t.Fatalf("no dense architecture %q", arch)
	}
	spec.Type = ggml.Q8_0
	if os.Getenv("STRATA_DUMP_TYPE") == "F32" {
		spec.Type = ggml.F32
	}
	if err := model.WriteRandomFile(path, spec); err != nil {
		t.Fatal(err)
	}
}

// llamaTensor is one tensor of the dump program's output.
type llamaTensor struct {
	name string
	op   string
	ne   [4]int
	data []float32
}

func readLlamaDump(t *testing.T, dir string) []llamaTensor {
	t.Helper()
	idx, err := os.ReadFile(filepath.Join(dir, "index.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var ts []llamaTensor
	for _, line := range strings.Split(strings.TrimSpace(string(idx)), "\n") {
		f := strings.Fields(line)
		var lt llamaTensor
		// The name may hold spaces ("Qcur-0 (view)"); the op and the four
		// dimensions are the last five fields.
		k := len(f) - 5
		lt.name, lt.op = strings.Join(f[1:k], " "), f[k]
		for i := range 4 {
			lt.ne[i], _ = strconv.Atoi(f[k+1+i])
		}
		b, err := os.ReadFile(filepath.Join(dir, f[0]+".f32"))
		if err != nil {
			t.Fatal(err)
		}
		lt.data = make([]float32, len(b)/4)
		for i := range lt.data {
			lt.data[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		ts = append(ts, lt)
	}
	return ts
}

// TestDumpVsLlamaCpp runs one prompt through strata and through libllama
// (scripts/vs-llamacpp/dump, flash attention on, 2 threads) and logs, per
// intermediate tensor in the order strata computes them, how many elements
// differ and by how much: the first tensor that differs is where the two
// programs' arithmetic parts. It needs the dump program:
// STRATA_LLAMA_DUMP is the command that runs it (e.g. "chroot /work/trixie
// /models/res/dump"), STRATA_LLAMA_ROOT the directory it sees as / (the
// files are written under its tmp/). The model is STRATA_DUMP_FILE (a
// dense model's GGUF file under that root) or else a random file
// (writeDumpModel); the tokens are STRATA_DUMP_TOKENS (IDs separated by
// commas or spaces, BOS included) or else llamaArchPrompts'
// STRATA_DUMP_PROMPT'th (default 4) as the file's tokenizer encodes it.
// STRATA_DUMP_KEEP keeps the files.
func TestDumpVsLlamaCpp(t *testing.T) {
	dump := strings.Fields(os.Getenv("STRATA_LLAMA_DUMP"))
	if len(dump) == 0 {
		t.Skip("set STRATA_LLAMA_DUMP to the dump program's command to compare tensors with llama.cpp")
	}
	root := os.Getenv("STRATA_LLAMA_ROOT")
	dir, err := os.MkdirTemp(filepath.Join(root, "tmp"), "strata-dump-")
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("STRATA_DUMP_KEEP") == "" {
		t.Cleanup(func() { os.RemoveAll(dir) })
	} else {
		t.Logf("files kept in %s", dir)
	}
	path := os.Getenv("STRATA_DUMP_FILE")
	if path == "" {
		path = filepath.Join(dir, "model.gguf")
		writeDumpModel(t, path)
	}
	f := openGGUF(t, path)
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	var prompt []int32
	if ids := os.Getenv("STRATA_DUMP_TOKENS"); ids != "" {
		for _, w := range strings.FieldsFunc(ids, func(r rune) bool { return r == ',' || r == ' ' }) {
			id, err := strconv.Atoi(w)
			if err != nil {
				t.Fatalf("STRATA_DUMP_TOKENS: %v", err)
			}
			prompt = append(prompt, int32(id))
		}
	} else {
		tok, err := tokenizer.FromGGUF(f)
		if err != nil {
			t.Fatal(err)
		}
		pi, _ := strconv.Atoi(cmp.Or(os.Getenv("STRATA_DUMP_PROMPT"), "4"))
		prompt = tok.Encode(llamaArchPrompts[pi], tokenizer.EncodeOptions{AddSpecial: true})
	}
	t.Logf("%s: tokens %v", path, prompt)

	out := filepath.Join(dir, "dump")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	args := append(dump[1:], strings.TrimPrefix(path, root), strings.TrimPrefix(out, root), "on", "2")
	for _, id := range prompt {
		args = append(args, strconv.Itoa(int(id)))
	}
	if b, err := exec.Command(dump[0], args...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", dump, err, b)
	}
	llama := readLlamaDump(t, out)

	T := len(prompt)
	r := &recorder{T: T, rows: map[string][][]float32{}}
	e := newEngine(t, m, 2, 8, ggml.F16)
	be := &recBackend{Backend: cpu.NewBackend(e.pool), r: r, layers: m.Layers}
	st, err := model.NewStage(m, 0, m.Layers, be, &recKV{KV: e.kv, r: r})
	if err != nil {
		t.Fatal(err)
	}
	blocks := e.blocksFor(nil, T)
	logits, err := st.Forward([]model.Row{{Seq: 1, First: true, Tokens: prompt, Blocks: blocks, Logits: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.put("logits", T-1, logits)

	// llama.cpp's tensor for each of strata's: the first one of that name
	// (a name is reused through reshape, RoPE and views), for the rope
	// names the first of that name that ROPE computes.
	find := func(name string) *llamaTensor {
		ln, op := name, ""
		if strings.Contains(name, "-rope-") {
			ln, op = strings.Replace(name, "-rope-", "-", 1), "ROPE"
		}
		if name == "logits" {
			ln = "result_output"
		}
		for i := range llama {
			if llama[i].name == ln && (op == "" || llama[i].op == op) {
				return &llama[i]
			}
		}
		return nil
	}
	for _, name := range r.order {
		lt := find(name)
		if lt == nil {
			t.Logf("%-16s not in llama.cpp's dump", name)
			continue
		}
		rows := r.rows[name]
		width := 0
		for _, row := range rows {
			if row != nil {
				width = len(row)
			}
		}
		ltRows := len(lt.data) / width
		var diff, total int
		var worst float64
		first := -1
		for k := 0; k < ltRows; k++ {
			row := rows[T-ltRows+k]
			if row == nil {
				continue
			}
			for i, v := range row {
				w := lt.data[k*width+i]
				total++
				if math.Float32bits(v) != math.Float32bits(w) {
					diff++
					if d := math.Abs(float64(v - w)); d > worst {
						worst = d
					}
					if first < 0 {
						first = (T-ltRows+k)*width + i
					}
				}
			}
		}
		t.Logf("%-16s %5d/%5d differ, max |Δ| %.3g, first at token %d element %d", name, diff, total, worst, first/max(width, 1), first%max(width, 1))
	}
}
