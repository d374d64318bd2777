package coordinator

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
	"github.com/strata-llm/strata/transport/trust"
)

func secureClient(t *testing.T, c *testCluster, opt grpc.DialOption) pb.CoordinatorClient {
	t.Helper()
	cc, err := transport.Dial(c.GRPCAddr(), opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewCoordinatorClient(cc)
}

// TestSecureJoinAndBinding: a secure cluster admits a Join only with a live
// token's secret and answers it with a certificate for the caller's node
// ID; without a certificate every other call is Unauthenticated; with one,
// Register, Control and Results claiming another node ID (or another
// node's shard ID) are PermissionDenied, counted as wrong_identity, while
// the certificate's own node registers. No shard process, no gossip.
func TestSecureJoinAndBinding(t *testing.T) {
	c := startCluster(t, t.TempDir(), 1, func(cfg *ClusterConfig) { cfg.Secure = true })
	a := c.Authority()
	if a == nil {
		t.Fatal("a secure cluster has no authority")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tok, created, err := a.DefaultToken(time.Hour, time.Now())
	if err != nil || !created {
		t.Fatalf("DefaultToken: %v, %v", created, err)
	}

	anon := secureClient(t, c, transport.JoinDialCreds(a.Fingerprint()))
	key, csr, err := trust.NewCSR("node-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anon.Join(ctx, &pb.JoinRequest{Secret: "not-the-secret", NodeId: "node-a", Csr: csr}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Join with a wrong secret: %v, want Unauthenticated", err)
	}
	if got := c.refused.Get(transport.CodeUnauthenticated); got != 1 {
		t.Errorf("unauthenticated refusals = %d after a bad Join, want 1", got)
	}
	rep, err := anon.Join(ctx, &pb.JoinRequest{Secret: tok.Secret, NodeId: "node-a", Csr: csr})
	if err != nil {
		t.Fatalf("Join with the token: %v", err)
	}
	id, err := trust.NewIdentity(rep.GetCertificate(), key, rep.GetCa(), trust.Cluster{ID: rep.GetClusterId(), GossipKey: rep.GetGossipKey()})
	if err != nil || id.ID != "node-a" || id.Role != trust.RoleShard || id.Fingerprint() != a.Fingerprint() {
		t.Fatalf("the Join reply's identity: %+v, %v", id, err)
	}

	reg := func(node string) *pb.RegisterRequest {
		return &pb.RegisterRequest{NodeId: node, Incarnation: 7, GrpcAddr: "127.0.0.1:1", ProtocolVersion: transport.ProtocolVersion,
			Devices: &pb.Devices{CpuCores: 1, MemoryBytes: 1 << 30, Device: "cpu"}}
	}
	if _, err := anon.Register(ctx, reg("node-a")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Register without a certificate: %v, want Unauthenticated", err)
	}
	ws, err := anon.Weights(ctx, &pb.WeightsRequest{})
	if err == nil {
		_, err = ws.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Weights without a certificate: %v, want Unauthenticated", err)
	}

	asA := secureClient(t, c, transport.DialCreds(id, trust.RoleCoordinator))
	if _, err := asA.Register(ctx, reg("node-b")); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Register as node-b with node-a's certificate: %v, want PermissionDenied", err)
	}
	r, err := asA.Register(ctx, reg("node-a"))
	if err != nil {
		t.Fatalf("Register as itself: %v", err)
	}
	forged := []*pb.StreamHello{
		{ShardId: "node-b-0000000000000007", NodeId: "node-b", Incarnation: 7, Epoch: r.GetEpoch()},
		{ShardId: "node-b-0000000000000007", NodeId: "node-a", Incarnation: 7, Epoch: r.GetEpoch()},
	}
	for _, h := range forged {
		cs, err := asA.Control(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := cs.Send(&pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Hello{Hello: h}}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.Recv(); status.Code(err) != codes.PermissionDenied {
			t.Errorf("Control hello %v: %v, want PermissionDenied", h, err)
		}
		rs, err := asA.Results(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = rs.Send(&pb.ResultMessage{Msg: &pb.ResultMessage_Hello{Hello: h}})
		if _, err := rs.CloseAndRecv(); status.Code(err) != codes.PermissionDenied {
			t.Errorf("Results hello %v: %v, want PermissionDenied", h, err)
		}
	}
	if got := c.refused.Get(transport.CodeWrongIdentity); got != 5 {
		t.Errorf("wrong_identity refusals = %d, want 5", got)
	}
	// Its own control stream opens.
	cs, err := asA.Control(ctx)
	if err != nil {
		t.Fatal(err)
	}
	own := &pb.StreamHello{ShardId: r.GetShardId(), NodeId: "node-a", Incarnation: 7, Epoch: r.GetEpoch()}
	if err := cs.Send(&pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Hello{Hello: own}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "node-a's control stream open", func() bool { return connected(c.View(), "node-a") })
	cs.CloseSend()
}

// TestInsecureClusterRefusesJoin: a plaintext cluster answers Join with
// FailedPrecondition (the shard then says the coordinator runs --insecure).
func TestInsecureClusterRefusesJoin(t *testing.T) {
	c := startCluster(t, t.TempDir(), 1, nil)
	if c.Authority() != nil {
		t.Fatal("a plaintext cluster has an authority")
	}
	cl := attacker(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cl.Join(ctx, &pb.JoinRequest{Secret: "x", NodeId: "node-a"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Join on a plaintext cluster: %v, want FailedPrecondition", err)
	}
}
