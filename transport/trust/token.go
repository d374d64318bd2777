package trust

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

const (
	tokenPrefix = "strata-"
	secretBytes = 32
	tokensFile  = "tokens.json"
	// DefaultTokenFile holds the coordinator's default join token in clear
	// (0600), so that a restart prints the same line and a shard beside it
	// (compose, tests) can read it with --token-file.
	DefaultTokenFile = "join-token"
	// MaxTokens bounds the token file: past it Create refuses until some
	// expire or are revoked.
	MaxTokens = 1024
)

// Errors of tokens.
var (
	ErrBadToken = errors.New("trust: malformed join token: want strata-<64 hex CA fingerprint>.<secret>")
	// ErrTokenRefused: no live token has this secret (unknown, expired or
	// revoked). The message says no more, to the caller or in logs.
	ErrTokenRefused = errors.New("trust: join token refused (unknown, expired or revoked)")
)

// Token is a join token: the CA's fingerprint and a secret.
type Token struct {
	Fingerprint string
	Secret      string
}

// String returns strata-<fingerprint>.<secret>.
func (t Token) String() string { return tokenPrefix + t.Fingerprint + "." + t.Secret }

// LogValue keeps the secret out of logs.
func (t Token) LogValue() slog.Value {
	return slog.StringValue(tokenPrefix + t.Fingerprint + ".<redacted>")
}

// ParseToken parses strata-<fingerprint>.<secret>; surrounding white space
// (a token file's newline) is ignored.
func ParseToken(s string) (Token, error) {
	s = strings.TrimSpace(s)
	rest, ok := strings.CutPrefix(s, tokenPrefix)
	if !ok {
		return Token{}, ErrBadToken
	}
	fp, secret, ok := strings.Cut(rest, ".")
	if !ok || len(fp) != 2*sha256.Size || strings.ToLower(fp) != fp {
		return Token{}, ErrBadToken
	}
	if _, err := hex.DecodeString(fp); err != nil {
		return Token{}, ErrBadToken
	}
	if b, err := base64.RawURLEncoding.DecodeString(secret); err != nil || len(b) != secretBytes {
		return Token{}, ErrBadToken
	}
	return Token{Fingerprint: fp, Secret: secret}, nil
}

// newSecret returns 32 random bytes, base64url without padding.
func newSecret() (string, error) {
	b := make([]byte, secretBytes)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// hashSecret is what the token file keeps: hex SHA-256 of the secret (32
// random bytes need no slow hash).
func hashSecret(secret string) string {
	s := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(s[:])
}

// TokenInfo is one token in the file: never its secret.
type TokenInfo struct {
	// ID is the first 12 hex digits of the secret's hash: what list shows
	// and revoke takes.
	ID      string    `json:"id"`
	Hash    string    `json:"sha256"`
	Created time.Time `json:"created"`
	// Expires is zero for a token without expiry.
	Expires time.Time `json:"expires,omitzero"`
	Default bool      `json:"default,omitempty"`
}

func (t TokenInfo) live(now time.Time) bool { return t.Expires.IsZero() || now.Before(t.Expires) }

// Tokens is the coordinator's token file, tokens.json in the trust
// directory: hashed secrets with their expiry. The running coordinator
// reads it at every Join, so tokens created or revoked by another process
// (`coordinator token create`) take effect at once. Writes replace the
// file atomically; two writers at the same instant can lose one's change
// (the CLI is run by hand; the coordinator itself writes only at start).
type Tokens struct {
	path string
}

// OpenTokens returns the token file of the trust directory dir.
func OpenTokens(dir string) *Tokens { return &Tokens{path: filepath.Join(dir, tokensFile)} }

func (ts *Tokens) read() ([]TokenInfo, error) {
	b, err := os.ReadFile(ts.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("trust: %w", err)
	}
	var out []TokenInfo
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("trust: %s: %w", ts.path, err)
	}
	return out, nil
}

func (ts *Tokens) write(list []TokenInfo) error {
	b, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Dir(ts.path), filepath.Base(ts.path), append(b, '\n'))
}

// List returns the tokens not yet expired.
func (ts *Tokens) List(now time.Time) ([]TokenInfo, error) {
	all, err := ts.read()
	if err != nil {
		return nil, err
	}
	var out []TokenInfo
	for _, t := range all {
		if t.live(now) {
			out = append(out, t)
		}
	}
	return out, nil
}

// Create makes a token for the CA of fingerprint that expires after ttl (0:
// never) and records its hash, dropping expired ones.
func (ts *Tokens) Create(fingerprint string, ttl time.Duration, now time.Time) (Token, TokenInfo, error) {
	return ts.create(fingerprint, ttl, now, false)
}

func (ts *Tokens) create(fingerprint string, ttl time.Duration, now time.Time, def bool) (Token, TokenInfo, error) {
	if ttl < 0 {
		return Token{}, TokenInfo{}, fmt.Errorf("trust: token TTL must be >= 0, got %v", ttl)
	}
	live, err := ts.List(now)
	if err != nil {
		return Token{}, TokenInfo{}, err
	}
	if len(live) >= MaxTokens {
		return Token{}, TokenInfo{}, fmt.Errorf("trust: %d live tokens, the limit: revoke some first", len(live))
	}
	secret, err := newSecret()
	if err != nil {
		return Token{}, TokenInfo{}, err
	}
	h := hashSecret(secret)
	info := TokenInfo{ID: h[:12], Hash: h, Created: now.UTC(), Default: def}
	if ttl > 0 {
		info.Expires = now.Add(ttl).UTC()
	}
	if err := ts.write(append(live, info)); err != nil {
		return Token{}, TokenInfo{}, err
	}
	return Token{Fingerprint: fingerprint, Secret: secret}, info, nil
}

// Revoke removes the tokens whose ID starts with prefix (at least 6
// characters) and returns how many.
func (ts *Tokens) Revoke(prefix string, now time.Time) (int, error) {
	if len(prefix) < 6 {
		return 0, fmt.Errorf("trust: give at least 6 characters of a token ID, got %q", prefix)
	}
	all, err := ts.List(now)
	if err != nil {
		return 0, err
	}
	var keep []TokenInfo
	for _, t := range all {
		if !strings.HasPrefix(t.ID, prefix) {
			keep = append(keep, t)
		}
	}
	n := len(all) - len(keep)
	if n == 0 {
		return 0, nil
	}
	return n, ts.write(keep)
}

// Check reports whether secret is a live token's: nil, or ErrTokenRefused.
func (ts *Tokens) Check(secret string, now time.Time) error {
	all, err := ts.read()
	if err != nil {
		return err
	}
	h := []byte(hashSecret(secret))
	ok := false
	for _, t := range all {
		if subtle.ConstantTimeCompare(h, []byte(t.Hash)) == 1 && t.live(now) {
			ok = true
		}
	}
	if !ok {
		return ErrTokenRefused
	}
	return nil
}

// DefaultToken returns the coordinator's default token: the one in the
// join-token file while it is still live in the token file, else a new one
// valid for ttl (0: no expiry), written to both. created reports a new one.
func (a *Authority) DefaultToken(ttl time.Duration, now time.Time) (tok Token, created bool, err error) {
	b, err := os.ReadFile(filepath.Join(a.Dir, DefaultTokenFile))
	if err == nil {
		if t, perr := ParseToken(string(b)); perr == nil && t.Fingerprint == a.Fingerprint() && a.Tokens.Check(t.Secret, now) == nil {
			return t, false, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return Token{}, false, fmt.Errorf("trust: %w", err)
	}
	tok, _, err = a.Tokens.create(a.Fingerprint(), ttl, now, true)
	if err != nil {
		return Token{}, false, err
	}
	if err := writeFile(a.Dir, DefaultTokenFile, []byte(tok.String()+"\n")); err != nil {
		return Token{}, false, err
	}
	return tok, true, nil
}

// CAFingerprint returns the fingerprint of the CA in the trust directory
// dir (for `coordinator token`, which does not need the CA's key).
func CAFingerprint(dir string) (string, error) {
	certs, err := readPEM(dir, caFile, "CERTIFICATE")
	if err != nil {
		return "", err
	}
	return Fingerprint(certs[0]), nil
}
