package loadgen

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseRange(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Range
		bad  bool
	}{
		{"34", Range{34, 34}, false},
		{"16-64", Range{16, 64}, false},
		{" 1 - 2 ", Range{1, 2}, false},
		{"5-3", Range{}, true},
		{"x", Range{}, true},
		{"-3", Range{}, true},
	} {
		got, err := ParseRange(tt.in)
		if (err != nil) != tt.bad || (!tt.bad && got != tt.want) {
			t.Errorf("ParseRange(%q) = %v, %v; want %v (error %v)", tt.in, got, err, tt.want, tt.bad)
		}
	}
}

func TestLoadgenValidate(t *testing.T) {
	ok := DefaultConfig()
	ok.URL = "http://127.0.0.1:1"
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"unbounded":       func(c *Config) { c.Requests, c.Duration = 0, 0 },
		"no url":          func(c *Config) { c.URL = "" },
		"no clients":      func(c *Config) { c.Clients = 0 },
		"no timeout":      func(c *Config) { c.Timeout = 0 },
		"abort no stream": func(c *Config) { c.AbortFrac, c.Stream = 0.5, false },
		"abort frac > 1":  func(c *Config) { c.AbortFrac = 2 },
		"empty prompt":    func(c *Config) { c.PromptLen = Range{0, 0} },
	} {
		c := ok
		mut(&c)
		if c.Validate() == nil {
			t.Errorf("%s: Validate accepted %+v", name, c)
		}
	}
}

func TestLoadgenPercentiles(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	p := percentiles(d)
	if p.N != 100 || p.P50 != 51*time.Millisecond || p.P99 != 100*time.Millisecond {
		t.Errorf("percentiles %+v", p)
	}
	if percentiles(nil) != (Percentiles{}) {
		t.Error("empty sample")
	}
}

// TestLoadgenErrorKinds runs against a server that answers 429 to every
// other request and cuts the rest short: each failure is counted by kind.
func TestLoadgenErrorKinds(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprint(w, `{"data":[{"id":"m"}]}`)
		case "/tokenize":
			fmt.Fprint(w, `{"tokens":[5,6,7]}`)
		case "/v1/cluster":
			fmt.Fprint(w, `{"running":0,"waiting":0,"shards":[{"shard_id":"s0","kv_blocks_used":3,"kv_blocks_total":9,"sequences":1}]}`)
		case "/v1/completions":
			if n.Add(1)%2 == 0 {
				http.Error(w, `{"error":{"message":"full"}}`, http.StatusTooManyRequests)
				return
			}
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
			fmt.Fprint(w, "data: {\"error\":{\"message\":\"x\",\"type\":\"server_error\",\"code\":\"timeout\"}}\n\n")
		}
	}))
	defer srv.Close()
	cfg := DefaultConfig()
	cfg.URL, cfg.Clients, cfg.Requests, cfg.Settle = srv.URL, 1, 4, 0
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Errors["status_429"] != 2 || rep.Errors["stream_error:timeout"] != 2 || rep.Completed != 0 || rep.OutputTokens != 2 {
		t.Errorf("report %+v", rep)
	}
	var out strings.Builder
	rep.Write(&out)
	for _, want := range []string{"status_429=2", "stream_error:timeout=2", "shard s0: KV blocks in use 3/9, live sequences 1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
