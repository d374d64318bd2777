// Package sample picks the next token from a row of logits.
//
// Sample applies, in the order of llama.cpp's common sampler chain:
//
//  1. penalties over history: repetition (llama.cpp: a positive logit is
//     divided by RepetitionPenalty, a non-positive one multiplied), then
//     frequency and presence as OpenAI defines them
//     (logit -= count*FrequencyPenalty + (count > 0)*PresencePenalty);
//  2. LogitBias, added to the logit;
//  3. top-k, top-p, min-p, each keeping a prefix of the candidates sorted by
//     (logit descending, token ID ascending), top-p and min-p with
//     probabilities at temperature 1 (renormalised over the top-k survivors
//     for top-p, relative to the largest probability for min-p);
//  4. temperature, then one random draw.
//
// Temperature 0 is greedy: the argmax of the logits after steps 1 and 2, the
// lowest token ID winning a tie. Ties always go to the lower ID, in sorting
// and in argmax, so the result never depends on sort stability.
//
// The draw is counter-based: u = hash(Seed, position) is a uniform float64 in
// [0, 1), and the token is the first kept candidate, walking them in sorted
// order, at which the running sum of temperature-scaled weights exceeds u
// times their total. No random state is carried between calls, so
// recomputing a sequence (after preemption, on another shard) samples the
// same tokens from bit-identical logits (DESIGN.md "Numerics").
//
// Result.Logprob and Result.Top are log-softmax values of the logits after
// penalties and bias but before truncation and temperature, the "processed
// logits" vLLM can report: they describe what the model (plus the request's
// penalties and bias) predicts, not the truncated distribution the token was
// drawn from, so they stay finite for every token and comparable across
// sampling settings. A caller that will not read Result.Logprob says so with
// Params.NoLogprob; then, without TopLogprobs, greedy sampling and top-k or
// min-p without top-p look at each vocabulary entry only to copy it and
// compare it, with no exp.
//
// Cost. The definitions above speak of softmax over the whole vocabulary;
// Sample gives the same tokens with less. Besides passes that only copy and
// compare (finding the largest logit, gathering candidates), its work is in
// proportion to the candidates a request can reach, plus at most one sum of
// exponentials over the vocabulary, when the logprob, top-p without top-k or
// an untruncated draw needs it (a second for an untruncated draw at a
// temperature other than 1). That sum is the one inexact step: exp.go
// computes it with an inlined exp within a few ulps of math.Exp, together
// with a rigorous bound on its distance from the plain sum (math.Exp of each
// term, in token ID order). Top-p's target and the untruncated draw's total
// come from it; a running sum that lands within the bound of its target
// (about 1e-10 of the sum wide at 152k tokens) is settled by computing the
// plain sum, so the token is always the one the plain computation gives.
// Logprobs use the fast sum: they are the plain computation's float32 values
// except where the exact value lies within about 1e-15 of a float32 rounding
// boundary, where they can differ in the last bit. reference_test.go
// compares Sample with the plain computation.
//
// Contract:
//   - The caller checks Params with Validate at the edge; Sample assumes
//     valid Params and does not return errors.
//   - Sample never modifies logits or history. It keeps no per-sequence
//     state: one Sampler serves any number of sequences, one call at a time.
//   - A Sampler holds scratch buffers reused across calls, so after the first
//     call for a vocabulary size Sample allocates nothing except Result.Top,
//     which belongs to the caller. A Sampler is not safe for concurrent use;
//     use one per goroutine. The zero Sampler is ready to use.
//   - history holds the token IDs to penalise (the caller chooses the window;
//     llama.cpp uses the last 64). IDs outside the vocabulary are ignored.
//   - A NaN logit counts as -Inf and +Inf as the largest float32, as does a
//     logit a penalty takes past it. If every logit is -Inf, Sample returns
//     token 0 with Logprob -Inf.
package sample
