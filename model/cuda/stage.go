package cuda

import (
	"errors"
	"fmt"
	"math"
	"os"
	"unsafe"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
)

// Device is an opened GPU with the kernels loaded: what stages run on.
type Device struct {
	Ctx     *Context
	Kernels *Kernels
}

// DeviceConfig says how to open a device.
type DeviceConfig struct {
	Ordinal  int      // cuda:N
	LibDirs  []string // extra directories searched for NVRTC (--cuda-lib-dir)
	CacheDir string   // compiled kernels are kept here ("" keeps none)
}

// OpenDevice opens cfg.Ordinal and loads the kernels, compiling them with
// NVRTC unless CacheDir holds them for this device already.
func OpenDevice(cfg DeviceConfig) (*Device, error) {
	c, err := Open(cfg.Ordinal)
	if err != nil {
		return nil, err
	}
	nv, nvErr := LoadNVRTC(NVRTCDirs(cfg.LibDirs...))
	if nvErr != nil {
		nv = nil // the cache may still hold the kernels
	}
	k, err := LoadKernels(c, nv, cfg.CacheDir)
	if err != nil {
		c.Close()
		if errors.Is(err, ErrNoNVRTC) {
			return nil, nvErr
		}
		return nil, err
	}
	return &Device{Ctx: c, Kernels: k}, nil
}

// Close releases the device's context.
func (d *Device) Close() error { return d.Ctx.Close() }

// devWeight is a matrix in device memory.
type devWeight struct {
	typ        ggml.Type
	p          Ptr
	rows, cols int
	bytes      int
}

// Stage runs layers [first, last) of a model on a Device: weights and the
// KV pool in device memory, one stream. It offers what the shard's runner
// calls of model.Stage (Forward, Model, First, Last).
//
// Forward returns only after the stream has completed its work (the
// results are downloaded), so when a sequence's blocks are freed after a
// Forward no kernel that writes them is in flight: the tombstone rule of
// DESIGN.md holds by construction on one stream. Forward is not safe for
// concurrent use (the runner serializes it).
type Stage struct {
	dev         *Device
	m           *model.Model
	first, last int
	kv          KVLayout
	k, v        []Ptr // per stage-local layer
	attnScale   float32

	weights map[*model.Weight]*devWeight
	norms   map[*float32]Ptr
	allocs  []struct {
		p Ptr
		n int
	}

	// Scratch on the device, for up to capT tokens.
	capT                                                  int
	x, h, q, kk, vv, att, gate, up, out, logitsIn, logits Ptr
	xh, xq, xd, cs                                        Ptr
	dtok, dpos, dtbl, dtables, dlrows                     Ptr
	capTables                                             int

	graphsOn bool  // capture small batches into CUDA graphs (STRATA_CUDA_GRAPHS=0: never)
	graphErr error // why capture was turned off, if it was
	graphs   map[graphKey]*Graph
	conv     convKey // what xh or xq/xd hold (forward.go)

	meta     batchMeta
	csHost   []float32
	outHost  []float32
	lastDone *Event
}

// NewStage loads layers [first, last) of m onto dev with a KV pool of
// blocks blocks of bs positions.
func NewStage(dev *Device, m *model.Model, first, last, blocks, bs int) (*Stage, error) {
	if first < 0 || last > m.Layers || first >= last {
		return nil, fmt.Errorf("cuda: layer range [%d, %d) is not inside [0, %d)", first, last, m.Layers)
	}
	if err := Supported(m, first, last); err != nil {
		return nil, err
	}
	s := &Stage{dev: dev, m: m, first: first, last: last,
		kv:      KVLayout{Layers: last - first, Blocks: blocks, BlockSize: bs, HeadsKV: m.HeadsKV, HeadDim: m.HeadDim},
		weights: map[*model.Weight]*devWeight{}, norms: map[*float32]Ptr{},
		graphs: map[graphKey]*Graph{}, graphsOn: os.Getenv("STRATA_CUDA_GRAPHS") != "0",
	}
	if err := s.kv.Validate(); err != nil {
		return nil, err
	}
	s.attnScale = 1 / float32(math.Sqrt(float64(m.HeadDim)))
	err := dev.Ctx.Do(func() error {
		for l := first; l < last; l++ {
			L := &m.LayerWeights[l]
			for _, w := range []*model.Weight{L.Q, L.K, L.V, L.O, L.Gate, L.Up, L.Down} {
				if err := s.upload(w); err != nil {
					return err
				}
			}
			for _, n := range [][]float32{L.AttnNorm, L.FFNNorm} {
				if err := s.uploadNorm(n); err != nil {
					return err
				}
			}
		}
		if first == 0 {
			if err := s.upload(m.Embed); err != nil {
				return err
			}
		}
		if last == m.Layers {
			if err := s.upload(m.Output); err != nil {
				return err
			}
			if err := s.uploadNorm(m.OutputNorm); err != nil {
				return err
			}
		}
		n := int(s.kv.LayerElems() * 2)
		for range s.kv.Layers {
			k, err := s.alloc(n)
			if err != nil {
				return fmt.Errorf("KV pool: %w", err)
			}
			v, err := s.alloc(n)
			if err != nil {
				return fmt.Errorf("KV pool: %w", err)
			}
			if err := dev.Ctx.Zero(k, n); err != nil {
				return err
			}
			if err := dev.Ctx.Zero(v, n); err != nil {
				return err
			}
			s.k, s.v = append(s.k, k), append(s.v, v)
		}
		e, err := dev.Ctx.NewEvent()
		if err != nil {
			return err
		}
		s.lastDone = e
		return dev.Ctx.Sync()
	})
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("cuda: load layers [%d, %d) on %s: %w", first, last, dev.Ctx.Info.Name, err)
	}
	return s, nil
}

func (s *Stage) alloc(n int) (Ptr, error) {
	p, err := s.dev.Ctx.Alloc(n)
	if err != nil {
		return 0, err
	}
	s.allocs = append(s.allocs, struct {
		p Ptr
		n int
	}{p, n})
	return p, nil
}

// upload copies w to the device in DeviceType's type.
func (s *Stage) upload(w *model.Weight) error {
	if w == nil {
		return nil
	}
	if _, ok := s.weights[w]; ok {
		return nil
	}
	data, typ := w.Data, w.Type
	if t := DeviceType(w.Type, w.Cols, false); t != w.Type {
		f := make([]float32, w.Rows*w.Cols)
		for r := 0; r < w.Rows; r++ {
			if err := ggml.DequantizeRow(w.Type, w.Row(r), f[r*w.Cols:(r+1)*w.Cols]); err != nil {
				return fmt.Errorf("%s: %w", w.Name, err)
			}
		}
		typ = DeviceType(w.Type, w.Cols, !fitsF16(f))
		if typ == ggml.F16 {
			h := make([]uint16, len(f))
			for i, v := range f {
				h[i] = ggml.F32ToF16(v)
			}
			data = unsafe.Slice((*byte)(unsafe.Pointer(&h[0])), 2*len(h))
		} else {
			data = unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
		}
	}
	p, err := s.alloc(len(data))
	if err != nil {
		return fmt.Errorf("%s: %w", w.Name, err)
	}
	if err := s.dev.Ctx.Upload(p, unsafe.Pointer(&data[0]), len(data)); err != nil {
		return err
	}
	if err := s.dev.Ctx.Sync(); err != nil { // data may be a temporary
		return err
	}
	s.weights[w] = &devWeight{typ: typ, p: p, rows: w.Rows, cols: w.Cols, bytes: len(data)}
	return nil
}

func (s *Stage) uploadNorm(n []float32) error {
	if len(n) == 0 {
		return nil
	}
	if _, ok := s.norms[&n[0]]; ok {
		return nil
	}
	p, err := s.alloc(4 * len(n))
	if err != nil {
		return err
	}
	if err := s.dev.Ctx.Upload(p, unsafe.Pointer(&n[0]), 4*len(n)); err != nil {
		return err
	}
	s.norms[&n[0]] = p
	return nil
}

// Close frees the stage's device memory.
func (s *Stage) Close() error {
	return s.dev.Ctx.Do(func() error {
		var first error
		s.dev.Ctx.Sync()
		s.dropGraphs()
		for _, a := range s.allocs {
			if err := s.dev.Ctx.Free(a.p, a.n); err != nil && first == nil {
				first = err
			}
		}
		s.allocs = nil
		if s.lastDone != nil {
			s.lastDone.Destroy()
			s.lastDone = nil
		}
		return first
	})
}

// Model returns the model the stage runs.
func (s *Stage) Model() *model.Model { return s.m }

// First reports whether the stage embeds tokens.
func (s *Stage) First() bool { return s.first == 0 }

// Last reports whether the stage applies the head.
func (s *Stage) Last() bool { return s.last == s.m.Layers }

// Range returns the stage's layers [first, last).
func (s *Stage) Range() (first, last int) { return s.first, s.last }

// Blocks is the KV pool's size in blocks.
func (s *Stage) Blocks() int { return s.kv.Blocks }

// BlockSize is the positions a KV block holds.
func (s *Stage) BlockSize() int { return s.kv.BlockSize }

// DeviceBytes is the device memory the stage holds.
func (s *Stage) DeviceBytes() int64 {
	var n int64
	for _, a := range s.allocs {
		n += int64(a.n)
	}
	return n
}

// grow makes the scratch hold T tokens and tables block-table entries.
func (s *Stage) grow(T, tables int) error {
	m := s.m
	if T > s.capT {
		s.dropGraphs()
		T = max(T, s.capT*3/2, 16)
		widest := max(m.Embd, m.QDim(), m.FF, m.KVDim())
		bufs := []struct {
			p *Ptr
			n int
		}{
			{&s.x, T * m.Embd * 4}, {&s.h, T * m.Embd * 4}, {&s.out, T * m.Embd * 4}, {&s.logitsIn, T * m.Embd * 4},
			{&s.q, T * m.QDim() * 4}, {&s.att, T * m.QDim() * 4}, {&s.kk, T * m.KVDim() * 4}, {&s.vv, T * m.KVDim() * 4},
			{&s.gate, T * m.FF * 4}, {&s.up, T * m.FF * 4},
			{&s.xh, T * widest * 2}, {&s.xq, T * widest}, {&s.xd, (T*widest/32 + 1) * 4},
			{&s.cs, max(T*m.RopeDims, 1) * 4},
			{&s.dtok, T * 4}, {&s.dpos, T * 4}, {&s.dtbl, T * 4}, {&s.dlrows, T * 4},
		}
		if s.Last() {
			bufs = append(bufs, struct {
				p *Ptr
				n int
			}{&s.logits, T * m.Vocab * 4})
		}
		for _, b := range bufs {
			if *b.p != 0 {
				s.free(*b.p)
			}
			p, err := s.alloc(b.n)
			if err != nil {
				return fmt.Errorf("scratch for %d tokens: %w", T, err)
			}
			*b.p = p
		}
		s.capT = T
	}
	if tables > s.capTables {
		s.dropGraphs()
		tables = max(tables, s.capTables*3/2, 64)
		if s.dtables != 0 {
			s.free(s.dtables)
		}
		p, err := s.alloc(tables * 4)
		if err != nil {
			return err
		}
		s.dtables, s.capTables = p, tables
	}
	return nil
}

func (s *Stage) free(p Ptr) {
	for i, a := range s.allocs {
		if a.p == p {
			s.dev.Ctx.Free(a.p, a.n)
			s.allocs = append(s.allocs[:i], s.allocs[i+1:]...)
			return
		}
	}
}

// Graphs reports whether small batches replay CUDA graphs, and why capture
// was turned off when it was.
func (s *Stage) Graphs() (on bool, err error) { return s.graphsOn, s.graphErr }

// SetGraphs turns graph capture on or off (on has no effect after a
// capture failed).
func (s *Stage) SetGraphs(on bool) { s.graphsOn = on && s.graphErr == nil }
