package main

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"testing"
)

// TestHTTPLogprobsThroughShards: through two real shard stages, a request
// that asks for logprobs gets the sampled token's and its alternatives
// (finite, the sampled one among the most likely), and the same request
// without them gets the same text: the last stage skips the logprob sum
// only when nobody will read it, and the token does not change.
func TestHTTPLogprobsThroughShards(t *testing.T) {
	s := startServe(t, "--model", stories, "--local-shards", "2", "--threads", "2", "--kv-memory", "1MiB")
	post := func(body map[string]any) (text string, lp *struct {
		Tokens        []string             `json:"tokens"`
		TokenLogprobs []float64            `json:"token_logprobs"`
		TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	}) {
		b, _ := json.Marshal(body)
		resp, err := http.Post(s.base+"/v1/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r struct {
			Choices []struct {
				Text     string `json:"text"`
				Logprobs *struct {
					Tokens        []string             `json:"tokens"`
					TokenLogprobs []float64            `json:"token_logprobs"`
					TopLogprobs   []map[string]float64 `json:"top_logprobs"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK || len(r.Choices) != 1 {
			t.Fatalf("status %d, %v: %+v", resp.StatusCode, err, r)
		}
		return r.Choices[0].Text, r.Choices[0].Logprobs
	}
	plain, none := post(map[string]any{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0})
	if none != nil {
		t.Errorf("logprobs without asking: %+v", none)
	}
	text, lp := post(map[string]any{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "logprobs": 3})
	if text != plain {
		t.Errorf("text with logprobs %q, without %q", text, plain)
	}
	if lp == nil || len(lp.TokenLogprobs) != 16 || len(lp.TopLogprobs) != 16 {
		t.Fatalf("logprobs: %+v", lp)
	}
	for i, v := range lp.TokenLogprobs {
		if math.IsNaN(v) || math.IsInf(v, 0) || v > 0 {
			t.Errorf("token %d (%q): logprob %v", i, lp.Tokens[i], v)
		}
		best := math.Inf(-1)
		for _, alt := range lp.TopLogprobs[i] {
			best = max(best, alt)
		}
		if len(lp.TopLogprobs[i]) == 0 || v < best-1e-6 {
			t.Errorf("token %d (%q): greedy logprob %v below the best alternative %v", i, lp.Tokens[i], v, best)
		}
	}
}
