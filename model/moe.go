package model

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/strata-llm/strata/model/gguf"
)

// Mixture of experts, as llama.cpp's graphs for qwen2moe, qwen3moe and for
// llama files with expert_count (Mixtral) compute it.
//
// Keys (arch-prefixed): expert_count (Experts; qwen2moe and qwen3moe
// require > 0), expert_used_count (ExpertsUsed, 1..Experts),
// expert_feed_forward_length (qwen2moe's and qwen3moe's ExpertFF;
// FF/ExpertsUsed when absent, as llama.cpp's loader; a llama file's experts
// are FF wide), expert_weights_norm (absent: false for qwen2moe, true for
// the others; llama.cpp's graphs take their architecture's value whatever
// the key says, strata follows the file), expert_gating_func (absent, 0 or
// 1: softmax; sigmoid and the others are refused), expert_weights_scale
// (absent, 0 or 1; others refused), expert_shared_feed_forward_length
// (qwen2moe's SharedFF, FF when absent; refused elsewhere when > 0) and
// expert_shared_count (qwen2moe: 0 or 1, its one shared expert; refused
// elsewhere when > 0).
//
// Tensors per layer: ffn_gate_inp (the router, Experts rows of Embd),
// ffn_gate_exps and ffn_up_exps (Experts × ExpertFF rows of Embd) and
// ffn_down_exps (Experts × Embd rows of ExpertFF), each expert's matrix a
// contiguous slice of the 3-D tensor that Load views without copying.
// qwen2moe adds its shared expert: ffn_gate_inp_shexp (one row of Embd, the
// shared expert's gate), ffn_gate_shexp and ffn_up_shexp (SharedFF rows of
// Embd) and ffn_down_shexp (Embd rows of SharedFF). The other
// architectures' files with shared-expert tensors are refused, as
// llama.cpp's loader refuses tensors their graphs do not use.
//
// Numerics. Each token's router logits are one MatMul row; their softmax
// takes the maximum, exp(l-max) in float32 summed in float64 in expert
// order, then every term times float32(1/sum), as ggml's soft_max does. The
// top ExpertsUsed probabilities are chosen in descending order, a tie going
// to the lower expert ID; with ExpertWeightsNorm their weights are divided
// by their sum (float64, in that order, at least 2^-14 as llama.cpp clamps
// it). The batch's rows are grouped by expert (ascending ID, tokens in batch
// order) so that each chosen expert's matrices stream once per batch; every
// expert output row is a MatMul row, which depends only on its input row.
// A token's FFN output is then weight×output of its first chosen expert,
// plus weight×output of the second, and so on in the chosen order, each
// product rounded to float32 before the add (llama.cpp's ggml_mul, then
// ggml_add over the chosen experts in order). A shared expert is a dense
// SwiGLU FFN over every token of the batch; its gate logit x (a MatMul row
// of ffn_gate_inp_shexp) becomes silu(x)/x = (x/(1+e^-x))/x, each step
// rounded to float32 as llama.cpp's graph computes the sigmoid, and the
// token's output gains float32(gate×shared[i]) after the routed sum. Nothing
// in a token's output depends on the other tokens of the batch.

// Limits on the experts a file may claim.
const (
	MaxExperts  = 1024
	MaxExpertFF = MaxFF
)

// expertNormMin is the least sum the chosen weights are divided by (the
// smallest normal half-precision value, llama.cpp's clamp).
const expertNormMin = 6.103515625e-5

// Expert is one expert's FFN: views of its slices of the layer's 3-D
// ffn_gate_exps, ffn_up_exps and ffn_down_exps tensors.
type Expert struct {
	Gate, Up, Down *Weight
}

// SharedExpert is a MoE layer's shared expert: a SwiGLU FFN every token
// takes, its output times sigmoid(GateInp·x).
type SharedExpert struct {
	GateInp        *Weight // ffn_gate_inp_shexp: one row of Embd
	Gate, Up, Down *Weight // ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp
}

// moeConfig reads the expert keys of c.Arch into c.
func moeConfig(f *gguf.File, c *Config) error {
	key := func(s string) string { return c.Arch + "." + s }
	uintKey := func(k string, limit int) (int, error) {
		if !f.Has(key(k)) {
			return 0, nil
		}
		v, err := f.Uint(key(k))
		if err != nil {
			return 0, err
		}
		if v > uint64(limit) {
			return 0, fmt.Errorf("model: %s = %d, want 0..%d", key(k), v, limit)
		}
		return int(v), nil
	}
	n, err := uintKey("expert_count", MaxExperts)
	if err != nil {
		return err
	}
	moeArch := c.Arch == "qwen2moe" || c.Arch == "qwen3moe"
	switch {
	case n == 0 && moeArch:
		return fmt.Errorf("model: %s must be > 0 for %s", key("expert_count"), c.Arch)
	case n == 0:
		return nil
	case c.Arch != "llama" && !moeArch:
		return fmt.Errorf("model: %s = %d: mixture-of-experts %s files are not supported (llama, qwen2moe and qwen3moe are)", key("expert_count"), n, c.Arch)
	}
	c.Experts = n
	if !f.Has(key("expert_used_count")) {
		return fmt.Errorf("model: %s is missing for %d experts", key("expert_used_count"), n)
	}
	if c.ExpertsUsed, err = uintKey("expert_used_count", n); err != nil {
		return err
	}
	if c.ExpertsUsed == 0 {
		return fmt.Errorf("model: %s = 0, want 1..%d", key("expert_used_count"), n)
	}
	c.ExpertFF = c.FF
	if moeArch {
		c.ExpertFF = c.FF / c.ExpertsUsed
		ff, err := uintKey("expert_feed_forward_length", MaxExpertFF)
		if err != nil {
			return err
		}
		if ff > 0 {
			c.ExpertFF = ff
		}
		if c.ExpertFF == 0 {
			return fmt.Errorf("model: %s is missing and %s %d / %s %d is 0", key("expert_feed_forward_length"), key("feed_forward_length"), c.FF, key("expert_used_count"), c.ExpertsUsed)
		}
	}
	c.ExpertWeightsNorm = c.Arch != "qwen2moe"
	if f.Has(key("expert_weights_norm")) {
		if c.ExpertWeightsNorm, err = f.Bool(key("expert_weights_norm")); err != nil {
			return err
		}
	}
	if f.Has(key("expert_gating_func")) {
		v, err := f.Uint(key("expert_gating_func"))
		if err != nil {
			return err
		}
		if v > 1 { // llama.cpp: 0 none (the architecture's default), 1 softmax, 2 sigmoid
			return fmt.Errorf("model: %s = %d: only softmax gating (0 or 1) is supported", key("expert_gating_func"), v)
		}
	}
	if f.Has(key("expert_weights_scale")) {
		v, err := f.Float(key("expert_weights_scale"))
		if err != nil {
			return err
		}
		if v != 0 && v != 1 {
			return fmt.Errorf("model: %s = %g: scaled expert weights are not supported", key("expert_weights_scale"), v)
		}
	}
	shared, err := uintKey("expert_shared_count", math.MaxInt32)
	if err != nil {
		return err
	}
	sharedFF, err := uintKey("expert_shared_feed_forward_length", MaxFF)
	if err != nil {
		return err
	}
	if c.Arch != "qwen2moe" {
		if shared > 0 {
			return fmt.Errorf("model: %s = %d: shared experts are supported in qwen2moe files only", key("expert_shared_count"), shared)
		}
		if sharedFF > 0 {
			return fmt.Errorf("model: %s = %d: shared experts are supported in qwen2moe files only", key("expert_shared_feed_forward_length"), sharedFF)
		}
		return nil
	}
	if shared > 1 {
		return fmt.Errorf("model: %s = %d: a qwen2moe layer has one shared expert", key("expert_shared_count"), shared)
	}
	c.SharedFF = cmp.Or(sharedFF, c.FF)
	return nil
}

// loadExperts finds layer i's router and experts.
func (m *Model) loadExperts(f *gguf.File, l *Layer, i int) error {
	name := func(s string) string { return fmt.Sprintf("blk.%d.%s", i, s) }
	refused := []string{"exp_probs_b.bias"}
	if m.SharedFF == 0 {
		refused = append(refused, "ffn_gate_inp_shexp.weight", "ffn_up_shexp.weight", "ffn_gate_shexp.weight", "ffn_down_shexp.weight")
	}
	for _, s := range refused {
		if _, err := f.Tensor(name(s)); err == nil {
			return fmt.Errorf("model: tensor %s: shared experts (outside qwen2moe) and expert biases are not supported", name(s))
		}
	}
	if m.SharedFF > 0 {
		if err := m.loadShared(f, l, i); err != nil {
			return err
		}
	}
	if _, err := f.Tensor(name("ffn_gate_exps.weight")); err != nil {
		if _, err := f.Tensor(name("ffn_gate.0.weight")); err == nil {
			return fmt.Errorf("model: tensor %s: experts stored as separate 2-D tensors (an old Mixtral conversion) are not supported; reconvert with llama.cpp's convert_hf_to_gguf.py", name("ffn_gate.0.weight"))
		}
	}
	var err error
	if l.Router, err = matrix(f, name("ffn_gate_inp.weight"), m.Experts, m.Embd); err != nil {
		return err
	}
	l.Experts = make([]Expert, m.Experts)
	for _, t := range []struct {
		name       string
		rows, cols int
		dst        func(e *Expert) **Weight
	}{
		{"ffn_gate_exps.weight", m.ExpertFF, m.Embd, func(e *Expert) **Weight { return &e.Gate }},
		{"ffn_up_exps.weight", m.ExpertFF, m.Embd, func(e *Expert) **Weight { return &e.Up }},
		{"ffn_down_exps.weight", m.Embd, m.ExpertFF, func(e *Expert) **Weight { return &e.Down }},
	} {
		ws, err := experts(f, name(t.name), m.Experts, t.rows, t.cols)
		if err != nil {
			return err
		}
		for e := range l.Experts {
			*t.dst(&l.Experts[e]) = ws[e]
		}
	}
	return nil
}

// loadShared finds layer i's shared expert (qwen2moe).
func (m *Model) loadShared(f *gguf.File, l *Layer, i int) error {
	name := func(s string) string { return fmt.Sprintf("blk.%d.%s", i, s) }
	sh := &SharedExpert{}
	var err error
	if sh.GateInp, err = rowVector(f, name("ffn_gate_inp_shexp.weight"), m.Embd); err != nil {
		return err
	}
	for _, t := range []struct {
		dst        **Weight
		name       string
		rows, cols int
	}{
		{&sh.Gate, "ffn_gate_shexp.weight", m.SharedFF, m.Embd},
		{&sh.Up, "ffn_up_shexp.weight", m.SharedFF, m.Embd},
		{&sh.Down, "ffn_down_shexp.weight", m.Embd, m.SharedFF},
	} {
		if *t.dst, err = matrix(f, name(t.name), t.rows, t.cols); err != nil {
			return err
		}
	}
	l.Shared = sh
	return nil
}

// rowVector finds a tensor of n elements, 1-D or one row of n, as a Weight
// of one row (a dot product with each token's hidden state).
func rowVector(f *gguf.File, name string, n int) (*Weight, error) {
	t, err := f.Tensor(name)
	if err != nil {
		return nil, err
	}
	if t.RowLen() != n || t.Rows() != 1 || len(t.Dims) > 2 {
		return nil, fmt.Errorf("model: tensor %q has shape %v, want [%d]", name, t.Dims, n)
	}
	if !slices.Contains(MatrixTypes, t.Type) {
		return nil, unsupportedType(name, t.Type)
	}
	return &Weight{Name: name, Type: t.Type, Rows: 1, Cols: n, Data: t.Data}, nil
}

// experts views a 3-D tensor of n matrices of rows×cols as n Weights, each
// its own contiguous slice of the tensor's data.
func experts(f *gguf.File, name string, n, rows, cols int) ([]*Weight, error) {
	t, err := f.Tensor(name)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(t.Dims, []uint64{uint64(cols), uint64(rows), uint64(n)}) {
		return nil, fmt.Errorf("model: tensor %q has shape %v, want [%d %d %d]", name, t.Dims, cols, rows, n)
	}
	if !slices.Contains(MatrixTypes, t.Type) {
		return nil, unsupportedType(name, t.Type)
	}
	if len(t.Data)%n != 0 {
		return nil, fmt.Errorf("model: tensor %q holds %d bytes, not %d equal experts", name, len(t.Data), n)
	}
	per := len(t.Data) / n
	ws := make([]*Weight, n)
	for e := range ws {
		ws[e] = &Weight{Name: fmt.Sprintf("%s[%d]", name, e), Type: t.Type, Rows: rows, Cols: cols, Data: t.Data[e*per : (e+1)*per : (e+1)*per]}
	}
	return ws, nil
}

// moeScratch is a Stage's scratch for mixture-of-experts layers, grown to
// the largest batch seen.
type moeScratch struct {
	logits   []float32 // T×Experts router logits
	sel      []int32   // T×ExpertsUsed chosen experts, in chosen order
	w        []float32 // their weights
	off      []int     // Experts+1: expert e's grouped rows are [off[e], off[e+1])
	next     []int     // Experts: the next free grouped row of each expert
	at       []int32   // T×ExpertsUsed: the grouped row of each choice
	slot     []int32   // grouped row → its choice t*ExpertsUsed+j
	xg       []float32 // grouped rows of the normalised hidden states
	gate, up []float32 // grouped expert hidden rows (ExpertFF each)
	y        []float32 // grouped expert outputs (Embd each)
	// The shared expert's, per token: gate logit, hidden rows (SharedFF
	// each) and output (Embd each).
	shLogit, shGate, shUp, shOut []float32
}

func (s *Stage) growMoE(T int) {
	m := s.m
	if m.Experts == 0 {
		return
	}
	g := func(b *[]float32, n int) {
		if cap(*b) < n {
			*b = make([]float32, n)
		}
		*b = (*b)[:n]
	}
	gi := func(b *[]int32, n int) {
		if cap(*b) < n {
			*b = make([]int32, n)
		}
		*b = (*b)[:n]
	}
	M := &s.moe
	E := m.Embd
	TK := T * m.ExpertsUsed
	g(&M.logits, T*m.Experts)
	g(&M.w, TK)
	gi(&M.sel, TK)
	gi(&M.at, TK)
	gi(&M.slot, TK)
	g(&M.xg, TK*E)
	g(&M.gate, TK*m.ExpertFF)
	g(&M.up, TK*m.ExpertFF)
	g(&M.y, TK*E)
	if m.SharedFF > 0 {
		g(&M.shLogit, T)
		g(&M.shGate, T*m.SharedFF)
		g(&M.shUp, T*m.SharedFF)
		g(&M.shOut, T*E)
	}
	if M.off == nil {
		M.off, M.next = make([]int, m.Experts+1), make([]int, m.Experts)
	}
}

// moeFFN sets s.out[:T×Embd] to the mixture-of-experts FFN of the
// normalised hidden states in s.h (see the numerics above).
func (s *Stage) moeFFN(T int) {
	m, L, M := s.m, s.L, &s.moe
	E, FF, K := m.Embd, m.ExpertFF, m.ExpertsUsed
	s.be.MatMul(L.Router, s.h[:T*E], T, M.logits[:T*m.Experts])
	s.be.Parallel(T, s.steps.route)
	// Group the choices by expert: a counting sort, tokens in batch order.
	off := M.off
	clear(off)
	for _, e := range M.sel[:T*K] {
		off[e+1]++
	}
	for e := 1; e <= m.Experts; e++ {
		off[e] += off[e-1]
	}
	next := M.next
	copy(next, off[:m.Experts])
	for c, e := range M.sel[:T*K] {
		r := next[e]
		next[e]++
		M.at[c], M.slot[r] = int32(r), int32(c)
	}
	s.be.Parallel(T*K, s.steps.gather)
	for e := range L.Experts {
		lo, hi := off[e], off[e+1]
		if lo == hi {
			continue
		}
		x := M.xg[lo*E : hi*E]
		s.be.MatMul(L.Experts[e].Gate, x, hi-lo, M.gate[lo*FF:hi*FF])
		s.be.MatMul(L.Experts[e].Up, x, hi-lo, M.up[lo*FF:hi*FF])
	}
	s.be.Parallel(T*K, s.steps.expertGLU)
	for e := range L.Experts {
		lo, hi := off[e], off[e+1]
		if lo == hi {
			continue
		}
		s.be.MatMul(L.Experts[e].Down, M.gate[lo*FF:hi*FF], hi-lo, M.y[lo*E:hi*E])
	}
	if sh := L.Shared; sh != nil {
		h, SF := s.h[:T*E], m.SharedFF
		s.be.MatMul(sh.GateInp, h, T, M.shLogit[:T])
		s.be.MatMul(sh.Gate, h, T, M.shGate[:T*SF])
		s.be.MatMul(sh.Up, h, T, M.shUp[:T*SF])
		s.be.Parallel(T, s.steps.sharedGLU)
		s.be.MatMul(sh.Down, M.shGate[:T*SF], T, M.shOut[:T*E])
	}
	s.be.Parallel(T, s.steps.combine)
}

// routeToken chooses token t's experts and their weights.
func (s *Stage) routeToken(_, t int) {
	m, M := s.m, &s.moe
	K := m.ExpertsUsed
	route(M.logits[t*m.Experts:(t+1)*m.Experts], m.ExpertWeightsNorm, M.sel[t*K:(t+1)*K], M.w[t*K:(t+1)*K])
}

// route turns one token's router logits into probabilities in place and
// sets sel and w to the len(sel) most probable experts, in descending order
// with ties to the lower ID, and their weights.
func route(p []float32, norm bool, sel []int32, w []float32) {
	mx := float32(math.Inf(-1))
	for _, v := range p {
		mx = max(mx, v)
	}
	var sum float64
	for i, v := range p {
		e := float32(math.Exp(float64(v - mx)))
		p[i] = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for i := range p {
		p[i] *= inv
	}
	for j := range sel {
		best := -1
		for i, v := range p {
			if slices.Contains(sel[:j], int32(i)) {
				continue
			}
			if best < 0 || v > p[best] {
				best = i
			}
		}
		sel[j], w[j] = int32(best), p[best]
	}
	if !norm {
		return
	}
	var ws float64
	for _, v := range w {
		ws += float64(v)
	}
	d := max(float32(ws), expertNormMin)
	for j := range w {
		w[j] /= d
	}
}

// gatherRow copies the hidden state of grouped row r's token into the
// grouped rows.
func (s *Stage) gatherRow(_, r int) {
	E := s.m.Embd
	t := int(s.moe.slot[r]) / s.m.ExpertsUsed
	copy(s.moe.xg[r*E:(r+1)*E], s.h[t*E:(t+1)*E])
}

func (s *Stage) expertGLURow(_, r int) {
	FF := s.m.ExpertFF
	s.be.SwiGLU(s.moe.gate[r*FF:(r+1)*FF], s.moe.up[r*FF:(r+1)*FF])
}

func (s *Stage) sharedGLUToken(_, t int) {
	SF := s.m.SharedFF
	s.be.SwiGLU(s.moe.shGate[t*SF:(t+1)*SF], s.moe.shUp[t*SF:(t+1)*SF])
}

// sharedGate is the shared expert's gate of logit x: sigmoid computed as
// llama.cpp's graph does, silu(x)/x, each step rounded to float32; at x = 0,
// where that is 0/0, the sigmoid's 1/2.
func sharedGate(x float32) float32 {
	if x == 0 {
		return 0.5
	}
	silu := x / (1 + float32(math.Exp(float64(-x))))
	return silu / x
}

// combineToken sums token t's weighted expert outputs into s.out in its
// chosen order, then adds its gated shared expert output, if any.
func (s *Stage) combineToken(_, t int) {
	m, M := s.m, &s.moe
	E, K := m.Embd, m.ExpertsUsed
	out := s.out[t*E : (t+1)*E]
	for j := 0; j < K; j++ {
		r := int(M.at[t*K+j])
		y, w := M.y[r*E:(r+1)*E], M.w[t*K+j]
		if j == 0 {
			for i := range out {
				out[i] = w * y[i]
			}
			continue
		}
		for i := range out {
			out[i] += float32(w * y[i]) // rounded before the add: no fused multiply-add
		}
	}
	if s.L.Shared != nil {
		g := sharedGate(M.shLogit[t])
		for i, y := range M.shOut[t*E : (t+1)*E] {
			out[i] += float32(g * y)
		}
	}
}
