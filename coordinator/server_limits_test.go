package coordinator

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// rawRequest opens a connection to h's server and writes head (a request
// line and headers, CRLF-terminated, without the blank line) and then body.
func rawRequest(t *testing.T, h *harness, head, body string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", h.http.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, head+"\r\n"+body); err != nil {
		t.Fatal(err)
	}
	return conn
}

// readResponse reads one response from conn within 10 s.
func readResponse(t *testing.T, conn net.Conn) (*http.Response, string) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading the response body: %v", err)
	}
	return resp, string(b)
}

// closedByServer waits up to 10 s for the server to close conn.
func closedByServer(t *testing.T, conn net.Conn) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Fatalf("the server did not close the connection: %v", err)
	}
}

// TestAuthBeforeBody: without the API key, a request announcing a large
// body gets its 401 before sending a byte of it, and the server closes the
// connection instead of waiting to drain the body.
func TestAuthBeforeBody(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: ServerConfig{APIKey: "sekret"}})
	conn := rawRequest(t, h, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n", "")
	resp, body := readResponse(t, conn)
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("got %d (close %v) %s, want 401 and Connection: close", resp.StatusCode, resp.Close, body)
	}
	if e := checkEnvelope(t, []byte(body)); *e.Error.Code != "invalid_api_key" {
		t.Errorf("code %q", *e.Error.Code)
	}
	closedByServer(t, conn)
}

// TestSlowBody: a client that sends a body slower than BodyTimeout gets a
// 408 in OpenAI's envelope and its connection closed, while another
// request is served meanwhile.
func TestSlowBody(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: ServerConfig{BodyTimeout: 300 * time.Millisecond}})
	conn := rawRequest(t, h, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n", `{"prompt": "Once`)
	if resp, body := h.post("/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 4}); resp.StatusCode != http.StatusOK {
		t.Fatalf("good request beside the slow one: %d %s", resp.StatusCode, body)
	}
	resp, body := readResponse(t, conn)
	if resp.StatusCode != http.StatusRequestTimeout || !resp.Close {
		t.Fatalf("got %d (close %v) %s, want 408 and Connection: close", resp.StatusCode, resp.Close, body)
	}
	if e := checkEnvelope(t, []byte(body)); *e.Error.Code != "request_timeout" || !strings.Contains(e.Error.Message, "300ms") {
		t.Errorf("envelope %s", body)
	}
	closedByServer(t, conn)
	h.waitIdle()
}

// TestBodyDeadlineLifted: the body's read deadline does not outlive the
// body: a stream that runs longer than BodyTimeout is not cut off.
func TestBodyDeadlineLifted(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: ServerConfig{BodyTimeout: 100 * time.Millisecond}})
	h.pipe.setDelay(10 * time.Millisecond)
	start := time.Now()
	resp, body := h.post("/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 40, "stream": true, "ignore_eos": true})
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "data: [DONE]") || strings.Contains(string(body), `"error"`) {
		t.Fatalf("stream longer than the body timeout: %d %s", resp.StatusCode, body)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("the stream took %v, not longer than the body timeout: the test proves nothing", d)
	}
}

// deadlineWriter records the write deadlines a handler sets.
type deadlineWriter struct {
	*httptest.ResponseRecorder
	deadlines []time.Time
}

func (w *deadlineWriter) SetWriteDeadline(d time.Time) error {
	w.deadlines = append(w.deadlines, d)
	return nil
}

// TestWriteDeadlines: every response write — a JSON answer, each
// server-sent event — is bounded by WriteTimeout from the moment it is
// written, so a client that stops reading is cut off and a stream may still
// last as long as its request.
func TestWriteDeadlines(t *testing.T) {
	s := &Server{cfg: ServerConfig{WriteTimeout: 7 * time.Second}, log: slog.New(slog.DiscardHandler)}
	w := &deadlineWriter{ResponseRecorder: httptest.NewRecorder()}
	c := &call{w: &statusWriter{ResponseWriter: w}, r: httptest.NewRequest("GET", "/", nil), log: s.log}
	before := time.Now()
	s.writeJSON(c, http.StatusOK, map[string]int{"a": 1})
	ev := &sse{w: c.w, rc: http.NewResponseController(c.w), timeout: s.cfg.WriteTimeout}
	ev.raw([]byte("one"))
	ev.raw([]byte("two"))
	if len(w.deadlines) != 3 {
		t.Fatalf("%d write deadlines set, want 3 (one per write)", len(w.deadlines))
	}
	for i, d := range w.deadlines {
		if d.Before(before.Add(7*time.Second)) || d.After(time.Now().Add(7*time.Second)) {
			t.Errorf("deadline %d = %v after the write began, want 7s", i, d.Sub(before))
		}
	}
}

// TestPromptBoundBeforeTokenize: a prompt that cannot fit the context by
// the tokenizer's lower bound is refused with a 400 naming the field, the
// bound and the context, on completions, chat and /tokenize alike; a
// neighbouring request is unaffected.
func TestPromptBoundBeforeTokenize(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	huge := strings.Repeat("Lily played with her ball in the park. ", 70000) // 2.7 MB
	cases := []struct {
		path, param string
		body        map[string]any
	}{
		{"/v1/completions", "prompt", map[string]any{"prompt": huge, "max_tokens": 4}},
		{"/v1/completions", "prompt", map[string]any{"prompt": []string{huge}, "max_tokens": 4}},
		{"/v1/chat/completions", "messages", map[string]any{"messages": []map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user", "content": huge}}}},
		{"/tokenize", "prompt", map[string]any{"prompt": huge}},
		{"/tokenize", "prompt", map[string]any{"content": huge}},
		{"/tokenize", "messages", map[string]any{"messages": []map[string]any{{"role": "user", "content": huge}}}},
	}
	for _, tc := range cases {
		resp, body := h.post(tc.path, tc.body)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s %s: %d, want 400", tc.path, tc.param, resp.StatusCode)
			continue
		}
		e := checkEnvelope(t, body)
		if e.Error.Param == nil || *e.Error.Param != tc.param || !strings.Contains(e.Error.Message, "at least") || !strings.Contains(e.Error.Message, "context of 256") {
			t.Errorf("%s: %s", tc.path, body)
		}
	}
	// Just past the bound's reach, the real count still refuses it.
	over := strings.Repeat("a b ", testContext)
	if resp, body := h.post("/v1/completions", map[string]any{"prompt": over, "max_tokens": 4}); resp.StatusCode != http.StatusBadRequest || strings.Contains(string(body), "at least") {
		t.Errorf("a prompt over the context by its tokens: %d %s", resp.StatusCode, body)
	}
	if resp, body := h.post("/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 4}); resp.StatusCode != http.StatusOK {
		t.Errorf("a good request after the refusals: %d %s", resp.StatusCode, body)
	}
}

// TestAPIKeys: any key of APIKeys (from --api-key-file) is accepted beside
// APIKey; others are not.
func TestAPIKeys(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: ServerConfig{APIKey: "one", APIKeys: []string{"two", "three"}}})
	for key, want := range map[string]int{"one": 200, "two": 200, "three": 200, "four": 401, "": 401, "twothree": 401} {
		if resp, body := h.do("GET", "/v1/models", nil, "Authorization", "Bearer "+key); resp.StatusCode != want {
			t.Errorf("key %q: %d %s, want %d", key, resp.StatusCode, body, want)
		}
	}
}

// TestEmptyPromptIsBOS: an empty completions prompt, for a model that adds
// BOS, generates from BOS alone (llama.cpp's server and vLLM do the same);
// without BOS it is refused.
func TestEmptyPromptIsBOS(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	if !h.info.Tokenizer.AddBOS() {
		t.Fatal("the test vocabulary adds no BOS: this test needs one that does")
	}
	for _, prompt := range []any{"", []string{""}} {
		resp, body := h.post("/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 3})
		var r struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &r) != nil || r.Usage.PromptTokens != 1 {
			t.Errorf("prompt %q: %d %s, want 200 with a 1-token prompt (BOS)", prompt, resp.StatusCode, body)
		}
	}
	h.waitIdle()
}
