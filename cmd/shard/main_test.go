package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const testToken = "strata-0000000000000000000000000000000000000000000000000000000000000000.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"

// TestTokenSources: --token wins over --token-file, which wins over
// $STRATA_TOKEN; --insecure drops any; a shard that already holds a
// certificate does not read (or wait for) the token file; a malformed token
// is refused with a one-line reason.
func TestTokenSources(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--coordinator", "127.0.0.1:7946", "--data-dir", filepath.Join(dir, "data")}
	parse := func(env string, args ...string) (string, error) {
		t.Setenv("STRATA_TOKEN", env)
		cfg, err := parseJoin(append(append([]string(nil), base...), args...), io.Discard)
		return cfg.Token, err
	}
	if tok, err := parse("", "--token-file", file); err != nil || tok != testToken {
		t.Fatalf("--token-file: %q, %v", tok, err)
	}
	if tok, err := parse(testToken); err != nil || tok != testToken {
		t.Fatalf("$STRATA_TOKEN: %q, %v", tok, err)
	}
	if tok, err := parse(testToken, "--insecure"); err != nil || tok != "" {
		t.Fatalf("--insecure kept the token: %q, %v", tok, err)
	}
	if _, err := parse("", "--token", "strata-nonsense"); err == nil || !strings.Contains(err.Error(), "malformed join token") {
		t.Fatalf("a malformed token: %v", err)
	}
	// Joined: the file is not needed.
	if err := os.MkdirAll(filepath.Join(dir, "data", "trust"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data", "trust", "node.pem"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if tok, err := parse("", "--token-file", filepath.Join(dir, "absent")); err != nil || tok != "" {
		t.Fatalf("a joined shard with an absent --token-file: %q, %v", tok, err)
	}
	if time.Since(start) > tokenFileWait/2 {
		t.Fatal("a joined shard waited for the token file")
	}
}

// TestReadTokenFileWaits: a token file that appears while waiting is read;
// one that never does fails after the wait.
func TestReadTokenFileWaits(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	if _, err := readTokenFile(path, 0); !os.IsNotExist(err) {
		t.Fatalf("an absent file without a wait: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(300 * time.Millisecond) // the coordinator writing it a moment later
		_ = os.WriteFile(path, []byte(" "+testToken+"\n"), 0o600)
	}()
	tok, err := readTokenFile(path, time.Minute)
	<-done
	if err != nil || tok != testToken {
		t.Fatalf("readTokenFile = %q, %v", tok, err)
	}
}

// TestDeviceFlags: --device and --cuda-lib-dir reach the Config.
func TestDeviceFlags(t *testing.T) {
	cfg, err := parseJoin([]string{"--coordinator", "127.0.0.1:7946", "--insecure", "--device", "cuda:1", "--cuda-lib-dir", "/opt/nvrtc"}, io.Discard)
	if err != nil || cfg.Device != "cuda:1" || cfg.CUDALibDir != "/opt/nvrtc" {
		t.Fatalf("got device %q lib dir %q, %v", cfg.Device, cfg.CUDALibDir, err)
	}
}
