package coordinator

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strings"
	"time"
)

// DefaultMaxBodyBytes bounds a request body when ServerConfig leaves it 0:
// 4 MiB holds a prompt far longer than any context this project serves,
// even as a JSON array of token IDs.
const DefaultMaxBodyBytes = 4 << 20

// DefaultBodyTimeout bounds the reading of one request body when
// ServerConfig leaves it 0: a 4 MiB body arrives in well under a second on
// any network a client would serve from; 30 s is room for a slow one and
// still frees a connection a slow-body client holds open.
const DefaultBodyTimeout = 30 * time.Second

// DefaultWriteTimeout bounds each write of a response (one server-sent
// event, or a whole JSON answer) when ServerConfig leaves it 0: a client
// that stops reading is cut off after it, and its request aborted, instead
// of holding a connection and a goroutine forever. It is per write, so
// streams may last as long as their requests.
const DefaultWriteTimeout = 30 * time.Second

// DefaultKeepAlive is how long a stream may go without an event before it
// gets an SSE comment saying what it waits for, when ServerConfig leaves
// it 0: 10 s is well inside the idle timeouts of common proxies and
// clients (60 s and more) and costs a few bytes.
const DefaultKeepAlive = 10 * time.Second

// ServerConfig configures the HTTP API.
type ServerConfig struct {
	// APIKey, when set, is a Bearer token every endpoint but /healthz,
	// /readyz and the status page's shell requires.
	APIKey string
	// APIKeys are more accepted keys (from --api-key-file); any one of them
	// or APIKey is accepted.
	APIKeys []string
	// MaxBodyBytes bounds a request body; larger bodies get 413. 0 means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// BodyTimeout bounds the reading of a request body (408 after it); 0
	// means DefaultBodyTimeout.
	BodyTimeout time.Duration
	// WriteTimeout bounds each write of a response; 0 means
	// DefaultWriteTimeout.
	WriteTimeout time.Duration
	// KeepAlive is how long a stream may go without an event (queued, its
	// pipeline re-forming) before it gets an SSE comment; 0 means
	// DefaultKeepAlive.
	KeepAlive time.Duration
	// RequestTimeout, when > 0, is each generation request's deadline,
	// counted from its arrival; the engine ends it with FinishTimeout.
	RequestTimeout time.Duration
	// View, when set, returns the cluster for GET /v1/cluster, the status
	// page and the per-shard metrics: serve supplies the cluster's, through
	// a LocalView when some shards run in its process.
	View func() ClusterView
	// StageTimings, when set, returns each local shard's cumulative batches
	// and busy time (strata_stage_latency_seconds).
	StageTimings func() []StageTiming
	// History, when set, is where Run samples and where the cluster's
	// events are recorded (serve shares it with the cluster's logger);
	// nil: the server keeps its own, with no events.
	History *History
	Log     *slog.Logger
}

// Server is the OpenAI-compatible HTTP API over an Engine. Handlers validate
// and tokenize requests, submit them to the engine, detokenize the tokens,
// match stop strings and write JSON or server-sent events. Its only mutable
// state is the History, which Run fills; its handler is safe for
// concurrent use.
type Server struct {
	cfg     ServerConfig
	eng     *Engine
	info    *ModelInfo
	ready   func() error
	log     *slog.Logger
	keySums [][sha256.Size]byte // accepted API keys, hashed; none: the API is open
	start   time.Time
	routes  map[string]route
	stops   map[int32]bool // info.Stop as a set
	metrics *metrics
	hist    *History
}

type route struct {
	method string
	h      func(*call)
}

// call is one HTTP request as a handler sees it.
type call struct {
	w   *statusWriter
	r   *http.Request
	rid string
	log *slog.Logger
}

// NewServer returns the API over eng for the model info describes. ready
// reports why the cluster cannot serve (nil when it can); a nil ready means
// always ready.
func NewServer(cfg ServerConfig, eng *Engine, info *ModelInfo, ready func() error) *Server {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if ready == nil {
		ready = func() error { return nil }
	}
	s := &Server{
		cfg: cfg, eng: eng, info: info, ready: ready,
		log:   cfg.Log.With("component", "api"),
		start: time.Now(),
		stops: map[int32]bool{},
	}
	s.metrics = newMetrics(eng, s.clusterView, cfg.StageTimings)
	s.hist = cfg.History
	if s.hist == nil {
		s.hist = NewHistory(0, 0)
	}
	for _, k := range append([]string{cfg.APIKey}, cfg.APIKeys...) {
		if k != "" {
			s.keySums = append(s.keySums, sha256.Sum256([]byte(k)))
		}
	}
	for _, id := range info.Stop {
		s.stops[id] = true
	}
	s.routes = map[string]route{
		"/v1/completions":      {http.MethodPost, s.handleCompletions},
		"/v1/chat/completions": {http.MethodPost, s.handleChat},
		"/v1/models":           {http.MethodGet, s.handleModels},
		"/tokenize":            {http.MethodPost, s.handleTokenize},
		"/detokenize":          {http.MethodPost, s.handleDetokenize},
		"/healthz":             {http.MethodGet, s.handleHealthz},
		"/readyz":              {http.MethodGet, s.handleReadyz},
		"/metrics":             {http.MethodGet, s.handleMetrics},
		"/v1/cluster":          {http.MethodGet, s.handleCluster},
		"/v1/cluster/history":  {http.MethodGet, s.handleHistory},
		"/":                    {http.MethodGet, s.handleStatus},
	}
	return s
}

// Handler returns the API's http.Handler.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serve) }

// openPaths need no API key: probes must work without one, and the status
// page holds no data (it asks for the key when /v1/cluster wants one).
var openPaths = map[string]bool{"/healthz": true, "/readyz": true, "/": true}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	rid := requestID(r.Header.Get("X-Request-ID"))
	w.Header().Set("X-Request-ID", rid)
	c := &call{w: &statusWriter{ResponseWriter: w}, r: r, rid: rid, log: s.log.With("request_id", rid)}
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		if v == http.ErrAbortHandler {
			panic(v)
		}
		c.log.Error("handler panic", "path", r.URL.Path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		if !c.w.wrote {
			s.writeError(c, errInternal("internal error (request %s)", rid))
		}
	}()

	path := r.URL.Path
	if !openPaths[path] && len(s.keySums) > 0 && !s.authorized(r) {
		// Refused before a byte of the body is read; closing the connection
		// keeps the server from draining a body nobody authorized.
		c.w.Header().Set("Connection", "close")
		c.w.Header().Set("WWW-Authenticate", `Bearer realm="strata"`)
		s.writeError(c, &apiError{status: http.StatusUnauthorized, typ: "authentication_error", code: "invalid_api_key",
			msg: "missing or invalid API key: send it as \"Authorization: Bearer KEY\""})
		return
	}
	rt, ok := s.routes[path]
	if !ok && strings.HasPrefix(path, "/v1/models/") {
		rt, ok = route{http.MethodGet, s.handleModel}, true
	}
	if !ok {
		c.w.Header().Set("Connection", "close")
		s.writeError(c, &apiError{status: http.StatusNotFound, typ: "not_found_error", code: "not_found",
			msg: fmt.Sprintf("no such endpoint: %s %s", r.Method, path)})
		return
	}
	if r.Method != rt.method && !(rt.method == http.MethodGet && r.Method == http.MethodHead) {
		c.w.Header().Set("Connection", "close")
		c.w.Header().Set("Allow", rt.method)
		s.writeError(c, &apiError{status: http.StatusMethodNotAllowed, typ: "invalid_request_error", code: "method_not_allowed",
			msg: fmt.Sprintf("%s takes %s, got %s", path, rt.method, r.Method)})
		return
	}
	rt.h(c)
}

// authorized compares the Bearer key in constant time (hashing first, so
// not even the key's length leaks).
func (s *Server) authorized(r *http.Request) bool {
	h := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if len(h) < len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(h[len(prefix):])))
	ok := 0
	for i := range s.keySums {
		ok |= subtle.ConstantTimeCompare(got[:], s.keySums[i][:])
	}
	return ok == 1
}

// requestID returns the client's X-Request-ID when it is sane (1 to 128
// characters of [A-Za-z0-9._:-]), or a new random one.
func requestID(client string) string {
	if n := len(client); n > 0 && n <= 128 && strings.Trim(client,
		"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-") == "" {
		return client
	}
	var b [12]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return "req-" + hex.EncodeToString(b[:])
}

// readBody reads the request body within MaxBodyBytes and BodyTimeout.
// The read deadline is lifted once the body is in: the connection's reads
// then only watch for the client going away, for as long as the request
// runs (net/http cancels the request's context when such a read fails). A
// body refused or cut short closes the connection.
func (s *Server) readBody(c *call) ([]byte, *apiError) {
	limit := s.cfg.MaxBodyBytes
	if c.r.ContentLength > limit {
		c.w.Header().Set("Connection", "close")
		return nil, errTooLarge(c.r.ContentLength, limit)
	}
	rc := http.NewResponseController(c.w)
	rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout)) // ErrNotSupported only for exotic writers: then unbounded, as before
	body, err := io.ReadAll(http.MaxBytesReader(c.w, c.r.Body, limit))
	if err != nil {
		// The deadline stays: the server must not wait for the rest of a
		// body it refused before it closes the connection.
		c.w.Header().Set("Connection", "close")
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, errTooLarge(-1, limit)
		}
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			return nil, &apiError{status: http.StatusRequestTimeout, typ: "invalid_request_error", code: "request_timeout",
				msg: fmt.Sprintf("the request body did not arrive within %v", s.cfg.BodyTimeout)}
		}
		return nil, invalid("", "reading the request body: %v", err)
	}
	rc.SetReadDeadline(time.Time{})
	return body, nil
}

// writeDeadline bounds the next write of c's response by WriteTimeout.
func (s *Server) writeDeadline(rc *http.ResponseController) {
	rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout)) // ErrNotSupported only for exotic writers
}

func (s *Server) handleHealthz(c *call) {
	s.writeJSON(c, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleReadyz(c *call) {
	if err := s.ready(); err != nil {
		s.writeError(c, errNotReady(err))
		return
	}
	s.writeJSON(c, http.StatusOK, map[string]string{"status": "ready"})
}

type modelCard struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen int    `json:"max_model_len"`
}

func (s *Server) card() modelCard {
	return modelCard{ID: s.info.Name, Object: "model", Created: s.start.Unix(), OwnedBy: "strata", MaxModelLen: s.info.Context}
}

func (s *Server) handleModels(c *call) {
	s.writeJSON(c, http.StatusOK, struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", []modelCard{s.card()}})
}

// handleModel answers GET /v1/models/{id}.
func (s *Server) handleModel(c *call) {
	id := strings.TrimPrefix(c.r.URL.Path, "/v1/models/")
	if id != s.info.Name {
		s.writeError(c, errUnknownModel(id))
		return
	}
	s.writeJSON(c, http.StatusOK, s.card())
}

// writeJSON writes v with status.
func (s *Server) writeJSON(c *call, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		c.log.Error("encode response", "err", err)
		status = http.StatusInternalServerError
		b, _ = json.Marshal(errInternal("internal error encoding the response (request %s)", c.rid).envelope())
	}
	c.w.Header().Set("Content-Type", "application/json")
	s.writeDeadline(http.NewResponseController(c.w))
	c.w.WriteHeader(status)
	c.w.Write(append(b, '\n'))
}

// writeError writes e in OpenAI's envelope and logs it: client errors at
// Debug, server errors at Error (the one place they are handled).
func (s *Server) writeError(c *call, e *apiError) {
	if e.retryAfter > 0 {
		c.w.Header().Set("Retry-After", fmt.Sprint(e.retryAfter))
	}
	// 4xx are the client's business; 503/429 are load or readiness (a
	// probe polling /readyz must not flood the log); only other 5xx are
	// our errors.
	lvl := slog.LevelDebug
	switch {
	case e.status == http.StatusServiceUnavailable || e.status == http.StatusTooManyRequests:
		lvl = slog.LevelInfo
		if c.r.URL.Path == "/readyz" {
			lvl = slog.LevelDebug
		}
	case e.status >= 500:
		lvl = slog.LevelError
	}
	c.log.Log(c.r.Context(), lvl, "request refused", "path", c.r.URL.Path, "status", e.status, "err", e.msg)
	s.writeJSON(c, e.status, e.envelope())
}

// statusWriter records whether the response has started, so a recovered
// panic does not write a second header.
type statusWriter struct {
	http.ResponseWriter
	wrote  bool
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.wrote, w.status = true, code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.wrote, w.status = true, http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush and deadlines.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
