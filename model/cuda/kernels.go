package cuda

import (
	_ "embed"
	"fmt"
)

// kernelSource is the project's CUDA C (kernels.cu), compiled at start.
//
//go:embed kernels.cu
var kernelSource string

// KernelSource returns the embedded CUDA C.
func KernelSource() string { return kernelSource }

// KernelNames are the kernels kernels.cu defines and the backend launches;
// loading a module checks that each is present.
var KernelNames = []string{
	"embed_f32", "embed_f16", "embed_q8_0",
	"rms_norm", "rope", "kv_store", "attend", "swiglu",
	"to_f16", "quant_q8_0",
	"mm_f32_1", "mm_f32_8", "mm_f16_1", "mm_f16_8", "mm_q8_0_1", "mm_q8_0_8",
}

// CompileOptions are NVRTC's flags for kernels.cu. No fast-math: the
// kernels' numerics are stated in kernels.cu (expf in SwiGLU, __expf only
// in attention's softmax).
var CompileOptions = []string{"--std=c++17", "-default-device"}

// Kernels is the loaded module and its functions by name.
type Kernels struct {
	Image *Image
	mod   *Module
	fn    map[string]*Function
}

// LoadKernels compiles (or reads from cacheDir) kernels.cu for c's device
// and loads it. nv may be nil when the cache already holds the image.
func LoadKernels(c *Context, nv *NVRTC, cacheDir string) (*Kernels, error) {
	arch := c.Info.Arch()
	if nv != nil {
		sup, err := nv.SupportedArchs()
		if err != nil {
			return nil, err
		}
		if arch, err = ChooseArch(c.Info.Major*10+c.Info.Minor, sup); err != nil {
			return nil, err
		}
	}
	img, _, err := CompileCached(nv, cacheDir, kernelSource, "kernels.cu", arch, CompileOptions)
	if err != nil {
		return nil, err
	}
	k := &Kernels{Image: img, fn: map[string]*Function{}}
	err = c.Do(func() error {
		data := img.Data
		if img.PTX && (len(data) == 0 || data[len(data)-1] != 0) {
			data = append(append([]byte(nil), data...), 0)
		}
		m, err := c.LoadModule(data)
		if err != nil {
			return fmt.Errorf("load kernels (%s): %w", img.Arch, err)
		}
		k.mod = m
		for _, n := range KernelNames {
			f, err := m.Function(n)
			if err != nil {
				return err
			}
			k.fn[n] = f
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// Func returns kernel name; it panics for a name not in KernelNames (a
// programming error).
func (k *Kernels) Func(name string) *Function {
	f, ok := k.fn[name]
	if !ok {
		panic("cuda: no kernel " + name)
	}
	return f
}
