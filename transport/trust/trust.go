package trust

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// Roles a certificate names in its URI SAN.
const (
	RoleShard       = "shard"
	RoleCoordinator = "coordinator"
)

// ServerName is the DNS SAN of every node certificate and the name every
// dialer verifies, whatever host it dials: nodes are reached by address,
// and the CA, not the address, is what is trusted.
const ServerName = "strata"

// Validity periods. The CA lives long (re-creating it means every shard
// joins again); a node certificate a year (a shard restarting after that
// needs a new token).
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 365 * 24 * time.Hour
	// clockSkew backdates NotBefore so that a peer whose clock is a little
	// behind accepts a certificate issued a moment ago.
	clockSkew = time.Hour
)

// GossipKeyBytes is the gossip key's length: AES-256 in memberlist's
// keyring.
const GossipKeyBytes = 32

// maxIDLen bounds a node ID in a certificate (and in a Join request).
const maxIDLen = 128

// File names inside a trust directory.
const (
	caFile      = "ca.pem"
	caKeyFile   = "ca-key.pem"
	certFile    = "node.pem"
	keyFile     = "node-key.pem"
	clusterFile = "cluster.json"
)

// Errors.
var (
	// ErrNoIdentity: the directory holds no node certificate (a shard that
	// has not joined).
	ErrNoIdentity = errors.New("trust: no identity")
	// ErrNotPeer: a gRPC call without a verified client certificate of the
	// cluster.
	ErrNotPeer = errors.New("trust: no verified cluster certificate")
)

// URI returns the identity URI of role and id.
func URI(role, id string) *url.URL {
	return &url.URL{Scheme: "strata", Host: role, Path: "/" + id}
}

// IDOf returns the role and ID a certificate's strata:// URI SAN names.
func IDOf(cert *x509.Certificate) (role, id string, ok bool) {
	for _, u := range cert.URIs {
		if u.Scheme == "strata" && (u.Host == RoleShard || u.Host == RoleCoordinator) && len(u.Path) > 1 {
			return u.Host, u.Path[1:], true
		}
	}
	return "", "", false
}

// CheckID reports whether id can name a node: 1..128 bytes of [0-9A-Za-z._-].
func CheckID(id string) error {
	if id == "" || len(id) > maxIDLen {
		return fmt.Errorf("trust: node ID must be 1..%d bytes, got %d", maxIDLen, len(id))
	}
	for _, r := range id {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("trust: node ID %q has a character outside [0-9A-Za-z._-]", id)
		}
	}
	return nil
}

// Fingerprint is the lower-case hex SHA-256 of a certificate's DER.
func Fingerprint(der []byte) string {
	s := sha256.Sum256(der)
	return hex.EncodeToString(s[:])
}

// NewKey returns a fresh ECDSA P-256 key.
func NewKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// Cluster is what every member shares besides the CA: the cluster ID
// (memberlist's label) and the gossip key.
type Cluster struct {
	ID        string `json:"cluster_id"`
	GossipKey []byte `json:"gossip_key"`
}

// Identity is one node's trust material: its certificate chain and key,
// the CA, and the cluster's shared secrets. It is immutable once made.
type Identity struct {
	Role, ID string
	Cert     tls.Certificate // leaf first, then the CA; PrivateKey set
	CA       *x509.Certificate
	Cluster  Cluster
}

// Fingerprint returns the CA's fingerprint.
func (id *Identity) Fingerprint() string { return Fingerprint(id.CA.Raw) }

func (id *Identity) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(id.CA)
	return p
}

// ServerTLS returns the TLS configuration of a gRPC server: this identity's
// certificate, client certificates verified against the CA, required
// (shards' stage endpoints) or only verified when given (the coordinator,
// whose Join is called before the caller has one; an interceptor requires
// it for everything else).
func (id *Identity) ServerTLS(requireClient bool) *tls.Config {
	auth := tls.VerifyClientCertIfGiven
	if requireClient {
		auth = tls.RequireAndVerifyClientCert
	}
	return &tls.Config{
		Certificates: []tls.Certificate{id.Cert},
		ClientAuth:   auth,
		ClientCAs:    id.pool(),
		MinVersion:   tls.VersionTLS13,
	}
}

// ClientTLS returns the TLS configuration of a dialer: this identity's
// certificate, the server verified against the CA under ServerName, and,
// when role is not empty, the server's certificate required to name that
// role (a shard dialling the coordinator wants the coordinator).
func (id *Identity) ClientTLS(role string) *tls.Config {
	cfg := &tls.Config{
		Certificates: []tls.Certificate{id.Cert},
		RootCAs:      id.pool(),
		ServerName:   ServerName,
		MinVersion:   tls.VersionTLS13,
	}
	if role != "" {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("trust: the server sent no certificate")
			}
			if r, _, ok := IDOf(cs.PeerCertificates[0]); !ok || r != role {
				return fmt.Errorf("trust: the server's certificate is not a %s's", role)
			}
			return nil
		}
	}
	return cfg
}

// JoinClientTLS returns the TLS configuration a joining shard dials the
// coordinator with: no certificate of its own, and the server accepted
// only when its chain ends in a CA whose fingerprint is fingerprint and its
// leaf, verified against that CA, names the coordinator.
func JoinClientTLS(fingerprint string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The chain is verified below against the pinned CA; the default
		// verification would want a system root and a host name.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPinned(cs.PeerCertificates, fingerprint)
		},
	}
}

// verifyPinned checks that certs (leaf first) hold a CA of the given
// fingerprint, that the leaf verifies against it, and that the leaf names
// the coordinator.
func verifyPinned(certs []*x509.Certificate, fingerprint string) error {
	if len(certs) == 0 {
		return errors.New("trust: the coordinator sent no certificate")
	}
	var ca *x509.Certificate
	for _, c := range certs[1:] {
		if Fingerprint(c.Raw) == fingerprint {
			ca = c
		}
	}
	if ca == nil {
		return fmt.Errorf("trust: the coordinator's CA is not the one the token names (fingerprint %.12s…): wrong token or wrong coordinator", fingerprint)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, DNSName: ServerName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("trust: the coordinator's certificate: %w", err)
	}
	if r, _, ok := IDOf(certs[0]); !ok || r != RoleCoordinator {
		return errors.New("trust: the server's certificate is not a coordinator's")
	}
	return nil
}

// CA is the cluster's certificate authority: the coordinator's.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// NewCA makes a self-signed ECDSA P-256 CA for the cluster clusterID.
func NewCA(clusterID string, now time.Time) (*CA, error) {
	key, err := NewKey()
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "strata cluster CA " + clusterID},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("trust: create CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Fingerprint returns the CA certificate's fingerprint.
func (ca *CA) Fingerprint() string { return Fingerprint(ca.Cert.Raw) }

// Issue signs a leaf certificate for role and id over pub, good for TLS
// server and client auth, and returns its DER.
func (ca *CA) Issue(role, id string, pub crypto.PublicKey, now time.Time) ([]byte, error) {
	if err := CheckID(id); err != nil {
		return nil, err
	}
	if role != RoleShard && role != RoleCoordinator {
		return nil, fmt.Errorf("trust: role must be %s or %s, got %q", RoleShard, RoleCoordinator, role)
	}
	if _, ok := pub.(*ecdsa.PublicKey); !ok {
		return nil, fmt.Errorf("trust: the public key must be ECDSA, got %T", pub)
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: role + " " + id},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{ServerName},
		URIs:         []*url.URL{URI(role, id)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("trust: issue %s %s: %w", role, id, err)
	}
	return der, nil
}

// NewIdentity makes a fresh key and a certificate for role and id: the
// coordinator's own, and an in-process shard's (no token needed).
func (ca *CA) NewIdentity(role, id string, cl Cluster, now time.Time) (*Identity, error) {
	key, err := NewKey()
	if err != nil {
		return nil, err
	}
	der, err := ca.Issue(role, id, &key.PublicKey, now)
	if err != nil {
		return nil, err
	}
	return NewIdentity(der, key, ca.Cert.Raw, cl)
}

// NewIdentity assembles an identity from a leaf certificate's DER (issued
// by the CA of caDER), its key and the cluster secrets, checking that the
// leaf verifies against the CA, names a strata identity and matches key.
func NewIdentity(leafDER []byte, key *ecdsa.PrivateKey, caDER []byte, cl Cluster) (*Identity, error) {
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("trust: CA certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(leafDER)
	if err != nil {
		return nil, fmt.Errorf("trust: node certificate: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("trust: node certificate: %w", err)
	}
	role, id, ok := IDOf(leaf)
	if !ok {
		return nil, errors.New("trust: node certificate names no strata identity")
	}
	if pub, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, errors.New("trust: node certificate does not match its key")
	}
	if len(cl.GossipKey) != GossipKeyBytes || cl.ID == "" {
		return nil, fmt.Errorf("trust: cluster secrets: want an ID and a %d-byte gossip key", GossipKeyBytes)
	}
	return &Identity{
		Role: role, ID: id, CA: ca, Cluster: cl,
		Cert: tls.Certificate{Certificate: [][]byte{leafDER, caDER}, PrivateKey: key, Leaf: leaf},
	}, nil
}

// NewCluster returns cluster secrets for clusterID with a fresh gossip key.
func NewCluster(clusterID string) (Cluster, error) {
	k := make([]byte, GossipKeyBytes)
	if _, err := rand.Read(k); err != nil {
		return Cluster{}, err
	}
	return Cluster{ID: clusterID, GossipKey: k}, nil
}

// writeFile writes b to dir/name with mode 0600 through a temporary file
// and a rename, so that a reader never sees half a file.
func writeFile(dir, name string, b []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("trust: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return fmt.Errorf("trust: %w", err)
	}
	defer os.Remove(f.Name()) // after the rename: a no-op
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("trust: %w", err)
	}
	matchOwner(f.Name(), dir)
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("trust: write %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("trust: write %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("trust: write %s: %w", name, err)
	}
	if err := os.Rename(f.Name(), filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("trust: %w", err)
	}
	return nil
}

func pemCerts(ders ...[]byte) []byte {
	var out []byte
	for _, d := range ders {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: d})...)
	}
	return out
}

func pemKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func readPEM(dir, name, typ string) ([][]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			break
		}
		if blk.Type != typ {
			return nil, fmt.Errorf("trust: %s: a %s block where %s was expected", name, blk.Type, typ)
		}
		out = append(out, blk.Bytes)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("trust: %s holds no %s", name, typ)
	}
	return out, nil
}

func readKey(dir, name string) (*ecdsa.PrivateKey, error) {
	blocks, err := readPEM(dir, name, "EC PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParseECPrivateKey(blocks[0])
	if err != nil {
		return nil, fmt.Errorf("trust: %s: %w", name, err)
	}
	return k, nil
}

// SaveIdentity writes id to dir: node.pem, node-key.pem, ca.pem and
// cluster.json, each 0600.
func SaveIdentity(dir string, id *Identity) error {
	key, ok := id.Cert.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return fmt.Errorf("trust: identity key is %T, not ECDSA", id.Cert.PrivateKey)
	}
	kb, err := pemKey(key)
	if err != nil {
		return err
	}
	cb, err := json.Marshal(id.Cluster)
	if err != nil {
		return err
	}
	// Key first and certificate last: LoadIdentity needs node.pem, so a
	// save cut short leaves no half identity behind.
	for _, f := range []struct {
		name string
		b    []byte
	}{{keyFile, kb}, {caFile, pemCerts(id.CA.Raw)}, {clusterFile, cb}, {certFile, pemCerts(id.Cert.Certificate...)}} {
		if err := writeFile(dir, f.name, f.b); err != nil {
			return err
		}
	}
	return nil
}

// LoadIdentity reads the identity SaveIdentity wrote in dir; ErrNoIdentity
// when there is none.
func LoadIdentity(dir string) (*Identity, error) {
	certs, err := readPEM(dir, certFile, "CERTIFICATE")
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s", ErrNoIdentity, dir)
	}
	if err != nil {
		return nil, err
	}
	key, err := readKey(dir, keyFile)
	if err != nil {
		return nil, err
	}
	ca, err := readPEM(dir, caFile, "CERTIFICATE")
	if err != nil {
		return nil, err
	}
	cl, err := readCluster(dir)
	if err != nil {
		return nil, err
	}
	return NewIdentity(certs[0], key, ca[0], cl)
}

func readCluster(dir string) (Cluster, error) {
	var cl Cluster
	b, err := os.ReadFile(filepath.Join(dir, clusterFile))
	if err != nil {
		return cl, err
	}
	if err := json.Unmarshal(b, &cl); err != nil {
		return cl, fmt.Errorf("trust: %s: %w", clusterFile, err)
	}
	return cl, nil
}

// Authority is the coordinator's trust material: the CA, its own identity,
// the cluster secrets, and the token file, all under one directory.
type Authority struct {
	Dir    string
	CA     *CA
	Self   *Identity
	Tokens *Tokens
}

// OpenAuthority loads the authority in dir, creating it on first start: a
// CA, cluster secrets (clusterID and a fresh gossip key; an existing
// cluster.json keeps its own, which the joined shards hold) and the
// coordinator's certificate. created reports a first start.
func OpenAuthority(dir, clusterID string, now time.Time) (a *Authority, created bool, err error) {
	a = &Authority{Dir: dir, Tokens: &Tokens{path: filepath.Join(dir, tokensFile)}}
	caCerts, err := readPEM(dir, caFile, "CERTIFICATE")
	switch {
	case errors.Is(err, os.ErrNotExist):
		if a.CA, err = NewCA(clusterID, now); err != nil {
			return nil, false, err
		}
		kb, err := pemKey(a.CA.Key)
		if err != nil {
			return nil, false, err
		}
		if err := writeFile(dir, caKeyFile, kb); err != nil {
			return nil, false, err
		}
		if err := writeFile(dir, caFile, pemCerts(a.CA.Cert.Raw)); err != nil {
			return nil, false, err
		}
		created = true
	case err != nil:
		return nil, false, err
	default:
		cert, err := x509.ParseCertificate(caCerts[0])
		if err != nil {
			return nil, false, fmt.Errorf("trust: %s: %w", caFile, err)
		}
		key, err := readKey(dir, caKeyFile)
		if err != nil {
			return nil, false, err
		}
		a.CA = &CA{Cert: cert, Key: key}
	}
	cl, err := readCluster(dir)
	if errors.Is(err, os.ErrNotExist) {
		if cl, err = NewCluster(clusterID); err != nil {
			return nil, false, err
		}
		b, _ := json.Marshal(cl)
		if err := writeFile(dir, clusterFile, b); err != nil {
			return nil, false, err
		}
	} else if err != nil {
		return nil, false, err
	}
	// The coordinator's own certificate is made afresh at every start:
	// nothing pins it but the CA.
	if a.Self, err = a.CA.NewIdentity(RoleCoordinator, cl.ID, cl, now); err != nil {
		return nil, false, err
	}
	return a, created, nil
}

// Fingerprint returns the CA's fingerprint.
func (a *Authority) Fingerprint() string { return a.CA.Fingerprint() }

// ShardIdentity makes an identity for the in-process shard id (no token).
func (a *Authority) ShardIdentity(id string) (*Identity, error) {
	return a.CA.NewIdentity(RoleShard, id, a.Self.Cluster, time.Now())
}

// IssueCSR checks a certificate request's signature and signs a shard
// certificate for id over its public key; the request's own subject is
// ignored.
func (a *Authority) IssueCSR(id string, csrDER []byte, now time.Time) ([]byte, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("trust: certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("trust: certificate request: %w", err)
	}
	return a.CA.Issue(RoleShard, id, csr.PublicKey, now)
}

// NewCSR returns a fresh key and a certificate request over it, for Join.
func NewCSR(id string) (*ecdsa.PrivateKey, []byte, error) {
	key, err := NewKey()
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "shard " + id},
	}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("trust: certificate request: %w", err)
	}
	return key, der, nil
}
