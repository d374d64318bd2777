package coordinator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/chat"
	"github.com/strata-llm/strata/model/gguf"
	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/model/tokenizer"
)

const (
	testModel   = "stories"
	testContext = 256
)

var (
	infoOnce sync.Once
	infoVal  *ModelInfo
	infoErr  error
)

// testInfo describes the real stories260K vocabulary (or, without the
// shared file, the demo model's) with a 256-token context.
func testInfo(t testing.TB) *ModelInfo {
	t.Helper()
	infoOnce.Do(func() {
		var f *gguf.File
		f, infoErr = gguf.Open("../../shared/models/stories260K.gguf")
		if errors.Is(infoErr, os.ErrNotExist) {
			f, infoErr = model.RandomFile(model.DemoSpec())
		}
		if infoErr != nil {
			return
		}
		defer f.Close()
		var tok *tokenizer.Tokenizer
		if tok, infoErr = tokenizer.FromGGUF(f); infoErr != nil {
			return
		}
		info := &ModelInfo{Name: testModel, Context: testContext, Vocab: tok.VocabSize(), Tokenizer: tok,
			Template: chat.Fallback(func(s string) bool { _, ok := tok.Lookup(s); return ok })}
		if id := tok.BOS(); id >= 0 {
			info.BOS = tok.Piece(id)
		}
		if id := tok.EOS(); id >= 0 {
			info.EOS = tok.Piece(id)
		}
		for id := range tok.VocabSize() {
			if tok.IsEOG(int32(id)) {
				info.Stop = append(info.Stop, int32(id))
			}
		}
		infoVal = info
	})
	if infoErr != nil {
		t.Skipf("no test model: %v", infoErr)
	}
	return infoVal
}

type harness struct {
	t    *testing.T
	srv  *Server
	http *httptest.Server
	eng  *Engine
	pipe *fakePipeline
	info *ModelInfo
	stop context.CancelFunc // stops the engine
}

type harnessOpts struct {
	cfg    ServerConfig
	engine func(*EngineConfig)
	ready  func() error
	blocks int
}

func newHarness(t *testing.T, o harnessOpts) *harness {
	t.Helper()
	info := testInfo(t)
	if o.blocks == 0 {
		o.blocks = 256
	}
	pipe := newFakePipeline(info.Vocab, o.blocks)
	ec := DefaultEngineConfig()
	ec.Sched.MaxModelLen = info.Context
	ec.Tick = 5 * time.Millisecond
	if o.engine != nil {
		o.engine(&ec)
	}
	eng, err := NewEngine(ec, pipe)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { pipe.run(ctx) })
	engCtx, stopEng := context.WithCancel(ctx)
	wg.Go(func() { eng.Run(engCtx) })
	srv := NewServer(o.cfg, eng, info, o.ready)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		pipe.resume()
		cancel()
		wg.Wait()
	})
	return &harness{t: t, srv: srv, http: hs, eng: eng, pipe: pipe, info: info, stop: stopEng}
}

// do sends a request and returns the response with its body read.
func (h *harness) do(method, path string, body any, hdr ...string) (*http.Response, []byte) {
	h.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			h.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, h.http.URL+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := h.http.Client().Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp, out
}

func (h *harness) post(path string, body any, hdr ...string) (*http.Response, []byte) {
	h.t.Helper()
	return h.do(http.MethodPost, path, body, hdr...)
}

// waitIdle waits until the engine runs nothing and the fake holds no
// sequence: every ending reached the pipeline as a tombstone.
func (h *harness) waitIdle() {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := h.eng.Stats()
		if st.Running == 0 && st.Waiting == 0 && st.KV.Used == 0 && h.pipe.liveSeqs() == 0 {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("not idle: running %d waiting %d kv used %d, fake live %d", st.Running, st.Waiting, st.KV.Used, h.pipe.liveSeqs())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type envelope struct {
	Error *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// checkEnvelope checks that body is OpenAI's error envelope, exactly.
func checkEnvelope(t *testing.T, body []byte) envelope {
	t.Helper()
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || len(raw) != 1 || raw["error"] == nil {
		t.Fatalf("not an error envelope: %s", body)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Errorf("envelope lacks %q: %s", k, body)
		}
	}
	var e envelope
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("bad envelope: %s", body)
	}
	return e
}

func TestHealthReadyModels(t *testing.T) {
	var notReady error
	var mu sync.Mutex
	h := newHarness(t, harnessOpts{ready: func() error { mu.Lock(); defer mu.Unlock(); return notReady }})

	resp, body := h.do("GET", "/healthz", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("healthz: %d %s", resp.StatusCode, body)
	}
	resp, body = h.do("GET", "/readyz", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("readyz: %d %s", resp.StatusCode, body)
	}
	resp, body = h.do("GET", "/v1/models", nil)
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &models); err != nil || resp.StatusCode != 200 || models.Object != "list" ||
		len(models.Data) != 1 || models.Data[0].ID != testModel || models.Data[0].Object != "model" {
		t.Fatalf("models: %d %s", resp.StatusCode, body)
	}
	if resp, body = h.do("GET", "/v1/models/"+testModel, nil); resp.StatusCode != 200 {
		t.Fatalf("model: %d %s", resp.StatusCode, body)
	}
	if resp, body = h.do("GET", "/v1/models/nope", nil); resp.StatusCode != 404 {
		t.Fatalf("unknown model card: %d %s", resp.StatusCode, body)
	}

	mu.Lock()
	notReady = errors.New("no pipeline: 1 of 2 shards")
	mu.Unlock()
	resp, body = h.do("GET", "/readyz", nil)
	e := checkEnvelope(t, body)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(e.Error.Message, "1 of 2 shards") {
		t.Fatalf("readyz not ready: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if resp, _ = h.do("GET", "/healthz", nil); resp.StatusCode != 200 {
		t.Fatalf("healthz while not ready: %d", resp.StatusCode)
	}
	resp, body = h.post("/v1/completions", map[string]any{"prompt": "Once", "max_tokens": 3})
	checkEnvelope(t, body)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("completion while not ready: %d %s", resp.StatusCode, body)
	}
	// Bad input is still answered as such.
	if resp, body = h.post("/v1/completions", `{"prompt": 5}`); resp.StatusCode != 400 {
		t.Fatalf("bad input while not ready: %d %s", resp.StatusCode, body)
	}
}

func TestRoutingAndRequestID(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	tests := []struct {
		method, path string
		body         any
		hdr          []string
		status       int
		wantID       string // "" means a generated one
	}{
		{"GET", "/nope", nil, nil, 404, ""},
		{"GET", "/v1/completions", nil, nil, 405, ""},
		{"POST", "/v1/models", "{}", nil, 405, ""},
		{"DELETE", "/healthz", nil, nil, 405, ""},
		{"GET", "/healthz", nil, []string{"X-Request-ID", "client-42.a:b_c-d"}, 200, "client-42.a:b_c-d"},
		{"GET", "/healthz", nil, []string{"X-Request-ID", "bad id with spaces"}, 200, ""},
		{"GET", "/healthz", nil, []string{"X-Request-ID", strings.Repeat("x", 200)}, 200, ""},
		{"POST", "/v1/completions", map[string]any{"prompt": "Hi", "max_tokens": 2}, []string{"X-Request-ID", "mine"}, 200, "mine"},
		{"POST", "/v1/completions", `{"prompt":`, nil, 400, ""},
		{"POST", "/tokenize", map[string]any{"prompt": "Hi"}, nil, 200, ""},
	}
	for _, tt := range tests {
		resp, body := h.do(tt.method, tt.path, tt.body, tt.hdr...)
		if resp.StatusCode != tt.status {
			t.Errorf("%s %s: status %d, want %d: %s", tt.method, tt.path, resp.StatusCode, tt.status, body)
		}
		id := resp.Header.Get("X-Request-ID")
		switch {
		case tt.wantID != "" && id != tt.wantID:
			t.Errorf("%s %s: X-Request-ID %q, want %q", tt.method, tt.path, id, tt.wantID)
		case tt.wantID == "" && (!strings.HasPrefix(id, "req-") || len(id) != 28):
			t.Errorf("%s %s: X-Request-ID %q, want a generated one", tt.method, tt.path, id)
		}
		if tt.status >= 400 {
			checkEnvelope(t, body)
		}
		if tt.status == 405 && resp.Header.Get("Allow") == "" {
			t.Errorf("%s %s: 405 without Allow", tt.method, tt.path)
		}
	}
	// Two requests get two IDs.
	r1, _ := h.do("GET", "/healthz", nil)
	r2, _ := h.do("GET", "/healthz", nil)
	if r1.Header.Get("X-Request-ID") == r2.Header.Get("X-Request-ID") {
		t.Error("two requests got the same X-Request-ID")
	}
}

func TestAuth(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: ServerConfig{APIKey: "sekret"}})
	good := map[string]any{"prompt": "Hi", "max_tokens": 2}
	tests := []struct {
		name, method, path string
		auth               string
		status             int
	}{
		{"no key", "POST", "/v1/completions", "", 401},
		{"wrong key", "POST", "/v1/completions", "Bearer nope", 401},
		{"key prefix", "POST", "/v1/completions", "Bearer sekre", 401},
		{"not bearer", "POST", "/v1/completions", "Basic sekret", 401},
		{"right key", "POST", "/v1/completions", "Bearer sekret", 200},
		{"lowercase scheme", "POST", "/v1/completions", "bearer sekret", 200},
		{"models needs key", "GET", "/v1/models", "", 401},
		{"tokenize needs key", "POST", "/tokenize", "", 401},
		{"unknown path needs key", "GET", "/nope", "", 401},
		{"healthz open", "GET", "/healthz", "", 200},
		{"readyz open", "GET", "/readyz", "", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hdr []string
			if tt.auth != "" {
				hdr = []string{"Authorization", tt.auth}
			}
			var body any
			if tt.method == "POST" {
				body = good
			}
			resp, out := h.do(tt.method, tt.path, body, hdr...)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, out)
			}
			if tt.status == 401 {
				e := checkEnvelope(t, out)
				if e.Error.Type != "authentication_error" || resp.Header.Get("WWW-Authenticate") == "" {
					t.Errorf("401 shape: %s %v", out, resp.Header)
				}
			}
			if resp.Header.Get("X-Request-ID") == "" {
				t.Error("no X-Request-ID")
			}
		})
	}
}

// TestBadInput sends the table of bad requests while good requests
// run beside them: each gets its 4xx in the envelope, naming the field, and
// every good request completes.
func TestBadInput(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	big := `{"prompt": "` + strings.Repeat("a", 10<<20) + `"}`
	longPrompt := make([]int, testContext+10)
	for i := range longPrompt {
		longPrompt[i] = 300
	}
	tests := []struct {
		name   string
		path   string
		body   string
		status int
		param  string   // "" means null
		want   []string // substrings of the message
	}{
		{"malformed JSON", "/v1/completions", `{"prompt": "hi",`, 400, "", []string{"malformed JSON"}},
		{"garbage", "/v1/completions", `not json`, 400, "", []string{"malformed JSON"}},
		{"empty body", "/v1/completions", ``, 400, "", []string{"empty"}},
		{"array body", "/v1/completions", `[{"prompt": "hi"}]`, 400, "", []string{"JSON object", "array"}},
		{"string body", "/v1/chat/completions", `"hi"`, 400, "", []string{"JSON object", "string"}},
		{"prompt wrong type", "/v1/completions", `{"prompt": {"a": 1}}`, 400, "prompt", []string{"prompt must be", "object"}},
		{"max_tokens string", "/v1/completions", `{"prompt": "hi", "max_tokens": "10"}`, 400, "max_tokens", []string{"max_tokens must be an integer", `"10"`}},
		{"max_tokens fraction", "/v1/completions", `{"prompt": "hi", "max_tokens": 1.5}`, 400, "max_tokens", []string{"integer", "1.5"}},
		{"max_tokens negative", "/v1/completions", `{"prompt": "hi", "max_tokens": -5}`, 400, "max_tokens", []string{"max_tokens must be >= 1, got -5"}},
		{"max_tokens zero", "/v1/completions", `{"prompt": "hi", "max_tokens": 0}`, 400, "max_tokens", []string{">= 1, got 0"}},
		{"max_tokens enormous", "/v1/completions", `{"prompt": "hi", "max_tokens": 9000}`, 400, "max_tokens", []string{"max_tokens must be <= ", "(context 256 minus prompt ", "got 9000"}},
		{"max_tokens huge", "/v1/completions", `{"prompt": "hi", "max_tokens": 1e300}`, 400, "max_tokens", []string{"got 1e+300"}},
		{"max_completion_tokens", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 100000}`, 400, "max_completion_tokens", []string{"max_completion_tokens must be <= "}},
		{"temperature negative", "/v1/completions", `{"prompt": "hi", "temperature": -1}`, 400, "temperature", []string{"temperature must be >= 0", "got -1"}},
		{"temperature string", "/v1/completions", `{"prompt": "hi", "temperature": "hot"}`, 400, "temperature", []string{"temperature must be a number"}},
		{"top_p > 1", "/v1/completions", `{"prompt": "hi", "top_p": 1.5}`, 400, "top_p", []string{"top_p must be in (0, 1]", "got 1.5"}},
		{"top_k negative", "/v1/completions", `{"prompt": "hi", "top_k": -3}`, 400, "top_k", []string{"top_k must be >= 0"}},
		{"presence_penalty", "/v1/completions", `{"prompt": "hi", "presence_penalty": 3}`, 400, "presence_penalty", []string{"presence_penalty must be in [-2, 2], got 3"}},
		{"logit_bias key", "/v1/completions", `{"prompt": "hi", "logit_bias": {"abc": 1}}`, 400, "logit_bias", []string{"token IDs"}},
		{"logit_bias id", "/v1/completions", `{"prompt": "hi", "logit_bias": {"99999": 1}}`, 400, "logit_bias", []string{"99999"}},
		{"logit_bias value", "/v1/completions", `{"prompt": "hi", "logit_bias": {"5": 101}}`, 400, "logit_bias", []string{"logit_bias[5] must be in [-100, 100], got 101"}},
		{"logprobs range", "/v1/completions", `{"prompt": "hi", "logprobs": 21}`, 400, "logprobs", []string{"logprobs must be in [0, 20], got 21"}},
		{"top_logprobs without logprobs", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}`, 400, "top_logprobs", []string{"requires logprobs"}},
		{"stream not bool", "/v1/completions", `{"prompt": "hi", "stream": "yes"}`, 400, "stream", []string{"stream must be a boolean"}},
		{"stream_options without stream", "/v1/completions", `{"prompt": "hi", "stream_options": {"include_usage": true}}`, 400, "stream_options", []string{"only allowed when stream is true"}},
		{"stop too many", "/v1/completions", `{"prompt": "hi", "stop": ["a","b","c","d","e"]}`, 400, "stop", []string{"stop must hold <= 4 strings, got 5"}},
		{"stop wrong type", "/v1/completions", `{"prompt": "hi", "stop": 5}`, 400, "stop", []string{"stop must be a string or an array"}},
		{"seed fraction", "/v1/completions", `{"prompt": "hi", "seed": 1.5}`, 400, "seed", []string{"seed must be"}},
		{"unknown model", "/v1/completions", `{"model": "gpt-4", "prompt": "hi"}`, 404, "model", []string{`"gpt-4" does not exist`}},
		{"unknown model chat", "/v1/chat/completions", `{"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}`, 404, "model", []string{"gpt-4"}},
		{"model wrong type", "/v1/completions", `{"model": 7, "prompt": "hi"}`, 400, "model", []string{"model must be a string"}},
		{"prompt too long", "/v1/completions", string(mustJSON(map[string]any{"prompt": longPrompt})), 400, "prompt", []string{"< 256 tokens", "got 266"}},
		{"prompt too long text", "/v1/completions", string(mustJSON(map[string]any{"prompt": strings.Repeat("Once upon a time ", 100)})), 400, "prompt", []string{"< 256 tokens"}},
		{"invalid UTF-8", "/v1/completions", "{\"prompt\": \"caf\xe9\"}", 400, "", []string{"UTF-8"}},
		{"token out of vocab", "/v1/completions", `{"prompt": [1, 5, 99999]}`, 400, "prompt", []string{"prompt[2] must be a token ID in [0, ", "got 99999"}},
		{"token negative", "/v1/completions", `{"prompt": [[1, -1]]}`, 400, "prompt[0]", []string{"got -1"}},
		{"token not integer", "/v1/completions", `{"prompt": [1, "x"]}`, 400, "prompt[1]", []string{"integer"}},
		{"empty prompt array", "/v1/completions", `{"prompt": []}`, 400, "prompt", []string{"must not be empty"}},
		{"no prompt", "/v1/completions", `{}`, 400, "prompt", []string{"prompt is required"}},
		{"two prompts", "/v1/completions", `{"prompt": ["a", "b"]}`, 400, "prompt", []string{"one prompt", "got 2"}},
		{"empty messages", "/v1/chat/completions", `{"messages": []}`, 400, "messages", []string{"messages must not be empty"}},
		{"no messages", "/v1/chat/completions", `{}`, 400, "messages", []string{"messages is required"}},
		{"messages not array", "/v1/chat/completions", `{"messages": {"role": "user"}}`, 400, "messages", []string{"array"}},
		{"message without role", "/v1/chat/completions", `{"messages": [{"content": "hi"}]}`, 400, "messages[0].role", []string{"messages[0].role is required"}},
		{"unknown role", "/v1/chat/completions", `{"messages": [{"role": "wizard", "content": "hi"}]}`, 400, "messages[0].role", []string{"must be one of", `"wizard"`}},
		{"role wrong type", "/v1/chat/completions", `{"messages": [{"role": 1, "content": "hi"}]}`, 400, "messages[0].role", []string{"role must be a string"}},
		{"message not object", "/v1/chat/completions", `{"messages": ["hi"]}`, 400, "messages[0]", []string{"messages[0] must be an object"}},
		{"image part", "/v1/chat/completions", `{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}`, 400, "messages[0].content[0]", []string{"image_url"}},
		{"n > 1", "/v1/completions", `{"prompt": "hi", "n": 2}`, 400, "n", []string{"n must be 1", "got 2"}},
		{"best_of", "/v1/completions", `{"prompt": "hi", "best_of": 3}`, 400, "best_of", []string{"best_of must be 1"}},
		{"suffix", "/v1/completions", `{"prompt": "hi", "suffix": "end"}`, 400, "suffix", []string{"suffix is not supported"}},
		{"echo with logprobs", "/v1/completions", `{"prompt": "hi", "echo": true, "logprobs": 1}`, 400, "echo", []string{"echo"}},
		{"tool name", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f g"}}]}`, 400, "tools[0].function.name", []string{"letters, digits"}},
		{"tool type", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "web_search"}]}`, 400, "tools[0].type", []string{"function"}},
		{"tool_choice without tools", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}`, 400, "tool_choice", []string{"needs tools"}},
		{"tool_choice unknown function", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}`, 400, "tool_choice", []string{`"g"`, "not in tools"}},
		{"tool parameters unsupported", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}}}}], "tool_choice": "required"}`, 400, "tools[1].function.parameters", []string{`"maximum"`, "#/properties/n"}},
		{"tools and response_format", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required", "response_format": {"type": "json_object"}}`, 400, "tool_choice", []string{"response_format"}},
		{"tool message without id", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "3"}]}`, 400, "messages[1].tool_call_id", []string{"required"}},
		{"functions", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f"}]}`, 400, "functions", []string{"functions is not supported"}},
		{"response_format unsupported keyword", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true, "schema": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}}, "required": ["a"]}}}}`, 400, "response_format", []string{`"minimum"`, "#/properties/a"}},
		{"response_format oneOf", "/v1/completions", `{"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}}`, 400, "response_format", []string{`"oneOf"`, "at #"}},
		{"response_format type", "/v1/completions", `{"prompt": "hi", "response_format": {"type": "xml"}}`, 400, "response_format", []string{"xml"}},
		{"response_format internal type", "/v1/completions", `{"prompt": "hi", "response_format": {"type": "wrapped", "prefix": "", "suffix": "", "schema": {}}}`, 400, "response_format", []string{"wrapped"}},
		{"response_format not object", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "response_format": "json"}`, 400, "response_format", []string{"must be an object"}},
		{"chat n > 1", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "n": 4}`, 400, "n", []string{"got 4"}},
		{"tokenize bad", "/tokenize", `{"prompt": 5}`, 400, "prompt", []string{"prompt must be a string"}},
		{"detokenize out of vocab", "/detokenize", `{"tokens": [1, 100000]}`, 400, "tokens", []string{"tokens[1] must be a token ID", "got 100000"}},
		{"detokenize no tokens", "/detokenize", `{}`, 400, "tokens", []string{"tokens is required"}},
		{"10 MB body", "/v1/completions", big, 413, "", []string{"<= 4194304 bytes"}},
		{"10 MB body chat", "/v1/chat/completions", big, 413, "", []string{"bytes"}},
	}

	// Good requests run throughout.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var goodMu sync.Mutex
	goodN, goodErr := 0, []string{}
	for i := range 3 {
		wg.Go(func() {
			for ctx.Err() == nil {
				path, body := "/v1/completions", `{"prompt": "Once upon a time", "max_tokens": 8}`
				if i == 1 {
					path, body = "/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": true}`
				}
				resp, err := http.Post(h.http.URL+path, "application/json", strings.NewReader(body))
				if err != nil {
					goodMu.Lock()
					goodErr = append(goodErr, err.Error())
					goodMu.Unlock()
					return
				}
				out, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				goodMu.Lock()
				goodN++
				if resp.StatusCode != 200 || bytes.Contains(out, []byte(`"error"`)) {
					goodErr = append(goodErr, string(out))
				}
				goodMu.Unlock()
			}
		})
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := h.post(tt.path, tt.body)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, body)
			}
			e := checkEnvelope(t, body)
			gotParam := ""
			if e.Error.Param != nil {
				gotParam = *e.Error.Param
			}
			if gotParam != tt.param {
				t.Errorf("param %q, want %q (%s)", gotParam, tt.param, e.Error.Message)
			}
			for _, w := range tt.want {
				if !strings.Contains(e.Error.Message, w) {
					t.Errorf("message %q lacks %q", e.Error.Message, w)
				}
			}
			wantType := map[int]string{400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error"}[tt.status]
			if e.Error.Type != wantType {
				t.Errorf("type %q, want %q", e.Error.Type, wantType)
			}
			if resp.Header.Get("X-Request-ID") == "" {
				t.Error("no X-Request-ID")
			}
		})
	}
	cancel()
	wg.Wait()
	if goodN == 0 || len(goodErr) > 0 {
		t.Fatalf("good requests: %d done, failures: %q", goodN, goodErr)
	}
	h.waitIdle()
	if st := h.eng.Stats(); st.PromptTokens == 0 {
		t.Fatal("good requests never reached the engine")
	}
}

// TestBadInputNeverReachesEngine checks that refused requests add nothing.
func TestBadInputNeverReachesEngine(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	for _, body := range []string{`{"prompt": [99999]}`, `{"prompt": "hi", "max_tokens": 9999}`, `{"prompt": "hi", "top_p": 2}`, `[]`} {
		if resp, out := h.post("/v1/completions", body); resp.StatusCode != 400 {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, out)
		}
	}
	if st := h.eng.Stats(); st.PromptTokens != 0 || st.Running+st.Waiting != 0 {
		t.Fatalf("bad input reached the engine: %+v", st)
	}
}

func TestPanicRecovered(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.srv.routes["/boom"] = route{http.MethodGet, func(*call) { panic("boom") }}
	resp, body := h.do("GET", "/boom", nil)
	e := checkEnvelope(t, body)
	if resp.StatusCode != 500 || e.Error.Type != "server_error" || resp.Header.Get("X-Request-ID") == "" {
		t.Fatalf("panic: %d %s", resp.StatusCode, body)
	}
	if resp, _ := h.do("GET", "/healthz", nil); resp.StatusCode != 200 {
		t.Fatal("server down after a panic")
	}
}

// TestQueueFull fills the waiting queue behind a paused pipeline: 429 with
// Retry-After.
func TestQueueFull(t *testing.T) {
	h := newHarness(t, harnessOpts{engine: func(c *EngineConfig) {
		c.Sched.MaxWaiting = 1
		c.Sched.MaxInFlight = 1
	}})
	h.pipe.pause()
	// One request in flight, one waiting (Submit returns once the loop has
	// queued it).
	var streams []*Stream
	for range 2 {
		st, err := h.eng.Submit(context.Background(), GenParams{Prompt: []int32{1, 300}, MaxTokens: 4, Sample: sample.DefaultParams()})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	resp, body := h.post("/v1/completions", `{"prompt": "Hi", "max_tokens": 4}`)
	e := checkEnvelope(t, body)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || e.Error.Type != "rate_limit_exceeded" {
		t.Fatalf("queue full: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	for _, st := range streams {
		st.Abort()
	}
	h.pipe.resume()
	h.waitIdle()
}

// TestTimeouts: a request that times out in the queue gets 503; one whose
// deadline passes after admission gets 504; in a stream, an error event and
// [DONE].
func TestTimeouts(t *testing.T) {
	h := newHarness(t, harnessOpts{
		cfg: ServerConfig{RequestTimeout: 300 * time.Millisecond},
		engine: func(c *EngineConfig) {
			c.Sched.MaxInFlight = 1
			c.Sched.QueueTimeout = 100 * time.Millisecond
		},
	})
	h.pipe.pause()
	type result struct {
		status int
		body   []byte
		hdr    http.Header
	}
	first := make(chan result, 1)
	go func() {
		resp, err := http.Post(h.http.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "Hi", "max_tokens": 4}`))
		if err != nil {
			first <- result{body: []byte(err.Error())}
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		first <- result{resp.StatusCode, body, resp.Header}
	}()
	waitFor(t, func() bool { return h.eng.Stats().Running == 1 })
	resp, body := h.post("/v1/completions", `{"prompt": "Hi", "max_tokens": 4}`) // waits behind the first
	e := checkEnvelope(t, body)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || e.Error.Type != "server_error" {
		t.Fatalf("queue timeout: %d %s", resp.StatusCode, body)
	}
	r := <-first
	checkEnvelope(t, r.body)
	if r.status != 504 {
		t.Fatalf("request timeout: %d %s", r.status, r.body)
	}

	// Streaming: the error comes as an event.
	resp, body = h.post("/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": true}`)
	events := sseEvents(t, body)
	if resp.StatusCode != 200 || len(events) < 2 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream timeout: %d %s", resp.StatusCode, body)
	}
	checkEnvelope(t, []byte(events[len(events)-2]))
	h.pipe.resume()
	h.waitIdle()
}

func TestEngineStopped(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.stop()
	waitFor(t, func() bool {
		select {
		case <-h.eng.stopped:
			return true
		default:
			return false
		}
	})
	resp, body := h.post("/v1/completions", `{"prompt": "Hi", "max_tokens": 4}`)
	checkEnvelope(t, body)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("stopped engine: %d %s", resp.StatusCode, body)
	}
}

func TestBodyLimit(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: ServerConfig{MaxBodyBytes: 100}})
	body := `{"prompt": "` + strings.Repeat("a", 200) + `"}`
	resp, out := h.post("/v1/completions", body)
	if resp.StatusCode != 413 {
		t.Fatalf("over limit: %d %s", resp.StatusCode, out)
	}
	checkEnvelope(t, out)
	// Without Content-Length the limit still holds.
	req, _ := http.NewRequest("POST", h.http.URL+"/v1/completions", io.MultiReader(strings.NewReader(body)))
	req.ContentLength = -1
	r2, err := h.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out, _ = io.ReadAll(r2.Body)
	r2.Body.Close()
	if r2.StatusCode != 413 {
		t.Fatalf("chunked over limit: %d %s", r2.StatusCode, out)
	}
	checkEnvelope(t, out)
	if resp, out := h.post("/v1/completions", `{"prompt": "Hi", "max_tokens": 2}`); resp.StatusCode != 200 {
		t.Fatalf("under limit: %d %s", resp.StatusCode, out)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// sseEvents splits an SSE body into its data payloads, checking the framing.
func sseEvents(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	blank := true
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			blank = true
			continue
		}
		if !blank || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("bad SSE framing at %q in %s", line, body)
		}
		blank = false
		out = append(out, strings.TrimPrefix(line, "data: "))
	}
	return out
}
