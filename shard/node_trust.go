package shard

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/membership"
	"github.com/strata-llm/strata/transport/pb"
	"github.com/strata-llm/strata/transport/trust"
)

// TrustDir is where a shard keeps its certificate, key, the CA and the
// gossip secrets, inside Config.DataDir.
const TrustDir = "trust"

// DefaultCoordinatorGRPCPort is the port Join dials on the --coordinator
// host when Config.JoinAddr is empty: `coordinator serve`'s --grpc default.
const DefaultCoordinatorGRPCPort = "7070"

// joinTimeout bounds the Join call: a coordinator that does not answer a
// TLS handshake and one call in this time is reported, not waited for.
const joinTimeout = 15 * time.Second

// Issuer gives an in-process shard its identity directly, without a token:
// the coordinator's authority (trust.Authority).
type Issuer interface {
	ShardIdentity(nodeID string) (*trust.Identity, error)
}

// ErrInsecureCoordinator: the coordinator answered Join as a plaintext
// cluster, or did not speak TLS at all.
var ErrInsecureCoordinator = errors.New("the coordinator runs --insecure (plaintext): start the shard with --insecure too, or the coordinator without it")

// loadIdentity sets the node's identity at New: none with Insecure, the
// Issuer's, or the one saved under DataDir/trust. Without any, a token
// must be given: Run joins with it (join).
func (n *Node) loadIdentity() error {
	switch {
	case n.cfg.Insecure:
		return nil
	case n.cfg.Issuer != nil:
		id, err := n.cfg.Issuer.ShardIdentity(n.nodeID)
		if err != nil {
			return fmt.Errorf("identity: %w", err)
		}
		n.setIdentity(id)
		return nil
	}
	dir := filepath.Join(n.cfg.DataDir, TrustDir)
	id, err := trust.LoadIdentity(dir)
	switch {
	case errors.Is(err, trust.ErrNoIdentity) && n.cfg.Token == "":
		return fmt.Errorf("this shard has not joined a cluster (no certificate in %s): give --token (printed by `coordinator serve`, or made by `coordinator token create`), or run with --insecure on a trusted network", dir)
	case errors.Is(err, trust.ErrNoIdentity):
		return nil // Run joins
	case err != nil:
		return fmt.Errorf("identity in %s: %w", dir, err)
	case id.Role != trust.RoleShard || id.ID != n.nodeID:
		return fmt.Errorf("identity in %s is %s %s, not this node's (%s): remove the directory and join again", dir, id.Role, id.ID, n.nodeID)
	}
	n.setIdentity(id)
	return nil
}

func (n *Node) setIdentity(id *trust.Identity) {
	n.id = id
	n.shardDial = []grpc.DialOption{transport.DialCreds(id, trust.RoleShard)}
	n.coordDial = []grpc.DialOption{transport.DialCreds(id, trust.RoleCoordinator)}
}

// joinAddr is the coordinator's gRPC address Join dials.
func (n *Node) joinAddr() string {
	if n.cfg.JoinAddr != "" {
		return n.cfg.JoinAddr
	}
	host, _, _ := net.SplitHostPort(n.cfg.Coordinator) // checked by Validate
	return net.JoinHostPort(host, DefaultCoordinatorGRPCPort)
}

// join sends the token's secret and a certificate request to the
// coordinator over TLS pinned to the token's CA, and saves the identity it
// gets under DataDir/trust, to be reused at every later start.
func (n *Node) join(ctx context.Context) error {
	tok, err := trust.ParseToken(n.cfg.Token)
	if err != nil {
		return err
	}
	key, csr, err := trust.NewCSR(n.nodeID)
	if err != nil {
		return err
	}
	addr := n.joinAddr()
	cc, err := transport.Dial(addr, transport.JoinDialCreds(tok.Fingerprint))
	if err != nil {
		return err
	}
	defer cc.Close()
	jctx, cancel := context.WithTimeout(ctx, joinTimeout)
	defer cancel()
	var rep *pb.JoinReply
	var last error // the last Unavailable, for a timeout's message
	// Unavailable is retried within the timeout: a coordinator starting
	// beside this shard may not listen yet.
	for {
		rep, err = pb.NewCoordinatorClient(cc).Join(jctx, &pb.JoinRequest{Secret: tok.Secret, NodeId: n.nodeID, Csr: csr})
		if status.Code(err) != codes.Unavailable || jctx.Err() != nil || handshakeFailed(err) {
			break
		}
		last = err
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-jctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	switch {
	case err == nil:
	case status.Code(err) == codes.FailedPrecondition || notTLS(err):
		return fmt.Errorf("join %s: %w", addr, ErrInsecureCoordinator)
	case status.Code(err) == codes.DeadlineExceeded && last != nil:
		return fmt.Errorf("join %s: no answer within %v: %s", addr, joinTimeout, status.Convert(last).Message())
	default:
		return fmt.Errorf("join %s: %s", addr, status.Convert(err).Message())
	}
	id, err := trust.NewIdentity(rep.GetCertificate(), key, rep.GetCa(), trust.Cluster{ID: rep.GetClusterId(), GossipKey: rep.GetGossipKey()})
	if err != nil {
		return fmt.Errorf("join %s: the coordinator's answer: %w", addr, err)
	}
	if id.Fingerprint() != tok.Fingerprint || id.ID != n.nodeID || id.Role != trust.RoleShard {
		return fmt.Errorf("join %s: the certificate received is not for this node under the token's CA", addr)
	}
	dir := filepath.Join(n.cfg.DataDir, TrustDir)
	if err := trust.SaveIdentity(dir, id); err != nil {
		return err
	}
	n.setIdentity(id)
	n.log.Info("joined the cluster: certificate saved", "dir", dir, "ca_fingerprint", id.Fingerprint())
	return nil
}

// handshakeFailed reports a TLS handshake that failed (a coordinator
// whose CA is not the token's): retrying cannot help.
func handshakeFailed(err error) bool {
	return strings.Contains(status.Convert(err).Message(), "handshake failed")
}

// notTLS reports a handshake with a server that does not speak TLS (a
// plaintext gRPC server answers the ClientHello with an HTTP/2 frame).
func notTLS(err error) bool {
	m := status.Convert(err).Message()
	return strings.Contains(m, "first record does not look like a TLS handshake") || strings.Contains(m, "tls: record overflow")
}

// serverOptions are the stage endpoint's TLS options: mutual TLS with the
// cluster CA (every caller is a member), plaintext with Insecure.
func (n *Node) serverOptions() []grpc.ServerOption {
	if n.id == nil {
		return nil
	}
	return []grpc.ServerOption{transport.ServerCreds(n.id, true), grpc.ChainStreamInterceptor(n.upstreamCheck)}
}

// gossipTrust encrypts the gossip member's messages with the cluster key
// and labels them with the cluster ID.
func (n *Node) gossipTrust(mc *membership.Config) {
	if n.id == nil {
		return
	}
	mc.SecretKey, mc.Label = n.id.Cluster.GossipKey, n.id.Cluster.ID
}

// newStageServer makes the stage endpoint's gRPC server, once the node's
// identity is known (at New, or in Run after join).
func (n *Node) newStageServer() {
	n.grpcSrv = transport.NewServer(append(transport.RecoverOptions(n.log, &n.refused), n.serverOptions()...)...)
	pb.RegisterStageServer(n.grpcSrv, stageServer{n: n})
}

// probeCoordinator fails fast when a shard with a certificate meets a
// coordinator whose gRPC port does not speak TLS (it runs --insecure):
// gossip would only fail, again and again, with nothing to say why. Any
// other outcome (no answer yet, a handshake) is left to the control loop.
func (n *Node) probeCoordinator(ctx context.Context) error {
	if n.id == nil || n.cfg.Issuer != nil {
		return nil
	}
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 3 * time.Second}, Config: n.id.ClientTLS(trust.RoleCoordinator)}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := d.DialContext(pctx, "tcp", n.joinAddr())
	if err == nil {
		c.Close()
		return nil
	}
	if _, ok := errors.AsType[tls.RecordHeaderError](err); ok {
		return fmt.Errorf("coordinator %s: %w", n.joinAddr(), ErrInsecureCoordinator)
	}
	return nil
}

// gossipHint says what a refused gossip join most likely means: the two
// sides disagree on security (one --insecure), or belong to two clusters.
func (n *Node) gossipHint() string {
	if n.id == nil {
		return "a secure cluster refuses gossip without its key: join with --token, or run the coordinator --insecure too"
	}
	return "is the coordinator running, of this cluster (its CA), and not --insecure?"
}

// stageMethod is service Stage's one method.
const stageMethod = "/strata.v1.Stage/Stream"

// upstreamCheck is the stage endpoint's stream interceptor in a secure
// cluster: it binds each batch to the hop the placement names upstream of
// this stage. A batch of the current placement is taken from the
// coordinator only when this shard is its stage 0, and from a shard only
// when it is not and only from the shard the placement names upstream
// (Assign.upstream_node_id); otherwise the stream ends with PermissionDenied, counted
// as wrong_identity. The check is per batch, against the placement the
// batch names, so that a stream opened while placements change is judged
// by what it carries (batches of another placement are refused as stale
// by the batch path).
func (n *Node) upstreamCheck(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if info.FullMethod != stageMethod {
		return h(srv, ss)
	}
	role, id, err := transport.PeerIdentity(ss.Context())
	if err != nil {
		n.refused.Add(transport.CodeUnauthenticated)
		return status.Error(codes.Unauthenticated, "shard: a cluster certificate is required")
	}
	return h(srv, &upstreamStream{ServerStream: ss, n: n, coordinator: role == trust.RoleCoordinator, id: id})
}

// upstreamStream checks each batch header it receives (upstreamCheck).
type upstreamStream struct {
	grpc.ServerStream
	n           *Node
	coordinator bool   // the peer's certificate is the coordinator's
	id          string // the node ID the peer's certificate names
}

func (s *upstreamStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	msg, ok := m.(*pb.StageMessage)
	if !ok || msg.GetHeader() == nil {
		return nil
	}
	n := s.n
	n.mu.Lock()
	p := n.p
	wrong := p != nil && p.version == msg.GetHeader().GetPlacementVersion() &&
		(s.coordinator != (p.assign.GetStage() == 0) ||
			!s.coordinator && p.assign.GetUpstreamNodeId() != "" && s.id != p.assign.GetUpstreamNodeId())
	n.mu.Unlock()
	if wrong {
		n.refused.Add(transport.CodeWrongIdentity)
		n.log.Warn("refused a stage stream from a peer the placement does not name upstream", "peer_is_coordinator", s.coordinator, "peer", s.id)
		return status.Error(codes.PermissionDenied, "shard: the placement names another upstream for this stage")
	}
	return nil
}
