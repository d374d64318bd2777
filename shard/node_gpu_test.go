package shard

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-llm/strata/model/cuda"
)

// TestDeviceCUDAWithoutDriver: on a machine without the NVIDIA driver,
// --device cuda:0 fails in New with one line that says so; a device that is
// neither cpu nor cuda:N is refused by Validate.
func TestDeviceCUDAWithoutDriver(t *testing.T) {
	if _, err := cuda.LoadDriver(); err == nil {
		t.Skip("this machine has an NVIDIA driver (model/cuda's GPU tests cover it)")
	}
	cfg := DefaultConfig()
	cfg.Coordinator, cfg.Insecure = "127.0.0.1:7946", true
	cfg.DataDir = filepath.Join(t.TempDir(), "d")
	cfg.GRPC, cfg.Gossip = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Device = "cuda:0"
	_, err := New(cfg)
	if !errors.Is(err, cuda.ErrNoDriver) || strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), "--device cuda:0: ") {
		t.Fatalf("New with cuda:0 and no driver: %q, want one line starting --device cuda:0 and wrapping cuda.ErrNoDriver", err)
	}
	cfg.Device = "cuda:x"
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "cuda:N") {
		t.Fatalf("cuda:x: %v", err)
	}
	cfg.Device = "gpu"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "cpu or cuda:N") {
		t.Fatalf("gpu: %v", err)
	}
}

// TestGPUOffer: a GPU shard offers its free memory less the margin a stage
// needs beside its weights and KV, and nothing when that is all it has.
func TestGPUOffer(t *testing.T) {
	for _, c := range []struct{ free, want uint64 }{
		{0, 0}, {cuda.DefaultMargin, 0}, {cuda.DefaultMargin + 1, 1}, {140 << 30, 140<<30 - cuda.DefaultMargin},
	} {
		if got := gpuOffer(c.free); got != c.want {
			t.Errorf("gpuOffer(%d) = %d, want %d", c.free, got, c.want)
		}
	}
}
