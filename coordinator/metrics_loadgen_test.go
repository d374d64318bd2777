package coordinator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/strata-llm/strata/loadgen"
)

// TestLoadgen runs loadgen briefly against the API over the fake pipeline,
// with a quarter of the streams disconnecting: every request is accounted
// for, the aborts reach the pipeline as tombstones, and at the end the shard
// holds no KV.
func TestLoadgen(t *testing.T) {
	h, pipe, _ := newViewHarness(t, ServerConfig{})
	pipe.setDelay(time.Millisecond) // a token per millisecond: aborts land mid-stream
	for _, chat := range []bool{false, true} {
		cfg := loadgen.DefaultConfig()
		cfg.URL, cfg.Chat, cfg.Clients, cfg.Requests = h.http.URL, chat, 6, 24
		cfg.PromptLen, cfg.OutputLen = loadgen.Range{Min: 4, Max: 12}, loadgen.Range{Min: 16, Max: 24}
		cfg.AbortFrac, cfg.AbortAfter = 0.25, loadgen.Range{Min: 2, Max: 4}
		cfg.Timeout, cfg.Settle = 30*time.Second, 2*time.Second
		rep, err := loadgen.Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		rep.Write(&out)
		t.Logf("chat %v:\n%s", chat, out.String())
		if rep.Requests != 24 || rep.Completed+rep.Aborted != 24 || len(rep.Errors) != 0 {
			t.Errorf("chat %v: %d requests, %d completed, %d aborted, errors %v", chat, rep.Requests, rep.Completed, rep.Aborted, rep.Errors)
		}
		// Chat answers of the fake are short: an abort point may lie past
		// their end, so only completions must have aborted some.
		if (rep.Aborted == 0 && !chat) || rep.OutputTokens == 0 || rep.TokensPerSec <= 0 || rep.TTFT.N != 24 || rep.ITLKept.N == 0 || rep.ITLKept.P99 <= 0 {
			t.Errorf("chat %v: report %+v", chat, rep)
		}
		if rep.Cluster == nil || len(rep.Cluster.Shards) != 1 {
			t.Fatalf("chat %v: cluster %+v (%s)", chat, rep.Cluster, rep.ClusterErr)
		}
		if s := rep.Cluster.Shards[0]; s.Shard != "local-0" || s.BlocksUsed != 0 || s.Sequences != 0 || s.BlocksTotal != 256 {
			t.Errorf("chat %v: shard after the run %+v", chat, s)
		}
	}
	h.waitIdle()
	st := h.eng.Stats()
	var tombs uint64
	for _, n := range st.Tombstones {
		tombs += n
	}
	if tombs != 48 || st.Tombstones["aborted"] == 0 {
		t.Errorf("tombstones %v, want 48 in all with some aborted", st.Tombstones)
	}
}
