package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/strata-llm/strata/model/cpu/bench"
)

func TestParseBenchConfig(t *testing.T) {
	cfg, err := parseBenchConfig("15M,110M", "f32,Q8_0,q4_k_m,Q6_K", "1,2", "1,8", 3)
	if err != nil || len(cfg.Sizes) != 2 || len(cfg.Types) != 4 || cfg.Types[2].Name != "Q4_K_M" || len(cfg.Threads) != 2 || len(cfg.Batches) != 2 {
		t.Fatalf("%+v, %v", cfg, err)
	}
	for _, bad := range [][4]string{{"2B", "F32", "1", "1"}, {"15M", "Q7_K", "1", "1"}, {"15M", "Q8_K", "1", "1"}, {"15M", "F32", "0", "1"}, {"15M", "F32", "1", "x"}} {
		if _, err := parseBenchConfig(bad[0], bad[1], bad[2], bad[3], 1); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// TestLoadCell: the load column shows what was measured, growth of zero or
// below included (weights used in place through the file's mapping), and
// "?" only where nothing was.
func TestLoadCell(t *testing.T) {
	for _, tc := range []struct {
		r    bench.Result
		want string
	}{
		{bench.Result{FileBytes: 100e6, LoadRSS: 105e6, RSSKnown: true, LoadTime: 1500 * time.Millisecond}, "105 / 100 = 1.05× (1.5)"},
		{bench.Result{FileBytes: 100e6, LoadRSS: 0, RSSKnown: true, LoadTime: time.Second}, "0 / 100 = 0.00× (1.0)"},
		{bench.Result{FileBytes: 100e6, LoadRSS: -2e6, RSSKnown: true, LoadTime: time.Second}, "-2 / 100 = -0.02× (1.0)"},
		{bench.Result{FileBytes: 100e6, LoadTime: time.Second}, "? (1.0)"},
		{bench.Result{LoadRSS: 5e6, RSSKnown: true, LoadTime: time.Second}, "? (1.0)"},
	} {
		if got := loadCell(tc.r); got != tc.want {
			t.Errorf("loadCell(%+v) = %q, want %q", tc.r, got, tc.want)
		}
	}
}

func TestRunBenchPrintsARow(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a generated model")
	}
	cfg, err := parseBenchConfig("15M", "Q8_0", "1", "2", 1)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := runBench(context.Background(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "CPU: ") || !strings.HasPrefix(lines[4], "| 15M | Q8_0 | 1 |") || strings.Count(lines[4], "|") != 13 {
		t.Fatalf("table:\n%s", out.String())
	}
	// The e2e column is a real measurement through generate.
	cells := strings.Split(lines[4], "|")
	if e2e, err := strconv.ParseFloat(strings.TrimSpace(cells[7]), 64); err != nil || e2e <= 0 {
		t.Errorf("e2e cell %q: %v", cells[7], err)
	}
	// The bytes of weights a generated token streams: the 15M model's
	// matrices and head in Q8_0 (34 bytes per 32 weights), about 15 MB.
	if mb, err := strconv.ParseFloat(strings.TrimSpace(cells[9]), 64); err != nil || mb < 10 || mb > 20 {
		t.Errorf("weights MB/token cell %q: %v", cells[9], err)
	}
	// The load column: resident memory the load added beside the file's size.
	if load := cells[11]; !strings.Contains(load, " / ") || !strings.Contains(load, "×") {
		t.Errorf("load cell %q", load)
	}
}
