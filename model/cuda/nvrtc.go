package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// ErrNoNVRTC is returned when no NVRTC library (libnvrtc.so.13 or .12) can
// be loaded.
var ErrNoNVRTC = errors.New("cuda: no NVRTC library (libnvrtc.so.13 or .12)")

// NVRTC is the loaded runtime compiler.
type NVRTC struct {
	Path         string // the library loaded
	Major, Minor int

	nvrtcVersion             func(major, minor *int32) Result
	nvrtcGetErrorString      func(r Result) *byte
	nvrtcCreateProgram       func(p *uintptr, src *byte, name *byte, nh int32, headers, names **byte) Result
	nvrtcDestroyProgram      func(p *uintptr) Result
	nvrtcCompileProgram      func(p uintptr, n int32, opts **byte) Result
	nvrtcGetProgramLogSize   func(p uintptr, n *uint64) Result
	nvrtcGetProgramLog       func(p uintptr, log *byte) Result
	nvrtcGetPTXSize          func(p uintptr, n *uint64) Result
	nvrtcGetPTX              func(p uintptr, ptx *byte) Result
	nvrtcGetCUBINSize        func(p uintptr, n *uint64) Result
	nvrtcGetCUBIN            func(p uintptr, cubin *byte) Result
	nvrtcGetNumSupportedArch func(n *int32) Result
	nvrtcGetSupportedArchs   func(a *int32) Result
}

// nvrtcSONames are the sonames tried, newest first.
var nvrtcSONames = []string{"libnvrtc.so.13", "libnvrtc.so.12"}

// NVRTCDirs lists the directories searched for NVRTC besides the dynamic
// loader's own path: extra (--cuda-lib-dir) first, then CUDA's usual
// install places and the lib folders of pip's nvidia wheels.
func NVRTCDirs(extra ...string) []string {
	dirs := append([]string(nil), extra...)
	dirs = append(dirs, libDirsFromEnv()...)
	if h := os.Getenv("CUDA_HOME"); h != "" {
		dirs = append(dirs, filepath.Join(h, "lib64"), filepath.Join(h, "lib"))
	}
	dirs = append(dirs, "/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64")
	globs := []string{"/usr/local/cuda-*/lib64"}
	var sites []string
	for _, p := range []string{"/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages", "/opt/conda/lib/python3*/site-packages", "/opt/*/lib/python3*/site-packages"} {
		sites = append(sites, p)
	}
	if v := os.Getenv("VIRTUAL_ENV"); v != "" {
		sites = append(sites, filepath.Join(v, "lib/python3*/site-packages"))
	}
	if h, err := os.UserHomeDir(); err == nil {
		sites = append(sites, filepath.Join(h, ".local/lib/python3*/site-packages"))
	}
	for _, s := range sites {
		globs = append(globs, filepath.Join(s, "nvidia/*/lib"), filepath.Join(s, "nvidia/cu1*/lib"))
	}
	for _, g := range globs {
		m, _ := filepath.Glob(g)
		sort.Sort(sort.Reverse(sort.StringSlice(m))) // newest version first
		dirs = append(dirs, m...)
	}
	return dirs
}

var (
	nvrtcMu    sync.Mutex
	nvrtcCache = map[string]*NVRTC{}
)

// LoadNVRTC loads NVRTC from the first of dirs (NVRTCDirs) that holds it,
// else by soname through the dynamic loader. The error says what was tried.
func LoadNVRTC(dirs []string) (*NVRTC, error) {
	nvrtcMu.Lock()
	defer nvrtcMu.Unlock()
	key := strings.Join(dirs, "\x00")
	if n := nvrtcCache[key]; n != nil {
		return n, nil
	}
	var tried []string
	try := func(path string) *NVRTC {
		dir := filepath.Dir(path)
		if filepath.IsAbs(path) {
			// The builtins library sits beside NVRTC; loading it first
			// lets NVRTC find it where no rpath or loader path names dir.
			if bs, _ := filepath.Glob(filepath.Join(dir, "libnvrtc-builtins.so*")); len(bs) > 0 {
				sort.Sort(sort.Reverse(sort.StringSlice(bs)))
				dlopen(bs[0]) //nolint:errcheck // best effort; the compile reports a missing one
			}
		}
		h, err := dlopen(path)
		if err != nil {
			tried = append(tried, err.Error())
			return nil
		}
		n := &NVRTC{Path: path}
		if err := bind(h, n.symbols()); err != nil {
			tried = append(tried, path+": "+err.Error())
			return nil
		}
		var ma, mi int32
		if r := n.nvrtcVersion(&ma, &mi); r != 0 {
			tried = append(tried, fmt.Sprintf("%s: nvrtcVersion: %d", path, r))
			return nil
		}
		n.Major, n.Minor = int(ma), int(mi)
		return n
	}
	for _, d := range dirs {
		for _, so := range nvrtcSONames {
			p := filepath.Join(d, so)
			if _, err := os.Stat(p); err != nil {
				continue
			}
			if n := try(p); n != nil {
				nvrtcCache[key] = n
				return n, nil
			}
		}
	}
	for _, so := range nvrtcSONames {
		if n := try(so); n != nil {
			nvrtcCache[key] = n
			return n, nil
		}
	}
	return nil, fmt.Errorf("%w: searched %d directories (pass --cuda-lib-dir): %s", ErrNoNVRTC, len(dirs), strings.Join(tried, "; "))
}

func (n *NVRTC) symbols() map[string]any {
	return map[string]any{
		"nvrtcVersion":              &n.nvrtcVersion,
		"nvrtcGetErrorString":       &n.nvrtcGetErrorString,
		"nvrtcCreateProgram":        &n.nvrtcCreateProgram,
		"nvrtcDestroyProgram":       &n.nvrtcDestroyProgram,
		"nvrtcCompileProgram":       &n.nvrtcCompileProgram,
		"nvrtcGetProgramLogSize":    &n.nvrtcGetProgramLogSize,
		"nvrtcGetProgramLog":        &n.nvrtcGetProgramLog,
		"nvrtcGetPTXSize":           &n.nvrtcGetPTXSize,
		"nvrtcGetPTX":               &n.nvrtcGetPTX,
		"nvrtcGetCUBINSize":         &n.nvrtcGetCUBINSize,
		"nvrtcGetCUBIN":             &n.nvrtcGetCUBIN,
		"nvrtcGetNumSupportedArchs": &n.nvrtcGetNumSupportedArch,
		"nvrtcGetSupportedArchs":    &n.nvrtcGetSupportedArchs,
	}
}

func (n *NVRTC) check(call string, r Result) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Code: r, Name: goString(n.nvrtcGetErrorString(r))}
}

// SupportedArchs lists the compute capabilities NVRTC compiles for, as
// major*10+minor, ascending.
func (n *NVRTC) SupportedArchs() ([]int, error) {
	var c int32
	if err := n.check("nvrtcGetNumSupportedArchs", n.nvrtcGetNumSupportedArch(&c)); err != nil {
		return nil, err
	}
	if c <= 0 {
		return nil, nil
	}
	a := make([]int32, c)
	if err := n.check("nvrtcGetSupportedArchs", n.nvrtcGetSupportedArchs(&a[0])); err != nil {
		return nil, err
	}
	out := make([]int, c)
	for i, v := range a {
		out[i] = int(v)
	}
	return out, nil
}

// Image is compiled device code.
type Image struct {
	Data []byte // CUBIN, or PTX with a trailing NUL
	PTX  bool   // Data is PTX (the driver compiles it at load)
	Arch string // the -arch it was compiled for, e.g. sm_90 or compute_90
	Log  string // NVRTC's warnings
}

// CompileError is a program NVRTC refused, with its log.
type CompileError struct {
	Arch string
	Log  string
	Err  error
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("cuda: compile kernels for %s: %v\n%s", e.Arch, e.Err, e.Log)
}

func (e *CompileError) Unwrap() error { return e.Err }

// Compile compiles src for arch: "sm_XY" gives CUBIN, "compute_XY" PTX.
func (n *NVRTC) Compile(src, name, arch string, opts []string) (*Image, error) {
	var p uintptr
	csrc, cname := cString(src), cString(name)
	if err := n.check("nvrtcCreateProgram", n.nvrtcCreateProgram(&p, &csrc[0], &cname[0], 0, nil, nil)); err != nil {
		return nil, err
	}
	defer n.nvrtcDestroyProgram(&p)
	all := append([]string{"--gpu-architecture=" + arch}, opts...)
	cs := make([][]byte, len(all))
	ptrs := make([]*byte, len(all))
	for i, o := range all {
		cs[i] = cString(o)
		ptrs[i] = &cs[i][0]
	}
	cerr := n.check("nvrtcCompileProgram", n.nvrtcCompileProgram(p, int32(len(ptrs)), &ptrs[0]))
	var logN uint64
	var log string
	if n.nvrtcGetProgramLogSize(p, &logN) == 0 && logN > 1 {
		b := make([]byte, logN)
		if n.nvrtcGetProgramLog(p, &b[0]) == 0 {
			log = strings.TrimRight(string(b), "\x00\n")
		}
	}
	if cerr != nil {
		return nil, &CompileError{Arch: arch, Log: log, Err: cerr}
	}
	img := &Image{Arch: arch, Log: log, PTX: strings.HasPrefix(arch, "compute_")}
	var size uint64
	if img.PTX {
		if err := n.check("nvrtcGetPTXSize", n.nvrtcGetPTXSize(p, &size)); err != nil {
			return nil, err
		}
		img.Data = make([]byte, size)
		if err := n.check("nvrtcGetPTX", n.nvrtcGetPTX(p, &img.Data[0])); err != nil {
			return nil, err
		}
		return img, nil
	}
	if err := n.check("nvrtcGetCUBINSize", n.nvrtcGetCUBINSize(p, &size)); err != nil {
		return nil, err
	}
	img.Data = make([]byte, size)
	if err := n.check("nvrtcGetCUBIN", n.nvrtcGetCUBIN(p, &img.Data[0])); err != nil {
		return nil, err
	}
	return img, nil
}

// ChooseArch picks what to compile for a device of capability cc
// (major*10+minor) given the capabilities NVRTC supports: CUBIN for cc
// itself when supported, else PTX for the newest supported capability
// below cc (the driver compiles PTX for newer devices), else an error.
func ChooseArch(cc int, supported []int) (string, error) {
	best := -1
	for _, s := range supported {
		if s == cc {
			return fmt.Sprintf("sm_%d", cc), nil
		}
		if s < cc && s > best {
			best = s
		}
	}
	if best < 0 {
		return "", fmt.Errorf("cuda: NVRTC compiles for compute capabilities %v, none at or below the device's %d.%d", supported, cc/10, cc%10)
	}
	return fmt.Sprintf("compute_%d", best), nil
}

// CacheKey names a compiled image by the source and options that made it
// and the architecture: a changed kernel or flag never reuses a stale file.
func CacheKey(src string, opts []string, arch string) string {
	h := sha256.New()
	h.Write([]byte(src))
	for _, o := range opts {
		h.Write([]byte{0})
		h.Write([]byte(o))
	}
	ext := ".cubin"
	if strings.HasPrefix(arch, "compute_") {
		ext = ".ptx"
	}
	return hex.EncodeToString(h.Sum(nil))[:24] + "-" + arch + ext
}

// CompileCached returns the image for (src, opts, arch) from dir when a
// previous run stored it there, else compiles it with n and stores it. An
// empty dir disables the cache. n may be nil when the cache holds the image.
func CompileCached(n *NVRTC, dir, src, name, arch string, opts []string) (*Image, bool, error) {
	key := CacheKey(src, opts, arch)
	ptx := strings.HasPrefix(arch, "compute_")
	if dir != "" {
		if b, err := os.ReadFile(filepath.Join(dir, key)); err == nil && len(b) > 0 {
			return &Image{Data: b, PTX: ptx, Arch: arch}, true, nil
		}
	}
	if n == nil {
		return nil, false, ErrNoNVRTC
	}
	img, err := n.Compile(src, name, arch, opts)
	if err != nil {
		return nil, false, err
	}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return img, false, fmt.Errorf("cuda: kernel cache: %w", err)
		}
		tmp := filepath.Join(dir, key+".tmp")
		if err := os.WriteFile(tmp, img.Data, 0o644); err != nil {
			return img, false, fmt.Errorf("cuda: kernel cache: %w", err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, key)); err != nil {
			return img, false, fmt.Errorf("cuda: kernel cache: %w", err)
		}
	}
	return img, false, nil
}
