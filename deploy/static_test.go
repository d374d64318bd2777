package deploy

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestStaticBinaries builds the binaries as the scratch images get them
// (compose-lib.sh, Dockerfile: CGO_ENABLED=0 -tags nocuda) and checks that
// neither asks for a dynamic loader: a scratch image has none, and the
// kernel then answers "no such file or directory" for a file that is there.
// Without the tag, the GPU backend's purego links the binary dynamically.
func TestStaticBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-tags", "nocuda", "-trimpath", "-o", dir+"/", "./cmd/coordinator", "./cmd/shard")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, name := range []string{"coordinator", "shard"} {
		f, err := elf.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s asks for a dynamic loader (PT_INTERP): it cannot start in a scratch image", name)
			}
		}
		if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
			t.Errorf("%s imports shared libraries %v", name, libs)
		}
		f.Close()
	}
}
