// Package loadgen drives an OpenAI-compatible server with concurrent
// clients and measures what they see: output tokens per second, time to
// first token, inter-token latency (also for the streams that were not
// aborted on purpose), and errors by kind. At the end it reads the server's
// /v1/cluster and reports the KV blocks each shard still holds.
//
// Run is bounded: by a request count, a duration, or both, and each request
// by a client-side timeout. It talks only to Config.URL. Run starts one
// goroutine per client and returns after all of them.
package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Range is an inclusive range of integers drawn uniformly; Min == Max is a
// fixed value.
type Range struct{ Min, Max int }

// ParseRange reads "N" (fixed) or "A-B" (uniform in [A, B]).
func ParseRange(s string) (Range, error) {
	a, b, found := strings.Cut(strings.TrimSpace(s), "-")
	lo, err := strconv.Atoi(strings.TrimSpace(a))
	if err != nil {
		return Range{}, fmt.Errorf("want N or A-B, got %q", s)
	}
	hi := lo
	if found {
		if hi, err = strconv.Atoi(strings.TrimSpace(b)); err != nil {
			return Range{}, fmt.Errorf("want N or A-B, got %q", s)
		}
	}
	r := Range{lo, hi}
	return r, r.validate("range")
}

func (r Range) String() string {
	if r.Min == r.Max {
		return strconv.Itoa(r.Min)
	}
	return fmt.Sprintf("%d-%d", r.Min, r.Max)
}

func (r Range) validate(name string) error {
	if r.Min < 0 || r.Max < r.Min {
		return fmt.Errorf("loadgen: %s must be N or A-B with 0 <= A <= B, got %d-%d", name, r.Min, r.Max)
	}
	return nil
}

func (r Range) draw(rng *rand.Rand) int { return r.Min + rng.IntN(r.Max-r.Min+1) }

// Config describes a load run.
type Config struct {
	URL    string // the server's base URL, e.g. http://127.0.0.1:8080
	APIKey string // sent as a Bearer token when set
	Model  string // "" asks /v1/models for the first model
	Chat   bool   // /v1/chat/completions instead of /v1/completions
	Stream bool

	Clients  int           // concurrent clients
	Requests int           // requests to start in all (0: no limit, Duration bounds the run)
	Duration time.Duration // stop starting requests after this (0: no limit, Requests bounds the run)
	Timeout  time.Duration // each request's client-side deadline

	PromptLen Range // prompt tokens (exact for completions; words for chat)
	OutputLen Range // max_tokens

	// AbortFrac of streamed requests disconnect after AbortAfter content
	// chunks (about one token each); their client starts a new request.
	AbortFrac  float64
	AbortAfter Range

	Seed int64
	// Settle is how long to wait at the end for the shards to report no KV
	// blocks in use before reporting what they hold.
	Settle time.Duration
	Client *http.Client // nil: a client with connections for every worker
}

// DefaultConfig returns a small streaming run: 4 clients, 32 requests, the
// prompt and output lengths of the benchmark.
func DefaultConfig() Config {
	return Config{
		Clients: 4, Requests: 32, Timeout: 2 * time.Minute, Stream: true,
		PromptLen: Range{34, 34}, OutputLen: Range{64, 64}, AbortAfter: Range{16, 16},
		Seed: 1, Settle: time.Second,
	}
}

// Validate names the field and the constraint that cfg breaks.
func (c Config) Validate() error {
	switch {
	case c.URL == "":
		return errors.New("loadgen: URL is required")
	case c.Clients < 1:
		return fmt.Errorf("loadgen: Clients must be >= 1, got %d", c.Clients)
	case c.Requests < 0 || c.Duration < 0:
		return fmt.Errorf("loadgen: Requests and Duration must be >= 0, got %d and %v", c.Requests, c.Duration)
	case c.Requests == 0 && c.Duration == 0:
		return errors.New("loadgen: a run must be bounded: set Requests, Duration or both")
	case c.Timeout <= 0:
		return fmt.Errorf("loadgen: Timeout must be > 0, got %v", c.Timeout)
	case c.AbortFrac < 0 || c.AbortFrac > 1:
		return fmt.Errorf("loadgen: AbortFrac must be in [0, 1], got %v", c.AbortFrac)
	case c.AbortFrac > 0 && !c.Stream:
		return errors.New("loadgen: AbortFrac needs Stream (a client disconnects mid-stream)")
	case c.PromptLen.Min < 1:
		return fmt.Errorf("loadgen: PromptLen must be >= 1, got %v", c.PromptLen)
	case c.OutputLen.Min < 1:
		return fmt.Errorf("loadgen: OutputLen must be >= 1, got %v", c.OutputLen)
	}
	for _, r := range []struct {
		name string
		r    Range
	}{{"PromptLen", c.PromptLen}, {"OutputLen", c.OutputLen}, {"AbortAfter", c.AbortAfter}} {
		if err := r.r.validate(r.name); err != nil {
			return err
		}
	}
	return nil
}

// Percentiles summarise a latency sample.
type Percentiles struct {
	N        int
	P50, P99 time.Duration
}

func percentiles(d []time.Duration) Percentiles {
	if len(d) == 0 {
		return Percentiles{}
	}
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return Percentiles{N: len(d), P50: at(0.50), P99: at(0.99)}
}

// ShardKV is one shard's KV as /v1/cluster reported it at the end.
type ShardKV struct {
	Shard       string `json:"shard_id"`
	BlocksUsed  int    `json:"kv_blocks_used"`
	BlocksTotal int    `json:"kv_blocks_total"`
	Sequences   int    `json:"sequences"`
}

// ClusterEnd is the server's state after the run.
type ClusterEnd struct {
	Running int       `json:"running"`
	Waiting int       `json:"waiting"`
	Shards  []ShardKV `json:"shards"`
}

// Report is what a run measured.
type Report struct {
	Elapsed      time.Duration
	Requests     int            // requests started
	Completed    int            // ended normally (stop or length)
	Aborted      int            // disconnected on purpose
	Errors       map[string]int // by kind: status_429, timeout, stream_error:<code>, …
	OutputTokens int            // tokens received, aborted streams included
	TokensPerSec float64
	TTFT         Percentiles
	ITL          Percentiles // all streams
	ITLKept      Percentiles // streams that were not aborted on purpose
	Latency      Percentiles // whole requests that completed
	Cluster      *ClusterEnd // nil when /v1/cluster could not be read
	ClusterErr   string
}

// result is one request's outcome.
type result struct {
	tokens  int
	ttft    time.Duration // 0: no token
	gaps    []time.Duration
	latency time.Duration
	aborted bool
	err     string // error kind; "" for success
}

// Run drives the server as cfg says and reports. It returns an error only
// when the run cannot start (bad config, no model, prompt set-up failed);
// request failures are counted in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.URL = strings.TrimRight(cfg.URL, "/")
	if cfg.Client == nil {
		cfg.Client = &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: cfg.Clients,
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		}}
	}
	g := &gen{cfg: cfg}
	if err := g.setup(ctx); err != nil {
		return nil, err
	}

	runCtx := ctx
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	var (
		started atomic.Int64
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
	)
	start := time.Now()
	for w := range cfg.Clients {
		rng := rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(w)))
		wg.Go(func() {
			for runCtx.Err() == nil {
				if cfg.Requests > 0 && started.Add(1) > int64(cfg.Requests) {
					return
				}
				// A request started before the end runs to its own end
				// (bounded by Timeout), not cut by the duration.
				r := g.one(ctx, rng)
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
				if ctx.Err() != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	rep := summarise(results, time.Since(start))
	rep.Cluster, rep.ClusterErr = g.clusterEnd(ctx)
	return rep, nil
}

func summarise(results []result, elapsed time.Duration) *Report {
	rep := &Report{Elapsed: elapsed, Requests: len(results), Errors: map[string]int{}}
	var ttft, itl, kept, lat []time.Duration
	for _, r := range results {
		rep.OutputTokens += r.tokens
		if r.ttft > 0 {
			ttft = append(ttft, r.ttft)
		}
		itl = append(itl, r.gaps...)
		switch {
		case r.aborted:
			rep.Aborted++
		case r.err != "":
			rep.Errors[r.err]++
		default:
			rep.Completed++
			kept = append(kept, r.gaps...)
			lat = append(lat, r.latency)
		}
	}
	if s := elapsed.Seconds(); s > 0 {
		rep.TokensPerSec = float64(rep.OutputTokens) / s
	}
	rep.TTFT, rep.ITL, rep.ITLKept, rep.Latency = percentiles(ttft), percentiles(itl), percentiles(kept), percentiles(lat)
	return rep
}

// gen holds what every request needs: the model and prompt material.
type gen struct {
	cfg   Config
	model string
	ids   []int32  // valid token IDs (from /tokenize) to cut completion prompts from
	words []string // words to cut chat prompts (and fallback prompts) from
}

// corpus is the prompt material: plain words any tokenizer knows.
const corpus = `Once upon a time there was a little girl named Lily. She loved to play outside in the sunshine with her dog.
One day she found a shiny red ball in the park. She was very happy and ran to show her mom. Her mom smiled and said
they could play with it together. They played all day until the sun went down, and then they went home to eat dinner.`

func (g *gen) setup(ctx context.Context) error {
	g.words = strings.Fields(corpus)
	g.model = g.cfg.Model
	if g.model == "" {
		var models struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := g.getJSON(ctx, "/v1/models", &models); err != nil {
			return fmt.Errorf("loadgen: list models: %w", err)
		}
		if len(models.Data) == 0 {
			return errors.New("loadgen: /v1/models lists no model")
		}
		g.model = models.Data[0].ID
	}
	if g.cfg.Chat {
		return nil
	}
	// Completions take token IDs, so prompt lengths are exact: tokenize the
	// corpus once and cut prompts from its IDs.
	var tok struct {
		Tokens []int32 `json:"tokens"`
	}
	// The fields of vLLM's and strata's shape (prompt, add_special_tokens)
	// and of llama.cpp's server (content, add_special), so that the same
	// load runs against llama-server side by side.
	body, _ := json.Marshal(map[string]any{"model": g.model, "prompt": corpus, "add_special_tokens": false,
		"content": corpus, "add_special": false})
	if err := g.postJSON(ctx, "/tokenize", body, &tok); err != nil {
		return fmt.Errorf("loadgen: tokenize the prompt corpus: %w", err)
	}
	if len(tok.Tokens) == 0 {
		return errors.New("loadgen: /tokenize returned no tokens for the prompt corpus")
	}
	g.ids = tok.Tokens
	return nil
}

func (g *gen) request(ctx context.Context, method, path string, body []byte) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, g.cfg.URL+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if g.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+g.cfg.APIKey)
	}
	return req, nil
}

func (g *gen) getJSON(ctx context.Context, path string, v any) error {
	return g.postJSON(ctx, path, nil, v)
}

// postJSON sends body (GET when nil) and decodes a 200 answer into v.
func (g *gen) postJSON(ctx context.Context, path string, body []byte, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	method := http.MethodPost
	if body == nil {
		method = http.MethodGet
	}
	req, err := g.request(ctx, method, path, body)
	if err != nil {
		return err
	}
	resp, err := g.cfg.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
	}
	return json.Unmarshal(data, v)
}

// body returns one request's JSON body.
func (g *gen) body(rng *rand.Rand) []byte {
	n := g.cfg.PromptLen.draw(rng)
	req := map[string]any{"model": g.model, "max_tokens": g.cfg.OutputLen.draw(rng), "temperature": 0,
		"seed": rng.Int64N(1 << 31)}
	if g.cfg.Stream {
		req["stream"] = true
		req["stream_options"] = map[string]any{"include_usage": true}
	}
	if g.cfg.Chat {
		off := rng.IntN(len(g.words))
		w := make([]string, n)
		for i := range w {
			w[i] = g.words[(off+i)%len(g.words)]
		}
		req["messages"] = []map[string]string{{"role": "user", "content": strings.Join(w, " ")}}
	} else {
		off := rng.IntN(len(g.ids))
		p := make([]int32, n)
		for i := range p {
			p[i] = g.ids[(off+i)%len(g.ids)]
		}
		req["prompt"] = p
	}
	b, _ := json.Marshal(req)
	return b
}

// one runs one request to its end, its abort or its timeout.
func (g *gen) one(ctx context.Context, rng *rand.Rand) (r result) {
	body := g.body(rng)
	abortAt := -1
	if g.cfg.AbortFrac > 0 && rng.Float64() < g.cfg.AbortFrac {
		abortAt = max(1, g.cfg.AbortAfter.draw(rng))
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()
	path := "/v1/completions"
	if g.cfg.Chat {
		path = "/v1/chat/completions"
	}
	req, err := g.request(ctx, http.MethodPost, path, body)
	if err != nil {
		r.err = "request"
		return r
	}
	start := time.Now()
	resp, err := g.cfg.Client.Do(req)
	if err != nil {
		r.err = transportKind(ctx, err)
		return r
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		r.err = "status_" + strconv.Itoa(resp.StatusCode)
		return r
	}
	if !g.cfg.Stream {
		var out struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			r.err = transportKind(ctx, err)
			return r
		}
		if err := json.Unmarshal(data, &out); err != nil {
			r.err = "bad_response"
			return r
		}
		r.latency = time.Since(start)
		r.ttft, r.tokens = r.latency, out.Usage.CompletionTokens
		return r
	}
	return g.readStream(ctx, resp.Body, start, abortAt, cancel)
}

// streamEvent is what loadgen reads of a streamed chunk.
type streamEvent struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Code *string `json:"code"`
		Type string  `json:"type"`
	} `json:"error"`
}

// readStream reads server-sent events; a content chunk counts as a token
// arrival (the usage chunk, when present, gives the exact count). At
// abortAt chunks it disconnects.
func (g *gen) readStream(ctx context.Context, body io.Reader, start time.Time, abortAt int, disconnect func()) (r result) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	chunks, usage := 0, -1
	last := start
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			r.latency = time.Since(start)
			r.tokens = chunks
			if usage >= 0 {
				r.tokens = usage
			}
			return r
		}
		var ev streamEvent
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			r.err, r.tokens = "bad_response", chunks
			return r
		}
		if ev.Error != nil {
			code := ev.Error.Type
			if ev.Error.Code != nil {
				code = *ev.Error.Code
			}
			r.err, r.tokens = "stream_error:"+code, chunks
			return r
		}
		if ev.Usage != nil {
			usage = ev.Usage.CompletionTokens
		}
		if len(ev.Choices) == 0 || ev.Choices[0].Text == "" && ev.Choices[0].Delta.Content == "" {
			continue
		}
		now := time.Now()
		if chunks == 0 {
			r.ttft = now.Sub(start)
		} else {
			r.gaps = append(r.gaps, now.Sub(last))
		}
		last = now
		chunks++
		if chunks == abortAt {
			disconnect() // cancels the request's context: the connection closes
			r.aborted, r.tokens = true, chunks
			return r
		}
	}
	r.tokens = chunks
	if err := sc.Err(); err != nil {
		r.err = transportKind(ctx, err)
	} else {
		r.err = "stream_truncated" // ended without [DONE]
	}
	return r
}

// transportKind names a transport error: timeout (the client's deadline) or
// transport.
func transportKind(ctx context.Context, err error) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "transport"
}

// clusterEnd reads /v1/cluster until every shard reports no KV blocks in
// use, or Settle passes, and returns the last answer.
func (g *gen) clusterEnd(ctx context.Context) (*ClusterEnd, string) {
	deadline := time.Now().Add(g.cfg.Settle)
	for {
		var c ClusterEnd
		if err := g.getJSON(ctx, "/v1/cluster", &c); err != nil {
			return nil, err.Error()
		}
		clean := c.Running == 0 && c.Waiting == 0
		for _, s := range c.Shards {
			clean = clean && s.BlocksUsed == 0 && s.Sequences == 0
		}
		if clean || !time.Now().Before(deadline) {
			return &c, ""
		}
		select {
		case <-ctx.Done():
			return &c, ""
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Write prints the report for people.
func (r *Report) Write(w io.Writer) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	fmt.Fprintf(w, "requests %d in %.2fs: %d completed, %d aborted on purpose, %d failed\n",
		r.Requests, r.Elapsed.Seconds(), r.Completed, r.Aborted, r.Requests-r.Completed-r.Aborted)
	fmt.Fprintf(w, "output tokens %d, %.2f tok/s\n", r.OutputTokens, r.TokensPerSec)
	fmt.Fprintf(w, "TTFT         p50 %s  p99 %s  (n=%d)\n", ms(r.TTFT.P50), ms(r.TTFT.P99), r.TTFT.N)
	fmt.Fprintf(w, "inter-token  p50 %s  p99 %s  (n=%d)\n", ms(r.ITL.P50), ms(r.ITL.P99), r.ITL.N)
	fmt.Fprintf(w, "  kept       p50 %s  p99 %s  (n=%d, streams not aborted)\n", ms(r.ITLKept.P50), ms(r.ITLKept.P99), r.ITLKept.N)
	fmt.Fprintf(w, "latency      p50 %s  p99 %s  (n=%d)\n", ms(r.Latency.P50), ms(r.Latency.P99), r.Latency.N)
	if len(r.Errors) > 0 {
		kinds := slices.Sorted(maps.Keys(r.Errors))
		fmt.Fprint(w, "errors:")
		for _, k := range kinds {
			fmt.Fprintf(w, " %s=%d", k, r.Errors[k])
		}
		fmt.Fprintln(w)
	}
	if r.Cluster == nil {
		fmt.Fprintf(w, "cluster: unavailable: %s\n", r.ClusterErr)
		return
	}
	fmt.Fprintf(w, "cluster after the run: %d running, %d waiting\n", r.Cluster.Running, r.Cluster.Waiting)
	for _, s := range r.Cluster.Shards {
		fmt.Fprintf(w, "  shard %s: KV blocks in use %d/%d, live sequences %d\n", s.Shard, s.BlocksUsed, s.BlocksTotal, s.Sequences)
	}
}
