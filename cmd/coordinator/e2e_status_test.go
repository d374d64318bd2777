package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestE2EStatusPageShardProcesses opens the status page in headless
// Chromium over a coordinator and three real `shard join` processes under
// a steady load (the coordinator package's test uses in-process fakes):
// the pipeline is drawn coordinator → stage 0 → 1 → 2 → back, each shard
// titled by the name it registered, every chart has points, and after a
// SIGKILL of the last stage the page shows that shard apart as lost, the
// loss on the timeline, and more chart points than before.
func TestE2EStatusPageShardProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes and a browser")
	}
	bin := chromiumBin(t)
	c := startE2E(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), guard(2*time.Minute))
	defer cancel()
	if _, _, err := c.complete(ctx, "Once upon a time", 8, false); err != nil {
		t.Fatalf("completion: %v", err)
	}
	// The load: short completions one after another, at most 2,000, until
	// the test ends (errors after the kill are expected and ignored).
	load := make(chan struct{})
	go func() {
		defer close(load)
		for i := 0; i < 2000 && ctx.Err() == nil; i++ {
			c.complete(ctx, "Once upon a time", 8, i%2 == 0)
		}
	}()
	defer func() { cancel(); <-load }()

	type shard struct {
		Name    string `json:"name"`
		Stage   int    `json:"stage"`
		State   string `json:"state"`
		Batches uint64 `json:"batches"`
		BusyNs  int64  `json:"busy_ns"`
	}
	view := func() []shard {
		var v struct {
			Shards []shard `json:"shards"`
		}
		getJSON(t, "http://"+c.api+"/v1/cluster", &v)
		return v.Shards
	}
	history := func() (samples int, events []string) {
		var h struct {
			Samples []json.RawMessage `json:"samples"`
			Events  []struct {
				Kind string `json:"kind"`
			} `json:"events"`
		}
		getJSON(t, "http://"+c.api+"/v1/cluster/history", &h)
		for _, e := range h.Events {
			events = append(events, e.Kind)
		}
		return len(h.Samples), events
	}
	waitFor(t, "two history samples", 30*time.Second, func() bool { n, _ := history(); return n >= 2 })
	// Each shard's heartbeats carry its batches and busy time, which the
	// page turns into a measured time per batch beside the prediction.
	waitFor(t, "every placed shard's batches and busy time", 30*time.Second, func() bool {
		for _, s := range view() {
			if s.Stage >= 0 && (s.Batches == 0 || s.BusyNs <= 0) {
				return false
			}
		}
		return true
	})

	stage := map[int]string{}
	for _, s := range view() {
		if s.Stage >= 0 {
			stage[s.Stage] = s.Name
		}
	}
	if len(stage) != 3 || stage[0] == "" || stage[1] == "" || stage[2] == "" {
		t.Fatalf("three placed shards with names expected, /v1/cluster says %v", stage)
	}

	dom := string(chromiumDOM(t, bin, "http://"+c.api+"/"))
	pipe := domSection(t, dom, `id="pipeline"`, `id="spares-box"`)
	var names []string
	for _, m := range regexp.MustCompile(`<h2>([^<]*)</h2>`).FindAllStringSubmatch(pipe, -1) {
		names = append(names, m[1])
	}
	if want := []string{"coordinator", stage[0], stage[1], stage[2]}; strings.Join(names, "|") != strings.Join(want, "|") || !strings.Contains(pipe, "node back") {
		t.Errorf("pipeline drawn as %q, want %q then back to the coordinator", names, want)
	}
	if n := strings.Count(pipe, " ms per batch<"); n != 3 {
		t.Errorf("%d of the 3 remote stages show a measured time per batch", n)
	}
	points := func(dom string) int {
		m := regexp.MustCompile(`data-points="(\d+)"`).FindStringSubmatch(domSection(t, dom, `id="chart-toks"`, `</svg>`))
		if m == nil {
			t.Fatalf("the tok/s chart has no series")
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	before := points(dom)
	if before == 0 {
		t.Errorf("the tok/s chart has no points")
	}
	for _, id := range []string{"requests", "itl", "kv"} {
		if box := domSection(t, dom, `id="chart-`+id+`"`, `</svg>`); !regexp.MustCompile(`data-points="[1-9]`).MatchString(box) {
			t.Errorf("chart %s has no points", id)
		}
	}
	if evs := domSection(t, dom, `id="events"`, `id="error"`); strings.Count(evs, ">joined<") != 3 {
		t.Errorf("timeline should show three joins: %s", evs)
	}

	// SIGKILL the last stage's process: the coordinator sees the control
	// stream break, records the loss and re-places onto the survivor.
	victim := stage[2]
	// The shard processes do not print their registered name; the one to
	// kill is the one whose log says it was assigned stage 2.
	var killed bool
	for _, s := range c.shards {
		if regexp.MustCompile(`msg=assigned .*stage=2 `).MatchString(s.out.String()) {
			s.kill()
			killed = true
			break
		}
	}
	if !killed {
		t.Fatalf("no shard process logged an assignment to stage 2")
	}
	waitFor(t, "the loss on the timeline", 30*time.Second, func() bool {
		n, evs := history()
		return n >= 3 && strings.Contains(strings.Join(evs, " "), "lost")
	})
	dom = string(chromiumDOM(t, bin, "http://"+c.api+"/"))
	if evs := domSection(t, dom, `id="events"`, `id="error"`); !strings.Contains(evs, `<span class="kind">lost</span><span class="who">`+victim+`</span>`) {
		t.Errorf("timeline lacks the loss of %s: %s", victim, evs)
	}
	if lost := domSection(t, dom, `id="lost-box"`, `id="charts"`); !strings.Contains(lost, victim) {
		t.Errorf("%s not shown apart as lost: %s", victim, lost)
	}
	if pipe := domSection(t, dom, `id="pipeline"`, `id="spares-box"`); strings.Contains(pipe, ">"+victim+"<") {
		t.Errorf("the lost shard %s is still drawn in the pipeline", victim)
	}
	if n := points(dom); n <= before {
		t.Errorf("the tok/s chart has %d points after the loss, %d before", n, before)
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// waitFor polls cond every 50 ms until it holds or d passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(guard(d))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, guard(d))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func chromiumBin(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "chrome-headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium on PATH (Debian: apt-get install chromium)")
	return ""
}

// chromiumDOM loads url in headless Chromium, lets its scripts run for a
// few seconds of virtual time, and returns the DOM.
func chromiumDOM(t *testing.T, bin, url string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard(90*time.Second))
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--user-data-dir="+t.TempDir(), "--virtual-time-budget=4000", "--window-size=1280,1000",
		"--dump-dom", url)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.Bytes())
	}
	return stdout.Bytes()
}

// domSection returns dom from the first from to the next to after it.
func domSection(t *testing.T, dom, from, to string) string {
	t.Helper()
	i := strings.Index(dom, from)
	if i < 0 {
		t.Fatalf("page has no %s", from)
	}
	j := strings.Index(dom[i:], to)
	if j < 0 {
		return dom[i:]
	}
	return dom[i : i+j]
}
