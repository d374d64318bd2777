package cuda

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"
)

// Ptr is a device address (CUdeviceptr).
type Ptr uint64

// Context is a device's primary context with one stream. Every method binds
// the context to the calling goroutine's OS thread for the call's duration,
// so it may be called from any goroutine; calls are serialized by mu.
type Context struct {
	d      *Driver
	Info   DeviceInfo
	dev    int32
	ctx    uintptr
	stream uintptr

	mu        sync.Mutex
	allocated uint64 // bytes held by Alloc
}

// Open retains device ordinal's primary context and creates the stream the
// package runs its work on.
func Open(ordinal int) (*Context, error) {
	d, err := LoadDriver()
	if err != nil {
		return nil, err
	}
	info, err := d.Info(ordinal)
	if err != nil {
		return nil, err
	}
	c := &Context{d: d, Info: info, dev: int32(ordinal)}
	if err := d.check("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(&c.ctx, c.dev)); err != nil {
		return nil, err
	}
	err = c.Do(func() error {
		return d.check("cuStreamCreate", d.cuStreamCreate(&c.stream, 1)) // CU_STREAM_NON_BLOCKING
	})
	if err != nil {
		d.cuDevicePrimaryCtxRelease(c.dev)
		return nil, err
	}
	return c, nil
}

// Do runs fn with the context current on a locked OS thread and the
// context's lock held.
func (c *Context) Do(fn func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.d.check("cuCtxSetCurrent", c.d.cuCtxSetCurrent(c.ctx)); err != nil {
		return err
	}
	return fn()
}

// Close destroys the stream and releases the primary context. Memory still
// allocated is freed with the context when no one else holds it.
func (c *Context) Close() error {
	err := c.Do(func() error {
		if c.stream != 0 {
			c.d.cuStreamSynchronize(c.stream)
			c.d.cuStreamDestroy(c.stream)
			c.stream = 0
		}
		return nil
	})
	if r := c.d.cuDevicePrimaryCtxRelease(c.dev); err == nil {
		err = c.d.check("cuDevicePrimaryCtxRelease", r)
	}
	return err
}

// MemInfo reports free and total device memory in bytes. Call it inside Do.
func (c *Context) MemInfo() (free, total uint64, err error) {
	err = c.d.check("cuMemGetInfo", c.d.cuMemGetInfo(&free, &total))
	return free, total, err
}

// Allocated is the bytes this context's Alloc calls hold.
func (c *Context) Allocated() uint64 { return c.allocated }

// Alloc allocates n bytes of device memory. Call it inside Do.
func (c *Context) Alloc(n int) (Ptr, error) {
	if n <= 0 {
		return 0, fmt.Errorf("cuda: allocation of %d bytes", n)
	}
	var p uint64
	if err := c.d.check("cuMemAlloc", c.d.cuMemAlloc(&p, uint64(n))); err != nil {
		return 0, fmt.Errorf("allocate %d bytes: %w", n, err)
	}
	c.allocated += uint64(n)
	return Ptr(p), nil
}

// Free frees p, which held n bytes. Call it inside Do.
func (c *Context) Free(p Ptr, n int) error {
	if p == 0 {
		return nil
	}
	c.allocated -= uint64(n)
	return c.d.check("cuMemFree", c.d.cuMemFree(uint64(p)))
}

// Upload copies src to dst on the stream. src must stay unchanged until the
// stream passes the copy (Sync). Call it inside Do.
func (c *Context) Upload(dst Ptr, src unsafe.Pointer, n int) error {
	if n == 0 {
		return nil
	}
	return c.d.check("cuMemcpyHtoDAsync", c.d.cuMemcpyHtoDAsync(uint64(dst), src, uint64(n), c.stream))
}

// Download copies n bytes from src to dst and waits for the stream: dst is
// complete when it returns. Call it inside Do.
func (c *Context) Download(dst unsafe.Pointer, src Ptr, n int) error {
	if n == 0 {
		return nil
	}
	if err := c.d.check("cuMemcpyDtoHAsync", c.d.cuMemcpyDtoHAsync(dst, uint64(src), uint64(n), c.stream)); err != nil {
		return err
	}
	return c.Sync()
}

// Zero sets n bytes at p to zero on the stream. Call it inside Do.
func (c *Context) Zero(p Ptr, n int) error {
	return c.d.check("cuMemsetD8Async", c.d.cuMemsetD8Async(uint64(p), 0, uint64(n), c.stream))
}

// Sync waits for everything queued on the stream. Call it inside Do.
func (c *Context) Sync() error {
	return c.d.check("cuStreamSynchronize", c.d.cuStreamSynchronize(c.stream))
}

// Event marks a point of the stream.
type Event struct {
	c *Context
	e uintptr
}

// NewEvent creates an event (timing enabled). Call it inside Do.
func (c *Context) NewEvent() (*Event, error) {
	var e uintptr
	if err := c.d.check("cuEventCreate", c.d.cuEventCreate(&e, 0)); err != nil {
		return nil, err
	}
	return &Event{c: c, e: e}, nil
}

// Record marks the stream's current end. Call it inside Do.
func (e *Event) Record() error {
	return e.c.d.check("cuEventRecord", e.c.d.cuEventRecord(e.e, e.c.stream))
}

// Done reports whether the work before the last Record has completed. Call
// it inside Do.
func (e *Event) Done() (bool, error) {
	r := e.c.d.cuEventQuery(e.e)
	if r == resultNotReady {
		return false, nil
	}
	return r == 0, e.c.d.check("cuEventQuery", r)
}

// Wait blocks until the work before the last Record has completed. Call it
// inside Do.
func (e *Event) Wait() error { return e.c.d.check("cuEventSynchronize", e.c.d.cuEventSynchronize(e.e)) }

// Since is the milliseconds from start's Record to e's. Call it inside Do.
func (e *Event) Since(start *Event) (float32, error) {
	var ms float32
	err := e.c.d.check("cuEventElapsedTime", e.c.d.cuEventElapsedTime(&ms, start.e, e.e))
	return ms, err
}

// Destroy frees the event. Call it inside Do.
func (e *Event) Destroy() error { return e.c.d.check("cuEventDestroy", e.c.d.cuEventDestroy(e.e)) }

// Module is loaded PTX or CUBIN.
type Module struct {
	c *Context
	m uintptr
}

// LoadModule loads a PTX (NUL-terminated) or CUBIN image. Call it inside Do.
func (c *Context) LoadModule(image []byte) (*Module, error) {
	if len(image) == 0 {
		return nil, fmt.Errorf("cuda: empty module image")
	}
	var m uintptr
	if err := c.d.check("cuModuleLoadData", c.d.cuModuleLoadData(&m, unsafe.Pointer(&image[0]))); err != nil {
		return nil, err
	}
	runtime.KeepAlive(image)
	return &Module{c: c, m: m}, nil
}

// Function is a kernel of a module.
type Function struct {
	c    *Context
	f    uintptr
	Name string
}

// Function looks up kernel name (an extern "C" name). Call it inside Do.
func (m *Module) Function(name string) (*Function, error) {
	var f uintptr
	n := cString(name)
	if err := m.c.d.check("cuModuleGetFunction "+name, m.c.d.cuModuleGetFunction(&f, m.m, &n[0])); err != nil {
		return nil, err
	}
	return &Function{c: m.c, f: f, Name: name}, nil
}

// Launch queues f on the stream with grid × block threads and dynamic
// shared memory shared bytes. Each argument is a Ptr, int32, uint32 or
// float32, passed by value. Call it inside Do.
func (f *Function) Launch(grid, block [3]uint32, shared uint32, args ...any) error {
	slots := make([]uint64, len(args))
	params := make([]unsafe.Pointer, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case Ptr:
			slots[i] = uint64(v)
		case int32:
			slots[i] = uint64(uint32(v))
		case uint32:
			slots[i] = uint64(v)
		case float32:
			slots[i] = uint64(math.Float32bits(v))
		case int:
			if v != int(int32(v)) {
				return fmt.Errorf("cuda: %s argument %d: %d does not fit in int32", f.Name, i, v)
			}
			slots[i] = uint64(uint32(int32(v)))
		default:
			return fmt.Errorf("cuda: %s argument %d: unsupported type %T", f.Name, i, a)
		}
		params[i] = unsafe.Pointer(&slots[i])
	}
	var pp *unsafe.Pointer
	if len(params) > 0 {
		pp = &params[0]
	}
	r := f.c.d.cuLaunchKernel(f.f, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, f.c.stream, pp, nil)
	runtime.KeepAlive(slots)
	runtime.KeepAlive(params)
	return f.c.d.check("cuLaunchKernel "+f.Name, r)
}

// SetMaxShared lets f use up to n bytes of dynamic shared memory
// (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES). Call it inside Do.
func (f *Function) SetMaxShared(n int) error {
	return f.c.d.check("cuFuncSetAttribute", f.c.d.cuFuncSetAttribute(f.f, 8, int32(n)))
}

// Graph is an instantiated CUDA graph: a captured sequence of launches
// replayed with one call.
type Graph struct {
	c *Context
	e uintptr
}

// captureRelaxed is CU_STREAM_CAPTURE_MODE_RELAXED: the capture does not
// forbid unrelated API calls on other threads.
const captureRelaxed = 2

// Capture records the launches fn queues on the stream into a graph
// instead of running them. fn must only launch kernels (no copies from host
// memory, no allocation). Call it inside Do.
func (c *Context) Capture(fn func() error) (*Graph, error) {
	if err := c.d.check("cuStreamBeginCapture", c.d.cuStreamBeginCapture(c.stream, captureRelaxed)); err != nil {
		return nil, err
	}
	ferr := fn()
	var g uintptr
	eerr := c.d.check("cuStreamEndCapture", c.d.cuStreamEndCapture(c.stream, &g))
	if ferr != nil || eerr != nil {
		if g != 0 {
			c.d.cuGraphDestroy(g)
		}
		if ferr != nil {
			return nil, ferr
		}
		return nil, eerr
	}
	defer c.d.cuGraphDestroy(g)
	var e uintptr
	if err := c.d.check("cuGraphInstantiate", c.d.cuGraphInstantiate(&e, g, 0)); err != nil {
		return nil, err
	}
	return &Graph{c: c, e: e}, nil
}

// Launch queues the graph on the stream. Call it inside Do.
func (g *Graph) Launch() error {
	return g.c.d.check("cuGraphLaunch", g.c.d.cuGraphLaunch(g.e, g.c.stream))
}

// Destroy frees the graph. Call it inside Do.
func (g *Graph) Destroy() error {
	return g.c.d.check("cuGraphExecDestroy", g.c.d.cuGraphExecDestroy(g.e))
}
