package sample

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// logs returns the natural logs of ps, so tests can write probabilities.
func logs(ps ...float64) []float32 {
	out := make([]float32, len(ps))
	for i, p := range ps {
		out[i] = float32(math.Log(p))
	}
	return out
}

func params(mod func(*Params)) *Params {
	p := DefaultParams()
	if mod != nil {
		mod(&p)
	}
	return &p
}

// kept returns the candidates truncate keeps, in sorted order.
func kept(t *testing.T, logits []float32, p *Params) []int32 {
	t.Helper()
	var s Sampler
	s.Sample(logits, params(nil), nil, 0) // fills s.work, s.m and s.z (no penalties here)
	s.sorted = -1
	k := s.truncate(p)
	s.ensureSorted(k)
	return slices.Clone(s.idx[:k])
}

func TestGreedy(t *testing.T) {
	tests := []struct {
		logits []float32
		want   int32
	}{
		{[]float32{0.1, 3, -1, 2.9}, 1},
		{[]float32{1, 3, 3, 2}, 1},   // tie: lower ID
		{[]float32{5, 5, 5, 5}, 0},   // all tied
		{[]float32{-3, -2, -2.5}, 1}, // all negative
		{[]float32{-1, float32(math.NaN()), -2}, 0},
		{[]float32{float32(math.Inf(-1)), float32(math.Inf(-1)), -7}, 2},
	}
	var s Sampler
	for _, tt := range tests {
		// Filters do not change the argmax; only Temperature > 0 draws.
		p := params(func(p *Params) { p.TopK = 2; p.TopP = 0.5; p.MinP = 0.1; p.Seed = 7 })
		got := s.Sample(tt.logits, p, nil, 3)
		if got.Token != tt.want {
			t.Errorf("Sample(%v).Token = %d, want %d", tt.logits, got.Token, tt.want)
		}
	}
}

func TestAllImpossible(t *testing.T) {
	var s Sampler
	inf := float32(math.Inf(-1))
	got := s.Sample([]float32{inf, inf, inf}, params(func(p *Params) { p.Temperature = 1; p.TopLogprobs = 2 }), nil, 0)
	if got.Token != 0 || !math.IsInf(float64(got.Logprob), -1) || len(got.Top) != 2 {
		t.Errorf("all -Inf: got %+v, want token 0 with Logprob -Inf and 2 Top", got)
	}
}

func TestLogprobs(t *testing.T) {
	logits := []float32{1, 3, 3, 0.5, 2, 3}
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l))
	}
	lp := func(id int32) float32 { return float32(float64(logits[id]) - math.Log(z)) }

	var s Sampler
	got := s.Sample(logits, params(func(p *Params) { p.TopLogprobs = 4 }), nil, 0)
	want := Result{Token: 1, Logprob: lp(1), Top: []TokenLogprob{
		{1, lp(1)}, {2, lp(2)}, {5, lp(5)}, {4, lp(4)},
	}}
	if diff := cmp.Diff(got, want); diff != "" {
		t.Errorf("Sample (-got +want):\n%s", diff)
	}

	// Logprobs are of the logits before truncation and temperature, so the
	// same token reports the same logprob whatever the sampling settings.
	for pos := range 50 {
		r := s.Sample(logits, params(func(p *Params) { p.Temperature = 0.3; p.TopK = 2; p.Seed = 1 }), nil, pos)
		if r.Logprob != lp(r.Token) {
			t.Fatalf("position %d: Logprob %v, want %v", pos, r.Logprob, lp(r.Token))
		}
	}

	// More alternatives than the vocabulary: all of it.
	got = s.Sample(logits[:2], params(func(p *Params) { p.TopLogprobs = 5 }), nil, 0)
	if len(got.Top) != 2 || got.Top[0].Token != 1 || got.Top[1].Token != 0 {
		t.Errorf("TopLogprobs over vocab: Top = %v", got.Top)
	}
}

func TestNoLogprob(t *testing.T) {
	logits := realLogits(1000, 3)
	var s Sampler
	for _, mod := range []func(*Params){
		nil,
		func(p *Params) { p.Temperature = 0.8; p.TopK = 40 },
		func(p *Params) { p.Temperature = 0.8; p.TopP = 0.9 },
		func(p *Params) { p.Temperature = 1; p.MinP = 0.05 },
	} {
		for pos := range 20 {
			want := s.Sample(logits, params(mod), nil, pos)
			p := params(mod)
			p.NoLogprob = true
			got := s.Sample(logits, p, nil, pos)
			if got.Token != want.Token || !math.IsNaN(float64(got.Logprob)) || got.Top != nil {
				t.Errorf("NoLogprob: got %+v, want token %d with Logprob NaN", got, want.Token)
			}
			// Top logprobs need the sum anyway, and then Logprob comes with it.
			p.TopLogprobs = 2
			got = s.Sample(logits, p, nil, pos)
			if got.Token != want.Token || got.Logprob != want.Logprob || len(got.Top) != 2 {
				t.Errorf("NoLogprob with TopLogprobs 2: got %+v, want %+v and 2 Top", got, want)
			}
		}
	}
}

func TestTruncation(t *testing.T) {
	probs := logs(0.05, 0.5, 0.15, 0.3) // sorted: 1, 3, 2, 0
	tests := []struct {
		name   string
		logits []float32
		mod    func(*Params)
		want   []int32
	}{
		{"off", probs, nil, []int32{1, 3, 2, 0}},
		{"top-k 2", probs, func(p *Params) { p.TopK = 2 }, []int32{1, 3}},
		{"top-k 1", probs, func(p *Params) { p.TopK = 1 }, []int32{1}},
		{"top-k >= vocab", probs, func(p *Params) { p.TopK = 9 }, []int32{1, 3, 2, 0}},
		{"top-k tie at boundary", []float32{2, 1, 1, 0}, func(p *Params) { p.TopK = 2 }, []int32{0, 1}},
		{"top-k tie at top", []float32{1, 1, 1, 2}, func(p *Params) { p.TopK = 3 }, []int32{3, 0, 1}},
		{"top-p 0.4", probs, func(p *Params) { p.TopP = 0.4 }, []int32{1}},
		{"top-p 0.75", probs, func(p *Params) { p.TopP = 0.75 }, []int32{1, 3}},
		{"top-p 0.83", probs, func(p *Params) { p.TopP = 0.83 }, []int32{1, 3, 2}},
		{"top-p 0.97", probs, func(p *Params) { p.TopP = 0.97 }, []int32{1, 3, 2, 0}},
		// The running sum meets the target exactly: 2 of 4 is half.
		{"top-p at the target", []float32{0, 0, 0, 0}, func(p *Params) { p.TopP = 0.5 }, []int32{0, 1}},
		// After top-k 3 the probabilities renormalise over 0.95: 0.526, 0.842.
		{"top-k 3 then top-p 0.83", probs, func(p *Params) { p.TopK = 3; p.TopP = 0.83 }, []int32{1, 3}},
		{"min-p 0.2", probs, func(p *Params) { p.MinP = 0.2 }, []int32{1, 3, 2}},
		{"min-p 0.5", probs, func(p *Params) { p.MinP = 0.5 }, []int32{1, 3}},
		{"min-p 0.7", probs, func(p *Params) { p.MinP = 0.7 }, []int32{1}},
		{"min-p 1", []float32{3, 1, 3}, func(p *Params) { p.MinP = 1 }, []int32{0, 2}},
		{"top-p 0.97 and min-p 0.5", probs, func(p *Params) { p.TopP = 0.97; p.MinP = 0.5 }, []int32{1, 3}},
		{"top-p 0.4 and min-p 0.2", probs, func(p *Params) { p.TopP = 0.4; p.MinP = 0.2 }, []int32{1}},
		{"all three", probs, func(p *Params) { p.TopK = 3; p.TopP = 0.9; p.MinP = 0.2 }, []int32{1, 3, 2}},
	}
	for _, tt := range tests {
		p := params(tt.mod)
		p.Temperature = 1
		if diff := cmp.Diff(kept(t, tt.logits, p), tt.want); diff != "" {
			t.Errorf("%s: kept (-got +want):\n%s", tt.name, diff)
		}
		// And the draws land only in the kept set.
		var s Sampler
		seen := map[int32]bool{}
		for pos := range 2000 {
			seen[s.Sample(tt.logits, p, nil, pos).Token] = true
		}
		for _, id := range tt.want {
			if !seen[id] {
				t.Errorf("%s: token %d kept but never drawn in 2000 positions", tt.name, id)
			}
			delete(seen, id)
		}
		if len(seen) > 0 {
			t.Errorf("%s: drew tokens %v outside the kept set %v", tt.name, seen, tt.want)
		}
	}
}

func TestPenalties(t *testing.T) {
	tests := []struct {
		name    string
		logits  []float32
		history []int32
		mod     func(*Params)
		want    []float32
	}{
		{"off", []float32{2, -2, 1}, []int32{0, 1}, nil, []float32{2, -2, 1}},
		{"repetition", []float32{2, -2, 1, 0}, []int32{0, 1, 0, 3}, func(p *Params) { p.RepetitionPenalty = 2 },
			[]float32{1, -4, 1, 0}},
		{"repetition < 1", []float32{2, -2, 1}, []int32{0, 1}, func(p *Params) { p.RepetitionPenalty = 0.5 },
			[]float32{4, -1, 1}},
		{"frequency and presence", []float32{3, 2, 1}, []int32{0, 0, 0, 1}, func(p *Params) { p.FrequencyPenalty = 0.5; p.PresencePenalty = 0.25 },
			[]float32{1.25, 1.25, 1}},
		{"negative presence", []float32{3, 2, 1}, []int32{2}, func(p *Params) { p.PresencePenalty = -1.5 },
			[]float32{3, 2, 2.5}},
		// Repetition first, then frequency/presence: (4/2) - 2*0.5 - 1.
		{"all", []float32{4, 1}, []int32{0, 0}, func(p *Params) { p.RepetitionPenalty = 2; p.FrequencyPenalty = 0.5; p.PresencePenalty = 1 },
			[]float32{0, 1}},
		{"out-of-range history ignored", []float32{2, 1}, []int32{-1, 5, 1}, func(p *Params) { p.PresencePenalty = 1 },
			[]float32{2, 0}},
		{"bias after penalties", []float32{2, 1}, []int32{0}, func(p *Params) {
			p.RepetitionPenalty = 2
			p.LogitBias = map[int32]float32{0: 1, 1: -0.5}
		}, []float32{2, 0.5}},
	}
	for _, tt := range tests {
		var s Sampler
		logits := slices.Clone(tt.logits)
		history := slices.Clone(tt.history)
		s.Sample(logits, params(tt.mod), history, 0)
		if diff := cmp.Diff(s.work, tt.want); diff != "" {
			t.Errorf("%s: processed logits (-got +want):\n%s", tt.name, diff)
		}
		if !slices.Equal(logits, tt.logits) || !slices.Equal(history, tt.history) {
			t.Errorf("%s: Sample modified its inputs", tt.name)
		}
		for i, c := range s.counts {
			if c != 0 {
				t.Fatalf("%s: counts[%d] = %d after Sample, want all zero", tt.name, i, c)
			}
		}
	}

	// Greedy sees the penalties: token 0 loses its lead, and the tie after
	// frequency/presence goes to the lower ID.
	var s Sampler
	if got := s.Sample([]float32{2, 1.5}, params(func(p *Params) { p.RepetitionPenalty = 2 }), []int32{0}, 0).Token; got != 1 {
		t.Errorf("repetition: greedy token %d, want 1", got)
	}
	if got := s.Sample([]float32{3, 2, 1}, params(func(p *Params) { p.FrequencyPenalty = 0.5; p.PresencePenalty = 0.25 }), []int32{0, 0, 0, 1}, 0).Token; got != 0 {
		t.Errorf("tie after penalties: greedy token %d, want 0", got)
	}
	// No state carries over: the same logits without history are unpenalised.
	if got := s.Sample([]float32{2, 1.5}, params(func(p *Params) { p.RepetitionPenalty = 2 }), nil, 0).Token; got != 0 {
		t.Errorf("after a penalised call: greedy token %d, want 0", got)
	}
}

func TestLogitBias(t *testing.T) {
	logits := []float32{5, 4, 3, 2}
	var s Sampler
	ban := params(func(p *Params) { p.LogitBias = map[int32]float32{0: -100} })
	if got := s.Sample(logits, ban, nil, 0).Token; got != 1 {
		t.Errorf("bias -100 on the argmax: greedy token %d, want 1", got)
	}
	ban.Temperature = 1
	force := params(func(p *Params) { p.Temperature = 1.5; p.LogitBias = map[int32]float32{3: 100} })
	for pos := range 2000 {
		if got := s.Sample(logits, ban, nil, pos).Token; got == 0 {
			t.Fatalf("position %d: drew banned token 0", pos)
		}
		if got := s.Sample(logits, force, nil, pos).Token; got != 3 {
			t.Fatalf("position %d: drew %d, want forced token 3", pos, got)
		}
	}
}

func TestDeterminism(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, 1000)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 2)
	}
	p := params(func(p *Params) { p.Temperature = 0.9; p.TopP = 0.95; p.Seed = 42 })
	var a, b Sampler
	first := make([]int32, 200)
	for pos := range first {
		first[pos] = a.Sample(logits, p, nil, pos).Token
	}
	// A fresh sampler, positions in reverse, interleaved with other calls.
	other := params(func(p *Params) { p.Temperature = 1; p.Seed = 9; p.TopK = 3 })
	for pos := len(first) - 1; pos >= 0; pos-- {
		b.Sample(logits[:10], other, []int32{1, 2}, pos+1000)
		if got := b.Sample(logits, p, nil, pos).Token; got != first[pos] {
			t.Fatalf("position %d: recomputed token %d, first time %d", pos, got, first[pos])
		}
	}
	// Another seed gives another sequence.
	p.Seed = 43
	same := 0
	for pos := range first {
		if a.Sample(logits, p, nil, pos).Token == first[pos] {
			same++
		}
	}
	if same == len(first) {
		t.Errorf("seeds 42 and 43 drew the same %d tokens", len(first))
	}
}

// TestDistribution draws once per position with a fixed seed and checks the
// frequencies against the probabilities with a chi-square statistic. The
// bound is the 99.99th percentile, and the seed is fixed, so the test is
// deterministic; a biased draw (or a poor hash) fails it.
func TestDistribution(t *testing.T) {
	const draws = 20000
	tests := []struct {
		name   string
		logits []float32
		mod    func(*Params)
		want   []float64 // expected probability per token
	}{
		{"temperature 1", logs(0.4, 0.25, 0.15, 0.1, 0.07, 0.03), func(p *Params) { p.Temperature = 1 },
			[]float64{0.4, 0.25, 0.15, 0.1, 0.07, 0.03}},
		// Temperature 0.5 squares the probabilities: 16, 9, 4, 1 over 30.
		{"temperature 0.5", logs(0.4, 0.3, 0.2, 0.1), func(p *Params) { p.Temperature = 0.5 },
			[]float64{16.0 / 30, 9.0 / 30, 4.0 / 30, 1.0 / 30}},
		// Top-k 3 drops 0.1 and renormalises; temperature 2 takes square roots.
		{"top-k 3, temperature 2", logs(0.36, 0.09, 0.25, 0.04), func(p *Params) { p.Temperature = 2; p.TopK = 3 },
			[]float64{0.6 / 1.4, 0.3 / 1.4, 0.5 / 1.4, 0}},
		{"ties", []float32{1, 1, 1, 1}, func(p *Params) { p.Temperature = 1; p.Seed = 12345 },
			[]float64{0.25, 0.25, 0.25, 0.25}},
	}
	// 99.99th percentiles of chi-square with df = 1..5.
	crit := []float64{0, 15.14, 18.42, 21.11, 23.51, 25.74}
	for _, tt := range tests {
		p := params(tt.mod)
		if p.Seed == 0 {
			p.Seed = 2024
		}
		var s Sampler
		counts := make([]int, len(tt.logits))
		for pos := range draws {
			counts[s.Sample(tt.logits, p, nil, pos).Token]++
		}
		chi2, df := 0.0, -1
		for i, c := range counts {
			e := tt.want[i] * draws
			if e == 0 {
				if c != 0 {
					t.Errorf("%s: token %d drawn %d times, want never", tt.name, i, c)
				}
				continue
			}
			chi2 += (float64(c) - e) * (float64(c) - e) / e
			df++
		}
		t.Logf("%s: chi-square %.2f (df %d, bound %.2f)", tt.name, chi2, df, crit[df])
		if chi2 > crit[df] {
			t.Errorf("%s: chi-square %.2f > %.2f (df %d); counts %v", tt.name, chi2, crit[df], df, counts)
		}
	}
}

func TestUniform(t *testing.T) {
	// In range, and roughly uniform across deciles for consecutive positions.
	var deciles [10]int
	for pos := range 100000 {
		u := uniform(7, pos)
		if u < 0 || u >= 1 {
			t.Fatalf("uniform(7, %d) = %v, out of [0, 1)", pos, u)
		}
		deciles[int(u*10)]++
	}
	for i, c := range deciles {
		if c < 9500 || c > 10500 {
			t.Errorf("decile %d has %d of 100000", i, c)
		}
	}
	if uniform(1, 5) == uniform(2, 5) || uniform(1, 5) == uniform(1, 6) {
		t.Error("uniform ignores seed or position")
	}
}

// TestEnsureSorted checks the lazy partial sort against a full sort, on
// logits with many ties, for many prefix lengths grown in steps.
func TestEnsureSorted(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 200 {
		n := 1 + rng.IntN(3000)
		var s Sampler
		s.grow(n)
		for i := range s.work {
			s.work[i] = float32(rng.IntN(1 + n/10)) // ties
		}
		want := make([]int32, n)
		for i := range want {
			want[i] = int32(i)
		}
		sortIDs(want, s.work)
		s.sorted = -1
		for k := 0; k < n; k += 1 + rng.IntN(n/3+1) {
			s.ensureSorted(k)
			if !slices.Equal(s.idx[:k], want[:k]) {
				t.Fatalf("trial %d, n %d: prefix %d differs from a full sort", trial, n, k)
			}
		}
		s.ensureSorted(n)
		if !slices.Equal(s.idx, want) {
			t.Fatalf("trial %d, n %d: full order differs", trial, n)
		}
	}
}

func TestAllocs(t *testing.T) {
	logits := benchLogits(32000)
	history := []int32{5, 17, 5, 31999, 200}
	tests := []struct {
		name string
		p    *Params
		want float64
	}{
		{"greedy", params(nil), 0},
		{"greedy without logprob", params(func(p *Params) { p.NoLogprob = true }), 0},
		{"top-k without logprob", params(func(p *Params) { p.Temperature = 0.8; p.TopK = 40; p.NoLogprob = true }), 0},
		{"top-p with penalties and bias", params(func(p *Params) {
			p.Temperature = 0.8
			p.TopP = 0.95
			p.RepetitionPenalty = 1.1
			p.FrequencyPenalty = 0.2
			p.LogitBias = map[int32]float32{3: -100, 7: 2}
		}), 0},
		{"top-k, min-p", params(func(p *Params) { p.Temperature = 1; p.TopK = 40; p.MinP = 0.05 }), 0},
		{"temperature only", params(func(p *Params) { p.Temperature = 1 }), 0},
		{"top logprobs", params(func(p *Params) { p.Temperature = 1; p.TopLogprobs = 5 }), 1},
	}
	for _, tt := range tests {
		var s Sampler
		s.Sample(logits, tt.p, history, 0)
		pos := 0
		got := testing.AllocsPerRun(50, func() {
			pos++
			s.Sample(logits, tt.p, history, pos)
		})
		if got != tt.want {
			t.Errorf("%s: %v allocations per Sample, want %v", tt.name, got, tt.want)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		mod   func(*Params)
		field string
		want  string // substring of the message: limit and value
	}{
		{func(p *Params) { p.Temperature = -0.1 }, "Temperature", ">= 0 and finite, got -0.1"},
		{func(p *Params) { p.Temperature = float32(math.NaN()) }, "Temperature", "got NaN"},
		{func(p *Params) { p.TopK = -1 }, "TopK", ">= 0 (0 is off), got -1"},
		{func(p *Params) { p.TopP = 0 }, "TopP", "in (0, 1] (1 is off), got 0"},
		{func(p *Params) { p.TopP = 1.5 }, "TopP", "got 1.5"},
		{func(p *Params) { p.MinP = -0.5 }, "MinP", "in [0, 1] (0 is off), got -0.5"},
		{func(p *Params) { p.RepetitionPenalty = 0 }, "RepetitionPenalty", "> 0 and finite (1 is off), got 0"},
		{func(p *Params) { p.FrequencyPenalty = 2.5 }, "FrequencyPenalty", "in [-2, 2], got 2.5"},
		{func(p *Params) { p.PresencePenalty = -3 }, "PresencePenalty", "in [-2, 2], got -3"},
		{func(p *Params) { p.TopLogprobs = 21 }, "TopLogprobs", "in [0, 20], got 21"},
		{func(p *Params) { p.LogitBias = map[int32]float32{5: 1, 1000: 1} }, "LogitBias", "in [0, 1000), got 1000"},
		{func(p *Params) { p.LogitBias = map[int32]float32{-1: 1} }, "LogitBias", "got -1"},
		{func(p *Params) { p.LogitBias = map[int32]float32{7: -101} }, "LogitBias[7]", "in [-100, 100], got -101"},
	}
	for _, tt := range tests {
		err := params(tt.mod).Validate(1000)
		var pe *ParamError
		if !errors.As(err, &pe) {
			t.Errorf("Validate = %v, want a *ParamError for %s", err, tt.field)
			continue
		}
		if pe.Field != tt.field || !strings.Contains(err.Error(), tt.field+" must be") || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Validate = %q (field %q), want field %s and %q", err, pe.Field, tt.field, tt.want)
		}
	}
	ok := params(func(p *Params) {
		p.Temperature = 0.7
		p.TopK = 50
		p.TopP = 0.9
		p.MinP = 0.05
		p.RepetitionPenalty = 1.1
		p.FrequencyPenalty = -2
		p.PresencePenalty = 2
		p.LogitBias = map[int32]float32{0: -100, 999: 100}
		p.TopLogprobs = 20
	})
	if err := ok.Validate(1000); err != nil {
		t.Errorf("Validate(valid) = %v", err)
	}
	if err := params(nil).Validate(0); err == nil {
		t.Error("Validate(vocab 0) = nil")
	}
}

// benchLogits returns a peaked row like an LLM's: the bulk of the vocabulary
// around 0 (standard deviation 1, about 2.5% of the probability), 50
// candidates 8 to 12 above it sharing the rest.
func benchLogits(n int) []float32 {
	rng := rand.New(rand.NewPCG(5, 6))
	l := make([]float32, n)
	for i := range l {
		l[i] = float32(rng.NormFloat64())
	}
	for range 50 {
		l[rng.IntN(n)] = float32(8 + 4*rng.Float64())
	}
	return l
}

func benchmarkSample(b *testing.B, mod func(*Params)) {
	logits := benchLogits(32000)
	history := []int32{1, 2, 3, 4, 5, 6, 7, 8}
	p := params(mod)
	var s Sampler
	pos := 0
	b.ReportAllocs()
	for b.Loop() {
		s.Sample(logits, p, history, pos)
		pos++
	}
}

func BenchmarkSampleGreedy(b *testing.B) { benchmarkSample(b, nil) }

func BenchmarkSampleTopP(b *testing.B) {
	benchmarkSample(b, func(p *Params) { p.Temperature = 0.8; p.TopP = 0.95 })
}

// BenchmarkSampleTopPFlat is top-p on unpeaked logits (standard normal), where
// 95% of the mass spreads over most of the vocabulary: the worst case.
func BenchmarkSampleTopPFlat(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 8))
	logits := make([]float32, 32000)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64())
	}
	p := params(func(p *Params) { p.Temperature = 0.8; p.TopP = 0.95 })
	var s Sampler
	pos := 0
	for b.Loop() {
		s.Sample(logits, p, nil, pos)
		pos++
	}
}

// BenchmarkSampleLlamaCpp uses llama.cpp's defaults: top-k 40, top-p 0.95,
// min-p 0.05, temperature 0.8, repetition penalty over the history.
func BenchmarkSampleLlamaCpp(b *testing.B) {
	benchmarkSample(b, func(p *Params) {
		p.Temperature = 0.8
		p.TopK = 40
		p.TopP = 0.95
		p.MinP = 0.05
		p.RepetitionPenalty = 1.1
	})
}

func BenchmarkSampleTemperature(b *testing.B) {
	benchmarkSample(b, func(p *Params) { p.Temperature = 1 })
}

// realLogits returns a row shaped like a real model's at vocabulary size n:
// the bulk normal with standard deviation 3, and a few peaks 12 to 22 above
// its mean that hold most of the probability.
func realLogits(n int, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 11))
	l := make([]float32, n)
	for i := range l {
		l[i] = float32(3 * rng.NormFloat64())
	}
	for range 10 {
		l[rng.IntN(n)] = float32(12 + 10*rng.Float64())
	}
	return l
}

// BenchmarkSample runs Sample on realistic rows at Llama 2's vocabulary size
// and Qwen2.5/3's (151,936; Llama 3's 128,256 sits between).
func BenchmarkSample(b *testing.B) {
	cases := []struct {
		name string
		mod  func(*Params)
	}{
		{"greedy", nil}, // Result.Logprob computed, as callers get it by default
		{"greedy-nologprob", func(p *Params) { p.NoLogprob = true }},
		{"greedy+top5", func(p *Params) { p.TopLogprobs = 5 }},
		{"t0.8+topp0.95", func(p *Params) { p.Temperature = 0.8; p.TopP = 0.95 }},
		{"t0.8+topk40", func(p *Params) { p.Temperature = 0.8; p.TopK = 40 }},
		{"t0.8+topk40-nologprob", func(p *Params) { p.Temperature = 0.8; p.TopK = 40; p.NoLogprob = true }},
	}
	for _, n := range []int{32000, 151936} {
		logits := realLogits(n, 1)
		for _, c := range cases {
			b.Run(fmt.Sprintf("vocab=%d/%s", n, c.name), func(b *testing.B) {
				p := params(c.mod)
				var s Sampler
				pos := 0
				b.ReportAllocs()
				for b.Loop() {
					s.Sample(logits, p, nil, pos)
					pos++
				}
			})
		}
	}
}
