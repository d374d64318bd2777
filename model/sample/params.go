package sample

import (
	"fmt"
	"math"
	"slices"
)

// Limits Validate enforces, as the OpenAI API defines them where it does.
const (
	MaxPenalty     = 2   // |FrequencyPenalty|, |PresencePenalty|
	MaxBias        = 100 // |LogitBias value|
	MaxTopLogprobs = 20
	// MaxConstraint bounds Params.Constraint: a response_format with its
	// JSON schema, compact.
	MaxConstraint = 64 << 10
)

// ParamError is a Params field that Validate rejects. Field is the Go field
// name; the HTTP layer maps it to the request's parameter name.
type ParamError struct {
	Field string // e.g. "TopP" or "LogitBias[50257]"
	Limit string // the constraint, e.g. "in (0, 1]"
	Value string // the value received
}

// Error names the field, the limit and the value.
func (e *ParamError) Error() string {
	return fmt.Sprintf("sample: %s must be %s, got %s", e.Field, e.Limit, e.Value)
}

// Validate checks p for a vocabulary of vocab tokens. It returns a
// *ParamError for the first field out of range.
func (p *Params) Validate(vocab int) error {
	bad := func(field, limit string, v any) error {
		return &ParamError{Field: field, Limit: limit, Value: fmt.Sprint(v)}
	}
	finite := func(f float32) bool { return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) }
	switch {
	case vocab <= 0:
		return bad("vocab", "> 0", vocab)
	case !finite(p.Temperature) || p.Temperature < 0:
		return bad("Temperature", ">= 0 and finite", p.Temperature)
	case p.TopK < 0:
		return bad("TopK", ">= 0 (0 is off)", p.TopK)
	case !(p.TopP > 0 && p.TopP <= 1):
		return bad("TopP", "in (0, 1] (1 is off)", p.TopP)
	case !(p.MinP >= 0 && p.MinP <= 1):
		return bad("MinP", "in [0, 1] (0 is off)", p.MinP)
	case !finite(p.RepetitionPenalty) || p.RepetitionPenalty <= 0:
		return bad("RepetitionPenalty", "> 0 and finite (1 is off)", p.RepetitionPenalty)
	case !(p.FrequencyPenalty >= -MaxPenalty && p.FrequencyPenalty <= MaxPenalty):
		return bad("FrequencyPenalty", fmt.Sprintf("in [-%d, %d]", MaxPenalty, MaxPenalty), p.FrequencyPenalty)
	case !(p.PresencePenalty >= -MaxPenalty && p.PresencePenalty <= MaxPenalty):
		return bad("PresencePenalty", fmt.Sprintf("in [-%d, %d]", MaxPenalty, MaxPenalty), p.PresencePenalty)
	case p.TopLogprobs < 0 || p.TopLogprobs > MaxTopLogprobs:
		return bad("TopLogprobs", fmt.Sprintf("in [0, %d]", MaxTopLogprobs), p.TopLogprobs)
	case len(p.Constraint) > MaxConstraint:
		return bad("Constraint", fmt.Sprintf("at most %d bytes", MaxConstraint), len(p.Constraint))
	case p.OutputStart < 0:
		return bad("OutputStart", ">= 0", p.OutputStart)
	case p.OutputEnd != 0 && p.OutputEnd <= p.OutputStart:
		return bad("OutputEnd", "0 or > OutputStart", p.OutputEnd)
	case len(p.Output) > 0 && len(p.Constraint) == 0:
		return bad("Output", "empty without a Constraint", len(p.Output))
	}
	for i, id := range p.Output {
		if id < 0 || int(id) >= vocab {
			return bad(fmt.Sprintf("Output[%d]", i), fmt.Sprintf("a token ID in [0, %d)", vocab), id)
		}
	}
	// Check bias entries in ID order so the error is deterministic.
	ids := make([]int32, 0, len(p.LogitBias))
	for id := range p.LogitBias {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if id < 0 || int(id) >= vocab {
			return bad("LogitBias", fmt.Sprintf("keyed by token IDs in [0, %d)", vocab), id)
		}
		if b := p.LogitBias[id]; !(b >= -MaxBias && b <= MaxBias) {
			return bad(fmt.Sprintf("LogitBias[%d]", id), fmt.Sprintf("in [-%d, %d]", MaxBias, MaxBias), b)
		}
	}
	return nil
}
