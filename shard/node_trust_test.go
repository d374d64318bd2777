package shard

import (
	"context"
	"log/slog"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

// oneMessageStream is a stage stream's server side that receives msg.
type oneMessageStream struct {
	grpc.ServerStream
	msg *pb.StageMessage
}

func (s *oneMessageStream) Context() context.Context { return context.Background() }

func (s *oneMessageStream) RecvMsg(m any) error {
	m.(*pb.StageMessage).Msg = s.msg.Msg
	return nil
}

// TestUpstreamCheck: a batch of the current placement is taken only from
// the hop the Assign names upstream — the coordinator into stage 0, into a
// later stage only the shard upstream_node_id names — and every other
// sender is refused PermissionDenied and counted as wrong_identity; a batch
// of another placement is left to the batch path.
func TestUpstreamCheck(t *testing.T) {
	for _, tc := range []struct {
		name        string
		stage       uint32
		coordinator bool
		peer        string
		version     uint64
		refused     bool
	}{
		{"coordinator into stage 0", 0, true, "", 3, false},
		{"a shard into stage 0", 0, false, "up", 3, true},
		{"the named upstream into stage 1", 1, false, "up", 3, false},
		{"another shard into stage 1", 1, false, "other", 3, true},
		{"the coordinator into stage 1", 1, true, "", 3, true},
		{"another shard, another placement", 1, false, "other", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &Node{log: slog.New(slog.DiscardHandler)}
			n.p = &placement{version: 3, assign: &pb.Assign{Stage: tc.stage, UpstreamNodeId: map[bool]string{true: "up"}[tc.stage > 0]}}
			msg := &pb.StageMessage{Msg: &pb.StageMessage_Header{Header: &pb.BatchHeader{PlacementVersion: tc.version}}}
			s := &upstreamStream{ServerStream: &oneMessageStream{msg: msg}, n: n, coordinator: tc.coordinator, id: tc.peer}
			err := s.RecvMsg(new(pb.StageMessage))
			if got := status.Code(err) == codes.PermissionDenied; got != tc.refused || !tc.refused && err != nil {
				t.Fatalf("RecvMsg: %v, want refused %v", err, tc.refused)
			}
			if want := map[bool]uint64{true: 1}[tc.refused]; n.refused.Get(transport.CodeWrongIdentity) != want {
				t.Fatalf("wrong_identity counted %d, want %d", n.refused.Get(transport.CodeWrongIdentity), want)
			}
		})
	}
}
