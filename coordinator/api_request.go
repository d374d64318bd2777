package coordinator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/strata-llm/strata/model/chat"
	"github.com/strata-llm/strata/model/sample"
	"github.com/strata-llm/strata/model/tokenizer"
)

// Request limits the OpenAI API sets.
const (
	maxStops   = 4  // stop sequences per request
	maxRawShow = 40 // bytes of a bad value quoted back in an error
)

// genRequest is a validated, tokenized completion or chat request.
type genRequest struct {
	chat         bool
	prompt       []int32
	promptText   string // what echo prepends
	maxTokens    int
	sample       sample.Params
	seedRandom   bool // the seed was chosen by the server (logged)
	logprobs     bool
	stops        []string
	echo         bool
	stream       bool
	includeUsage bool
	tools        *toolSet // chat with tools (tool_choice not none); nil otherwise
}

// fields is a request object by field, each value still raw, so that each
// field is checked with its own name and the value received.
type fields map[string]json.RawMessage

// decodeObject parses body as a JSON object.
func decodeObject(body []byte) (fields, *apiError) {
	if !utf8.Valid(body) {
		return nil, invalid("", "request body is not valid UTF-8")
	}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil, invalid("", "request body is empty; expected a JSON object")
	}
	if trimmed[0] != '{' {
		if !json.Valid(trimmed) {
			return nil, invalid("", "malformed JSON in the request body")
		}
		return nil, invalid("", "request body must be a JSON object, got %s", kindOf(trimmed))
	}
	var f fields
	if err := json.Unmarshal(trimmed, &f); err != nil {
		if se, ok := errors.AsType[*json.SyntaxError](err); ok {
			return nil, invalid("", "malformed JSON in the request body at byte %d: %v", se.Offset, err)
		}
		return nil, invalid("", "malformed JSON in the request body: %v", err)
	}
	return f, nil
}

// kindOf names the JSON type of a raw value.
func kindOf(raw []byte) string {
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// show quotes a raw value for an error message, shortened.
func show(raw []byte) string {
	if len(raw) > maxRawShow {
		cut := maxRawShow
		for cut > 0 && !utf8.RuneStart(raw[cut]) {
			cut--
		}
		return string(raw[:cut]) + "…"
	}
	return string(raw)
}

func wrongType(name, want string, raw []byte) *apiError {
	return invalid(name, "%s must be %s, got %s %s", name, want, kindOf(raw), show(raw))
}

// get returns a field's raw value; null counts as absent.
func (f fields) get(name string) (json.RawMessage, bool) {
	raw, ok := f[name]
	if !ok || string(raw) == "null" {
		return nil, false
	}
	return raw, true
}

func (f fields) str(name string) (string, bool, *apiError) {
	raw, ok := f.get(name)
	if !ok {
		return "", false, nil
	}
	return rawString(name, raw)
}

func rawString(name string, raw json.RawMessage) (string, bool, *apiError) {
	var s string
	if kindOf(raw) != "string" || json.Unmarshal(raw, &s) != nil {
		return "", false, wrongType(name, "a string", raw)
	}
	return s, true, nil
}

func (f fields) boolean(name string) (bool, bool, *apiError) {
	raw, ok := f.get(name)
	if !ok {
		return false, false, nil
	}
	switch string(raw) {
	case "true":
		return true, true, nil
	case "false":
		return false, true, nil
	}
	return false, false, wrongType(name, "a boolean", raw)
}

// number returns a numeric field; a value beyond float64 is ±Inf.
func (f fields) number(name string) (float64, bool, *apiError) {
	raw, ok := f.get(name)
	if !ok {
		return 0, false, nil
	}
	return rawNumber(name, raw)
}

func rawNumber(name string, raw json.RawMessage) (float64, bool, *apiError) {
	if kindOf(raw) != "number" {
		return 0, false, wrongType(name, "a number", raw)
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, false, wrongType(name, "a number", raw)
	}
	return v, true, nil
}

// integer returns an integral numeric field as a float64, so that callers
// compare values of any size against their limits before converting.
func (f fields) integer(name string) (float64, bool, *apiError) {
	raw, ok := f.get(name)
	if !ok {
		return 0, false, nil
	}
	return rawInteger(name, raw)
}

func rawInteger(name string, raw json.RawMessage) (float64, bool, *apiError) {
	if kindOf(raw) != "number" {
		return 0, false, wrongType(name, "an integer", raw)
	}
	v, _, err := rawNumber(name, raw)
	if err != nil {
		return 0, false, err
	}
	if v != math.Trunc(v) {
		return 0, false, invalid(name, "%s must be an integer, got %s", name, show(raw))
	}
	return v, true, nil
}

// fmtNum prints a validated number the way a client would write it.
func fmtNum(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// checkModel answers 404 for a model other than the one served; an empty or
// absent model means it.
func (s *Server) checkModel(f fields) *apiError {
	name, ok, err := f.str("model")
	if err != nil {
		return err
	}
	if ok && name != "" && name != s.info.Name {
		return errUnknownModel(name)
	}
	return nil
}

// rejectUnsupported answers 400 for fields that would change what the
// client gets if strata ignored them.
func rejectUnsupported(f fields, chatReq bool) *apiError {
	if err := checkN(f, "n"); err != nil {
		return err
	}
	present := func(name string) bool {
		raw, ok := f.get(name)
		if !ok {
			return false
		}
		switch string(raw) {
		case "[]", "{}", `""`, "false":
			return false
		}
		return true
	}
	names := []string{"guided_json", "guided_regex", "guided_choice", "guided_grammar", "grammar", "json_schema", "min_tokens"}
	if chatReq {
		names = append(names, "functions", "audio", "prediction", "web_search_options")
		if raw, ok := f.get("function_call"); ok && string(raw) != `"none"` {
			return unsupported("function_call", "function_call is not supported (no functions), got %s", show(raw))
		}
		if raw, ok := f.get("modalities"); ok && string(raw) != `["text"]` {
			return unsupported("modalities", `modalities must be ["text"], got %s`, show(raw))
		}
	} else {
		if err := checkN(f, "best_of"); err != nil {
			return err
		}
		names = append(names, "suffix")
	}
	for _, name := range names {
		if present(name) {
			return unsupported(name, "%s is not supported", name)
		}
	}
	return nil
}

// checkN accepts n (or best_of) of 1 only.
func checkN(f fields, name string) *apiError {
	v, ok, err := f.integer(name)
	if err != nil {
		return err
	}
	if ok && v != 1 {
		return unsupported(name, "%s must be 1 (one choice per request is supported), got %s", name, fmtNum(v))
	}
	return nil
}

// parseCompletion validates and tokenizes a /v1/completions body.
func (s *Server) parseCompletion(body []byte) (*genRequest, *apiError) {
	f, err := decodeObject(body)
	if err != nil {
		return nil, err
	}
	if err := s.checkModel(f); err != nil {
		return nil, err
	}
	if err := rejectUnsupported(f, false); err != nil {
		return nil, err
	}
	raw, ok := f.get("prompt")
	if !ok {
		return nil, invalid("prompt", "prompt is required")
	}
	req := &genRequest{}
	req.prompt, req.promptText, err = s.promptTokens(raw)
	if err != nil {
		return nil, err
	}
	if req.echo, _, err = f.boolean("echo"); err != nil {
		return nil, err
	}
	if v, ok, err := f.integer("logprobs"); err != nil {
		return nil, err
	} else if ok {
		if v < 0 || v > sample.MaxTopLogprobs {
			return nil, invalid("logprobs", "logprobs must be in [0, %d], got %s", sample.MaxTopLogprobs, fmtNum(v))
		}
		req.logprobs, req.sample.TopLogprobs = true, int(v)
	}
	if req.echo && req.logprobs {
		return nil, unsupported("echo", "echo together with logprobs is not supported (prompt logprobs are not computed)")
	}
	if err := s.parseCommon(f, req, "max_tokens"); err != nil {
		return nil, err
	}
	return req, nil
}

// parseChat validates, renders and tokenizes a /v1/chat/completions body.
func (s *Server) parseChat(body []byte) (*genRequest, *apiError) {
	f, err := decodeObject(body)
	if err != nil {
		return nil, err
	}
	if err := s.checkModel(f); err != nil {
		return nil, err
	}
	if err := rejectUnsupported(f, true); err != nil {
		return nil, err
	}
	req := &genRequest{chat: true}
	if req.tools, _, err = s.parseTools(f); err != nil {
		return nil, err
	}
	if req.prompt, err = s.chatTokens(f, true); err != nil {
		return nil, err
	}
	lp, _, err := f.boolean("logprobs")
	if err != nil {
		return nil, err
	}
	req.logprobs = lp
	if v, ok, err := f.integer("top_logprobs"); err != nil {
		return nil, err
	} else if ok {
		if v < 0 || v > sample.MaxTopLogprobs {
			return nil, invalid("top_logprobs", "top_logprobs must be in [0, %d], got %s", sample.MaxTopLogprobs, fmtNum(v))
		}
		if !lp && v > 0 {
			return nil, invalid("top_logprobs", "top_logprobs requires logprobs to be true")
		}
		req.sample.TopLogprobs = int(v)
	}
	maxField := "max_tokens"
	if _, ok := f.get("max_completion_tokens"); ok {
		maxField = "max_completion_tokens"
	}
	if err := s.parseCommon(f, req, maxField); err != nil {
		return nil, err
	}
	if req.tools != nil {
		c, err := req.tools.constraint()
		if err != nil {
			return nil, err
		}
		if c != nil && req.sample.Constraint != nil {
			return nil, invalid("tool_choice", "tool_choice %q and response_format cannot both constrain the output", req.tools.choice)
		}
		if c != nil {
			req.sample.Constraint = c
		}
	}
	return req, nil
}

// fitsContext refuses text that cannot fit the context whatever it
// encodes to, by the tokenizer's cheap lower bound, before any CPU is spent
// rendering or tokenizing it (a multi-megabyte body would otherwise cost
// seconds of the cores the pipeline runs on). Text that passes is still
// checked against the context once tokenized.
func (s *Server) fitsContext(field, text string) *apiError {
	if s.info.Tokenizer == nil {
		return nil
	}
	if n := s.info.Tokenizer.MinTokens(text); n >= s.info.Context {
		return invalid(field, "the %s holds %d bytes, at least %d tokens, which do not fit the context of %d tokens", field, len(text), n, s.info.Context)
	}
	return nil
}

// chatTokens renders messages with the model's template and tokenizes the
// result.
func (s *Server) chatTokens(f fields, addGen bool) ([]int32, *apiError) {
	msgs, err := parseMessages(f)
	if err != nil {
		return nil, err
	}
	_, tools, err := s.parseTools(f)
	if err != nil {
		return nil, err
	}
	var all strings.Builder
	for _, m := range msgs {
		all.WriteString(m.Content)
	}
	if err := s.fitsContext("messages", all.String()); err != nil {
		return nil, err
	}
	text, rerr := s.info.Template.Render(msgs, chat.Options{BOS: s.info.BOS, EOS: s.info.EOS, AddGenerationPrompt: addGen, Tools: tools})
	if rerr != nil {
		if re, ok := errors.AsType[*chat.RaiseError](rerr); ok {
			return nil, invalid("messages", "the model's chat template refuses these messages: %s", re.Message)
		}
		return nil, invalid("messages", "the model's chat template cannot render these messages: %v", rerr)
	}
	// Templates usually write bos_token themselves. As llama.cpp's server
	// does (common_chat_templates_apply), strip a leading BOS and a trailing
	// EOS the vocabulary adds anyway, then tokenize with AddSpecial, so the
	// prompt holds each once.
	tok := s.info.Tokenizer
	if tok.AddBOS() && s.info.BOS != "" {
		text = strings.TrimPrefix(text, s.info.BOS)
	}
	if tok.AddEOS() && s.info.EOS != "" {
		text = strings.TrimSuffix(text, s.info.EOS)
	}
	toks := tok.Encode(text, tokenizer.EncodeOptions{AddSpecial: true, ParseSpecial: true})
	if len(toks) == 0 {
		return nil, invalid("messages", "messages render to an empty prompt")
	}
	return toks, nil
}

var chatRoles = map[string]string{"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}

func parseMessages(f fields) ([]chat.Message, *apiError) {
	raw, ok := f.get("messages")
	if !ok {
		return nil, invalid("messages", "messages is required")
	}
	var items []json.RawMessage
	if kindOf(raw) != "array" || json.Unmarshal(raw, &items) != nil {
		return nil, wrongType("messages", "an array of messages", raw)
	}
	if len(items) == 0 {
		return nil, invalid("messages", "messages must not be empty")
	}
	msgs := make([]chat.Message, len(items))
	for i, item := range items {
		name := fmt.Sprintf("messages[%d]", i)
		var m fields
		if kindOf(item) != "object" || json.Unmarshal(item, &m) != nil {
			return nil, wrongType(name, "an object", item)
		}
		role, ok, err := m.str("role")
		if err != nil {
			err.msg = name + "." + err.msg
			err.param = name + ".role"
			return nil, err
		}
		if !ok {
			return nil, invalid(name+".role", "%s.role is required", name)
		}
		mapped, known := chatRoles[role]
		if !known {
			return nil, invalid(name+".role", "%s.role must be one of system, developer, user, assistant, tool, got %q", name, role)
		}
		content, err := messageContent(name, m)
		if err != nil {
			return nil, err
		}
		msgs[i] = chat.Message{Role: mapped, Content: content}
		if err := toolMessage(name, role, m, &msgs[i]); err != nil {
			return nil, err
		}
	}
	return msgs, nil
}

// messageContent accepts a string or an array of text parts.
func messageContent(name string, m fields) (string, *apiError) {
	raw, ok := m.get("content")
	if !ok {
		return "", nil
	}
	switch kindOf(raw) {
	case "string":
		s, _, err := rawString(name+".content", raw)
		return s, err
	case "array":
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", wrongType(name+".content", `a string or an array of {"type": "text", "text": ...} parts`, raw)
		}
		var b strings.Builder
		for j, p := range parts {
			if p.Type != "text" || p.Text == nil {
				return "", unsupported(fmt.Sprintf("%s.content[%d]", name, j), `%s.content[%d] must be a {"type": "text", "text": ...} part, got type %q`, name, j, p.Type)
			}
			b.WriteString(*p.Text)
		}
		return b.String(), nil
	}
	return "", wrongType(name+".content", "a string or an array of text parts", raw)
}

// promptTokens turns a completions prompt (a string, an array of one
// string, an array of token IDs, or an array of one array of token IDs)
// into tokens, and the text echo prepends.
func (s *Server) promptTokens(raw json.RawMessage) ([]int32, string, *apiError) {
	tok := s.info.Tokenizer
	encode := func(text string) ([]int32, string, *apiError) {
		if err := s.fitsContext("prompt", text); err != nil {
			return nil, "", err
		}
		// An empty text is a prompt when the model adds BOS: generation
		// starts from BOS alone, as in llama.cpp's server and vLLM.
		toks := tok.Encode(text, tokenizer.EncodeOptions{AddSpecial: true, ParseSpecial: true})
		if len(toks) == 0 {
			return nil, "", invalid("prompt", "prompt must not be empty (it encodes to no tokens, and this model adds no BOS)")
		}
		return toks, text, nil
	}
	switch kindOf(raw) {
	case "string":
		text, _, err := rawString("prompt", raw)
		if err != nil {
			return nil, "", err
		}
		return encode(text)
	case "array":
	default:
		return nil, "", wrongType("prompt", "a string, an array of strings or an array of token IDs", raw)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, "", wrongType("prompt", "a string, an array of strings or an array of token IDs", raw)
	}
	if len(items) == 0 {
		return nil, "", invalid("prompt", "prompt must not be empty")
	}
	switch kindOf(items[0]) {
	case "string", "array":
		if len(items) > 1 {
			return nil, "", unsupported("prompt", "prompt must hold one prompt (n = 1 per request), got %d", len(items))
		}
		if kindOf(items[0]) == "string" {
			text, _, err := rawString("prompt[0]", items[0])
			if err != nil {
				return nil, "", err
			}
			return encode(text)
		}
		var inner []json.RawMessage
		if err := json.Unmarshal(items[0], &inner); err != nil {
			return nil, "", wrongType("prompt[0]", "an array of token IDs", items[0])
		}
		return s.tokenIDs("prompt[0]", inner)
	}
	return s.tokenIDs("prompt", items)
}

// tokenIDs checks an array of token IDs against the vocabulary.
func (s *Server) tokenIDs(name string, items []json.RawMessage) ([]int32, string, *apiError) {
	if len(items) == 0 {
		return nil, "", invalid(name, "%s must not be empty", name)
	}
	ids := make([]int32, len(items))
	for i, item := range items {
		field := fmt.Sprintf("%s[%d]", name, i)
		v, _, err := rawInteger(field, item)
		if err != nil {
			return nil, "", err
		}
		if v < 0 || v >= float64(s.info.Vocab) {
			return nil, "", invalid(name, "%s must be a token ID in [0, %d), got %s", field, s.info.Vocab, fmtNum(v))
		}
		ids[i] = int32(v)
	}
	return ids, s.info.Tokenizer.Decode(ids), nil
}

// parseCommon reads the fields completions and chat share, once the prompt
// is known.
func (s *Server) parseCommon(f fields, req *genRequest, maxField string) *apiError {
	var err *apiError
	if req.stream, _, err = f.boolean("stream"); err != nil {
		return err
	}
	if raw, ok := f.get("stream_options"); ok {
		if !req.stream {
			return invalid("stream_options", "stream_options is only allowed when stream is true")
		}
		var so fields
		if kindOf(raw) != "object" || json.Unmarshal(raw, &so) != nil {
			return wrongType("stream_options", "an object", raw)
		}
		if req.includeUsage, _, err = so.boolean("include_usage"); err != nil {
			err.param = "stream_options.include_usage"
			return err
		}
	}

	// Length.
	n, ctx := len(req.prompt), s.info.Context
	if n >= ctx {
		return invalid("prompt", "the prompt must be < %d tokens (the context) to leave room for output, got %d tokens", ctx, n)
	}
	room := ctx - n
	req.maxTokens = room
	if v, ok, err := f.integer(maxField); err != nil {
		return err
	} else if ok {
		switch {
		case v < 1:
			return invalid(maxField, "%s must be >= 1, got %s", maxField, fmtNum(v))
		case v > float64(room):
			return invalid(maxField, "%s must be <= %d (context %d minus prompt %d), got %s", maxField, room, ctx, n, fmtNum(v))
		}
		req.maxTokens = int(v)
	}

	// Sampling. OpenAI's defaults: temperature 1, top_p 1.
	p := sample.DefaultParams()
	p.TopLogprobs = req.sample.TopLogprobs
	p.Temperature = 1
	floats := []struct {
		name string
		dst  *float32
	}{
		{"temperature", &p.Temperature}, {"top_p", &p.TopP}, {"min_p", &p.MinP},
		{"presence_penalty", &p.PresencePenalty}, {"frequency_penalty", &p.FrequencyPenalty},
		{"repetition_penalty", &p.RepetitionPenalty},
	}
	for _, fl := range floats {
		v, ok, err := f.number(fl.name)
		if err != nil {
			return err
		}
		if ok {
			if math.Abs(v) > math.MaxFloat32 {
				return invalid(fl.name, "%s must be finite, got %s", fl.name, fmtNum(v))
			}
			*fl.dst = float32(v)
		}
	}
	if v, ok, err := f.integer("top_k"); err != nil {
		return err
	} else if ok {
		switch {
		case v == -1: // vLLM's "off"
		case v < 0:
			return invalid("top_k", "top_k must be >= 0 (0 or -1 is off), got %s", fmtNum(v))
		case v < float64(s.info.Vocab):
			p.TopK = int(v)
		}
	}
	if err := s.parseLogitBias(f, &p); err != nil {
		return err
	}
	if raw, ok := f.get("seed"); ok {
		seed, err := parseSeed(raw)
		if err != nil {
			return err
		}
		p.Seed = seed
	} else {
		p.Seed, req.seedRandom = rand.Uint64(), true
	}
	if verr := p.Validate(s.info.Vocab); verr != nil {
		if pe, ok := errors.AsType[*sample.ParamError](verr); ok {
			name := paramName(pe.Field)
			return invalid(strings.SplitN(name, "[", 2)[0], "%s must be %s, got %s", name, pe.Limit, pe.Value)
		}
		return invalid("", "%v", verr)
	}
	if p.Constraint, err = parseResponseFormat(f); err != nil {
		return err
	}
	req.sample = p

	// Stop strings.
	if raw, ok := f.get("stop"); ok {
		switch kindOf(raw) {
		case "string":
			st, _, err := rawString("stop", raw)
			if err != nil {
				return err
			}
			if st != "" {
				req.stops = []string{st}
			}
		case "array":
			var items []json.RawMessage
			if err := json.Unmarshal(raw, &items); err != nil {
				return wrongType("stop", "a string or an array of strings", raw)
			}
			if len(items) > maxStops {
				return invalid("stop", "stop must hold <= %d strings, got %d", maxStops, len(items))
			}
			for i, item := range items {
				st, _, err := rawString(fmt.Sprintf("stop[%d]", i), item)
				if err != nil {
					err.param = "stop"
					return err
				}
				if st == "" {
					return invalid("stop", "stop[%d] must not be empty", i)
				}
				req.stops = append(req.stops, st)
			}
		default:
			return wrongType("stop", "a string or an array of strings", raw)
		}
	}
	if _, _, err := f.str("user"); err != nil {
		return err
	}
	return nil
}

func (s *Server) parseLogitBias(f fields, p *sample.Params) *apiError {
	raw, ok := f.get("logit_bias")
	if !ok {
		return nil
	}
	var m map[string]json.RawMessage
	if kindOf(raw) != "object" || json.Unmarshal(raw, &m) != nil {
		return wrongType("logit_bias", "an object mapping token IDs to biases", raw)
	}
	if len(m) == 0 {
		return nil
	}
	if len(m) > s.info.Vocab {
		return invalid("logit_bias", "logit_bias must have <= %d entries (the vocabulary), got %d", s.info.Vocab, len(m))
	}
	p.LogitBias = make(map[int32]float32, len(m))
	for k, v := range m {
		id, err := strconv.ParseInt(k, 10, 32)
		if err != nil || id < 0 || id >= int64(s.info.Vocab) {
			return invalid("logit_bias", "logit_bias keys must be token IDs in [0, %d), got %q", s.info.Vocab, k)
		}
		name := fmt.Sprintf("logit_bias[%s]", k)
		b, _, aerr := rawNumber(name, v)
		if aerr != nil {
			aerr.param = "logit_bias"
			return aerr
		}
		if !(b >= -sample.MaxBias && b <= sample.MaxBias) {
			return invalid("logit_bias", "%s must be in [-%d, %d], got %s", name, sample.MaxBias, sample.MaxBias, fmtNum(b))
		}
		p.LogitBias[int32(id)] = float32(b)
	}
	return nil
}

// parseSeed accepts any integer in [-2^63, 2^64).
func parseSeed(raw json.RawMessage) (uint64, *apiError) {
	if kindOf(raw) != "number" {
		return 0, wrongType("seed", "an integer", raw)
	}
	if v, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return uint64(v), nil
	}
	if v, err := strconv.ParseUint(string(raw), 10, 64); err == nil {
		return v, nil
	}
	return 0, invalid("seed", "seed must be an integer in [-2^63, 2^64), got %s", show(raw))
}

// paramName maps a sample.Params field to the request's field.
func paramName(goField string) string {
	base, rest, _ := strings.Cut(goField, "[")
	name, ok := map[string]string{
		"Temperature": "temperature", "TopK": "top_k", "TopP": "top_p", "MinP": "min_p",
		"RepetitionPenalty": "repetition_penalty", "FrequencyPenalty": "frequency_penalty",
		"PresencePenalty": "presence_penalty", "LogitBias": "logit_bias", "TopLogprobs": "top_logprobs",
	}[base]
	if !ok {
		name = base
	}
	if rest != "" {
		name += "[" + rest
	}
	return name
}
