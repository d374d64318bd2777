package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// llamaServer is a running llama-server.
type llamaServer struct {
	cmd    *exec.Cmd
	exited chan error
	base   string
	client *http.Client
	log    *bytes.Buffer
}

// startLlama starts server (a command line: "chroot /work/trixie
// llama-server") on the model at path as the server sees it, with flash
// attention fa ("on" or "off"), and waits until it answers /health.
func startLlama(ctx context.Context, server []string, path, fa string, ctxLen, threads int) (*llamaServer, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	// -np 1: one slot holding the whole context; -lv 4 logs the settings
	// in effect (flash attention, threads, KV types) for the record.
	args := append(slices.Clone(server[1:]), "-m", path, "-c", strconv.Itoa(ctxLen), "-np", "1",
		"--host", "127.0.0.1", "--port", strconv.Itoa(port), "-fa", fa, "-t", strconv.Itoa(threads), "-lv", "4")
	s := &llamaServer{
		cmd:    exec.Command(server[0], args...),
		exited: make(chan error, 1),
		base:   fmt.Sprintf("http://127.0.0.1:%d", port),
		client: &http.Client{Timeout: 10 * time.Minute},
		log:    &bytes.Buffer{},
	}
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", strings.Join(server, " "), err)
	}
	go func() { s.exited <- s.cmd.Wait() }()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		select {
		case err := <-s.exited:
			s.exited <- err
			return nil, fmt.Errorf("llama-server exited early (%v):\n%s", err, tail(s.log.String(), 2000))
		default:
		}
		resp, err := s.client.Get(s.base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop()
			return nil, fmt.Errorf("llama-server not healthy within 3 minutes:\n%s", tail(s.log.String(), 2000))
		}
		time.Sleep(200 * time.Millisecond) // polling /health, bounded by the deadline
	}
}

func (s *llamaServer) stop() {
	s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// settings reads the settings in effect from the server's log.
func (s *llamaServer) settings() map[string]string {
	out := map[string]string{}
	text := s.log.String()
	for key, re := range map[string]*regexp.Regexp{
		"flash_attn":  regexp.MustCompile(`flash_attn\s*=\s*(\S+)`),
		"n_threads":   regexp.MustCompile(`n_threads = (\d+)`),
		"system_info": regexp.MustCompile(`system_info: (.*)`),
		"kv_k_type":   regexp.MustCompile(`K \((\w+)\):`),
		"build":       regexp.MustCompile(`build: (.*)`),
	} {
		if m := re.FindAllStringSubmatch(text, -1); m != nil {
			out[key] = strings.TrimSpace(m[len(m)-1][1])
		}
	}
	return out
}

var errStatus500 = errors.New("llama-server answered 500")

func (s *llamaServer) post(path string, body, into any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	resp, err := s.client.Post(s.base+path, "application/json", bytes.NewReader(b))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode == http.StatusInternalServerError {
		return fmt.Errorf("%w: %s", errStatus500, tail(string(raw), 300))
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s: %s", path, resp.Status, tail(string(raw), 300))
	}
	return json.Unmarshal(raw, into)
}

// tokenLP is one entry of llama-server's n_probs lists.
type tokenLP struct {
	ID      int32   `json:"id"`
	Logprob float64 `json:"logprob"`
}

type completion struct {
	Tokens []int32 `json:"tokens"`
	Probs  []struct {
		ID  int32     `json:"id"`
		Top []tokenLP `json:"top_logprobs"`
	} `json:"completion_probabilities"`
}

// llamaRun is llama.cpp's answer for one prompt.
type llamaRun struct {
	Prompt []int32 `json:"prompt_tokens"`
	Tokens []int32 `json:"tokens"`
	// Top holds, per generated token, llama.cpp's nProbs most likely tokens
	// at that position (log-softmax of the raw logits, before any bias).
	Top [][]tokenLP `json:"top"`
	// Top[i] is nil where llama-server gave no list: a token that ends
	// inside a UTF-8 sequence at the end of the text it returns.
	//
	// Stepwise says the 64-token request failed (500: the continuation
	// was not valid UTF-8) and the tokens were asked for one at a time,
	// each request reusing the cached prefix, so that each token is again
	// one decode step.
	Stepwise bool `json:"stepwise,omitempty"`
}

// greedyRequest is the /completion body: greedy (temperature 0, top_k 1,
// the top_k sampler alone), no penalties, past end-of-generation tokens
// (ignore_eos: llama.cpp biases them to -inf; n_probs stay raw).
func greedyRequest(prompt []int32, n, nProbs int, cache bool) map[string]any {
	return map[string]any{
		"prompt": prompt, "n_predict": n, "temperature": 0, "top_k": 1, "samplers": []string{"top_k"},
		"repeat_penalty": 1.0, "n_probs": nProbs, "cache_prompt": cache, "return_tokens": true,
		"ignore_eos": true, "seed": 0,
	}
}

// run tokenizes prompt and generates n greedy tokens with each position's
// top nProbs log-probabilities.
func (s *llamaServer) run(prompt string, n, nProbs int) (llamaRun, error) {
	var tok struct {
		Tokens []int32 `json:"tokens"`
	}
	if err := s.post("/tokenize", map[string]any{"content": prompt, "add_special": true, "parse_special": false}, &tok); err != nil {
		return llamaRun{}, err
	}
	r := llamaRun{Prompt: tok.Tokens}
	var c completion
	err := s.post("/completion", greedyRequest(tok.Tokens, n, nProbs, false), &c)
	if errors.Is(err, errStatus500) {
		return s.stepwise(r, n, nProbs)
	}
	if err != nil {
		return r, err
	}
	if len(c.Tokens) != n {
		return r, fmt.Errorf("llama-server gave %d tokens, want %d", len(c.Tokens), n)
	}
	r.Tokens = c.Tokens
	r.Top = align(c)
	return r, nil
}

// align gives each generated token its probability list: llama-server
// leaves out the lists of tokens that end inside a UTF-8 sequence at the
// end of the text, so lists are matched to tokens by ID, in order; a token
// without one gets nil.
func align(c completion) [][]tokenLP {
	top := make([][]tokenLP, len(c.Tokens))
	j := 0
	for i, t := range c.Tokens {
		if j < len(c.Probs) && c.Probs[j].ID == t {
			top[i] = c.Probs[j].Top
			j++
		}
	}
	return top
}

func (s *llamaServer) stepwise(r llamaRun, n, nProbs int) (llamaRun, error) {
	r.Stepwise = true
	seq := slices.Clone(r.Prompt)
	for range n {
		var c completion
		if err := s.post("/completion", greedyRequest(seq, 1, nProbs, true), &c); err != nil {
			return r, fmt.Errorf("stepwise token %d: %w", len(r.Tokens), err)
		}
		if len(c.Tokens) != 1 {
			return r, fmt.Errorf("stepwise token %d: %d tokens", len(r.Tokens), len(c.Tokens))
		}
		r.Tokens = append(r.Tokens, c.Tokens[0])
		r.Top = append(r.Top, align(c)[0])
		seq = append(seq, c.Tokens[0])
	}
	return r, nil
}

// llamaVersion is `llama-server --version`'s first line.
func llamaVersion(server []string) string {
	out, err := exec.Command(server[0], append(slices.Clone(server[1:]), "--version")...).CombinedOutput()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "version:") {
			return strings.TrimSpace(l)
		}
	}
	return strings.TrimSpace(tail(string(out), 200))
}
