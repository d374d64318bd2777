package transport

import (
	"context"
	"fmt"
	"net"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/strata-llm/strata/transport/trust"
)

// ProtocolVersion is the wire protocol this build speaks. It travels in
// membership metadata and RegisterRequest; a coordinator refuses a shard
// that speaks another.
//
// 2: rows carry the sliding groups' block tables (Row.slide_from, slides),
// and the coordinator releases sliding blocks a shard of version 1 would
// still read through its one table: the two must not share a cluster.
const ProtocolVersion uint32 = 2

// MaxMessageBytes is the largest gRPC message either side sends or accepts,
// set explicitly on both so neither falls back to gRPC's 4 MB default: 16
// MiB leaves room for a MaxChunkBytes chunk and for a batch header of many
// prefill rows, while bounding what one bad peer makes us buffer.
const MaxMessageBytes = 16 << 20

// Keepalive timing. A broken TCP connection already fails streams at once;
// keepalive catches the silent cases (a peer's host powered off, a
// partition) so that a stage or control stream fails within about
// Time + Timeout instead of the kernel's minutes.
const (
	// clientKeepaliveTime is gRPC's minimum for clients (it raises anything
	// lower to 10 s).
	clientKeepaliveTime = 10 * time.Second
	// serverKeepaliveTime lets the server, which has no such floor, notice
	// a dead client in about 5 s + 5 s.
	serverKeepaliveTime = 5 * time.Second
	keepaliveTimeout    = 5 * time.Second
	// minPingInterval is the most often the server lets a client ping; it
	// must stay below clientKeepaliveTime or the server answers pings with
	// GOAWAY (too_many_pings).
	minPingInterval = 5 * time.Second
	// maxReconnectDelay caps gRPC's reconnect backoff (default 120 s): on a
	// LAN a restarted peer should be found again within seconds.
	maxReconnectDelay = 3 * time.Second
)

// DialOptions returns the client options every strata connection uses:
// plaintext unless an option of DialCreds or JoinDialCreds follows (the
// later credentials option wins), keepalive pings even without active streams, MaxMessageBytes both ways,
// and a short reconnect backoff.
func DialOptions() []grpc.DialOption {
	bo := backoff.DefaultConfig
	bo.MaxDelay = maxReconnectDelay
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                clientKeepaliveTime,
			Timeout:             keepaliveTimeout,
			PermitWithoutStream: true,
		}),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(MaxMessageBytes),
			grpc.MaxCallSendMsgSize(MaxMessageBytes),
		),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           bo,
			MinConnectTimeout: 5 * time.Second,
		}),
	}
}

// ServerOptions returns the server options every strata gRPC server uses:
// MaxMessageBytes both ways, keepalive pings to clients, and a ping policy
// that accepts DialOptions' pings.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		grpc.MaxSendMsgSize(MaxMessageBytes),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:    serverKeepaliveTime,
			Timeout: keepaliveTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             minPingInterval,
			PermitWithoutStream: true,
		}),
	}
}

// Dial returns a client connection to target (host:port) with
// DialOptions, then extra. It does not wait for the connection: the first
// RPC does, and a stream fails fast if the peer is down.
func Dial(target string, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	cc, err := grpc.NewClient(target, append(DialOptions(), extra...)...)
	if err != nil {
		return nil, fmt.Errorf("transport: dial %s: %w", target, err)
	}
	return cc, nil
}

// NewServer returns a gRPC server with ServerOptions, then extra. The
// caller registers services (pb.RegisterCoordinatorServer,
// pb.RegisterStageServer), calls Serve on a listener from Listen, and ends
// it with GracefulStop or Stop.
func NewServer(extra ...grpc.ServerOption) *grpc.Server {
	return grpc.NewServer(append(ServerOptions(), extra...)...)
}

// Listen listens on the TCP address addr; "127.0.0.1:0" picks a free
// loopback port (in-process shards), whose address is Addr() of the result.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("transport: listen %s: %w", addr, err)
	}
	return ln, nil
}

// ServerCreds returns the option that makes a server speak TLS as id,
// verifying client certificates against the cluster CA: required when
// requireClient (a shard's stage endpoint), else only checked when given
// (the coordinator, whose Join comes before the caller has one; add
// RequirePeerOptions).
func ServerCreds(id *trust.Identity, requireClient bool) grpc.ServerOption {
	return grpc.Creds(credentials.NewTLS(id.ServerTLS(requireClient)))
}

// DialCreds returns the option that makes a connection mutual TLS as id,
// the server verified against the cluster CA and, when role is not empty,
// required to hold a certificate of that role.
func DialCreds(id *trust.Identity, role string) grpc.DialOption {
	return grpc.WithTransportCredentials(credentials.NewTLS(id.ClientTLS(role)))
}

// JoinDialCreds returns the option a joining shard dials the coordinator
// with: TLS, the coordinator's CA pinned by the token's fingerprint, no
// client certificate.
func JoinDialCreds(fingerprint string) grpc.DialOption {
	return grpc.WithTransportCredentials(credentials.NewTLS(trust.JoinClientTLS(fingerprint)))
}

// PeerIdentity returns the role and node ID of the verified client
// certificate of the call ctx belongs to; trust.ErrNotPeer when the call
// came without one (plaintext, or a TLS client that sent none).
func PeerIdentity(ctx context.Context) (role, id string, err error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", "", trust.ErrNotPeer
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return "", "", trust.ErrNotPeer
	}
	role, id, ok = trust.IDOf(ti.State.VerifiedChains[0][0])
	if !ok {
		return "", "", trust.ErrNotPeer
	}
	return role, id, nil
}

// RequirePeerOptions returns interceptors that refuse, with
// codes.Unauthenticated and a count on refused (CodeUnauthenticated), every
// call without a verified cluster certificate, except the full method
// names in open (the coordinator's Join).
func RequirePeerOptions(refused *Refusals, open ...string) []grpc.ServerOption {
	check := func(ctx context.Context, method string) error {
		if slices.Contains(open, method) {
			return nil
		}
		if _, _, err := PeerIdentity(ctx); err != nil {
			refused.Add(CodeUnauthenticated)
			return status.Error(codes.Unauthenticated, "a cluster certificate is required: join with a token first (shard join --token)")
		}
		return nil
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := check(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := check(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	}
}
