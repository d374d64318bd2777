package trust

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func newAuthority(t *testing.T) *Authority {
	t.Helper()
	a, created, err := OpenAuthority(filepath.Join(t.TempDir(), "trust"), "cluster-1", time.Now())
	if err != nil || !created {
		t.Fatalf("OpenAuthority: created %v, %v", created, err)
	}
	return a
}

// TestAuthorityPersists: files are 0600 in a 0700 directory, and a second
// open keeps the CA (its fingerprint) and the cluster secrets.
func TestAuthorityPersists(t *testing.T) {
	a := newAuthority(t)
	st, err := os.Stat(a.Dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("trust dir mode %v, %v; want 0700", st.Mode().Perm(), err)
	}
	if _, _, err := a.DefaultToken(time.Hour, time.Now()); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(a.Dir)
	for _, e := range ents {
		fi, _ := e.Info()
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", e.Name(), fi.Mode().Perm())
		}
	}
	b, created, err := OpenAuthority(a.Dir, "another-id", time.Now())
	if err != nil || created {
		t.Fatalf("reopen: created %v, %v", created, err)
	}
	if b.Fingerprint() != a.Fingerprint() || b.Self.Cluster.ID != "cluster-1" || string(b.Self.Cluster.GossipKey) != string(a.Self.Cluster.GossipKey) {
		t.Fatal("reopening changed the CA or the cluster secrets")
	}
	if fp, err := CAFingerprint(a.Dir); err != nil || fp != a.Fingerprint() {
		t.Fatalf("CAFingerprint = %q, %v; want %q", fp, err, a.Fingerprint())
	}
}

// TestIdentityRoundTrip: a shard's certificate from a CSR names its node
// ID, saves and loads back, and is refused under another CA.
func TestIdentityRoundTrip(t *testing.T) {
	a := newAuthority(t)
	key, csr, err := NewCSR("node-a")
	if err != nil {
		t.Fatal(err)
	}
	der, err := a.IssueCSR("node-a", csr, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	id, err := NewIdentity(der, key, a.CA.Cert.Raw, a.Self.Cluster)
	if err != nil {
		t.Fatal(err)
	}
	if id.Role != RoleShard || id.ID != "node-a" {
		t.Fatalf("identity %s/%s, want shard/node-a", id.Role, id.ID)
	}
	dir := filepath.Join(t.TempDir(), "trust")
	if _, err := LoadIdentity(dir); !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("LoadIdentity of an empty dir: %v, want ErrNoIdentity", err)
	}
	if err := SaveIdentity(dir, id); err != nil {
		t.Fatal(err)
	}
	got, err := LoadIdentity(dir)
	if err != nil || got.ID != "node-a" || got.Fingerprint() != a.Fingerprint() {
		t.Fatalf("LoadIdentity = %+v, %v", got, err)
	}
	other := newAuthority(t)
	if _, err := NewIdentity(der, key, other.CA.Cert.Raw, a.Self.Cluster); err == nil {
		t.Fatal("a certificate verified against another CA")
	}
	k2, _, _ := NewCSR("x")
	if _, err := NewIdentity(der, k2, a.CA.Cert.Raw, a.Self.Cluster); err == nil {
		t.Fatal("a certificate accepted with another key")
	}
	if _, err := a.IssueCSR("bad/id", csr, time.Now()); err == nil {
		t.Fatal("issued a certificate for a node ID with a slash")
	}
	csr[len(csr)-1] ^= 1
	if _, err := a.IssueCSR("node-a", csr, time.Now()); err == nil {
		t.Fatal("issued a certificate for a request with a broken signature")
	}
}

func TestTokens(t *testing.T) {
	a := newAuthority(t)
	now := time.Now()
	def, created, err := a.DefaultToken(time.Hour, now)
	if err != nil || !created {
		t.Fatalf("DefaultToken: %v, %v", created, err)
	}
	again, created, err := a.DefaultToken(time.Hour, now.Add(time.Minute))
	if err != nil || created || again != def {
		t.Fatalf("DefaultToken at restart = %v (created %v), %v; want the same token", again, created, err)
	}
	parsed, err := ParseToken(" " + def.String() + "\n")
	if err != nil || parsed != def || def.Fingerprint != a.Fingerprint() {
		t.Fatalf("ParseToken round trip: %v, %v", parsed, err)
	}
	for _, bad := range []string{"", "strata-", "strata-abc.def", def.Fingerprint + "." + def.Secret,
		"strata-" + strings.ToUpper(def.Fingerprint) + "." + def.Secret, "strata-" + def.Fingerprint + "." + def.Secret[1:]} {
		if _, err := ParseToken(bad); !errors.Is(err, ErrBadToken) {
			t.Errorf("ParseToken(%q) = %v, want ErrBadToken", bad, err)
		}
	}
	ts := a.Tokens
	if err := ts.Check(def.Secret, now); err != nil {
		t.Fatalf("Check(default) = %v", err)
	}
	if err := ts.Check(def.Secret, now.Add(2*time.Hour)); !errors.Is(err, ErrTokenRefused) {
		t.Fatalf("an expired token: %v, want ErrTokenRefused", err)
	}
	tok, info, err := ts.Create(a.Fingerprint(), 0, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := ts.Check(tok.Secret, now.Add(1000*time.Hour)); err != nil {
		t.Fatalf("a token without expiry: %v", err)
	}
	if err := ts.Check("nope", now); !errors.Is(err, ErrTokenRefused) {
		t.Fatalf("an unknown secret: %v", err)
	}
	b, _ := os.ReadFile(ts.path)
	if strings.Contains(string(b), tok.Secret) || strings.Contains(string(b), def.Secret) {
		t.Fatal("the token file holds a secret in clear")
	}
	if n, err := ts.Revoke(info.ID[:8], now); err != nil || n != 1 {
		t.Fatalf("Revoke = %d, %v", n, err)
	}
	if err := ts.Check(tok.Secret, now); !errors.Is(err, ErrTokenRefused) {
		t.Fatalf("a revoked token: %v", err)
	}
	// The default token revoked: the next start makes a new one.
	list, _ := ts.List(now)
	if len(list) != 1 || !list[0].Default {
		t.Fatalf("List = %+v, want the default token alone", list)
	}
	if _, err := ts.Revoke(list[0].ID, now); err != nil {
		t.Fatal(err)
	}
	if nd, created, err := a.DefaultToken(time.Hour, now); err != nil || !created || nd == def {
		t.Fatalf("DefaultToken after revoking it: created %v, same %v, %v", created, nd == def, err)
	}
}

// TestTLSPinningAndRoles: the pinned join dial accepts the coordinator
// only under the token's fingerprint; mutual TLS refuses a client of
// another CA; a shard dialling for the coordinator refuses a shard.
func TestTLSPinningAndRoles(t *testing.T) {
	a := newAuthority(t)
	shard, err := a.ShardIdentity("node-a")
	if err != nil {
		t.Fatal(err)
	}
	other := newAuthority(t)
	stranger, _ := other.ShardIdentity("node-b")

	handshake := func(srv, cli *tls.Config) error {
		l, err := tls.Listen("tcp", "127.0.0.1:0", srv)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		done := make(chan error, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				done <- err
				return
			}
			defer c.Close()
			done <- c.(*tls.Conn).Handshake()
		}()
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", l.Addr().String(), cli)
		if err == nil {
			// TLS 1.3: the client's certificate is checked after the
			// client's handshake; the server's verdict tells.
			err = <-done
			c.Close()
			return err
		}
		<-done
		return err
	}
	if err := handshake(a.Self.ServerTLS(false), JoinClientTLS(a.Fingerprint())); err != nil {
		t.Fatalf("pinned join handshake: %v", err)
	}
	if err := handshake(a.Self.ServerTLS(false), JoinClientTLS(other.Fingerprint())); err == nil {
		t.Fatal("the join dial accepted a coordinator of another CA")
	}
	if err := handshake(shard.ServerTLS(true), JoinClientTLS(a.Fingerprint())); err == nil {
		t.Fatal("the join dial accepted a shard's certificate as the coordinator")
	}
	if err := handshake(shard.ServerTLS(true), a.Self.ClientTLS(RoleShard)); err != nil {
		t.Fatalf("mutual TLS coordinator -> shard: %v", err)
	}
	if err := handshake(shard.ServerTLS(true), stranger.ClientTLS(RoleShard)); err == nil {
		t.Fatal("a shard's endpoint accepted a client of another CA")
	}
	if err := handshake(shard.ServerTLS(true), a.Self.ClientTLS("")); err != nil {
		t.Fatalf("mutual TLS without role check: %v", err)
	}
	if err := handshake(shard.ServerTLS(true), shard.ClientTLS(RoleCoordinator)); err == nil {
		t.Fatal("a dial for the coordinator accepted a shard")
	}
}
