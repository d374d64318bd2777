package transport

import (
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// ProtocolVersion is the wire protocol this build speaks. It travels in
// membership metadata and RegisterRequest; a coordinator refuses a shard
// that speaks another.
const ProtocolVersion uint32 = 1

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
// plaintext (inter-node traffic is for a trusted network until mTLS lands),
// keepalive pings even without active streams, MaxMessageBytes both ways,
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
