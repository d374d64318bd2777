package coordinator

import (
	"context"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStatusPageLiveCluster loads the status page in headless Chromium
// over a running cluster of three (fake) shards, whose own log feeds the
// timeline, while an engine serves a steady trickle of completions and the
// server samples once a second: the stages are drawn in placement order
// with the shards' names, the charts have points and gain more as samples come,
// and a shard killed mid-test shows as lost, on the timeline and apart from
// the pipeline.
func TestStatusPageLiveCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	bin := chromium(t)
	hist := NewHistory(0, 0)
	c := startCluster(t, t.TempDir(), 3, func(cfg *ClusterConfig) {
		cfg.Log = slog.New(hist.LogHandler(slog.DiscardHandler))
	})
	shards := map[string]*fakeShard{}
	for i, n := range []string{"node-c", "node-a", "node-b"} {
		shards[n] = newFakeShard(t, c.GRPCAddr(), n, uint64(i+1), 1<<20)
		shards[n].join()
	}
	waitReady(t, c.Cluster)

	h := newHarness(t, harnessOpts{cfg: ServerConfig{View: c.View, History: hist}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { h.srv.Run(ctx) })
	wg.Go(func() { // the load: one short completion after another
		for ctx.Err() == nil {
			req, _ := http.NewRequestWithContext(ctx, "POST", h.http.URL+"/v1/completions", strings.NewReader(`{"prompt":"Hi","max_tokens":8}`))
			if resp, err := h.http.Client().Do(req); err == nil {
				resp.Body.Close()
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	waitUntil(t, "two samples", func() bool { ss, _ := hist.snapshot(-1); return len(ss) >= 2 })

	stageOf := map[int]string{}
	for _, s := range c.View().Shards {
		if s.Stage >= 0 {
			stageOf[s.Stage] = s.Name
		}
	}
	dom := string(runChromium(t, bin, h.http.URL+"/", "--dump-dom"))
	pipe := section(t, dom, `id="pipeline"`, `id="spares-box"`)
	var names []string
	for _, m := range regexp.MustCompile(`<h2>([^<]*)</h2>`).FindAllStringSubmatch(pipe, -1) {
		names = append(names, m[1])
	}
	if want := []string{"coordinator", stageOf[0], stageOf[1], stageOf[2]}; strings.Join(names, " ") != strings.Join(want, " ") || !strings.Contains(pipe, "node back") {
		t.Errorf("pipeline drawn as %q, want %q then back to the coordinator", names, want)
	}
	points := func(dom string) int {
		box := section(t, dom, `id="chart-toks"`, `</svg>`)
		m := regexp.MustCompile(`data-points="(\d+)"`).FindStringSubmatch(box)
		if m == nil {
			t.Fatalf("tok/s chart has no series")
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	first := points(dom)
	sampled, _ := hist.snapshot(-1) // at least what the page drew
	if first == 0 {
		t.Errorf("tok/s chart has no points")
	}
	for _, id := range []string{"requests", "itl", "kv"} {
		if box := section(t, dom, `id="chart-`+id+`"`, `</svg>`); !regexp.MustCompile(`data-points="[1-9]`).MatchString(box) {
			t.Errorf("chart %s has no points", id)
		}
	}
	if evs := section(t, dom, `id="events"`, `id="error"`); strings.Count(evs, ">joined<") != 3 || !strings.Contains(evs, ">placement<") {
		t.Errorf("timeline before the loss: %s", evs)
	}

	// Kill the last stage; once the history has two more samples and the
	// loss, so has the page.
	victim := shards[strings.TrimPrefix(stageOf[2], "box-")]
	victim.closeControl()
	victim.srv.Stop()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ss, evs := hist.snapshot(-1)
		lost := slices.ContainsFunc(evs, func(e Event) bool { return e.Kind == "lost" })
		if len(ss) >= len(sampled)+2 && lost {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the kill: %d samples (%d before), loss recorded %v", len(ss), len(sampled), lost)
		}
		time.Sleep(50 * time.Millisecond)
	}
	dom = string(runChromium(t, bin, h.http.URL+"/", "--dump-dom"))
	if n := points(dom); n <= first {
		t.Errorf("tok/s chart has %d points 3 s after %d", n, first)
	}
	if evs := section(t, dom, `id="events"`, `id="error"`); !strings.Contains(evs, `<span class="kind">lost</span><span class="who">`+stageOf[2]+`</span>`) {
		t.Errorf("timeline lacks the loss of %s: %s", stageOf[2], evs)
	}
	if lost := section(t, dom, `id="lost-box"`, `id="charts"`); !strings.Contains(lost, stageOf[2]) || strings.Contains(section(t, dom, `id="pipeline"`, `id="spares-box"`), stageOf[2]) {
		t.Errorf("%s not shown apart as lost: %s", stageOf[2], lost)
	}
}
