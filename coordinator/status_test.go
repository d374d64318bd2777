package coordinator

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestViewClusterJSON(t *testing.T) {
	h, pipe, _ := newViewHarness(t, ServerConfig{})
	resp, out := h.post("/v1/completions", map[string]any{"prompt": "Hi", "max_tokens": 3})
	if resp.StatusCode != 200 {
		t.Fatalf("completion: %d %s", resp.StatusCode, out)
	}
	h.waitIdle()
	waitFor(t, func() bool { return pipe.shards()[0].Sequences == 0 })
	resp, out = h.do("GET", "/v1/cluster", nil)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("/v1/cluster: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), out)
	}
	var raw map[string]any
	mustUnmarshal(t, string(out), &raw)
	for _, k := range []string{"epoch", "placement_version", "ready", "shards", "running", "waiting", "batches_in_flight", "kv", "kv_blocks", "block_size", "live_sequences"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("/v1/cluster lacks %q: %s", k, out)
		}
	}
	shards, _ := raw["shards"].([]any)
	if len(shards) != 1 {
		t.Fatalf("shards: %s", out)
	}
	sh := shards[0].(map[string]any)
	for _, k := range []string{"shard_id", "addr", "device", "first_layer", "end_layer", "embed", "head", "kv_blocks_used", "kv_blocks_total", "sequences", "state", "local", "invariant_ok"} {
		if _, ok := sh[k]; !ok {
			t.Errorf("shard lacks %q: %v", k, sh)
		}
	}
	var got clusterResponse
	mustUnmarshal(t, string(out), &got)
	if got.Epoch != 42 || got.Placement != 1 || !got.Ready || got.Running != 0 || got.Waiting != 0 || got.KV.Total != 256 || got.KV.Used != 0 {
		t.Errorf("cluster %+v", got)
	}
	s := got.Shards[0]
	if s.ShardID != "local-0" || !s.Local || s.First != 0 || s.End != 2 || !s.Embed || !s.Head || s.Device != "cpu" ||
		s.KVUsed != 0 || s.KVTotal != 256 || s.Sequences != 0 || s.State != "ready" || !s.InvariantOK {
		t.Errorf("shard %+v", s)
	}

	// Without a View the shape holds, with no shards.
	h2 := newHarness(t, harnessOpts{})
	_, out = h2.do("GET", "/v1/cluster", nil)
	if !bytes.Contains(out, []byte(`"shards":[]`)) || !bytes.Contains(out, []byte(`"running":0`)) {
		t.Errorf("no view: %s", out)
	}
}

func TestStatusPageServed(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: ServerConfig{APIKey: "sekret"}})
	resp, out := h.do("GET", "/", nil)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, want := range []string{"<title>strata</title>", "/v1/cluster", `id="pipeline"`, "setTimeout(loop, 1000)"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("status page lacks %q", want)
		}
	}
	if resp, out := h.do("HEAD", "/", nil); resp.StatusCode != 200 || len(out) != 0 {
		t.Errorf("HEAD /: %d, %d bytes", resp.StatusCode, len(out))
	}
	// The page is open; its data and the metrics need the key.
	for _, p := range []string{"/v1/cluster", "/v1/cluster/history", "/metrics"} {
		if resp, _ := h.do("GET", p, nil); resp.StatusCode != 401 {
			t.Errorf("GET %s without key: %d, want 401", p, resp.StatusCode)
		}
		if resp, out := h.do("GET", p, nil, "Authorization", "Bearer sekret"); resp.StatusCode != 200 {
			t.Errorf("GET %s with key: %d %s", p, resp.StatusCode, out)
		}
	}
	if resp, _ := h.do("POST", "/", "x"); resp.StatusCode != 405 {
		t.Errorf("POST /: %d, want 405", resp.StatusCode)
	}
}

// chromium returns a headless Chromium binary, or skips.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "chrome-headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium on PATH (Debian: apt-get install chromium)")
	return ""
}

// runChromium runs headless Chromium on url with args and returns stdout.
func runChromium(t *testing.T, bin, url string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--hide-scrollbars", "--user-data-dir=" + t.TempDir(), "--virtual-time-budget=4000", "--window-size=1280,400"}
	cmd := exec.CommandContext(ctx, bin, append(append(base, args...), url)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.Bytes())
	}
	return stdout.Bytes()
}

// statusFixture is a loaded three-stage cluster as the status page sees
// it: the placed shards listed out of stage order (the view sorts by shard
// ID), a spare and a lost shard, and 15 minutes of history with events.
func statusFixture(now time.Time) (ClusterView, *History) {
	view := ClusterView{Epoch: 7, Placement: 3, Ready: true, BatchFailed: map[string]uint64{}, KVBlocks: 200, BlockSize: 16}
	type sh struct {
		id, name   string
		stage      int
		first, end int
		state      string
	}
	for i, x := range []sh{
		{"0a7f", "gpu-box-2", 2, 8, 12, "ready"}, {"3c21", "gpu-box-0", 0, 0, 4, "ready"}, {"5e90", "cpu-box-1", 1, 4, 8, "ready"},
		{"8d13", "spare-box", -1, 0, 0, "idle"}, {"b4e2", "old-box", -1, 0, 0, "lost"},
	} {
		id := x.id + strings.Repeat("0", 28) + "-00000000000000" + fmt.Sprint(i+1)
		s := ShardView{
			ShardID: id, Name: x.name, NodeID: x.id, Addr: fmt.Sprintf("10.0.0.%d:7071", i+2), Device: "cpu", CPUCores: 16, MemoryBytes: 32 << 30,
			Stage: x.stage, First: x.first, End: x.end, Embed: x.stage == 0, Head: x.stage == 2, State: x.state, Connected: x.state != "lost",
			KVTotal: 200, Sequences: 3, InvariantOK: true,
		}
		if x.stage >= 0 {
			s.KVUsed = uint64(40 * (x.stage + 1))
		}
		view.Shards = append(view.Shards, s)
	}
	hist := NewHistory(0, 0)
	start := now.Add(-15 * time.Minute)
	for i := range HistorySamples {
		t := start.Add(time.Duration(i+1) * time.Second)
		w := math.Sin(float64(i)/60) + 1
		s := Sample{T: t.UnixMilli(), TokS: 40 + 30*w, Running: 4 + int(3*w), Waiting: int(4 * w * w), KVUsed: 60 + int(40*w), KVTotal: 200}
		if i%7 != 0 { // some seconds see no first token
			p50, p99 := 120+40*w, 300+200*w
			s.TTFTp50, s.TTFTp99 = &p50, &p99
		}
		i50, i99 := 18+4*w, 35+20*w
		s.ITLp50, s.ITLp99 = &i50, &i99
		for _, v := range view.Shards {
			if v.State == "lost" && i > 600 || v.Stage < 0 && v.State != "lost" && i < 720 {
				continue
			}
			k := ShardKV{ShardID: v.ShardID, Stage: v.Stage, Used: uint64(10*(v.Stage+2)) + uint64(20*w), Total: 200}
			if v.Stage >= 0 {
				ms := 3 + float64(v.Stage) + w
				k.MSPerBatch = &ms
			}
			s.ShardsKV = append(s.ShardsKV, k)
		}
		hist.addSample(s)
	}
	ev := func(sec int, kind string, shard int, msg string) {
		e := Event{T: start.Add(time.Duration(sec) * time.Second).UnixMilli(), Kind: kind, Message: msg}
		if shard >= 0 {
			e.ShardID = view.Shards[shard].ShardID
		}
		hist.Record(e)
	}
	ev(30, "joined", 1, "shard registered")
	ev(31, "joined", 2, "shard registered")
	ev(32, "joined", 4, "shard registered")
	ev(33, "placement", -1, "placement placement=2 stages=3")
	ev(600, "lost", 4, "shard lost why=control stream closed")
	ev(601, "placement", -1, "placement placement=3 stages=3")
	ev(610, "joined", 0, "shard registered")
	ev(720, "joined", 3, "shard registered")
	return view, hist
}

// TestStatusPageChromium loads the status page in headless Chromium over
// statusFixture: after the page's scripts ran, the pipeline is drawn in
// stage order (coordinator, stage 0, 1, 2, back to the coordinator) with
// each shard titled by its name, the spare and the lost shard apart, every
// chart has points and the timeline has the events. With
// STRATA_SCREENSHOT_DIR set it leaves screenshots there, wide and narrow.
func TestStatusPageChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	bin := chromium(t)
	view, hist := statusFixture(time.Now())
	h := newHarness(t, harnessOpts{cfg: ServerConfig{View: func() ClusterView { return view }, History: hist}})

	dom := string(runChromium(t, bin, h.http.URL+"/", "--dump-dom"))
	pipe := section(t, dom, `id="pipeline"`, `id="spares-box"`)
	var order []string
	for _, m := range regexp.MustCompile(`data-stage="(-?\d+)"|node back`).FindAllStringSubmatch(pipe, -1) {
		if m[1] == "" {
			m[1] = "back"
		}
		order = append(order, m[1])
	}
	if got := strings.Join(order, " "); !strings.HasPrefix(pipe, `id="pipeline"><div class="node coordinator">`) || got != "0 1 2 back" {
		t.Errorf("pipeline drawn as coordinator? %v then %q, want stages 0 1 2 and back", strings.HasPrefix(pipe, `id="pipeline"><div class="node coordinator">`), got)
	}
	for _, want := range []string{"gpu-box-0", "cpu-box-1", "gpu-box-2", "10.0.0.3:7071", "stage 0 · layers 0–3", "stage 2 · layers 8–11", "KV 120 / 200 blocks", "16 threads · 32 GiB", "ms per batch"} {
		if !strings.Contains(pipe, want) {
			t.Errorf("pipeline lacks %q", want)
		}
	}
	if sp := section(t, dom, `id="spares-box"`, `id="lost-box"`); !strings.Contains(sp, "spare-box") || strings.Contains(sp, " hidden") || strings.Contains(sp, "old-box") {
		t.Errorf("spares: %s", sp)
	}
	if lost := section(t, dom, `id="lost-box"`, `id="charts"`); !strings.Contains(lost, "old-box") || !strings.Contains(lost, "state-lost") {
		t.Errorf("lost: %s", lost)
	}
	charts := section(t, dom, `id="charts"`, `id="events"`)
	for _, c := range []string{"toks", "requests", "ttft", "itl", "kv", "stage"} {
		box := section(t, charts, `id="chart-`+c+`"`, `</svg>`)
		pts := regexp.MustCompile(`data-points="(\d+)"`).FindAllStringSubmatch(box, -1)
		if len(pts) == 0 {
			t.Errorf("chart %s has no series", c)
		}
		for _, p := range pts {
			if p[1] == "0" {
				t.Errorf("chart %s has a series without points", c)
			}
		}
		if n := strings.Count(box, `class="event ev-`); n != 8 {
			t.Errorf("chart %s marks %d events, want 8", c, n)
		}
	}
	if kv := section(t, charts, `id="chart-kv"`, `</svg>`); strings.Count(kv, `class="series"`) != 5 || !strings.Contains(kv, "old-box") {
		t.Errorf("KV chart: want 5 shards' series, old-box among them")
	}
	evs := section(t, dom, `id="events"`, `id="error"`)
	if !strings.Contains(evs, `<span class="kind">lost</span><span class="who">old-box</span>`) || strings.Count(evs, `class="ev ev-`) != 8 {
		t.Errorf("events: %s", evs)
	}

	dir := os.Getenv("STRATA_SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	for _, size := range []string{"1280,1000", "480,1400"} {
		shot := filepath.Join(dir, "status-"+strings.Replace(size, ",", "x", 1)+".png")
		runChromium(t, bin, h.http.URL+"/", "--screenshot="+shot, "--window-size="+size)
		f, err := os.Open(shot)
		if err != nil {
			t.Fatalf("no screenshot: %v", err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		colours := map[uint32]bool{}
		b := img.Bounds()
		for x := b.Min.X; x < b.Max.X; x += 2 {
			for y := b.Min.Y; y < b.Max.Y; y += 2 {
				r, g, bl, _ := img.At(x, y).RGBA()
				colours[(r>>11)<<10|(g>>11)<<5|bl>>11] = true
			}
		}
		if len(colours) < 16 {
			t.Errorf("%s screenshot has %d colours: blank?", size, len(colours))
		}
	}
}

// section returns dom from the first from up to the next to after it.
func section(t *testing.T, dom, from, to string) string {
	t.Helper()
	i := strings.Index(dom, from)
	if i < 0 {
		t.Fatalf("DOM lacks %s:\n%s", from, dom)
	}
	j := strings.Index(dom[i+len(from):], to)
	if j < 0 {
		return dom[i:]
	}
	return dom[i : i+len(from)+j]
}
