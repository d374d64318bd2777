package coordinator

import (
	"testing"
	"time"
)

func TestStoreEpochSeqAndPlacement(t *testing.T) {
	dir := t.TempDir()
	future := time.Now().Add(time.Hour)
	s, st, err := OpenStore(dir, future)
	if err != nil {
		t.Fatal(err)
	}
	if st.Epoch != uint64(future.UnixMilli()) || st.PrevEpoch != 0 || st.ClusterID == "" {
		t.Fatalf("first start = %+v", st)
	}
	if err := s.RaiseSeqHWM(100); err != nil {
		t.Fatal(err)
	}
	if err := s.RaiseSeqHWM(50); err != nil { // never lowered
		t.Fatal(err)
	}
	p := &Placement{Version: 3, Epoch: st.Epoch, Model: "x", Blocks: 9, BlockSize: 16, Stages: []Stage{{ShardID: "a", First: 0, End: 2, Embed: true, Head: true}}}
	if err := s.SavePlacement(&Placement{Version: 2}); err != nil {
		t.Fatal(err)
	}
	if err := s.SavePlacement(p); err != nil {
		t.Fatal(err)
	}
	if err := s.PutShard(ShardRecord{NodeID: "n", ShardID: "n-1", MemoryBytes: 5}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	// A clock that went backwards still gives a higher epoch.
	s, st2, err := OpenStore(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st2.Epoch != st.Epoch+1 || st2.PrevEpoch != st.Epoch || st2.ClusterID != st.ClusterID || st2.SeqHWM != 100 {
		t.Fatalf("second start = %+v, first %+v", st2, st)
	}
	got, err := s.LatestPlacement()
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 3 || got.Blocks != 9 || len(got.Stages) != 1 || got.Stages[0].ShardID != "a" {
		t.Fatalf("latest placement = %+v", got)
	}
	shards, err := s.Shards()
	if err != nil || len(shards) != 1 || shards[0].ShardID != "n-1" {
		t.Fatalf("shards = %+v, %v", shards, err)
	}
}
