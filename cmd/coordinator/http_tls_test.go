package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// selfSigned writes a certificate for 127.0.0.1 and its key to dir and
// returns their paths and a pool that trusts the certificate.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "strata test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "api.crt"), filepath.Join(dir, "api.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestServeTLSKeysAndIdle: `coordinator serve` (the demo model) with
// --tls-cert/--tls-key, --api-key-file and $STRATA_API_KEY, and a short
// --idle-timeout: the API answers over TLS only, takes every key of the
// file and the environment's and no other, and closes a keep-alive
// connection that idles past the timeout.
func TestServeTLSKeysAndIdle(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	keys := filepath.Join(dir, "keys")
	if err := os.WriteFile(keys, []byte("# API keys\nkey-one\n\n  key-two  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("STRATA_API_KEY", "key-env")
	a, _ := listenServe(t, "--tls-cert", certFile, "--tls-key", keyFile, "--api-key-file", keys, "--idle-timeout", "300ms")
	tlsConf := &tls.Config{RootCAs: pool}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf}, Timeout: 30 * time.Second}
	get := func(path, key string) int {
		req, _ := http.NewRequest("GET", "https://"+a+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	deadline := time.Now().Add(guard(30 * time.Second))
	for get("/readyz", "") != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatalf("not ready within %v", guard(30*time.Second))
		}
		time.Sleep(50 * time.Millisecond)
	}
	for key, want := range map[string]int{"key-one": 200, "key-two": 200, "key-env": 200, "": 401, "key": 401, "# API keys": 401} {
		if got := get("/v1/models", key); got != want {
			t.Errorf("key %q: %d, want %d", key, got, want)
		}
	}
	// Plain HTTP on the TLS port gets no API.
	if resp, err := http.Get("http://" + a + "/v1/models"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP on the TLS port: %d", resp.StatusCode)
		}
	}
	// An idle keep-alive connection is closed after --idle-timeout.
	conn, err := tls.Dial("tcp", a, tlsConf)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(guard(10 * time.Second)))
	b, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("the idle connection was not closed within %v: %v", guard(10*time.Second), err)
	}
	if !strings.HasPrefix(string(b), "HTTP/1.1 200") {
		t.Errorf("answer on the kept-alive connection: %q", b)
	}
}

// TestServeFlagsRefused: bad HTTP flags get a one-line error naming them.
func TestServeFlagsRefused(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, []byte("# nothing\n\n"), 0o600)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert", "x.crt"}, "--tls-cert and --tls-key go together"},
		{[]string{"--max-body", "0"}, "--max-body"},
		{[]string{"--max-connections", "-1"}, "--max-connections"},
		{[]string{"--idle-timeout", "0s"}, "--idle-timeout"},
		{[]string{"--api-key-file", empty}, "holds no key"},
		{[]string{"--api-key-file", empty + ".absent"}, "--api-key-file"},
	} {
		_, err := parseServe(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v, want one line with %q", tc.args, err, tc.want)
		}
	}
}
