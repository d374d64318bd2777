package model

import (
	"math"
	"strings"
	"testing"

	"github.com/strata-llm/strata/model/ggml"
)

// TestGeGLUHalfPrecision pins strata's GELU to ggml's CPU numerics: for
// every half-precision input in (-10, 10) the table holds ggml's float32
// tanh GELU, 0.5x(1+tanh(sqrt(2/pi)x(1+0.044715x²))), rounded to half
// precision, which is within a half-precision step (plus float32's
// cancellation in 1+tanh for negative inputs) of the exact GELU; a float32
// gate is rounded to half precision before the lookup; inputs at or below
// -10 give 0 and at or above 10 pass unchanged; the up projection
// multiplies in float32.
func TestGeGLUHalfPrecision(t *testing.T) {
	tab := geluTable()
	for i := 0; i < 1<<16; i++ {
		x := ggml.F16ToF32(uint16(i))
		if !(x > -10 && x < 10) {
			continue
		}
		// ggml's expression, each operation in float32.
		a, c := float32(0.044715), float32(math.Sqrt(2/math.Pi))
		u := float32(c*x) * float32(1+float32(float32(a*x)*x))
		y32 := float32(0.5*x) * float32(1+float32(math.Tanh(float64(u))))
		if want := ggml.F16ToF32(ggml.F32ToF16(y32)); tab[i] != want {
			t.Fatalf("gelu(%g) = %g in the table, want %g (float32 %g)", x, tab[i], want, y32)
		}
		xd := float64(x)
		y := 0.5 * xd * (1 + math.Tanh(math.Sqrt(2/math.Pi)*xd*(1+0.044715*xd*xd)))
		step := math.Max(math.Abs(y)/1024, 0x1p-24) // half precision's spacing near y
		if math.Abs(float64(tab[i])-y) > step+1e-7 {
			t.Fatalf("gelu(%g) = %g in the table, exact %.9g", x, tab[i], y)
		}
	}

	gate := []float32{-11, -10, -9.99, -1.0001, 0, 0.3, 1.0004, 9.99, 10, 12.5, float32(math.Inf(1))}
	up := []float32{3, 3, 3, -2, 5, 0.5, 1, 1, 2, -1, 1}
	want := make([]float32, len(gate))
	for i, x := range gate {
		switch {
		case x <= -10:
			want[i] = 0
		case x >= 10:
			want[i] = x * up[i]
		default:
			want[i] = tab[ggml.F32ToF16(x)] * up[i]
		}
	}
	if want[6] != tab[ggml.F32ToF16(1)]*up[6] { // 1.0004 rounds to 1 in half precision
		t.Fatalf("1.0004 does not round to 1: %g", want[6])
	}
	geglu(gate, up)
	for i := range gate {
		if math.Float32bits(gate[i]) != math.Float32bits(want[i]) {
			t.Fatalf("geglu element %d = %g, want %g", i, gate[i], want[i])
		}
	}
}

// TestSoftCap: cap·tanh(x/cap), close to x for small x, never past ±cap.
func TestSoftCap(t *testing.T) {
	x := []float32{0, 0.01, -3, 29, 300, -1e30}
	softCap(x, 30)
	want := []float64{0, 0.01, -3, 29, 300, -1e30}
	for i, w := range want {
		w = 30 * math.Tanh(w/30)
		if math.Abs(float64(x[i])-w) > 1e-6*math.Max(1, math.Abs(w)) {
			t.Fatalf("softCap element %d = %g, want %g", i, x[i], w)
		}
	}
}

// plainKV is a KV without AttendSoftCap; nullBackend computes nothing.
type plainKV struct{ KV }

type nullBackend struct{ Backend }

func (nullBackend) Workers() int { return 1 }

// TestGemma2NeedsSoftCapKV: a gemma2 stage refuses a KV store that cannot
// soft-cap attention scores, naming it, rather than attend uncapped; with
// the cap turned off (0 in the file) any KV store serves.
func TestGemma2NeedsSoftCapKV(t *testing.T) {
	spec := RandomSpec{Arch: "gemma2", Layers: 2, Embd: 64, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 300, Context: 256, Type: ggml.F32, Seed: 6}
	f, err := RandomFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewStage(m, 0, 2, nullBackend{}, plainKV{})
	if err == nil || !strings.Contains(err.Error(), "gemma2 soft-caps attention scores, which the KV store model.plainKV cannot") {
		t.Fatalf("error %v", err)
	}
	m.AttnSoftCap = 0
	if _, err := NewStage(m, 0, 2, nullBackend{}, plainKV{}); err != nil {
		t.Fatal(err)
	}
}
