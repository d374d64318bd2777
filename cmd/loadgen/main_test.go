package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/strata-llm/strata/loadgen"
)

func TestLoadgenFlags(t *testing.T) {
	cfg, asJSON, err := parseFlags([]string{"--url", "http://127.0.0.1:9", "--clients", "8", "--duration", "5s", "--requests", "0",
		"--prompt-len", "10-20", "--output-len", "64", "--abort-frac", "0.25", "--abort-after", "16", "--chat", "--json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.URL != "http://127.0.0.1:9" || cfg.Clients != 8 || cfg.Duration != 5*time.Second || cfg.Requests != 0 || !cfg.Chat || !asJSON ||
		cfg.PromptLen != (loadgen.Range{Min: 10, Max: 20}) || cfg.OutputLen != (loadgen.Range{Min: 64, Max: 64}) ||
		cfg.AbortFrac != 0.25 || cfg.AbortAfter != (loadgen.Range{Min: 16, Max: 16}) {
		t.Errorf("config %+v", cfg)
	}
	for _, bad := range [][]string{
		{"--requests", "0"}, // unbounded
		{"--prompt-len", "9-3"},
		{"--abort-frac", "0.5", "--stream=false"},
		{"extra"},
	} {
		if _, _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

// TestLoadgenUnreachable: a server that is not there is an error, not a hang.
func TestLoadgenUnreachable(t *testing.T) {
	err := run(context.Background(), []string{"--url", "http://127.0.0.1:1", "--requests", "1"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "list models") {
		t.Errorf("run against nothing: %v", err)
	}
}
