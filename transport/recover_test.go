package transport

import (
	"context"
	"log/slog"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/strata-llm/strata/transport/pb"
)

// panicky is a stage endpoint whose handler panics on a batch with ID 13.
type panicky struct {
	pb.UnimplementedStageServer
}

func (panicky) Stream(s pb.Stage_StreamServer) error {
	for {
		b, err := RecvBatch(s, 0)
		if err != nil {
			return err
		}
		if b.Header.GetBatchId() == 13 {
			var rows []int
			_ = rows[b.Header.GetBatchId()] // an index out of range, as a bug would
		}
		if err := s.Send(&pb.StageReply{Msg: &pb.StageReply_Failed{Failed: &pb.BatchFailed{BatchId: b.Header.GetBatchId()}}}); err != nil {
			return err
		}
	}
}

// TestRecoverOptions: a handler that panics ends its call with
// codes.Internal, counted once as CodePanic, and the server keeps serving.
func TestRecoverOptions(t *testing.T) {
	var refused Refusals
	lis := bufconn.Listen(1 << 20)
	srv := NewServer(RecoverOptions(slog.New(slog.DiscardHandler), &refused)...)
	pb.RegisterStageServer(srv, panicky{})
	go srv.Serve(lis) // ended by Stop below
	defer srv.Stop()
	cc, err := grpc.NewClient("passthrough:///stage",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	call := func(id uint64) error {
		st, err := pb.NewStageClient(cc).Stream(context.Background())
		if err != nil {
			return err
		}
		if err := SendBatch(st, &pb.BatchHeader{BatchId: id}, nil); err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	if err := call(13); status.Code(err) != codes.Internal {
		t.Fatalf("a panicking handler: %v, want Internal", err)
	}
	if err := call(14); err != nil {
		t.Fatalf("after the panic: %v", err)
	}
	if n := refused.Get(CodePanic); n != 1 {
		t.Fatalf("%d panics counted, want 1", n)
	}
}
