package coordinator

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/membership"
	"github.com/strata-llm/strata/transport/pb"
	"github.com/strata-llm/strata/transport/trust"
)

// TrustDir is where a secure cluster keeps its trust material, inside
// ClusterConfig.DataDir (see transport/trust for the files).
const TrustDir = "trust"

// Limits of a Join request, checked before anything else reads it.
const (
	maxJoinSecret = 256
	maxJoinCSR    = 4096
)

// joinMethod is the one method served without a cluster certificate.
const joinMethod = "/strata.v1.Coordinator/Join"

// openTrust opens (creating on first start) the cluster's authority under
// DataDir/trust when cfg.Secure, and makes the stage-0 link mutual TLS.
// Call it before the gRPC server and the gossip member are made.
func (c *Cluster) openTrust(now time.Time) error {
	if !c.cfg.Secure {
		return nil
	}
	a, created, err := trust.OpenAuthority(filepath.Join(c.cfg.DataDir, TrustDir), c.start.ClusterID, now)
	if err != nil {
		return fmt.Errorf("coordinator: trust: %w", err)
	}
	c.auth = a
	c.cfg.StageDialOptions = append([]grpc.DialOption{transport.DialCreds(a.Self, trust.RoleShard)}, c.cfg.StageDialOptions...)
	c.log.Info("cluster trust", "ca_fingerprint", a.Fingerprint(), "created", created, "dir", a.Dir)
	return nil
}

// trustServerOptions returns service Coordinator's TLS options: client
// certificates verified when given and required for everything but Join.
func (c *Cluster) trustServerOptions() []grpc.ServerOption {
	if c.auth == nil {
		return nil
	}
	return append([]grpc.ServerOption{transport.ServerCreds(c.auth.Self, false)}, transport.RequirePeerOptions(&c.refused, joinMethod)...)
}

// gossipTrust encrypts the gossip member's messages with the cluster's
// key and labels them with its ID.
func (c *Cluster) gossipTrust(mc *membership.Config) {
	if c.auth == nil {
		return
	}
	mc.SecretKey, mc.Label = c.auth.Self.Cluster.GossipKey, c.auth.Self.Cluster.ID
}

// Authority returns the cluster's trust material, nil when it runs
// plaintext (ClusterConfig.Secure off).
func (c *Cluster) Authority() *trust.Authority { return c.auth }

// checkPeer binds a shard's message to its certificate: in a secure
// cluster the call's verified certificate must be a shard's for nodeID, and
// shardID (when not empty) the one Register gave that node's incarnation.
// A mismatch is counted (CodeWrongIdentity) and refused with
// PermissionDenied. Plaintext clusters check nothing.
func (c *Cluster) checkPeer(ctx context.Context, nodeID, shardID string, incarnation uint64) error {
	if c.auth == nil {
		return nil
	}
	role, id, err := transport.PeerIdentity(ctx)
	if err != nil {
		c.refused.Add(transport.CodeUnauthenticated)
		return status.Error(codes.Unauthenticated, "coordinator: a cluster certificate is required")
	}
	if role != trust.RoleShard || id != nodeID || (shardID != "" && shardID != fmt.Sprintf("%s-%016x", id, incarnation)) {
		c.refused.Add(transport.CodeWrongIdentity)
		c.log.Warn("refused a shard claiming another identity", "cert_role", role, "cert_node", id, "claimed_node", transport.Truncate(nodeID, 64),
			"claimed_shard", transport.Truncate(shardID, 96))
		return status.Error(codes.PermissionDenied, "coordinator: the node ID claimed is not the one in the caller's certificate")
	}
	return nil
}

// Join implements pb.CoordinatorServer: the secret of a live join token
// buys a certificate for the caller's node ID, signed by the cluster CA,
// with the CA and the gossip secrets. The token file is read at each call,
// so tokens created or revoked by `coordinator token` apply at once.
func (s *coordinatorService) Join(ctx context.Context, req *pb.JoinRequest) (*pb.JoinReply, error) {
	c := s.c
	if c.auth == nil {
		return nil, status.Error(codes.FailedPrecondition, "coordinator: this cluster runs --insecure: start the shard with --insecure")
	}
	switch {
	case len(req.GetSecret()) > maxJoinSecret, len(req.GetCsr()) > maxJoinCSR:
		c.refused.Add(transport.CodeTooLarge)
		return nil, status.Errorf(codes.InvalidArgument, "coordinator: join: secret (<= %d bytes) or csr (<= %d bytes) too long", maxJoinSecret, maxJoinCSR)
	case trust.CheckID(req.GetNodeId()) != nil:
		c.refused.Add(transport.CodeBadString)
		return nil, status.Errorf(codes.InvalidArgument, "coordinator: join: %v", trust.CheckID(req.GetNodeId()))
	}
	now := time.Now()
	from := ""
	if p, ok := peer.FromContext(ctx); ok {
		from = p.Addr.String()
	}
	if err := c.auth.Tokens.Check(req.GetSecret(), now); err != nil {
		c.refused.Add(transport.CodeUnauthenticated)
		c.log.Warn("join refused", "node", req.GetNodeId(), "from", from, "err", err)
		return nil, status.Error(codes.Unauthenticated, "coordinator: join token refused (unknown, expired or revoked)")
	}
	der, err := c.auth.IssueCSR(req.GetNodeId(), req.GetCsr(), now)
	if err != nil {
		c.refused.Add(transport.CodeBadField)
		return nil, status.Errorf(codes.InvalidArgument, "coordinator: join: %v", err)
	}
	cl := c.auth.Self.Cluster
	c.log.Info("shard joined: certificate issued", "node", req.GetNodeId(), "from", from)
	return &pb.JoinReply{Certificate: der, Ca: c.auth.CA.Cert.Raw, GossipKey: cl.GossipKey, ClusterId: cl.ID}, nil
}
