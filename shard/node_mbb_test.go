package shard

import (
	"testing"
	"time"

	"github.com/strata-llm/strata/transport/pb"
	"google.golang.org/protobuf/proto"
)

// TestNodeMakeBeforeBreak: a shard serving placement 1 that is assigned
// placement 2 loads it in the background and reports READY while placement
// 1 keeps serving (its batches compute, its sequence keeps its KV); the
// first batch of placement 2 switches (placement 1's sequences end, reason
// epoch, and its batches are refused from then on).
func TestNodeMakeBeforeBreak(t *testing.T) {
	m := loadStories(t)
	c := startCluster(t, newFakeCoord(100), m.Layers)
	n := c.nodes[0]
	c.greedy(100, 1, 1, 2) // sequence 1 on placement 1: prompt and one token
	sequences := func() float64 { return metric(t, n, labelled(n, "strata_kv_sequences", "")) }
	if v := sequences(); v != 1 {
		t.Fatalf("sequences %v on placement 1, want 1", v)
	}

	c.coord.mu.Lock()
	a := proto.Clone(c.coord.assigns[n.NodeID()]).(*pb.Assign)
	c.coord.mu.Unlock()
	a.PlacementVersion, a.KvBlocks = 2, 16
	c.coord.outbox(n.NodeID()) <- &pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_Assign{Assign: a}}
	waitFor(t, 20*time.Second, "READY for placement 2", func() bool { return c.coord.ready(n.NodeID(), 2) })

	// Placement 1 still serves: sequence 1 goes on, its KV intact.
	pos := int32(len(prompt) + 1)
	c.send(&pb.BatchHeader{Epoch: 100, PlacementVersion: 1, BatchId: 3, Rows: []*pb.Row{
		{Seq: 1, Pos: pos, Tokens: []int32{5}, Blocks: []int32{0, 1, 2}, Sample: true}}})
	if r := c.result(3); len(r.GetSamples()) != 1 || len(r.GetDropped()) != 0 {
		t.Fatalf("placement 1 after placement 2 loaded: samples %v dropped %v", r.GetSamples(), r.GetDropped())
	}
	if v := sequences(); v != 1 {
		t.Fatalf("sequences %v while placement 2 is staged, want 1", v)
	}

	// The first batch of placement 2 switches; its pool is placement 2's.
	c.send(&pb.BatchHeader{Epoch: 100, PlacementVersion: 2, BatchId: 4, Rows: []*pb.Row{
		{Seq: 2, First: true, Tokens: prompt, Blocks: []int32{15}, Sample: true}}})
	if r := c.result(4); len(r.GetSamples()) != 1 {
		t.Fatalf("first batch of placement 2: %v", r)
	}
	if v := metric(t, n, labelled(n, "strata_sequences_freed_total", `reason="epoch"`)); v != 1 {
		t.Errorf("sequences freed by the switch (reason epoch) %v, want 1", v)
	}
	if v := sequences(); v != 1 {
		t.Errorf("sequences %v after the switch, want 1 (placement 2's)", v)
	}
	if v := metric(t, n, labelled(n, "strata_kv_blocks_total", "")); v != 16 {
		t.Errorf("KV pool %v blocks after the switch, want placement 2's 16", v)
	}
	c.send(&pb.BatchHeader{Epoch: 100, PlacementVersion: 1, BatchId: 5, Rows: []*pb.Row{
		{Seq: 1, Pos: pos + 1, Tokens: []int32{5}, Blocks: []int32{0, 1, 2}, Sample: true}}})
	if f := c.failure(); f.GetBatchId() != 5 || f.GetReason() != "stale_placement" {
		t.Fatalf("placement 1 after the switch: %v", f)
	}

	// An Assign of placement 3 superseded by a resend of placement 2 (the
	// coordinator abandoned 3): the staged range is dropped, 2 serves on.
	b := proto.Clone(a).(*pb.Assign)
	b.PlacementVersion = 3
	c.coord.outbox(n.NodeID()) <- &pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_Assign{Assign: b}}
	waitFor(t, 20*time.Second, "READY for placement 3", func() bool { return c.coord.ready(n.NodeID(), 3) })
	c.coord.outbox(n.NodeID()) <- &pb.CoordinatorToShard{Msg: &pb.CoordinatorToShard_Assign{Assign: a}}
	waitFor(t, 20*time.Second, "READY for placement 2 again", func() bool { return c.coord.ready(n.NodeID(), 2) })
	c.send(&pb.BatchHeader{Epoch: 100, PlacementVersion: 3, BatchId: 6})
	if f := c.failure(); f.GetBatchId() != 6 || f.GetReason() != "stale_placement" {
		t.Fatalf("placement 3 after it was superseded: %v", f)
	}
	c.send(&pb.BatchHeader{Epoch: 100, PlacementVersion: 2, BatchId: 7, Rows: []*pb.Row{
		{Seq: 2, Pos: int32(len(prompt)), Tokens: []int32{5}, Blocks: []int32{15}, Sample: true}}})
	if r := c.result(7); len(r.GetSamples()) != 1 || len(r.GetDropped()) != 0 {
		t.Fatalf("placement 2 after placement 3 was dropped: %v", r)
	}
}
