package transport

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RecoverOptions returns server options whose interceptors recover a
// panic in any unary or stream handler: the panic is logged once, with its
// stack, on log, counted on refused (CodePanic), and the call ends with
// codes.Internal, so that nothing a peer sends brings the process down
// (a shard running inside the coordinator's process included). They are
// the last line behind the checks of wire.go and control.go, which should
// leave nothing to recover; state a handler holds across a panic must be
// released by its own defers.
func RecoverOptions(log *slog.Logger, refused *Refusals) []grpc.ServerOption {
	caught := func(method string, v any) error {
		refused.Add(CodePanic)
		log.Error("gRPC handler panicked; recovered", "method", method, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
			defer func() {
				if v := recover(); v != nil {
					resp, err = nil, caught(info.FullMethod, v)
				}
			}()
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
			defer func() {
				if v := recover(); v != nil {
					err = caught(info.FullMethod, v)
				}
			}()
			return h(srv, ss)
		}),
	}
}

// Recover runs f, recovering a panic in it the way RecoverOptions does:
// for goroutines that handle a peer's messages outside a gRPC handler (a
// client stream's receiver). It reports whether f panicked.
func Recover(log *slog.Logger, refused *Refusals, what string, f func()) (panicked bool) {
	defer func() {
		if v := recover(); v != nil {
			refused.Add(CodePanic)
			log.Error("panic handling a peer's message; recovered", "in", what, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			panicked = true
		}
	}()
	f()
	return false
}
