package shard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/gguf"
	"github.com/strata-llm/strata/transport/pb"
)

// loadedModel is an open GGUF file and the Model viewing it, shared by the
// placements that use it and the cache; the file closes with the last
// reference.
type loadedModel struct {
	sha  string
	file *gguf.File
	m    *model.Model
	// have names the tensors a streamed model holds, verified; nil for a
	// whole local file.
	have map[string]bool

	mu   sync.Mutex
	refs int
}

// covers reports whether lm holds every tensor a needs.
func (lm *loadedModel) covers(a *pb.Assign) bool {
	if lm.have == nil {
		return true
	}
	for _, t := range rangeOf(a).tensors(lm.file) {
		if !lm.have[t.Name] {
			return false
		}
	}
	return true
}

func (lm *loadedModel) acquire() {
	lm.mu.Lock()
	lm.refs++
	lm.mu.Unlock()
}

func (lm *loadedModel) release() {
	if lm == nil {
		return
	}
	lm.mu.Lock()
	lm.refs--
	last := lm.refs == 0
	lm.mu.Unlock()
	if last {
		lm.file.Close()
	}
}

// modelCache keeps the most recently loaded model open so that a new
// placement of the same model reuses it.
type modelCache struct {
	mu  sync.Mutex
	cur *loadedModel // holds one reference
}

// get returns a reference to the model a names, loading it when it is not
// the cached one (or, streamed, lacks a's range): the local file when its
// SHA-256 matches (or a names none), otherwise from the weight cache in the
// data dir, streamed from the coordinator when the cache lacks the range.
func (c *modelCache) get(ctx context.Context, n *Node, a *pb.Assign) (*loadedModel, error) {
	want := a.GetModelSha256()
	c.mu.Lock()
	if cur := c.cur; cur != nil && (want == "" || cur.sha == want) && cur.covers(a) {
		cur.acquire()
		c.mu.Unlock()
		return cur, nil
	}
	c.mu.Unlock()
	var (
		lm  *loadedModel
		err error
	)
	switch {
	case n.localSHA != "" && (want == "" || want == n.localSHA):
		lm, err = openModel(n.cfg.Model, n.localSHA)
	case want == "":
		return nil, fmt.Errorf("assign names no model SHA-256 and this shard has no --model")
	default:
		lm, err = n.streamModel(ctx, a)
	}
	if err != nil {
		return nil, err
	}
	lm.refs = 2 // the cache's and the caller's
	c.mu.Lock()
	old := c.cur
	c.cur = lm
	c.mu.Unlock()
	old.release()
	return lm, nil
}

// release drops the cache's reference (at shutdown).
func (c *modelCache) release() {
	c.mu.Lock()
	old := c.cur
	c.cur = nil
	c.mu.Unlock()
	old.release()
}

// openModel maps path and loads its architecture and tensors.
func openModel(path, sha string) (*loadedModel, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	m, err := model.Load(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &loadedModel{sha: sha, file: f, m: m}, nil
}

// localModelFile hashes --model (if any) for Register and records its
// SHA-256. It reads the whole file once per process start, unless the
// caller gave the hash (Config.ModelSHA256).
func (n *Node) localModelFile(ctx context.Context) (*pb.ModelFile, error) {
	if n.cfg.Model == "" {
		return nil, nil
	}
	sum := n.cfg.ModelSHA256
	var size int64
	var err error
	if sum == "" {
		sum, size, err = hashFile(ctx, n.cfg.Model)
	} else {
		var fi os.FileInfo
		if fi, err = os.Stat(n.cfg.Model); err == nil {
			size = fi.Size()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("--model: %w", err)
	}
	n.localSHA = sum
	n.log.Info("local model", "file", n.cfg.Model, "sha256", sum, "bytes", size)
	return &pb.ModelFile{Name: filepath.Base(n.cfg.Model), Sha256: sum, Size: uint64(size)}, nil
}

// hashFile returns the lower-case hex SHA-256 of the file at path and its
// size, stopping early when ctx ends.
func hashFile(ctx context.Context, path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	size, err := io.Copy(h, ctxReader{ctx, f})
	if err != nil {
		return "", 0, fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), size, nil
}

// ctxReader fails reads once ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}
