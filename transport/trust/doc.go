// Package trust holds a strata cluster's trust material: its certificate
// authority, the certificates it issues, the gossip key, and join tokens.
// It uses only crypto/tls, crypto/x509 and crypto/ecdsa; it imports no
// package of the cluster (coordinator, shard and sched are above it).
//
// # Identities
//
// The cluster CA is a self-signed ECDSA P-256 certificate the coordinator
// creates under its --data-dir on first start. Every node's certificate is
// an ECDSA P-256 leaf signed by it, good for TLS server and client auth,
// whose identity is one URI SAN:
//
//	strata://shard/<node-id>          a shard (its persistent node ID)
//	strata://coordinator/<cluster-id> the coordinator
//
// and the DNS SAN ServerName ("strata"), which every dialer names instead of
// the peer's host, so that standard verification against the CA applies
// whatever address a node is dialled at. IDOf reads a certificate's
// identity; PeerID reads it from a gRPC call's verified TLS state.
//
// # Join tokens
//
// A join token is
//
//	strata-<fingerprint>.<secret>
//
// where fingerprint is the lower-case hex SHA-256 of the CA certificate's
// DER (64 characters) and secret is 32 random bytes, base64url without
// padding (43 characters). A joining shard pins the CA by the fingerprint
// (JoinClientTLS), proves the secret over that TLS channel and receives its
// certificate. The coordinator keeps only SHA-256 hashes of secrets, with
// their expiry, in a file (Tokens) that the running coordinator re-reads
// on every join, so that `coordinator token create` works beside it.
//
// # Files
//
// Everything lives in one directory (DIR/trust), files 0600, the
// directory 0700. The coordinator's: ca.pem, ca-key.pem, node.pem (its
// chain: leaf then CA), node-key.pem, cluster.json (cluster ID and gossip
// key), tokens.json (hashed secrets) and join-token (the default token in
// clear, reprinted at each start until it expires or is revoked). A shard's:
// ca.pem, node.pem, node-key.pem, cluster.json.
package trust
