package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// ErrNoDriver is returned when libcuda.so.1 (the NVIDIA driver) cannot be
// loaded: the machine has no NVIDIA driver.
var ErrNoDriver = errors.New("cuda: no NVIDIA driver")

// Result is a CUresult: 0 is success.
type Result int32

// Error is a failed driver or NVRTC call.
type Error struct {
	Call string // the API function
	Code Result
	Name string // the library's name for Code (cuGetErrorName), when known
}

func (e *Error) Error() string {
	if e.Name != "" {
		return fmt.Sprintf("cuda: %s: %s (%d)", e.Call, e.Name, e.Code)
	}
	return fmt.Sprintf("cuda: %s: error %d", e.Call, e.Code)
}

// Device attributes (CUdevice_attribute) the package reads.
const (
	attrMaxThreadsPerBlock  = 1
	attrMaxSharedPerBlock   = 8
	attrClockRate           = 13
	attrMultiprocessors     = 16
	attrMemoryClockRate     = 36
	attrGlobalMemoryBusWide = 37
	attrComputeMajor        = 75
	attrComputeMinor        = 76
)

// Driver is the loaded driver API (libcuda.so.1), bound with purego. Its
// function values are safe to call from any goroutine; calls that need a
// context must run on an OS thread where it is current (see Context.Bind).
type Driver struct {
	lib uintptr

	cuInit                    func(flags uint32) Result
	cuDriverGetVersion        func(v *int32) Result
	cuGetErrorName            func(r Result, s **byte) Result
	cuDeviceGetCount          func(n *int32) Result
	cuDeviceGet               func(d *int32, ordinal int32) Result
	cuDeviceGetName           func(name *byte, n int32, d int32) Result
	cuDeviceGetAttribute      func(v *int32, attr int32, d int32) Result
	cuDeviceTotalMem          func(b *uint64, d int32) Result
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, d int32) Result
	cuDevicePrimaryCtxRelease func(d int32) Result
	cuCtxSetCurrent           func(ctx uintptr) Result
	cuCtxSynchronize          func() Result
	cuMemGetInfo              func(free, total *uint64) Result
	cuMemAlloc                func(p *uint64, n uint64) Result
	cuMemFree                 func(p uint64) Result
	cuMemAllocHost            func(p *unsafe.Pointer, n uint64) Result
	cuMemFreeHost             func(p unsafe.Pointer) Result
	cuMemcpyHtoD              func(dst uint64, src unsafe.Pointer, n uint64) Result
	cuMemcpyDtoH              func(dst unsafe.Pointer, src uint64, n uint64) Result
	cuMemcpyHtoDAsync         func(dst uint64, src unsafe.Pointer, n uint64, s uintptr) Result
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src uint64, n uint64, s uintptr) Result
	cuMemsetD8Async           func(dst uint64, v uint8, n uint64, s uintptr) Result
	cuStreamCreate            func(s *uintptr, flags uint32) Result
	cuStreamDestroy           func(s uintptr) Result
	cuStreamSynchronize       func(s uintptr) Result
	cuEventCreate             func(e *uintptr, flags uint32) Result
	cuEventDestroy            func(e uintptr) Result
	cuEventRecord             func(e, s uintptr) Result
	cuEventQuery              func(e uintptr) Result
	cuEventSynchronize        func(e uintptr) Result
	cuEventElapsedTime        func(ms *float32, start, end uintptr) Result
	cuModuleLoadData          func(m *uintptr, image unsafe.Pointer) Result
	cuModuleUnload            func(m uintptr) Result
	cuModuleGetFunction       func(f *uintptr, m uintptr, name *byte) Result
	cuFuncSetAttribute        func(f uintptr, attr int32, v int32) Result
	cuStreamBeginCapture      func(s uintptr, mode int32) Result
	cuStreamEndCapture        func(s uintptr, g *uintptr) Result
	cuGraphInstantiate        func(e *uintptr, g uintptr, flags uint64) Result
	cuGraphLaunch             func(e, s uintptr) Result
	cuGraphDestroy            func(g uintptr) Result
	cuGraphExecDestroy        func(e uintptr) Result
	cuLaunchKernel            func(f uintptr, gx, gy, gz, bx, by, bz, shared uint32, s uintptr, params *unsafe.Pointer, extra unsafe.Pointer) Result
}

// resultNotReady is CUDA_ERROR_NOT_READY, cuEventQuery's "still running".
const resultNotReady Result = 600

var (
	driverOnce sync.Once
	driver     *Driver
	driverErr  error
)

// driverNames are the names tried, in order, for the driver library.
var driverNames = []string{"libcuda.so.1", "libcuda.so"}

// LoadDriver loads libcuda.so.1 once per process and calls cuInit. Without a
// driver it returns an error wrapping ErrNoDriver that says what was tried.
func LoadDriver() (*Driver, error) {
	driverOnce.Do(func() { driver, driverErr = loadDriver(driverNames) })
	return driver, driverErr
}

func loadDriver(names []string) (*Driver, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("%w: the CUDA backend runs on Linux only, this is %s", ErrNoDriver, runtime.GOOS)
	}
	var lib uintptr
	var errs []string
	for _, n := range names {
		h, err := dlopen(n)
		if err == nil {
			lib = h
			break
		}
		errs = append(errs, err.Error())
	}
	if lib == 0 {
		return nil, fmt.Errorf("%w (%s)", ErrNoDriver, strings.Join(errs, "; "))
	}
	d := &Driver{lib: lib}
	if err := bind(lib, d.symbols()); err != nil {
		return nil, fmt.Errorf("%w: libcuda.so.1 lacks %v (driver too old?)", ErrNoDriver, err)
	}
	if err := d.check("cuInit", d.cuInit(0)); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDriver, err)
	}
	return d, nil
}

// symbols maps each function field to its exported name (the _v2 entry
// points where the driver has them, as cuda.h's macros pick).
func (d *Driver) symbols() map[string]any {
	return map[string]any{
		"cuInit":                       &d.cuInit,
		"cuDriverGetVersion":           &d.cuDriverGetVersion,
		"cuGetErrorName":               &d.cuGetErrorName,
		"cuDeviceGetCount":             &d.cuDeviceGetCount,
		"cuDeviceGet":                  &d.cuDeviceGet,
		"cuDeviceGetName":              &d.cuDeviceGetName,
		"cuDeviceGetAttribute":         &d.cuDeviceGetAttribute,
		"cuDeviceTotalMem_v2":          &d.cuDeviceTotalMem,
		"cuDevicePrimaryCtxRetain":     &d.cuDevicePrimaryCtxRetain,
		"cuDevicePrimaryCtxRelease_v2": &d.cuDevicePrimaryCtxRelease,
		"cuCtxSetCurrent":              &d.cuCtxSetCurrent,
		"cuCtxSynchronize":             &d.cuCtxSynchronize,
		"cuMemGetInfo_v2":              &d.cuMemGetInfo,
		"cuMemAlloc_v2":                &d.cuMemAlloc,
		"cuMemFree_v2":                 &d.cuMemFree,
		"cuMemAllocHost_v2":            &d.cuMemAllocHost,
		"cuMemFreeHost":                &d.cuMemFreeHost,
		"cuMemcpyHtoD_v2":              &d.cuMemcpyHtoD,
		"cuMemcpyDtoH_v2":              &d.cuMemcpyDtoH,
		"cuMemcpyHtoDAsync_v2":         &d.cuMemcpyHtoDAsync,
		"cuMemcpyDtoHAsync_v2":         &d.cuMemcpyDtoHAsync,
		"cuMemsetD8Async":              &d.cuMemsetD8Async,
		"cuStreamCreate":               &d.cuStreamCreate,
		"cuStreamDestroy_v2":           &d.cuStreamDestroy,
		"cuStreamSynchronize":          &d.cuStreamSynchronize,
		"cuEventCreate":                &d.cuEventCreate,
		"cuEventDestroy_v2":            &d.cuEventDestroy,
		"cuEventRecord":                &d.cuEventRecord,
		"cuEventQuery":                 &d.cuEventQuery,
		"cuEventSynchronize":           &d.cuEventSynchronize,
		"cuEventElapsedTime":           &d.cuEventElapsedTime,
		"cuModuleLoadData":             &d.cuModuleLoadData,
		"cuModuleUnload":               &d.cuModuleUnload,
		"cuModuleGetFunction":          &d.cuModuleGetFunction,
		"cuFuncSetAttribute":           &d.cuFuncSetAttribute,
		"cuLaunchKernel":               &d.cuLaunchKernel,
		"cuStreamBeginCapture_v2":      &d.cuStreamBeginCapture,
		"cuStreamEndCapture":           &d.cuStreamEndCapture,
		"cuGraphInstantiateWithFlags":  &d.cuGraphInstantiate,
		"cuGraphLaunch":                &d.cuGraphLaunch,
		"cuGraphDestroy":               &d.cuGraphDestroy,
		"cuGraphExecDestroy":           &d.cuGraphExecDestroy,
	}
}

// bind resolves every symbol of syms in lib; the first missing one is an
// error naming it.
func bind(lib uintptr, syms map[string]any) error {
	for name, fp := range syms {
		p, err := dlsym(lib, name)
		if err != nil {
			return fmt.Errorf("symbol %s: %w", name, err)
		}
		registerFunc(fp, p)
	}
	return nil
}

// check turns a CUresult into an *Error naming call, or nil.
func (d *Driver) check(call string, r Result) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: call, Code: r}
	if d != nil && d.cuGetErrorName != nil {
		var s *byte
		if d.cuGetErrorName(r, &s) == 0 {
			e.Name = goString(s)
		}
	}
	return e
}

// goString copies a NUL-terminated C string.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	var b []byte
	for ptr := unsafe.Pointer(p); *(*byte)(ptr) != 0; ptr = unsafe.Add(ptr, 1) {
		b = append(b, *(*byte)(ptr))
	}
	return string(b)
}

// cString returns s as a NUL-terminated byte slice.
func cString(s string) []byte { return append([]byte(s), 0) }

// Version is the driver's CUDA version, e.g. 13000 for 13.0.
func (d *Driver) Version() (int, error) {
	var v int32
	err := d.check("cuDriverGetVersion", d.cuDriverGetVersion(&v))
	return int(v), err
}

// DeviceCount is the number of CUDA devices.
func (d *Driver) DeviceCount() (int, error) {
	var n int32
	err := d.check("cuDeviceGetCount", d.cuDeviceGetCount(&n))
	return int(n), err
}

// DeviceInfo describes one device.
type DeviceInfo struct {
	Ordinal          int
	Name             string
	Major, Minor     int    // compute capability
	TotalMemory      uint64 // bytes
	Multiprocessors  int
	MemoryClockKHz   int // peak memory clock (0 when the driver does not say)
	MemoryBusBits    int // global memory bus width
	MaxSharedPerBlk  int // bytes
	MaxThreadsPerBlk int
}

// Arch is the NVRTC architecture name, e.g. "sm_90".
func (i DeviceInfo) Arch() string { return fmt.Sprintf("sm_%d%d", i.Major, i.Minor) }

// PeakBandwidth is the memory bandwidth the attributes imply, in bytes per
// second (double data rate), or 0 when the driver reports no clock.
func (i DeviceInfo) PeakBandwidth() float64 {
	return 2 * float64(i.MemoryClockKHz) * 1e3 * float64(i.MemoryBusBits) / 8
}

// Info reads device ordinal's name, capability and memory.
func (d *Driver) Info(ordinal int) (DeviceInfo, error) {
	n, err := d.DeviceCount()
	if err != nil {
		return DeviceInfo{}, err
	}
	if ordinal < 0 || ordinal >= n {
		return DeviceInfo{}, fmt.Errorf("cuda: device %d does not exist: this machine has %d", ordinal, n)
	}
	var dev int32
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&dev, int32(ordinal))); err != nil {
		return DeviceInfo{}, err
	}
	name := make([]byte, 256)
	if err := d.check("cuDeviceGetName", d.cuDeviceGetName(&name[0], int32(len(name)), dev)); err != nil {
		return DeviceInfo{}, err
	}
	info := DeviceInfo{Ordinal: ordinal, Name: goString(&name[0])}
	if err := d.check("cuDeviceTotalMem", d.cuDeviceTotalMem(&info.TotalMemory, dev)); err != nil {
		return DeviceInfo{}, err
	}
	for _, a := range []struct {
		attr int32
		dst  *int
	}{
		{attrComputeMajor, &info.Major}, {attrComputeMinor, &info.Minor},
		{attrMultiprocessors, &info.Multiprocessors}, {attrMemoryClockRate, &info.MemoryClockKHz},
		{attrGlobalMemoryBusWide, &info.MemoryBusBits}, {attrMaxSharedPerBlock, &info.MaxSharedPerBlk},
		{attrMaxThreadsPerBlock, &info.MaxThreadsPerBlk},
	} {
		var v int32
		if err := d.check("cuDeviceGetAttribute", d.cuDeviceGetAttribute(&v, a.attr, dev)); err != nil {
			if a.attr == attrMemoryClockRate || a.attr == attrGlobalMemoryBusWide {
				continue // deprecated in CUDA 13: PeakBandwidth is then 0, unknown
			}
			return DeviceInfo{}, err
		}
		*a.dst = int(v)
	}
	return info, nil
}

// ParseDevice parses "cuda:N" into N.
func ParseDevice(s string) (int, error) {
	rest, ok := strings.CutPrefix(s, "cuda:")
	if !ok || rest == "" {
		return 0, fmt.Errorf("cuda: device must be cuda:N, got %q", s)
	}
	n := 0
	for _, c := range rest {
		if c < '0' || c > '9' || n > 1<<20 {
			return 0, fmt.Errorf("cuda: device must be cuda:N with N a small number, got %q", s)
		}
		n = n*10 + int(c-'0')
	}
	return n, nil
}

// libDirsFromEnv lists the directories of LD_LIBRARY_PATH, used when
// searching for NVRTC by full path.
func libDirsFromEnv() []string {
	var dirs []string
	for _, d := range filepath.SplitList(os.Getenv("LD_LIBRARY_PATH")) {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	return dirs
}
