package coordinator

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/strata-llm/strata/model/tokenizer"
)

type testCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Message      *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Logprobs json.RawMessage `json:"logprobs"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

// expectTokens is what the fake pipeline generates after prompt: each token
// the previous one plus 1, stopping after an end-of-generation token.
func expectTokens(info *ModelInfo, last int32, n int) []int32 {
	var out []int32
	for range n {
		last = (last + 1) % int32(info.Vocab)
		out = append(out, last)
		if isStop(info, last) {
			break
		}
	}
	return out
}

func isStop(info *ModelInfo, id int32) bool {
	for _, s := range info.Stop {
		if s == id {
			return true
		}
	}
	return false
}

// expectText is the text a Decoder renders for toks, without stop tokens.
func expectText(tok *tokenizer.Tokenizer, info *ModelInfo, toks []int32) string {
	d := tok.NewDecoder()
	var b strings.Builder
	for _, id := range toks {
		if !isStop(info, id) {
			b.WriteString(d.Add(id))
		}
	}
	b.WriteString(d.Flush())
	return b.String()
}

func decodeCompletion(t *testing.T, body []byte) testCompletion {
	t.Helper()
	var c testCompletion
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	return c
}

// textPrompt is a prompt of normal text tokens, so the fake's output (each
// token the last plus 1) is readable text.
const textPromptLast = 300

func TestCompletionNonStream(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	prompt := []int32{1, 290, textPromptLast}
	resp, body := h.post("/v1/completions", map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 10, "temperature": 0})
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	c := decodeCompletion(t, body)
	want := expectText(h.info.Tokenizer, h.info, expectTokens(h.info, textPromptLast, 10))
	if c.Object != "text_completion" || c.Model != testModel || !strings.HasPrefix(c.ID, "cmpl-") || c.Created == 0 || len(c.Choices) != 1 {
		t.Fatalf("shape: %s", body)
	}
	if diff := cmp.Diff(c.Choices[0].Text, want); diff != "" {
		t.Errorf("text (-got +want):\n%s", diff)
	}
	if *c.Choices[0].FinishReason != "length" || string(c.Choices[0].Logprobs) != "null" {
		t.Errorf("choice: %s", body)
	}
	if diff := cmp.Diff(*c.Usage, usage{3, 10, 13}); diff != "" {
		t.Errorf("usage (-got +want):\n%s", diff)
	}
	// A string prompt, the default max_tokens (what the context leaves).
	resp, body = h.post("/v1/completions", map[string]any{"prompt": "Once upon a time"})
	c = decodeCompletion(t, body)
	n := len(h.info.Tokenizer.Encode("Once upon a time", tokenizer.EncodeOptions{AddSpecial: true, ParseSpecial: true}))
	if resp.StatusCode != 200 || c.Usage.PromptTokens != n || c.Usage.CompletionTokens == 0 || c.Usage.TotalTokens != n+c.Usage.CompletionTokens {
		t.Fatalf("string prompt: %s", body)
	}
	// Echo prepends the prompt.
	_, body = h.post("/v1/completions", map[string]any{"prompt": "Once upon", "max_tokens": 3, "echo": true})
	if c = decodeCompletion(t, body); !strings.HasPrefix(c.Choices[0].Text, "Once upon") || len(c.Choices[0].Text) <= len("Once upon") {
		t.Errorf("echo: %s", body)
	}
	h.waitIdle()
}

// TestEndOfGeneration: the end-of-generation token ends the request with
// "stop" and is not rendered; it counts as a completion token.
func TestEndOfGeneration(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	if len(h.info.Stop) == 0 {
		t.Skip("vocabulary without end-of-generation tokens")
	}
	eog := h.info.Stop[0]
	start := (eog - 4 + int32(h.info.Vocab)) % int32(h.info.Vocab)
	_, body := h.post("/v1/completions", map[string]any{"prompt": []int32{start}, "max_tokens": 50})
	c := decodeCompletion(t, body)
	toks := expectTokens(h.info, start, 50)
	if *c.Choices[0].FinishReason != "stop" || c.Usage.CompletionTokens != len(toks) || c.Usage.CompletionTokens != 4 {
		t.Fatalf("eog: %s (want %d tokens)", body, len(toks))
	}
	if piece := h.info.Tokenizer.Piece(eog); piece != "" && strings.Contains(c.Choices[0].Text, piece) {
		t.Errorf("the end token %q was emitted: %q", piece, c.Choices[0].Text)
	}
	h.waitIdle()
}

// readStream reads an SSE response, checking the framing and [DONE].
func readStream(t *testing.T, body []byte) []testCompletion {
	t.Helper()
	events := sseEvents(t, body)
	if len(events) == 0 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %s", body)
	}
	var out []testCompletion
	for _, e := range events[:len(events)-1] {
		if strings.Contains(e, `"error"`) {
			t.Fatalf("error event: %s", e)
		}
		out = append(out, decodeCompletion(t, []byte(e)))
	}
	return out
}

func TestCompletionStream(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	prompt := []int32{1, textPromptLast}
	_, whole := h.post("/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 12})
	want := decodeCompletion(t, whole).Choices[0].Text
	for _, includeUsage := range []bool{false, true} {
		req := map[string]any{"prompt": prompt, "max_tokens": 12, "stream": true}
		if includeUsage {
			req["stream_options"] = map[string]any{"include_usage": true}
		}
		resp, body := h.post("/v1/completions", req)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("X-Request-ID") == "" {
			t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
		}
		chunks := readStream(t, body)
		var text strings.Builder
		finish := ""
		var u *usage
		for i, c := range chunks {
			if c.Object != "text_completion" || !strings.HasPrefix(c.ID, "cmpl-") || c.ID != chunks[0].ID {
				t.Fatalf("chunk %d shape: %+v", i, c)
			}
			if c.Usage != nil {
				u = c.Usage
				if i != len(chunks)-1 || len(c.Choices) != 0 {
					t.Errorf("usage chunk %d of %d with %d choices", i, len(chunks), len(c.Choices))
				}
				continue
			}
			text.WriteString(c.Choices[0].Text)
			if fr := c.Choices[0].FinishReason; fr != nil {
				finish = *fr
			}
		}
		if text.String() != want || finish != "length" {
			t.Errorf("stream text %q finish %q, want %q length", text.String(), finish, want)
		}
		if includeUsage != (u != nil) || (u != nil && *u != (usage{2, 12, 14})) {
			t.Errorf("include_usage %v: usage %+v", includeUsage, u)
		}
		if includeUsage && !strings.Contains(string(body), `"usage":null`) {
			t.Errorf("include_usage: chunks before the last should carry usage null")
		}
	}
	h.waitIdle()
}

func TestChat(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	msgs := []map[string]any{
		{"role": "system", "content": "You tell stories."},
		{"role": "user", "content": []map[string]any{{"type": "text", "text": "Once upon"}, {"type": "text", "text": " a time"}}},
	}
	resp, body := h.post("/v1/chat/completions", map[string]any{"model": "", "messages": msgs, "max_completion_tokens": 6})
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	c := decodeCompletion(t, body)
	if c.Object != "chat.completion" || !strings.HasPrefix(c.ID, "chatcmpl-") || len(c.Choices) != 1 || c.Choices[0].Message == nil ||
		c.Choices[0].Message.Role != "assistant" || c.Usage.CompletionTokens > 6 ||
		*c.Choices[0].FinishReason != map[bool]string{true: "length", false: "stop"}[c.Usage.CompletionTokens == 6] {
		t.Fatalf("chat shape: %s", body)
	}
	// The prompt is the template's rendering with one BOS.
	_, tb := h.post("/tokenize", map[string]any{"messages": msgs})
	var tk struct {
		Tokens []int32 `json:"tokens"`
		Count  int     `json:"count"`
	}
	if err := json.Unmarshal(tb, &tk); err != nil || tk.Count != c.Usage.PromptTokens || tk.Count != len(tk.Tokens) {
		t.Fatalf("tokenize messages %s vs usage %+v", tb, c.Usage)
	}
	if bos := h.info.Tokenizer.BOS(); bos >= 0 && len(tk.Tokens) > 1 && tk.Tokens[0] == bos && tk.Tokens[1] == bos {
		t.Errorf("double BOS: %v", tk.Tokens[:4])
	}

	// Streamed: a role chunk, content chunks, a final chunk, usage, [DONE].
	_, body = h.post("/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 6, "stream": true,
		"stream_options": map[string]any{"include_usage": true}})
	chunks := readStream(t, body)
	if len(chunks) < 3 || chunks[0].Choices[0].Delta.Role != "assistant" {
		t.Fatalf("chat stream: %s", body)
	}
	var text strings.Builder
	finish := ""
	for _, ch := range chunks {
		if ch.Object != "chat.completion.chunk" {
			t.Fatalf("chunk object %q", ch.Object)
		}
		if len(ch.Choices) == 0 {
			continue
		}
		if d := ch.Choices[0].Delta; d != nil && d.Content != nil {
			text.WriteString(*d.Content)
		}
		if fr := ch.Choices[0].FinishReason; fr != nil {
			finish = *fr
		}
	}
	last := chunks[len(chunks)-1]
	if text.String() != c.Choices[0].Message.Content || finish != *c.Choices[0].FinishReason || last.Usage == nil || *last.Usage != *c.Usage {
		t.Errorf("chat stream text %q finish %q usage %+v; want %q length %+v", text.String(), finish, last.Usage, c.Choices[0].Message.Content, c.Usage)
	}
	h.waitIdle()
}

// TestStopStrings: stop strings that span token boundaries end the request
// with "stop", are not emitted, and free the request at once.
func TestStopStrings(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	tok := h.info.Tokenizer
	toks := expectTokens(h.info, textPromptLast, 30)
	full := expectText(tok, h.info, toks)
	// Find a token boundary deep in the text and a stop string across it.
	d := tok.NewDecoder()
	var pos []int
	n := 0
	for _, id := range toks {
		n += len(d.Add(id))
		pos = append(pos, n)
	}
	b := pos[5] // end of the sixth token's text
	if b < 2 || b+2 > len(full) {
		t.Skipf("text too short: %q", full)
	}
	stop := full[b-2 : b+2]
	if strings.Index(full, stop) != b-2 {
		t.Skipf("stop %q occurs earlier in %q", stop, full)
	}
	want := full[:b-2]
	// The token whose text completes the stop string is the last one the
	// request counts: the seventh where tokens are several bytes long
	// (stories260K's), later where they are single characters (the
	// random demo model's vocabulary, when ../shared is not there).
	wantTokens := 0
	for i, p := range pos {
		if p >= b+2 {
			wantTokens = i + 1
			break
		}
	}
	for _, stream := range []bool{false, true} {
		for _, chat := range []bool{false, true} {
			req := map[string]any{"max_tokens": 30, "stop": []string{"zzzzqq", stop}, "stream": stream}
			path := "/v1/completions"
			if chat {
				path = "/v1/chat/completions"
				req["messages"] = []map[string]any{{"role": "user", "content": "x"}}
				// Chat prompts end with other tokens; the completion path
				// is checked exactly, chat only for the stop.
			} else {
				req["prompt"] = []int32{1, textPromptLast}
			}
			resp, body := h.post(path, req)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			var text, finish string
			var u *usage
			if stream {
				for _, c := range readStream(t, body) {
					if c.Usage != nil {
						u = c.Usage
					}
					if len(c.Choices) == 0 {
						continue
					}
					text += c.Choices[0].Text
					if d := c.Choices[0].Delta; d != nil && d.Content != nil {
						text += *d.Content
					}
					if fr := c.Choices[0].FinishReason; fr != nil {
						finish = *fr
					}
				}
			} else {
				c := decodeCompletion(t, body)
				text, finish, u = c.Choices[0].Text, *c.Choices[0].FinishReason, c.Usage
				if chat {
					text = c.Choices[0].Message.Content
				}
			}
			if strings.Contains(text, stop) {
				t.Errorf("stream=%v chat=%v: stop string %q emitted in %q", stream, chat, stop, text)
			}
			if !chat {
				if text != want || finish != "stop" {
					t.Errorf("stream=%v: text %q finish %q, want %q stop", stream, text, finish, want)
				}
				if u != nil && u.CompletionTokens != wantTokens {
					t.Errorf("stream=%v: %d completion tokens, want %d (through the token completing the stop)", stream, u.CompletionTokens, wantTokens)
				}
			}
		}
	}
	h.waitIdle()
	if h.pipe.tombsFor("finished") == 0 {
		t.Error("no finished tombstones reached the pipeline")
	}
}

func (f *fakePipeline) tombsFor(reason string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tombs[reason]
}

func TestLogprobs(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	tok := h.info.Tokenizer
	toks := expectTokens(h.info, textPromptLast, 4)

	_, body := h.post("/v1/completions", map[string]any{"prompt": []int32{textPromptLast}, "max_tokens": 4, "logprobs": 2})
	var c struct {
		Choices []struct {
			Text     string `json:"text"`
			Logprobs struct {
				Tokens        []string             `json:"tokens"`
				TokenLogprobs []float64            `json:"token_logprobs"`
				TopLogprobs   []map[string]float64 `json:"top_logprobs"`
				TextOffset    []int                `json:"text_offset"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatal(err)
	}
	lp := c.Choices[0].Logprobs
	if len(lp.Tokens) != 4 || len(lp.TokenLogprobs) != 4 || len(lp.TopLogprobs) != 4 || len(lp.TextOffset) != 4 {
		t.Fatalf("completion logprobs: %s", body)
	}
	for i, id := range toks {
		if lp.Tokens[i] != string(tok.TokenBytes(id)) || lp.TokenLogprobs[i] != float64(fakeLogprob(id)) || len(lp.TopLogprobs[i]) == 0 {
			t.Errorf("token %d: %q %v %v", i, lp.Tokens[i], lp.TokenLogprobs[i], lp.TopLogprobs[i])
		}
		if !strings.HasPrefix(c.Choices[0].Text[lp.TextOffset[i]:], lp.Tokens[i]) {
			t.Errorf("text_offset %d of %q does not start %q", lp.TextOffset[i], c.Choices[0].Text, lp.Tokens[i])
		}
	}

	_, body = h.post("/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "hi"}},
		"max_tokens": 3, "logprobs": true, "top_logprobs": 3})
	var cc struct {
		Choices []struct {
			Logprobs struct {
				Content []struct {
					Token       string  `json:"token"`
					Logprob     float64 `json:"logprob"`
					Bytes       []int   `json:"bytes"`
					TopLogprobs []struct {
						Token   string  `json:"token"`
						Logprob float64 `json:"logprob"`
						Bytes   []int   `json:"bytes"`
					} `json:"top_logprobs"`
				} `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &cc); err != nil {
		t.Fatal(err)
	}
	content := cc.Choices[0].Logprobs.Content
	if len(content) != 3 {
		t.Fatalf("chat logprobs: %s", body)
	}
	for _, e := range content {
		if len(e.TopLogprobs) != 3 || e.TopLogprobs[0].Token != e.Token || e.TopLogprobs[0].Logprob != e.Logprob || len(e.Bytes) == 0 && e.Token != "" {
			t.Errorf("chat logprob entry: %+v", e)
		}
	}
	// Streamed chat logprobs ride on the chunks.
	_, body = h.post("/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "hi"}},
		"max_tokens": 3, "logprobs": true, "stream": true})
	if n := strings.Count(string(body), `"logprob":`); n != 3 {
		t.Errorf("streamed chat: %d logprob entries, want 3: %s", n, body)
	}
	h.waitIdle()
}

func TestTokenizeDetokenize(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	tok := h.info.Tokenizer
	text := "Once upon a time"
	withSpecial := tok.Encode(text, tokenizer.EncodeOptions{AddSpecial: true, ParseSpecial: true})
	plain := tok.Encode(text, tokenizer.EncodeOptions{ParseSpecial: true})
	tests := []struct {
		name string
		req  map[string]any
		want []int32
	}{
		{"vllm default", map[string]any{"prompt": text}, withSpecial},
		{"vllm no special", map[string]any{"prompt": text, "add_special_tokens": false}, plain},
		{"llama.cpp default", map[string]any{"content": text}, plain},
		{"llama.cpp add_special", map[string]any{"content": text, "add_special": true}, withSpecial},
	}
	for _, tt := range tests {
		resp, body := h.post("/tokenize", tt.req)
		var got struct {
			Tokens      []int32 `json:"tokens"`
			Count       int     `json:"count"`
			MaxModelLen int     `json:"max_model_len"`
		}
		if err := json.Unmarshal(body, &got); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", tt.name, resp.StatusCode, body)
		}
		if diff := cmp.Diff(got.Tokens, tt.want); diff != "" || got.Count != len(tt.want) || got.MaxModelLen != testContext {
			t.Errorf("%s: %s (-got +want):\n%s", tt.name, body, diff)
		}
	}
	_, body := h.post("/tokenize", map[string]any{"content": text, "with_pieces": true})
	var pieces struct {
		Tokens []struct {
			ID    int32  `json:"id"`
			Piece string `json:"piece"`
		} `json:"tokens"`
	}
	if err := json.Unmarshal(body, &pieces); err != nil || len(pieces.Tokens) != len(plain) {
		t.Fatalf("with_pieces: %s", body)
	}
	var joined strings.Builder
	for _, p := range pieces.Tokens {
		joined.WriteString(p.Piece)
	}
	if strings.TrimSpace(joined.String()) != text {
		t.Errorf("pieces join to %q", joined.String())
	}
	resp, body := h.post("/detokenize", map[string]any{"tokens": withSpecial})
	var dt struct{ Prompt, Content string }
	if err := json.Unmarshal(body, &dt); err != nil || resp.StatusCode != 200 || dt.Prompt != text || dt.Content != text {
		t.Fatalf("detokenize: %d %s", resp.StatusCode, body)
	}
	if st := h.eng.Stats(); st.PromptTokens != 0 {
		t.Error("tokenize reached the engine")
	}
}

// TestClientDisconnect: a client that goes away mid-stream, or while a
// non-stream request runs, aborts its request: its KV is freed and the
// pipeline gets its tombstone.
func TestClientDisconnect(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.pipe.setDelay(2 * time.Millisecond)
	for _, stream := range []bool{true, false} {
		ctx, cancel := context.WithCancel(context.Background())
		body := `{"prompt": [1, 300], "max_tokens": 200, "stream": ` + map[bool]string{true: "true", false: "false"}[stream] + `}`
		req, _ := http.NewRequestWithContext(ctx, "POST", h.http.URL+"/v1/completions", strings.NewReader(body))
		if !stream {
			before := h.eng.Stats().GeneratedTokens
			go func() {
				for h.eng.Stats().GeneratedTokens < before+5 && ctx.Err() == nil {
					time.Sleep(time.Millisecond)
				}
				cancel()
			}()
		}
		resp, err := h.http.Client().Do(req)
		if stream {
			if err != nil {
				t.Fatal(err)
			}
			rd := bufio.NewReader(resp.Body)
			for range 6 { // a few events in
				if _, err := rd.ReadString('\n'); err != nil {
					t.Fatal(err)
				}
			}
			if st := h.eng.Stats(); st.Running != 1 {
				t.Fatalf("running %d mid-stream", st.Running)
			}
			cancel()
			resp.Body.Close()
		} else {
			if err == nil {
				t.Fatalf("non-stream finished before the disconnect: %d", resp.StatusCode)
			}
		}
		h.waitIdle()
		cancel()
	}
	if got := h.pipe.tombsFor("aborted"); got != 2 {
		t.Errorf("%d aborted tombstones, want 2", got)
	}
	// The server still serves.
	if resp, body := h.post("/v1/completions", `{"prompt": "Hi", "max_tokens": 2}`); resp.StatusCode != 200 {
		t.Fatalf("after disconnects: %d %s", resp.StatusCode, body)
	}
}

// TestSeedsAndSampling: the sampling fields reach the pipeline as Params.
func TestSamplingParams(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	req, aerr := h.srv.parseCompletion(mustJSON(map[string]any{
		"prompt": "Hi", "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": -1,
		"presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
		"logit_bias": map[string]float64{"5": -100, "7": 2.5}, "user": "u1", "n": 1, "best_of": 1,
		"stop": "x", "max_tokens": 9,
	}))
	if aerr != nil {
		t.Fatal(aerr)
	}
	p := req.sample
	if p.Temperature != 0.7 || p.TopP != 0.9 || p.TopK != 40 || p.MinP != 0.05 || p.Seed != ^uint64(0) ||
		p.PresencePenalty != 0.5 || p.FrequencyPenalty != -0.5 || p.RepetitionPenalty != 1.1 ||
		p.LogitBias[5] != -100 || p.LogitBias[7] != 2.5 || req.maxTokens != 9 || len(req.stops) != 1 || req.seedRandom {
		t.Errorf("params: %+v %+v", p, req)
	}
	r1, _ := h.srv.parseCompletion([]byte(`{"prompt": "Hi"}`))
	r2, _ := h.srv.parseCompletion([]byte(`{"prompt": "Hi"}`))
	if !r1.seedRandom || r1.sample.Seed == r2.sample.Seed || r1.sample.Temperature != 1 {
		t.Errorf("default seed/temperature: %+v %+v", r1.sample, r2.sample)
	}
}

// TestStopHoldBack checks release directly: text that may start a stop
// string is held back and released when it turns out not to.
func TestStopHoldBack(t *testing.T) {
	g := &genRun{req: &genRequest{stops: []string{"END", "xyz"}}, st: &Stream{}}
	var out []string
	for _, piece := range []string{"ab", "cE", "N", "o more", " x", "y", "z!"} {
		g.pending += piece
		out = append(out, g.release(false))
		if g.finish != "" {
			break
		}
	}
	want := []string{"ab", "c", "", "ENo more", " ", "", ""}
	if diff := cmp.Diff(out, want); diff != "" || g.finish != "stop" {
		t.Errorf("release (-got +want):\n%s finish %q", diff, g.finish)
	}
}
