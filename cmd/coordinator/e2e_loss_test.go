package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lossPrompts are the eight streams' prompts: different, so that a mix-up
// between requests in the recomputation would show.
var lossPrompts = []string{
	"Once upon a time", "One day, a little girl", "The sun was shining", "Tom and his dog",
	"There was a big tree", "Lily wanted to fly", "A small bird sang", "Ben found a red ball",
}

// lossTokens is each stream's length. The end-of-sequence token (ID 2 in
// stories260K) is biased away so that every stream runs its full length.
const lossTokens = 400

// timedStream is one streamed completion: its text and when each event
// with text arrived.
type timedStream struct {
	text  string
	times []time.Time
	err   error
}

// streamTimed streams a greedy completion of prompt, sending the number
// of text events received so far to progress (without blocking).
func (c *e2eCluster) streamTimed(ctx context.Context, prompt string, progress chan<- int) timedStream {
	body := fmt.Sprintf(`{"prompt":%q,"max_tokens":%d,"temperature":0,"stream":true,"logit_bias":{"2":-100}}`, prompt, lossTokens)
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+c.api+"/v1/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return timedStream{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return timedStream{err: fmt.Errorf("status %d", resp.StatusCode)}
	}
	var out timedStream
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue // blank lines and keep-alive comments
		}
		if line == "[DONE]" {
			out.text = text.String()
			return out
		}
		var ev struct {
			Choices []struct{ Text string }   `json:"choices"`
			Error   *struct{ Message string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			out.err = err
			return out
		}
		if ev.Error != nil {
			out.err = fmt.Errorf("stream error: %s", ev.Error.Message)
			return out
		}
		for _, ch := range ev.Choices {
			if ch.Text != "" {
				text.WriteString(ch.Text)
				out.times = append(out.times, time.Now())
			}
		}
		select {
		case progress <- len(out.times):
		default:
		}
	}
	out.text = text.String()
	out.err = fmt.Errorf("stream ended without [DONE]: %v", sc.Err())
	return out
}

// streamAll runs one stream per prompt at once; once every stream has at
// least killAfter text events, atKill runs (nil: never).
func (c *e2eCluster) streamAll(ctx context.Context, killAfter int, atKill func()) []timedStream {
	out := make([]timedStream, len(lossPrompts))
	progress := make([]chan int, len(lossPrompts))
	var wg sync.WaitGroup
	for i, p := range lossPrompts {
		progress[i] = make(chan int, 1) // the latest count; older ones are dropped
		wg.Go(func() { out[i] = c.streamTimed(ctx, p, progress[i]) })
	}
	if atKill != nil {
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }() // ends with the streams
		for i := range progress {
			for n := 0; n < killAfter; {
				select {
				case n = <-progress[i]:
				case <-done:
					c.t.Fatalf("stream %d ended before %d events: %v", i, killAfter, out[i].err)
				}
			}
		}
		atKill()
	}
	wg.Wait()
	return out
}

// TestE2EShardLossDegradedService is the shard-loss case of issue 15: a
// coordinator with --min-shards 2, two `shard join` processes, eight
// greedy streams of 400 tokens; SIGKILL of one shard mid-stream. The
// survivor takes the whole model at once (below --min-shards: degraded is
// better than down), the streams' sequences are recomputed, and all eight
// complete, token-identical to a fault-free run, with no long silence.
//
// The gap bound: nothing between the kill and the next token waits on a
// timer. SIGKILL closes the dead process's sockets, so the coordinator sees
// its control stream break at once; that break is the loss, and the
// re-placement happens in the same turn of the coordinator's loop; the
// survivor loads the missing layers (stories260K: kilobytes) and reports
// READY on its control stream; the engine requeues the streams and
// recomputes their prompts and tokens so far. What is left is CPU time,
// which on an idle machine is well under a second. The bound of 5 s is the
// issue's and holds beside two CPU hogs (scripts/ci-under-load.sh); were
// it to depend on memberlist (5–25 s) or a confirmation timer (10 s), it
// would fail.
func TestE2EShardLossDegradedService(t *testing.T) {
	c := startE2E(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), guard(3*time.Minute))
	defer cancel()

	ref := c.streamAll(ctx, 0, nil)
	for i, r := range ref {
		if r.err != nil || len(r.times) < lossTokens/2 {
			t.Fatalf("fault-free stream %d (%q): %d events, %v", i, lossPrompts[i], len(r.times), r.err)
		}
	}

	var killed time.Time
	got := c.streamAll(ctx, 40, func() {
		c.shards[1].cmd.Process.Signal(syscall.SIGKILL)
		killed = time.Now()
		<-c.shards[1].done
	})
	var maxGap, killGap time.Duration
	maxAt := -1
	for i, r := range got {
		if r.err != nil {
			t.Errorf("stream %d (%q) did not complete across the loss: %v", i, lossPrompts[i], r.err)
			continue
		}
		if r.text != ref[i].text {
			t.Errorf("stream %d (%q) differs from the fault-free run:\n got %q\nwant %q", i, lossPrompts[i], r.text, ref[i].text)
		}
		for j := 1; j < len(r.times); j++ {
			gap := r.times[j].Sub(r.times[j-1])
			if gap > maxGap {
				maxGap, maxAt = gap, i
			}
			if r.times[j-1].Before(killed) && !r.times[j].Before(killed) {
				killGap = max(killGap, gap)
			}
		}
	}
	t.Logf("largest inter-token gap %v (stream %d); largest gap across the kill %v", maxGap.Round(time.Millisecond), maxAt, killGap.Round(time.Millisecond))
	if maxGap >= 5*time.Second {
		t.Errorf("largest inter-token gap %v, want < 5s", maxGap)
	}

	resp, err := http.Get("http://" + c.api + "/v1/cluster")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Ready     bool   `json:"ready"`
		Placement uint64 `json:"placement_version"`
		Shards    []struct {
			Stage int `json:"stage"`
		} `json:"shards"`
	}
	err = json.NewDecoder(resp.Body).Decode(&v)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	stages := 0
	for _, s := range v.Shards {
		if s.Stage >= 0 {
			stages++
		}
	}
	if !v.Ready || v.Placement != 2 || stages != 1 {
		t.Fatalf("after the loss: ready %v, placement %d with %d stages; want ready, placement 2 on the survivor alone", v.Ready, v.Placement, stages)
	}
	// The survivor frees everything once idle.
	deadline := time.Now().Add(guard(10 * time.Second))
	for {
		used, ok := metric(t, c.shardMets[0], "strata_kv_blocks_used")
		if ok && used == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the survivor still holds %v KV blocks", used)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
