package coordinator

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
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
	for _, p := range []string{"/v1/cluster", "/metrics"} {
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

// TestStatusPageChromium loads the status page in headless Chromium over a
// three-shard view: after the page's scripts ran, the DOM has one element per
// shard with its layer range, and the screenshot shows the KV bars.
func TestStatusPageChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	bin := chromium(t)
	view := ClusterView{Epoch: 7, Placement: 3, Ready: true, BatchFailed: map[string]uint64{}}
	for i, r := range [][2]int{{0, 4}, {4, 8}, {8, 12}} {
		view.Shards = append(view.Shards, ShardView{
			ShardID: fmt.Sprintf("local-%d", i), NodeID: fmt.Sprintf("node-%d", i), Addr: "127.0.0.1:7071", Local: true, Device: "cpu", CPUCores: 2,
			Stage: i, First: r[0], End: r[1], Embed: i == 0, Head: i == 2, State: "ready", Connected: true,
			KVUsed: uint64(50 * (i + 1)), KVTotal: 200, Sequences: 3, InvariantOK: true,
		})
	}
	h := newHarness(t, harnessOpts{cfg: ServerConfig{View: func() ClusterView { return view }}})

	dom := string(runChromium(t, bin, h.http.URL+"/", "--dump-dom"))
	if n := strings.Count(dom, `class="node shard"`); n != 3 {
		t.Fatalf("DOM has %d shard elements, want 3:\n%s", n, dom)
	}
	for _, want := range []string{"local-0", "layers 0–3", "layers 4–7", "layers 8–11", "KV 150 / 200 blocks", "embed", "head", `id="epoch">7<`} {
		if !strings.Contains(dom, want) {
			t.Errorf("DOM lacks %q", want)
		}
	}

	shot := filepath.Join(t.TempDir(), "status.png")
	runChromium(t, bin, h.http.URL+"/", "--screenshot="+shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	b := img.Bounds()
	if b.Dx() < 400 || b.Dy() < 200 {
		t.Fatalf("screenshot is %v", b)
	}
	// The KV bars' fill colour (#3d6fd9) must be on the page in three
	// separate columns (one bar per shard), and the page must not be blank.
	colours := map[uint32]bool{}
	var barCols []int
	for x := b.Min.X; x < b.Max.X; x++ {
		bar := false
		for y := b.Min.Y; y < b.Max.Y; y++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			colours[(r>>11)<<10|(g>>11)<<5|bl>>11] = true
			bar = bar || near(r>>8, 0x3d) && near(g>>8, 0x6f) && near(bl>>8, 0xd9)
		}
		if bar {
			barCols = append(barCols, x)
		}
	}
	if len(colours) < 16 {
		t.Errorf("screenshot has %d colours: blank?", len(colours))
	}
	if n := countRuns(barCols); n != 3 {
		t.Errorf("screenshot shows %d KV bars, want 3", n)
		if dir := os.Getenv("STRATA_SCREENSHOT_DIR"); dir != "" {
			data, _ := os.ReadFile(shot)
			os.WriteFile(filepath.Join(dir, "status.png"), data, 0o644)
		}
	}
}

func near(v, want uint32) bool { return v+12 >= want && v <= want+12 }

// countRuns counts runs of consecutive values in ascending xs.
func countRuns(xs []int) int {
	n := 0
	for i, x := range xs {
		if i == 0 || x != xs[i-1]+1 {
			n++
		}
	}
	return n
}
