package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// nvrtcForTest loads NVRTC from STRATA_CUDA_LIB_DIR and the usual places,
// or skips: NVRTC is not part of CI's required path.
func nvrtcForTest(t *testing.T) *NVRTC {
	t.Helper()
	var extra []string
	if d := os.Getenv("STRATA_CUDA_LIB_DIR"); d != "" {
		extra = append(extra, d)
	}
	n, err := LoadNVRTC(NVRTCDirs(extra...))
	if err != nil {
		t.Skipf("no NVRTC here (set STRATA_CUDA_LIB_DIR): %v", err)
	}
	return n
}

// TestCompileKernels compiles kernels.cu for sm_90 (the H200) with
// whatever NVRTC this machine has, and checks that every kernel the backend
// launches is in the image.
func TestCompileKernels(t *testing.T) {
	n := nvrtcForTest(t)
	t.Logf("NVRTC %d.%d from %s", n.Major, n.Minor, n.Path)
	sup, err := n.SupportedArchs()
	if err != nil {
		t.Fatal(err)
	}
	arch, err := ChooseArch(90, sup)
	if err != nil {
		t.Fatal(err)
	}
	img, err := n.Compile(kernelSource, "kernels.cu", arch, CompileOptions)
	if err != nil {
		t.Fatal(err)
	}
	if img.Log != "" {
		t.Logf("NVRTC log: %s", img.Log)
	}
	if len(img.Data) == 0 {
		t.Fatal("empty image")
	}
	for _, k := range KernelNames {
		if !strings.Contains(string(img.Data), k) {
			t.Errorf("kernel %s is not in the %s image", k, arch)
		}
	}
	// The PTX lists every entry point: compare with KernelNames both ways.
	ptx, err := n.Compile(kernelSource, "kernels.cu", "compute_90", CompileOptions)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range regexp.MustCompile(`\.entry\s+(\w+)\(`).FindAllStringSubmatch(string(ptx.Data), -1) {
		got = append(got, m[1])
	}
	want := map[string]bool{}
	for _, k := range KernelNames {
		want[k] = true
	}
	for _, g := range got {
		if !want[g] {
			t.Errorf("kernels.cu defines %s, which KernelNames does not list", g)
		}
		delete(want, g)
	}
	for k := range want {
		t.Errorf("KernelNames lists %s, which kernels.cu does not define", k)
	}
}

// TestCompileCached stores an image on the first compile and reads it back
// on the second without NVRTC; a changed source is a different key.
func TestCompileCached(t *testing.T) {
	n := nvrtcForTest(t)
	dir := t.TempDir()
	src := `extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.f; }`
	img, hit, err := CompileCached(n, dir, src, "k.cu", "compute_90", nil)
	if err != nil || hit {
		t.Fatalf("first compile: hit=%v err=%v", hit, err)
	}
	again, hit, err := CompileCached(nil, dir, src, "k.cu", "compute_90", nil)
	if err != nil || !hit || string(again.Data) != string(img.Data) {
		t.Fatalf("second compile: hit=%v err=%v same=%v", hit, err, err == nil && string(again.Data) == string(img.Data))
	}
	if _, _, err := CompileCached(nil, dir, src+" ", "k.cu", "compute_90", nil); !errors.Is(err, ErrNoNVRTC) {
		t.Fatalf("changed source without NVRTC: got %v, want ErrNoNVRTC", err)
	}
	_, err = n.Compile(`extern "C" __global__ void k( { }`, "bad.cu", "compute_90", nil)
	var ce *CompileError
	if !errors.As(err, &ce) || ce.Log == "" {
		t.Fatalf("bad source: got %v, want a CompileError with a log", err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 1 {
		t.Fatalf("cache holds %v, want one image", files)
	}
}
