package shard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/gguf"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// streamModel loads a's range from the weight cache in the data dir,
// streaming it from the coordinator (Coordinator.Weights) first when the
// cache lacks it or a cached tensor fails its checksum.
func (n *Node) streamModel(ctx context.Context, a *pb.Assign) (*loadedModel, error) {
	addr, _, _ := n.coordinator()
	if addr == "" {
		return nil, fmt.Errorf("model %s: no local file with that SHA-256 and no coordinator to stream it from", a.GetModelSha256())
	}
	cc, err := transport.Dial(addr, n.coordDial...)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	wc := &weightCache{
		dir:      filepath.Join(n.cfg.DataDir, weightsDir),
		log:      n.log,
		progress: terminalStderr(),
	}
	lm, _, err := wc.load(ctx, pb.NewCoordinatorClient(cc), a.GetModelSha256(), rangeOf(a))
	return lm, err
}

// weightsDir is the weight cache's directory under the data dir.
const weightsDir = "weights"

// weightRange is the part of a model a stage needs: layers [first, end),
// plus the token embedding and/or the final norm and output head.
type weightRange struct {
	first, end  uint32
	embed, head bool
}

func rangeOf(a *pb.Assign) weightRange {
	return weightRange{first: a.GetFirstLayer(), end: a.GetEndLayer(), embed: a.GetEmbed(), head: a.GetHead()}
}

func (r weightRange) String() string {
	s := fmt.Sprintf("layers %d-%d", r.first, r.end)
	if r.embed {
		s += " +embed"
	}
	if r.head {
		s += " +head"
	}
	return s
}

// tensors returns f's tensors that r needs, in file order: the rule
// Coordinator.Weights applies (blk.N.* for N in the range; token_embd* with
// the embedding, or with a head tied to it; output* with the head).
func (r weightRange) tensors(f *gguf.File) []*gguf.Tensor {
	_, noOutput := f.Tensor("output.weight")
	var out []*gguf.Tensor
	for _, t := range f.Tensors {
		var want bool
		switch {
		case strings.HasPrefix(t.Name, "blk."):
			var l uint32
			_, err := fmt.Sscanf(t.Name, "blk.%d.", &l)
			want = err == nil && l >= r.first && l < r.end
		case strings.HasPrefix(t.Name, "token_embd"):
			want = r.embed || (r.head && noOutput != nil)
		case strings.HasPrefix(t.Name, "output"):
			want = r.head
		}
		if want {
			out = append(out, t)
		}
	}
	return out
}

// weightCache is the cache of streamed weights in one directory, a file pair
// per model named by the model's SHA-256:
//
//	<sha256>.gguf  the model file's header and the tensors received so far,
//	               each at its offset in the model file; absent tensors are
//	               holes (a sparse file where the file system has them), so
//	               gguf.Open and model.Load read it like the original
//	<sha256>.json  the manifest: SHA-256 of the header and of every tensor
//	               present
//
// Tensors are checked against the manifest each time a range is loaded; a
// missing or mismatching one makes the whole range stream again. Both files
// are replaced by rename, so a model mapped by a running placement is never
// written under it. A weightCache is used by one loader at a time.
type weightCache struct {
	dir      string
	log      *slog.Logger
	progress io.Writer // a terminal for the progress bar; nil: none
}

// manifest is a cached model's <sha256>.json.
type manifest struct {
	Model   string            `json:"model_sha256"`
	Header  string            `json:"header_sha256"`
	Tensors map[string]string `json:"tensors"` // name → SHA-256, lower-case hex
}

// load returns the model sha with r's tensors verified, from the cache or
// else streamed with client. streamed reports whether it streamed.
func (c *weightCache) load(ctx context.Context, client pb.CoordinatorClient, sha string, r weightRange) (lm *loadedModel, streamed bool, err error) {
	if !validSHA256(sha) {
		return nil, false, fmt.Errorf("assign names model %q, not a SHA-256", sha)
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, false, fmt.Errorf("weight cache: %w", err)
	}
	man := c.readManifest(sha)
	lm, bad, err := c.open(ctx, sha, man, r)
	switch {
	case err == nil:
		c.log.Info("weights from cache", "model", sha, "range", r.String(), "file", c.path(sha, ".gguf"))
		return lm, false, nil
	case ctx.Err() != nil:
		return nil, false, ctx.Err()
	case errors.Is(err, fs.ErrNotExist):
	default:
		c.log.Warn("weight cache unusable, streaming again", "model", sha, "range", r.String(), "err", err)
	}
	if man != nil {
		for _, name := range bad {
			delete(man.Tensors, name)
		}
	}
	if err := c.stream(ctx, client, sha, r, man); err != nil {
		return nil, true, fmt.Errorf("stream model %s %s: %w", sha, r, err)
	}
	// The tensors were checked as they arrived: no second pass over them.
	lm, _, err = c.openVerified(ctx, sha, c.readManifest(sha), r, false)
	return lm, true, err
}

func (c *weightCache) path(sha, ext string) string { return filepath.Join(c.dir, sha+ext) }

// readManifest returns sha's manifest, or nil when it is absent or
// unreadable (then everything streams again).
func (c *weightCache) readManifest(sha string) *manifest {
	b, err := os.ReadFile(c.path(sha, ".json"))
	if err != nil {
		return nil
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil || m.Model != sha || m.Tensors == nil {
		c.log.Warn("weight cache manifest unreadable, ignoring it", "model", sha, "err", err)
		return nil
	}
	return &m
}

// open opens the cached model and checks r's tensors against man. bad
// names the tensors that are missing or fail their checksum.
func (c *weightCache) open(ctx context.Context, sha string, man *manifest, r weightRange) (*loadedModel, []string, error) {
	return c.openVerified(ctx, sha, man, r, true)
}

func (c *weightCache) openVerified(ctx context.Context, sha string, man *manifest, r weightRange, verify bool) (*loadedModel, []string, error) {
	if man == nil {
		return nil, nil, fmt.Errorf("no manifest: %w", fs.ErrNotExist)
	}
	path := c.path(sha, ".gguf")
	f, err := gguf.Open(path)
	if err != nil {
		return nil, nil, err
	}
	if sum, err := headerSHA256(path, f.DataOffset); err != nil || sum != man.Header {
		f.Close()
		if err == nil {
			err = fmt.Errorf("%s: header checksum mismatch", path)
		}
		return nil, nil, err
	}
	var bad []string
	corrupt := 0
	have := map[string]bool{}
	for _, t := range r.tensors(f) {
		if err := ctx.Err(); err != nil {
			f.Close()
			return nil, nil, err
		}
		want, ok := man.Tensors[t.Name]
		if ok && verify {
			sum := sha256.Sum256(t.Data)
			if ok = hex.EncodeToString(sum[:]) == want; !ok {
				corrupt++
			}
		}
		if !ok {
			bad = append(bad, t.Name)
			continue
		}
		have[t.Name] = true
	}
	if len(bad) > 0 {
		f.Close()
		if corrupt == 0 { // a range not cached yet: not worth a warning
			return nil, bad, fmt.Errorf("%s: %d tensors of %s not cached: %w", path, len(bad), r, fs.ErrNotExist)
		}
		return nil, bad, fmt.Errorf("%s: %d tensors of %s fail their checksum, %d missing (first %s)", path, corrupt, r, len(bad)-corrupt, bad[0])
	}
	m, err := model.Load(f)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return &loadedModel{sha: sha, file: f, m: m, have: have}, nil, nil
}

// stream fetches r's tensors of model sha, checks each against its
// SHA-256, and writes a new <sha>.gguf holding them plus the tensors of old
// (the previous manifest, if any) that r does not cover, then the manifest.
func (c *weightCache) stream(ctx context.Context, client pb.CoordinatorClient, sha string, r weightRange, old *manifest) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ws, err := client.Weights(ctx, &pb.WeightsRequest{ModelSha256: sha, FirstLayer: r.first, EndLayer: r.end, Embed: r.embed, Head: r.head})
	if err != nil {
		return err
	}
	first, err := ws.Recv()
	if err != nil {
		return err
	}
	header := first.GetGgufHeader()
	hf, err := gguf.ParseHeader(header)
	if err != nil {
		return fmt.Errorf("model header: %w", err)
	}
	if uint64(len(header)) != hf.DataOffset {
		return fmt.Errorf("model header is %d bytes, its tensor data starts at %d", len(header), hf.DataOffset)
	}
	want := map[string]*gguf.Tensor{}
	var total int64
	for _, t := range r.tensors(hf) {
		want[t.Name] = t
		total += int64(t.Size())
	}
	size := hf.DataOffset
	for _, t := range hf.Tensors {
		size = max(size, t.Offset+t.Size())
	}

	tmp, err := os.CreateTemp(c.dir, sha+".gguf.*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name()) // gone already after the rename
	}()
	if _, err := tmp.WriteAt(header, 0); err != nil {
		return err
	}
	if err := tmp.Truncate(int64(size)); err != nil {
		return err
	}
	c.log.Info("streaming weights", "model", sha, "range", r.String(), "tensors", len(want), "bytes", total)
	bar := newProgressBar(c.progress, "weights "+r.String(), total)
	start := time.Now()
	rx := &tensorReceiver{file: tmp, want: want, got: map[string]string{}}
	for ch := first; ; {
		if err := rx.chunk(ch); err != nil {
			bar.abort()
			return err
		}
		bar.add(int64(len(ch.GetData())))
		if ch, err = ws.Recv(); err == io.EOF {
			break
		} else if err != nil {
			bar.abort()
			return err
		}
	}
	bar.finish()
	if err := rx.done(); err != nil {
		return err
	}
	hsum := sha256.Sum256(header)
	man := &manifest{Model: sha, Header: hex.EncodeToString(hsum[:]), Tensors: rx.got}
	if err := c.keepOld(tmp, hf, man, old); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), c.path(sha, ".gguf")); err != nil {
		return err
	}
	if err := c.writeManifest(man); err != nil {
		return err
	}
	secs := time.Since(start).Seconds()
	c.log.Info("streamed weights", "model", sha, "range", r.String(), "bytes", total,
		"seconds", fmt.Sprintf("%.2f", secs), "mib_per_s", fmt.Sprintf("%.1f", float64(total)/(1<<20)/max(secs, 1e-6)))
	return nil
}

// keepOld copies into dst the tensors old lists that man lacks, from the
// current cached file, when its header is the same; their checksums are
// checked when a range that needs them is loaded.
func (c *weightCache) keepOld(dst *os.File, hf *gguf.File, man, old *manifest) error {
	if old == nil || old.Header != man.Header {
		return nil
	}
	src, err := os.Open(c.path(man.Model, ".gguf"))
	if err != nil {
		return nil // nothing to keep
	}
	defer src.Close()
	names := make([]string, 0, len(old.Tensors))
	for name := range old.Tensors {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		t, err := hf.Tensor(name)
		if _, dup := man.Tensors[name]; dup || err != nil {
			continue
		}
		n, err := io.Copy(io.NewOffsetWriter(dst, int64(t.Offset)), io.NewSectionReader(src, int64(t.Offset), int64(t.Size())))
		if err != nil {
			return fmt.Errorf("keep cached tensor %s: %w", name, err)
		}
		if n == int64(t.Size()) {
			man.Tensors[name] = old.Tensors[name]
		}
	}
	return nil
}

// writeManifest replaces man's file atomically.
func (c *weightCache) writeManifest(man *manifest) error {
	b, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(c.dir, man.Model+".json.*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), c.path(man.Model, ".json"))
}

// tensorReceiver checks a Weights stream's chunks against the header and
// writes them at their offsets in file.
type tensorReceiver struct {
	file *os.File
	want map[string]*gguf.Tensor
	got  map[string]string // tensors complete and verified: name → SHA-256

	cur  *gguf.Tensor // the tensor in progress; nil between tensors
	off  uint64       // bytes of cur received
	hash hash.Hash
}

func (rx *tensorReceiver) chunk(ch *pb.WeightsChunk) error {
	name := ch.GetTensor()
	if rx.cur == nil || rx.cur.Name != name {
		if rx.cur != nil {
			return fmt.Errorf("tensor %s ended after %d of %d bytes without a checksum", rx.cur.Name, rx.off, rx.cur.Size())
		}
		t, ok := rx.want[name]
		switch {
		case !ok:
			return fmt.Errorf("coordinator sent tensor %q, which is not in the requested range", name)
		case rx.got[name] != "":
			return fmt.Errorf("coordinator sent tensor %q twice", name)
		}
		info := ch.GetInfo()
		if info == nil || uint32(t.Type) != info.GetGgmlType() || !slices.Equal(t.Dims, info.GetDims()) || info.GetSize() != t.Size() {
			return fmt.Errorf("tensor %s: info %v disagrees with the header (type %d, dims %v, %d bytes)", name, info, t.Type, t.Dims, t.Size())
		}
		rx.cur, rx.off, rx.hash = t, 0, sha256.New()
	}
	t, data := rx.cur, ch.GetData()
	if ch.GetOffset() != rx.off || uint64(len(data)) > t.Size()-rx.off {
		return fmt.Errorf("tensor %s: chunk of %d bytes at offset %d, expected offset %d of %d bytes", name, len(data), ch.GetOffset(), rx.off, t.Size())
	}
	if _, err := rx.file.WriteAt(data, int64(t.Offset+rx.off)); err != nil {
		return err
	}
	rx.hash.Write(data)
	rx.off += uint64(len(data))
	sum := ch.GetSha256()
	if sum == "" {
		return nil
	}
	if rx.off != t.Size() {
		return fmt.Errorf("tensor %s: checksum after %d of %d bytes", name, rx.off, t.Size())
	}
	if got := hex.EncodeToString(rx.hash.Sum(nil)); got != sum {
		return fmt.Errorf("tensor %s: SHA-256 %s, coordinator says %s", name, got, sum)
	}
	rx.got[name] = sum
	rx.cur = nil
	return nil
}

// done checks that every wanted tensor arrived whole.
func (rx *tensorReceiver) done() error {
	if rx.cur != nil {
		return fmt.Errorf("stream ended inside tensor %s (%d of %d bytes)", rx.cur.Name, rx.off, rx.cur.Size())
	}
	if len(rx.got) != len(rx.want) {
		for name := range rx.want {
			if rx.got[name] == "" {
				return fmt.Errorf("stream ended with %d of %d tensors (%s missing)", len(rx.got), len(rx.want), name)
			}
		}
	}
	return nil
}

// headerSHA256 returns the SHA-256 of the first n bytes of the file at path.
func headerSHA256(path string, n uint64) (string, error) {
	fh, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer fh.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, fh, int64(n)); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// validSHA256 reports whether s is 64 lower-case hex digits (it names
// files).
func validSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
