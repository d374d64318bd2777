package coordinator

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzCompletionRequest feeds arbitrary bodies to both generation endpoints'
// decoding: each must be refused with a 4xx in OpenAI's envelope or yield a
// request the engine can run; nothing panics. The full handler runs too,
// with a server that is not ready, so an accepted request ends in 503
// without an engine.
func FuzzCompletionRequest(f *testing.F) {
	for _, seed := range []string{
		`{"prompt": "Once upon a time", "max_tokens": 16}`,
		`{"prompt": [1, 2, 3], "stream": true, "stream_options": {"include_usage": true}}`,
		`{"prompt": [[5, 6]], "logprobs": 3, "stop": ["a", "b"], "seed": -7}`,
		`{"prompt": ["x"], "echo": true, "temperature": 0.5, "top_p": 0.9, "top_k": -1, "min_p": 0.1}`,
		`{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 2}`,
		`{"messages": [{"role": "system", "content": [{"type": "text", "text": "s"}]}, {"role": "user", "content": "u"}]}`,
		`{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "text"}, "logit_bias": {"3": -100}}`,
		`{"prompt": "hi", "max_tokens": 1e309}`,
		`{"prompt": "hi", "max_tokens": -0}`,
		`{"prompt": "hi", "presence_penalty": 1e39}`,
		`{"prompt": "\ud800"}`,
		`{"prompt": "", "response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]+$"}, "b": {"anyOf": [{"type": "integer"}, {"$ref": "#"}]}}, "required": ["a"]}}}}`,
		`{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}, "stream": true}`,
		`{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "2"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}], "tool_choice": "required", "parallel_tool_calls": false}`,
		`{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "f"}}}`,
		`[]`, `{`, `null`, ``, `{"prompt": null}`, `{"messages": [{}]}`,
	} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	info := testInfo(f)
	srv := NewServer(ServerConfig{}, nil, info, func() error { return errors.New("fuzzing") })
	h := srv.Handler()
	f.Fuzz(func(t *testing.T, body string, chatReq bool) {
		parse, path := srv.parseCompletion, "/v1/completions"
		if chatReq {
			parse, path = srv.parseChat, "/v1/chat/completions"
		}
		req, aerr := parse([]byte(body))
		if aerr != nil {
			if aerr.status < 400 || aerr.status >= 500 || aerr.msg == "" || aerr.typ == "" {
				t.Fatalf("bad refusal %+v", aerr)
			}
			if _, err := json.Marshal(aerr.envelope()); err != nil {
				t.Fatal(err)
			}
		} else {
			n := len(req.prompt)
			switch {
			case n == 0 || req.maxTokens < 1 || n+req.maxTokens > info.Context:
				t.Fatalf("accepted prompt %d + max_tokens %d (context %d)", n, req.maxTokens, info.Context)
			case len(req.stops) > maxStops:
				t.Fatalf("accepted %d stops", len(req.stops))
			case req.chat != chatReq:
				t.Fatal("chat flag")
			}
			for _, id := range req.prompt {
				if id < 0 || int(id) >= info.Vocab {
					t.Fatalf("accepted token %d", id)
				}
			}
			if err := req.sample.Validate(info.Vocab); err != nil {
				t.Fatalf("accepted invalid params: %v", err)
			}
		}

		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		want := http.StatusServiceUnavailable
		if aerr != nil {
			want = aerr.status
		}
		if w.Code != want {
			t.Fatalf("handler status %d, parse says %d: %s", w.Code, want, w.Body)
		}
		var env errorEnvelope
		if err := json.Unmarshal(w.Body.Bytes(), &env); err != nil || env.Error.Message == "" {
			t.Fatalf("not an envelope: %s", w.Body)
		}
		if w.Header().Get("X-Request-ID") == "" {
			t.Fatal("no X-Request-ID")
		}
	})
}
