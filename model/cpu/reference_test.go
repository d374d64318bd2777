package cpu_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// ref64 is a float64 transformer layer written for clarity, not speed: the
// reference each f32 layer is checked against.
type ref64 struct{ m *model.Model }

func (r ref64) weight(w *model.Weight) [][]float64 {
	out := make([][]float64, w.Rows)
	row := make([]float32, w.Cols)
	for i := range out {
		if err := ggml.DequantizeRow(w.Type, w.Row(i), row); err != nil {
			panic(err)
		}
		out[i] = make([]float64, w.Cols)
		for j, v := range row {
			out[i][j] = float64(v)
		}
	}
	return out
}

func matvec(w [][]float64, x []float64) []float64 {
	out := make([]float64, len(w))
	for i, row := range w {
		for j, v := range row {
			out[i] += v * x[j]
		}
	}
	return out
}

func rms(x []float64, w []float32, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	s := 1 / math.Sqrt(ss/float64(len(x))+eps)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v * s * float64(w[i])
	}
	return out
}

func rope(x []float64, heads, hd, dims, pos int, base float64, neox bool) {
	for h := 0; h < heads; h++ {
		for i := 0; i < dims; i += 2 {
			th := float64(pos) * math.Pow(base, -float64(i)/float64(dims))
			c, s := math.Cos(th), math.Sin(th)
			ia, ib := h*hd+i, h*hd+i+1
			if neox { // pairs (j, j+dims/2)
				ia, ib = h*hd+i/2, h*hd+i/2+dims/2
			}
			a, b := x[ia], x[ib]
			x[ia], x[ib] = a*c-b*s, a*s+b*c
		}
	}
}

func addBias(x []float64, b []float32) {
	for i := range b {
		x[i] += float64(b[i])
	}
}

// layer runs layer l over a whole sequence x (positions 0..len-1).
func (r ref64) layer(l int, x [][]float64) [][]float64 {
	m := r.m
	L := m.LayerWeights[l]
	wq, wk, wv, wo := r.weight(L.Q), r.weight(L.K), r.weight(L.V), r.weight(L.O)
	wg, wu, wd := r.weight(L.Gate), r.weight(L.Up), r.weight(L.Down)
	hd, group := m.HeadDim, m.Heads/m.HeadsKV
	eps := float64(m.NormEps)
	var qs, ks, vs [][]float64
	for p, xp := range x {
		h := rms(xp, L.AttnNorm, eps)
		q, k, v := matvec(wq, h), matvec(wk, h), matvec(wv, h)
		if L.QBias != nil {
			addBias(q, L.QBias)
			addBias(k, L.KBias)
			addBias(v, L.VBias)
		}
		neox := m.Rope == model.RopeNeoX
		rope(q, m.Heads, hd, m.RopeDims, p, float64(m.RopeBase), neox)
		rope(k, m.HeadsKV, hd, m.RopeDims, p, float64(m.RopeBase), neox)
		qs, ks, vs = append(qs, q), append(ks, k), append(vs, v)
	}
	out := make([][]float64, len(x))
	for p := range x {
		att := make([]float64, m.Embd)
		for h := 0; h < m.Heads; h++ {
			kh := (h / group) * hd
			sc := make([]float64, p+1)
			mx := math.Inf(-1)
			for j := 0; j <= p; j++ {
				for i := 0; i < hd; i++ {
					sc[j] += qs[p][h*hd+i] * ks[j][kh+i]
				}
				sc[j] /= math.Sqrt(float64(hd))
				mx = max(mx, sc[j])
			}
			var sum float64
			for j := range sc {
				sc[j] = math.Exp(sc[j] - mx)
				sum += sc[j]
			}
			for j := range sc {
				for i := 0; i < hd; i++ {
					att[h*hd+i] += sc[j] / sum * vs[j][kh+i]
				}
			}
		}
		y := matvec(wo, att)
		for i := range y {
			y[i] += x[p][i]
		}
		h := rms(y, L.FFNNorm, eps)
		g, u := matvec(wg, h), matvec(wu, h)
		for i := range g {
			g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
		}
		d := matvec(wd, g)
		for i := range d {
			d[i] += y[i]
		}
		out[p] = d
	}
	return out
}

// TestLayersAgainstFloat64 runs each layer of a random F32 model with an F32
// KV cache as its own stage and compares its hidden states with the float64
// reference: relative error well under 1e-4.
func TestLayersAgainstFloat64(t *testing.T) {
	for _, arch := range []string{"llama", "qwen2"} {
		t.Run(arch, func(t *testing.T) { testLayersAgainstFloat64(t, arch) })
	}
}

func testLayersAgainstFloat64(t *testing.T, arch string) {
	f, err := model.RandomFile(model.RandomSpec{Arch: arch, Layers: 3, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Type: ggml.F32, Seed: 11})
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	if want := arch == "qwen2"; m.QKVBias != want || (m.Rope == model.RopeNeoX) != want {
		t.Fatalf("%s: QKVBias %v, NeoX %v", arch, m.QKVBias, m.Rope == model.RopeNeoX)
	}
	rng := rand.New(rand.NewPCG(8, 9))
	const T = 20
	pool := newEngine(t, m, 2, 4, ggml.F32).pool
	for l := 1; l < m.Layers; l++ { // layer 0 embeds; the stage input must come from outside
		in := make([]float32, T*m.Embd)
		x := make([][]float64, T)
		for p := range x {
			x[p] = make([]float64, m.Embd)
			for i := range x[p] {
				v := float32(rng.NormFloat64())
				in[p*m.Embd+i] = v
				x[p][i] = float64(v)
			}
		}
		kv, err := newKVType(m, 1, ggml.F32)
		if err != nil {
			t.Fatal(err)
		}
		st, err := model.NewStage(m, l, l+1, newBackend(pool), kv)
		if err != nil {
			t.Fatal(err)
		}
		toks := make([]int32, T)
		last := l == m.Layers-1
		got, err := st.Forward([]model.Row{{Seq: 1, First: true, Tokens: toks, Blocks: []int32{0, 1}, Logits: last}}, in)
		if err != nil {
			t.Fatal(err)
		}
		want := ref64{m}.layer(l, x)
		if last { // the last stage returns the head's logits for the last position
			want = [][]float64{matvec(ref64{m}.weight(m.Output), rms(want[T-1], m.OutputNorm, float64(m.NormEps)))}
		}
		var num, den float64
		for p := range want {
			for i, w := range want[p] {
				d := float64(got[p*len(want[p])+i]) - w
				num += d * d
				den += w * w
			}
		}
		if rel := math.Sqrt(num / den); rel > 1e-5 {
			t.Errorf("layer %d: relative error %.3g against float64", l, rel)
		} else {
			t.Logf("layer %d: relative error %.3g", l, rel)
		}
	}
}
