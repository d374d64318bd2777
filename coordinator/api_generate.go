package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/model/tokenizer"
)

func (s *Server) handleCompletions(c *call) { s.generate(c, s.parseCompletion) }

func (s *Server) handleChat(c *call) { s.generate(c, s.parseChat) }

// generate is the life of a completion or chat request in the handler:
// validate, submit, read the stream, write the answer.
func (s *Server) generate(c *call, parse func([]byte) (*genRequest, *apiError)) {
	arrived := time.Now()
	body, aerr := s.readBody(c)
	if aerr != nil {
		s.writeError(c, aerr)
		return
	}
	req, aerr := parse(body)
	if aerr != nil {
		s.writeError(c, aerr)
		return
	}
	if err := s.ready(); err != nil && !errors.Is(err, ErrPipelineDown) {
		// Not ready and not merely down: never formed, draining, given up
		// or stuck. A pipeline that formed before and is re-forming (or
		// waiting for shards that can hold the model) takes the request:
		// it waits, up to its queue timeout, with keep-alives.
		s.writeError(c, errNotReady(err))
		return
	}
	p := GenParams{
		ID: c.rid, Prompt: req.prompt, MaxTokens: req.maxTokens, Sample: req.sample,
		Logprobs: req.logprobs, Stop: s.info.Stop,
	}
	if s.cfg.RequestTimeout > 0 {
		p.Deadline = time.Now().Add(s.cfg.RequestTimeout)
	}
	ctx := c.r.Context()
	st, err := s.eng.Submit(ctx, p)
	if err != nil {
		if ctx.Err() != nil {
			c.log.Debug("client gone before admission", "err", err)
			return
		}
		s.writeError(c, submitError(err))
		return
	}
	defer st.Abort() // a no-op once the request ended; frees its KV otherwise
	c.log.Debug("submitted", "prompt_tokens", len(req.prompt), "max_tokens", req.maxTokens,
		"seed", req.sample.Seed, "seed_random", req.seedRandom, "stream", req.stream)
	g := &genRun{s: s, req: req, st: st, dec: s.info.Tokenizer.NewDecoder(), p: p, timer: s.metrics.timer(arrived)}
	if req.tools != nil {
		g.tc = &toolStream{ts: req.tools, stream: req.stream}
	}
	if req.echo {
		g.offset = len(req.promptText)
	}
	if req.stream {
		s.streamResponse(ctx, c, g)
	} else {
		s.wholeResponse(ctx, c, g)
	}
}

// genRun turns one request's tokens into text: streaming detokenization,
// stop strings matched across token boundaries on the text, and the text
// that could still start a stop string held back.
type genRun struct {
	s       *Server
	req     *genRequest
	p       GenParams
	st      *Stream
	dec     *tokenizer.Decoder
	pending string // decoded text not yet emitted: a possible stop-string start
	tokens  int    // completion tokens received up to the end
	offset  int    // bytes of text before the next token's (text_offset)
	lps     []tokLP
	finish  string // "stop" or "length" once ended normally
	timer   tokenTimer
	tc      *toolStream // chat with tools: splits text and calls
}

type tokLP struct {
	id      int32
	logprob float32
	top     []sample.TokenLogprob
	offset  int
}

// feed takes one token and returns the text it releases; it sets g.finish
// when a stop string matched.
func (g *genRun) feed(t Token) string {
	g.tokens++
	if g.s.stops[t.ID] {
		return "" // the end-of-generation token is not text
	}
	piece := g.dec.Add(t.ID)
	if g.tc != nil && piece == "" {
		// A call marker that is a control token ([TOOL_CALLS] in Mistral's
		// vocabulary) has no text, but opens the calls the parser looks for.
		tok := g.s.info.Tokenizer
		if m := g.tc.ts.syntax.Marker(); len(tok.TokenBytes(t.ID)) == 0 && tok.Piece(t.ID) == m {
			piece = m
		}
	}
	if g.req.logprobs {
		g.lps = append(g.lps, tokLP{id: t.ID, logprob: t.Logprob, top: t.Top, offset: g.offset})
	}
	g.offset += len(piece)
	g.pending += piece
	return g.release(false)
}

// release returns what of pending can be emitted: everything before a
// matched stop string (ending the request), else all but the longest suffix
// that starts some stop string; at the end (final), everything.
func (g *genRun) release(final bool) string {
	if len(g.req.stops) == 0 {
		out := g.pending
		g.pending = ""
		return out
	}
	cut := -1
	for _, stop := range g.req.stops {
		if i := strings.Index(g.pending, stop); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
	}
	if cut >= 0 {
		out := g.pending[:cut]
		g.pending = ""
		g.finish = string(FinishStop)
		g.st.Stop()
		return out
	}
	hold := 0
	if !final {
		for _, stop := range g.req.stops {
			for k := min(len(stop)-1, len(g.pending)); k > hold; k-- {
				if strings.HasSuffix(g.pending, stop[:k]) {
					hold = k
					break
				}
			}
		}
	}
	out := g.pending[:len(g.pending)-hold]
	g.pending = g.pending[len(g.pending)-hold:]
	return out
}

// end handles the engine's end of the request: the remaining text, or the
// error to report.
func (g *genRun) end(reason FinishReason, err error) (string, *apiError) {
	switch reason {
	case FinishStop, FinishLength:
		g.finish = string(reason)
		g.pending += g.dec.Flush()
		out := g.release(true)
		if g.finish == "" { // release matched no stop string
			g.finish = string(reason)
		}
		return out, nil
	case FinishTimeout:
		// Before any token and before its own deadline, the request timed out
		// in the queue: the cluster is overloaded (503). Otherwise its
		// deadline passed (504).
		if g.tokens == 0 && (g.p.Deadline.IsZero() || time.Now().Before(g.p.Deadline)) {
			msg := "the request timed out waiting to be scheduled; the server is overloaded"
			if rerr := g.s.ready(); rerr != nil {
				msg = "the request timed out waiting for a pipeline: " + rerr.Error()
			}
			return "", &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "queue_timeout",
				msg: msg, retryAfter: retryNotReady}
		}
		return "", &apiError{status: http.StatusGatewayTimeout, typ: "server_error", code: "timeout",
			msg: "the request did not finish before its deadline (request timeout " + g.s.cfg.RequestTimeout.String() + ")"}
	case FinishAborted:
		msg := "the request was aborted"
		if err != nil {
			msg += ": " + err.Error()
		}
		return "", errInternal("%s", msg)
	}
	select {
	case <-g.s.eng.stopped:
		return "", &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "service_unavailable",
			msg: "the server stopped before the request finished", retryAfter: retryNotReady}
	default:
	}
	if errors.Is(err, ErrUnavailable) {
		return "", errUnavailable(err)
	}
	msg := "the request failed"
	if err != nil {
		msg = err.Error()
	}
	return "", errInternal("%s", msg)
}

func (g *genRun) usage() usage {
	return usage{PromptTokens: len(g.req.prompt), CompletionTokens: g.tokens, TotalTokens: len(g.req.prompt) + g.tokens}
}

// takeLogprobs returns the logprobs gathered since the last call in the
// request's shape, or nil.
func (g *genRun) takeLogprobs(all bool) any {
	if !g.req.logprobs {
		return nil
	}
	lps := g.lps
	g.lps = nil
	if len(lps) == 0 && !all {
		return nil
	}
	tok := g.s.info.Tokenizer
	if g.req.chat {
		out := chatLogprobs{Content: make([]chatTokenLP, len(lps))}
		for i, lp := range lps {
			text, b := tokenText(tok, lp.id)
			e := chatTokenLP{Token: text, Logprob: logprob(lp.logprob), Bytes: b, TopLogprobs: make([]chatTopLP, len(lp.top))}
			for j, alt := range lp.top {
				at, ab := tokenText(tok, alt.Token)
				e.TopLogprobs[j] = chatTopLP{Token: at, Logprob: logprob(alt.Logprob), Bytes: ab}
			}
			out.Content[i] = e
		}
		return out
	}
	out := completionLogprobs{
		Tokens: make([]string, len(lps)), TokenLogprobs: make([]logprob, len(lps)),
		TopLogprobs: make([]map[string]logprob, len(lps)), TextOffset: make([]int, len(lps)),
	}
	for i, lp := range lps {
		out.Tokens[i], _ = tokenText(tok, lp.id)
		out.TokenLogprobs[i] = logprob(lp.logprob)
		out.TextOffset[i] = lp.offset
		m := make(map[string]logprob, len(lp.top))
		for _, alt := range lp.top {
			at, _ := tokenText(tok, alt.Token)
			if _, dup := m[at]; !dup {
				m[at] = logprob(alt.Logprob)
			}
		}
		out.TopLogprobs[i] = m
	}
	return out
}

// tokenText renders a token for logprobs: its text when it is valid UTF-8,
// else "bytes:\xNN..." as OpenAI writes partial characters; control tokens
// as their piece. bytes are the token's bytes as integers.
func tokenText(tok *tokenizer.Tokenizer, id int32) (string, []int) {
	b := tok.TokenBytes(id)
	if len(b) == 0 {
		p := tok.Piece(id)
		return p, bytesOf([]byte(p))
	}
	if utf8.Valid(b) {
		return string(b), bytesOf(b)
	}
	var sb strings.Builder
	sb.WriteString("bytes:")
	for _, c := range b {
		sb.WriteString(`\x`)
		sb.WriteString(strconv.FormatUint(uint64(c)|0x100, 16)[1:])
	}
	return sb.String(), bytesOf(b)
}

func bytesOf(b []byte) []int {
	out := make([]int, len(b))
	for i, c := range b {
		out[i] = int(c)
	}
	return out
}

// wholeResponse reads the request to its end and writes one JSON answer.
func (s *Server) wholeResponse(ctx context.Context, c *call, g *genRun) {
	var text strings.Builder
	if g.req.echo {
		text.WriteString(g.req.promptText)
	}
	for g.finish == "" {
		toks, done, reason, err := g.st.Next(ctx)
		if !done && err != nil { // ctx ended: Next aborted the request
			c.log.Debug("client gone", "err", err, "completion_tokens", g.tokens)
			return
		}
		g.timer.observe(len(toks))
		for _, t := range toks {
			text.WriteString(g.feed(t))
			if g.finish != "" {
				break
			}
		}
		if done && g.finish == "" {
			out, aerr := g.end(reason, err)
			if aerr != nil {
				s.writeError(c, aerr)
				return
			}
			text.WriteString(out)
		}
	}
	now := time.Now().Unix()
	if g.req.chat {
		msg := &chatMessage{Role: "assistant", Content: new(text.String())}
		if g.tc != nil {
			g.tc.push(text.String())
			content, calls := g.tc.finish()
			if len(calls) > 0 {
				msg.Content, g.finish = nil, "tool_calls"
				if content != "" {
					msg.Content = &content
				}
				for _, call := range calls {
					msg.ToolCalls = append(msg.ToolCalls, toolCallOut{ID: callID(g.tc.ts.syntax), Type: "function",
						Function: toolFunction{Name: call.Name, Arguments: call.Arguments}})
				}
			}
		}
		s.logDone(c, g)
		s.writeJSON(c, http.StatusOK, chatResponse{
			ID: "chatcmpl-" + c.rid, Object: "chat.completion", Created: now, Model: s.info.Name,
			Choices: []chatChoice{{Message: msg, Logprobs: g.takeLogprobs(true), FinishReason: g.finish}},
			Usage:   new(g.usage()),
		})
		return
	}
	s.logDone(c, g)
	s.writeJSON(c, http.StatusOK, completionResponse{
		ID: "cmpl-" + c.rid, Object: "text_completion", Created: now, Model: s.info.Name,
		Choices: []completionChoice{{Text: text.String(), Logprobs: g.takeLogprobs(true), FinishReason: &g.finish}},
		Usage:   new(g.usage()),
	})
}

func (s *Server) logDone(c *call, g *genRun) {
	c.log.Info("request done", "path", c.r.URL.Path, "prompt_tokens", len(g.req.prompt),
		"completion_tokens", g.tokens, "finish_reason", g.finish, "seed", g.req.sample.Seed, "stream", g.req.stream)
}

// sse writes server-sent events; after a write error it writes nothing.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration // each event's write deadline
	err     error
}

func (e *sse) send(v any) {
	if e.err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		e.err = err
		return
	}
	e.raw(b)
}

func (e *sse) raw(b []byte) {
	if e.err != nil {
		return
	}
	buf := make([]byte, 0, len(b)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	e.rc.SetWriteDeadline(time.Now().Add(e.timeout)) // ErrNotSupported only for exotic writers
	if _, e.err = e.w.Write(buf); e.err == nil {
		e.err = e.rc.Flush()
	}
}

// comment writes an SSE comment line (": text"), which clients ignore and
// which keeps proxies and clients from timing the connection out.
func (e *sse) comment(text string) {
	if e.err != nil {
		return
	}
	text = strings.NewReplacer("\r", " ", "\n", " ").Replace(text)
	e.rc.SetWriteDeadline(time.Now().Add(e.timeout)) // ErrNotSupported only for exotic writers
	if _, e.err = e.w.Write([]byte(": " + text + "\n\n")); e.err == nil {
		e.err = e.rc.Flush()
	}
}

// keepAlive is the comment a stream gets after KeepAlive without an event:
// why it waits, as far as the server can tell.
func (s *Server) keepAlive() string {
	if err := s.ready(); err != nil {
		return "waiting for a pipeline: " + err.Error()
	}
	return "waiting"
}

// streamResponse writes the request's tokens as server-sent events as they
// come, and a keep-alive comment after every KeepAlive without one.
func (s *Server) streamResponse(ctx context.Context, c *call, g *genRun) {
	h := c.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	c.w.WriteHeader(http.StatusOK)
	ev := &sse{w: c.w, rc: http.NewResponseController(c.w), timeout: s.cfg.WriteTimeout}
	created := time.Now().Unix()
	id := "cmpl-" + c.rid
	if g.req.chat {
		id = "chatcmpl-" + c.rid
	}
	chunk := func(text string, lp any, finish string) any {
		var fr *string
		if finish != "" {
			fr = &finish
		}
		if g.req.chat {
			d := chatDelta{}
			if finish == "" {
				d.Content = &text
			}
			ch := chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.info.Name,
				Choices: []chatChoice{{Delta: &d, Logprobs: lp, FinishReason: finish}}}
			if g.req.includeUsage {
				ch.Usage = new(*usage)
			}
			return ch
		}
		ch := completionResponse{ID: id, Object: "text_completion", Created: created, Model: s.info.Name,
			Choices: []completionChoice{{Text: text, Logprobs: lp, FinishReason: fr}}}
		if g.req.includeUsage {
			ch.Usage = nil // the usage chunk carries it
			ch.UsageNull = true
		}
		return ch
	}
	callChunk := func(d toolCallDelta) any {
		return chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.info.Name,
			Choices: []chatChoice{{Delta: &chatDelta{ToolCalls: []toolCallDelta{d}}}}, Usage: usageNull(g.req.includeUsage)}
	}
	if g.req.chat {
		role := chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.info.Name,
			Choices: []chatChoice{{Delta: &chatDelta{Role: "assistant", Content: new("")}}}}
		if g.req.includeUsage {
			role.Usage = new(*usage)
		}
		ev.send(role)
	} else if g.req.echo {
		ev.send(chunk(g.req.promptText, nil, ""))
	}
	fail := func(aerr *apiError) {
		c.log.Log(ctx, levelOf(aerr), "stream failed", "status", aerr.status, "err", aerr.msg, "completion_tokens", g.tokens)
		ev.send(aerr.envelope())
		ev.raw([]byte("[DONE]"))
	}
	idle := time.NewTimer(s.cfg.KeepAlive)
	defer idle.Stop()
	for g.finish == "" && ev.err == nil {
		toks, done, reason, err, waited := g.st.next(ctx, idle.C)
		if waited {
			ev.comment(s.keepAlive())
			idle.Reset(s.cfg.KeepAlive)
			continue
		}
		idle.Reset(s.cfg.KeepAlive)
		if !done && err != nil { // ctx ended: Next aborted the request
			c.log.Debug("client gone", "err", err, "completion_tokens", g.tokens)
			return
		}
		g.timer.observe(len(toks))
		var text strings.Builder
		for _, t := range toks {
			text.WriteString(g.feed(t))
			if g.finish != "" {
				break
			}
		}
		if done && g.finish == "" {
			out, aerr := g.end(reason, err)
			if aerr != nil {
				if text.Len() > 0 {
					ev.send(chunk(text.String(), g.takeLogprobs(false), ""))
				}
				fail(aerr)
				return
			}
			text.WriteString(out)
		}
		out := text.String()
		var calls []toolCallDelta
		if g.tc != nil {
			out, calls = g.tc.push(out)
		}
		if lp := g.takeLogprobs(false); out != "" || lp != nil {
			ev.send(chunk(out, lp, ""))
		}
		for _, d := range calls {
			ev.send(callChunk(d))
		}
	}
	if ev.err != nil {
		c.log.Debug("client gone", "err", ev.err, "completion_tokens", g.tokens)
		g.st.Abort()
		return
	}
	if g.tc != nil && ev.err == nil {
		rest, calls, ok := g.tc.finishStream()
		if rest != "" {
			ev.send(chunk(rest, nil, ""))
		}
		for _, d := range calls {
			ev.send(callChunk(d))
		}
		if ok {
			g.finish = "tool_calls"
		}
	}
	ev.send(chunk("", nil, g.finish))
	if g.req.includeUsage {
		u := g.usage()
		if g.req.chat {
			ev.send(chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.info.Name,
				Choices: []chatChoice{}, Usage: new(&u)})
		} else {
			ev.send(completionResponse{ID: id, Object: "text_completion", Created: created, Model: s.info.Name,
				Choices: []completionChoice{}, Usage: &u})
		}
	}
	ev.raw([]byte("[DONE]"))
	s.logDone(c, g)
}

// levelOf is the level a failed stream is logged at: errors only for the
// server's own failures, not for overload and timeouts.
func levelOf(e *apiError) slog.Level {
	if e.status >= 500 && e.status != http.StatusServiceUnavailable && e.status != http.StatusGatewayTimeout {
		return slog.LevelError
	}
	return slog.LevelInfo
}

// logprob is a log-probability as JSON: shortest float32 digits, and -9999
// for -Inf (as vLLM writes it), since JSON has no infinities.
type logprob float32

func (l logprob) MarshalJSON() ([]byte, error) {
	v := float64(l)
	if math.IsInf(v, 0) || math.IsNaN(v) {
		v = -9999
	}
	return strconv.AppendFloat(nil, v, 'g', -1, 32), nil
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type chatMessage struct {
	Role      string        `json:"role"`
	Content   *string       `json:"content"` // null beside tool calls
	ToolCalls []toolCallOut `json:"tool_calls,omitempty"`
}

type chatDelta struct {
	Role      string          `json:"role,omitempty"`
	Content   *string         `json:"content,omitempty"`
	ToolCalls []toolCallDelta `json:"tool_calls,omitempty"`
}

// usageNull is a streamed chunk's usage: null when the client asked for
// usage (the last chunk carries it), absent otherwise.
func usageNull(include bool) **usage {
	if include {
		return new(*usage)
	}
	return nil
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatDelta   `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason string       `json:"-"`
}

// MarshalJSON writes finish_reason as null until there is one.
func (c chatChoice) MarshalJSON() ([]byte, error) {
	type plain chatChoice
	var fr *string
	if c.FinishReason != "" {
		fr = &c.FinishReason
	}
	return json.Marshal(struct {
		plain
		FinishReason *string `json:"finish_reason"`
	}{plain(c), fr})
}

type chatResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
}

// chatChunk is a streamed chat event. Usage is absent unless the client
// asked for it; then it is null on every chunk but the last.
type chatChunk struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   **usage      `json:"usage,omitempty"`
}

type chatLogprobs struct {
	Content []chatTokenLP `json:"content"`
}

type chatTokenLP struct {
	Token       string      `json:"token"`
	Logprob     logprob     `json:"logprob"`
	Bytes       []int       `json:"bytes"`
	TopLogprobs []chatTopLP `json:"top_logprobs"`
}

type chatTopLP struct {
	Token   string  `json:"token"`
	Logprob logprob `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type completionResponse struct {
	ID        string             `json:"id"`
	Object    string             `json:"object"`
	Created   int64              `json:"created"`
	Model     string             `json:"model"`
	Choices   []completionChoice `json:"choices"`
	Usage     *usage             `json:"usage,omitempty"`
	UsageNull bool               `json:"-"`
}

// MarshalJSON writes "usage": null on streamed chunks when usage comes last.
func (r completionResponse) MarshalJSON() ([]byte, error) {
	type plain completionResponse
	if !r.UsageNull {
		return json.Marshal(plain(r))
	}
	return json.Marshal(struct {
		plain
		Usage *usage `json:"usage"`
	}{plain(r), nil})
}

type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []logprob            `json:"token_logprobs"`
	TopLogprobs   []map[string]logprob `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}
