package shard

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// weightsCoord is a coordinator that serves only Weights, from a model
// file, the way coordinator.Weights does (header first, then the range's
// tensors in file order, each in chunks with its SHA-256 on the last), in
// small chunks so that tensors span several. tamper, when set, may change
// a chunk before it is sent.
type weightsCoord struct {
	pb.UnimplementedCoordinatorServer
	path, sha string
	calls     atomic.Int32
	tamper    func(*pb.WeightsChunk)
}

const testChunk = 16 << 10

func (c *weightsCoord) Weights(req *pb.WeightsRequest, stream pb.Coordinator_WeightsServer) error {
	c.calls.Add(1)
	if req.GetModelSha256() != c.sha {
		return status.Errorf(codes.NotFound, "model %q not served", req.GetModelSha256())
	}
	raw, err := os.ReadFile(c.path)
	if err != nil {
		return err
	}
	f, err := gguf.Parse(raw)
	if err != nil {
		return err
	}
	header := raw[:f.DataOffset]
	_, noOutput := f.Tensor("output.weight")
	for _, t := range f.Tensors {
		var want bool
		switch {
		case strings.HasPrefix(t.Name, "blk."):
			var l uint32
			fmt.Sscanf(t.Name, "blk.%d.", &l)
			want = l >= req.GetFirstLayer() && l < req.GetEndLayer()
		case strings.HasPrefix(t.Name, "token_embd"):
			want = req.GetEmbed() || (req.GetHead() && noOutput != nil)
		case strings.HasPrefix(t.Name, "output"):
			want = req.GetHead()
		}
		if !want {
			continue
		}
		sum := sha256.Sum256(t.Data)
		for off := 0; off == 0 || off < len(t.Data); {
			end := min(off+testChunk, len(t.Data))
			ch := &pb.WeightsChunk{Tensor: t.Name, Offset: uint64(off), Data: slices.Clone(t.Data[off:end])}
			if off == 0 {
				ch.Info = &pb.TensorInfo{GgmlType: uint32(t.Type), Dims: t.Dims, Size: uint64(len(t.Data))}
			}
			if end == len(t.Data) {
				ch.Sha256 = hex.EncodeToString(sum[:])
			}
			if header != nil {
				ch.GgufHeader, header = header, nil
			}
			if c.tamper != nil {
				c.tamper(ch)
			}
			if err := stream.Send(ch); err != nil {
				return err
			}
			off = end
		}
	}
	return nil
}

// startWeightsCoord serves c on loopback and returns a client of it.
func startWeightsCoord(t *testing.T, c *weightsCoord) pb.CoordinatorClient {
	t.Helper()
	ln, err := transport.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := transport.NewServer()
	pb.RegisterCoordinatorServer(srv, c)
	go srv.Serve(ln) // ended by Stop below
	t.Cleanup(srv.Stop)
	cc, err := transport.Dial(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewCoordinatorClient(cc)
}

func newWeightsCoord(t *testing.T) *weightsCoord {
	t.Helper()
	if _, err := os.Stat(storiesPath); err != nil {
		sharedAbsent(t, storiesPath, err)
	}
	sha, _, err := hashFile(context.Background(), storiesPath)
	if err != nil {
		t.Fatal(err)
	}
	return &weightsCoord{path: storiesPath, sha: sha}
}

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func loadRange(t *testing.T, wc *weightCache, client pb.CoordinatorClient, sha string, r weightRange) (*loadedModel, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lm, streamed, err := wc.load(ctx, client, sha, r)
	if err != nil {
		t.Fatalf("load %s: %v", r, err)
	}
	t.Cleanup(func() { lm.file.Close() })
	return lm, streamed
}

// TestWeightsStreamCacheRestart: a range streams once, is cached under
// files named by the model's SHA-256, loads from the cache on restart
// without a Weights call, and streams again when a cached tensor is
// corrupted; another range joins the cache without evicting the first.
func TestWeightsStreamCacheRestart(t *testing.T) {
	coord := newWeightsCoord(t)
	client := startWeightsCoord(t, coord)
	dir := t.TempDir()
	r := weightRange{first: 0, end: 2, embed: true}

	lm, streamed := loadRange(t, &weightCache{dir: dir, log: testLog(t)}, client, coord.sha, r)
	if !streamed || coord.calls.Load() != 1 {
		t.Fatalf("first load: streamed %v, %d Weights calls; want a stream", streamed, coord.calls.Load())
	}
	for _, ext := range []string{".gguf", ".json"} {
		if _, err := os.Stat(filepath.Join(dir, coord.sha+ext)); err != nil {
			t.Fatalf("cache file: %v", err)
		}
	}
	if tmps, _ := filepath.Glob(filepath.Join(dir, "*.tmp")); len(tmps) > 0 {
		t.Fatalf("temporary files left: %v", tmps)
	}
	local, err := gguf.Open(storiesPath)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	for _, want := range r.tensors(local) {
		got, err := lm.file.Tensor(want.Name)
		if err != nil || !bytes.Equal(got.Data, want.Data) {
			t.Fatalf("cached tensor %s differs from the model file (%v)", want.Name, err)
		}
	}
	if !lm.covers(&pb.Assign{FirstLayer: 0, EndLayer: 2, Embed: true}) || lm.covers(&pb.Assign{FirstLayer: 2, EndLayer: 3}) {
		t.Fatalf("covers: the streamed model must cover exactly its range, have %d tensors", len(lm.have))
	}

	// A restart: a new cache on the same dir loads without streaming.
	if _, streamed = loadRange(t, &weightCache{dir: dir, log: testLog(t)}, client, coord.sha, r); streamed || coord.calls.Load() != 1 {
		t.Fatalf("restart: streamed %v, %d Weights calls; want the cache", streamed, coord.calls.Load())
	}

	// Corrupt one byte of a cached tensor: detected, streamed anew.
	tn, _ := lm.file.Tensor("blk.1.ffn_down.weight")
	fh, err := os.OpenFile(filepath.Join(dir, coord.sha+".gguf"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := []byte{tn.Data[5] ^ 0xff}
	if _, err := fh.WriteAt(b, int64(tn.Offset)+5); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	lm2, streamed := loadRange(t, &weightCache{dir: dir, log: testLog(t)}, client, coord.sha, r)
	if !streamed || coord.calls.Load() != 2 {
		t.Fatalf("after corruption: streamed %v, %d Weights calls; want a new stream", streamed, coord.calls.Load())
	}
	if got, _ := lm2.file.Tensor(tn.Name); !bytes.Equal(got.Data, mustTensor(t, local, tn.Name).Data) {
		t.Fatal("the corrupted tensor was not replaced")
	}
	if _, streamed = loadRange(t, &weightCache{dir: dir, log: testLog(t)}, client, coord.sha, r); streamed {
		t.Fatal("after the re-stream the cache was not used")
	}

	// A corrupt manifest is ignored: streamed anew.
	if err := os.WriteFile(filepath.Join(dir, coord.sha+".json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, streamed = loadRange(t, &weightCache{dir: dir, log: testLog(t)}, client, coord.sha, r); !streamed || coord.calls.Load() != 3 {
		t.Fatalf("corrupt manifest: streamed %v, %d calls", streamed, coord.calls.Load())
	}

	// Another range streams and keeps the first in the cache.
	tail := weightRange{first: 2, end: uint32(mustLayers(t, local)), head: true}
	if _, streamed = loadRange(t, &weightCache{dir: dir, log: testLog(t)}, client, coord.sha, tail); !streamed || coord.calls.Load() != 4 {
		t.Fatalf("second range: streamed %v, %d calls", streamed, coord.calls.Load())
	}
	for _, rr := range []weightRange{r, tail} {
		if _, streamed = loadRange(t, &weightCache{dir: dir, log: testLog(t)}, client, coord.sha, rr); streamed {
			t.Fatalf("range %s not served from the cache after both were streamed", rr)
		}
	}
	if coord.calls.Load() != 4 {
		t.Fatalf("%d Weights calls, want 4", coord.calls.Load())
	}
}

func mustTensor(t *testing.T, f *gguf.File, name string) *gguf.Tensor {
	t.Helper()
	tt, err := f.Tensor(name)
	if err != nil {
		t.Fatal(err)
	}
	return tt
}

func mustLayers(t *testing.T, f *gguf.File) int {
	t.Helper()
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return m.Layers
}

// TestWeightsStreamRefusesBadData: a wrong checksum, a tensor outside the
// range, a truncated tensor or an unknown model fail the load and leave no
// cache behind.
func TestWeightsStreamRefusesBadData(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sha    string
		tamper func(*pb.WeightsChunk)
		want   string
	}{
		{"checksum", "", func(ch *pb.WeightsChunk) {
			if ch.GetTensor() == "blk.0.attn_q.weight" && ch.GetOffset() == 0 {
				ch.Data[0] ^= 1
			}
		}, "SHA-256"},
		{"outside the range", "", func(ch *pb.WeightsChunk) {
			if ch.GetTensor() == "blk.0.attn_q.weight" {
				ch.Tensor = "blk.3.attn_q.weight"
			}
		}, "not in the requested range"},
		{"short tensor", "", func(ch *pb.WeightsChunk) {
			if ch.GetTensor() == "token_embd.weight" && ch.GetSha256() != "" {
				ch.Data = ch.Data[:len(ch.Data)-1]
			}
		}, "checksum after"},
		{"unknown model", strings.Repeat("ab", 32), nil, "NotFound"},
		{"not a SHA-256", "../x", nil, "not a SHA-256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			coord := newWeightsCoord(t)
			coord.tamper = tc.tamper
			client := startWeightsCoord(t, coord)
			dir := t.TempDir()
			sha := coord.sha
			if tc.sha != "" {
				sha = tc.sha
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			wc := &weightCache{dir: dir, log: testLog(t)}
			_, _, err := wc.load(ctx, client, sha, weightRange{first: 0, end: 1, embed: true})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Fatalf("files left in the cache: %v", left)
			}
		})
	}
}

// TestWeightsStreamGreedyMatchesLocal: two stages loaded from streamed
// ranges (each in its own cache, as two shards have) decode the same
// greedy tokens as the whole local file.
func TestWeightsStreamGreedyMatchesLocal(t *testing.T) {
	m := loadStories(t)
	want, _ := greedyA(t, newPipe(t, m), 12, -1)

	coord := newWeightsCoord(t)
	client := startWeightsCoord(t, coord)
	pool := cpu.NewPool(2)
	t.Cleanup(pool.Close)
	cut := 2
	var p pipe
	for _, r := range []weightRange{{first: 0, end: uint32(cut), embed: true}, {first: uint32(cut), end: uint32(m.Layers), head: true}} {
		lm, streamed := loadRange(t, &weightCache{dir: t.TempDir(), log: testLog(t)}, client, coord.sha, r)
		if !streamed {
			t.Fatalf("range %s was not streamed", r)
		}
		kv, err := cpu.NewKV(cpu.KVConfig{Layers: int(r.end - r.first), Blocks: 32, Heads: m.Heads, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim, Type: ggml.F16})
		if err != nil {
			t.Fatal(err)
		}
		st, err := model.NewStage(lm.m, int(r.first), int(r.end), cpu.NewBackend(pool), kv)
		if err != nil {
			t.Fatal(err)
		}
		p = append(p, NewRunner(st, 32, kv.BlockSize()))
	}
	got, _ := greedyA(t, p, 12, -1)
	if !slices.Equal(got, want) {
		t.Fatalf("streamed ranges decode %v, the local file %v", got, want)
	}
}

// TestProgressBar: the bar draws on its writer, at most every redrawEvery,
// and a nil writer draws nothing.
func TestProgressBar(t *testing.T) {
	var out bytes.Buffer
	now := time.Unix(0, 0)
	b := newProgressBar(&out, "weights", 4<<20)
	b.now = func() time.Time { return now }
	b.start, b.drawn = now, now
	b.add(1 << 20) // within redrawEvery of the first draw: no redraw
	draws := strings.Count(out.String(), "\r")
	now = now.Add(time.Second)
	b.add(1 << 20)
	if got := strings.Count(out.String(), "\r"); got != draws+1 {
		t.Fatalf("%d draws after a second, want %d", got, draws+1)
	}
	b.finish()
	last := out.String()[strings.LastIndex(out.String(), "\r"):]
	if !strings.Contains(last, " 50%") || !strings.Contains(last, "2.0/4.0 MiB") || !strings.HasSuffix(last, "\n") {
		t.Fatalf("final line %q", last)
	}
	newProgressBar(nil, "x", 1).add(1) // no writer: no bar, no panic
	var _ io.Writer = terminalStderr()
}
