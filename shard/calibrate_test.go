package shard

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/strata-llm/strata/model/cpu"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

func TestCalibrateReportsEachKind(t *testing.T) {
	m := loadStories(t)
	pool := cpu.NewPool(2)
	defer pool.Close()
	sha := strings.Repeat("ab", 32)
	cal, err := Calibrate(context.Background(), m, sha, pool, CalibrationBudget)
	if err != nil {
		t.Fatal(err)
	}
	if cal.GetModelSha256() != sha || cal.GetLayers() != calibrationLayers || cal.GetPrefillTokens() != calibrationChunk {
		t.Fatalf("calibration %v: want model %s, %d layers, %d-token chunk", cal, sha, calibrationLayers, calibrationChunk)
	}
	if cal.GetDecode1Ns() == 0 || cal.GetDecode8Ns() == 0 || cal.GetPrefillNs() == 0 {
		t.Fatalf("calibration %v has a zero time", cal)
	}
	// What the shard reports passes the coordinator's check of Register.
	req := &pb.RegisterRequest{NodeId: "n1", GrpcAddr: "127.0.0.1:1", Devices: &pb.Devices{MemoryBytes: 1}, Calibration: cal}
	if err := transport.CheckRegister(req); err != nil {
		t.Fatalf("CheckRegister refuses the calibration: %v", err)
	}
}

func TestCalibrateStopsWithItsContext(t *testing.T) {
	m := loadStories(t)
	pool := cpu.NewPool(1)
	defer pool.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Calibrate(ctx, m, strings.Repeat("ab", 32), pool, CalibrationBudget); !errors.Is(err, context.Canceled) {
		t.Fatalf("Calibrate on a cancelled context: got %v, want context.Canceled", err)
	}
}

func TestSharedCalibrationMeasuresOncePerModel(t *testing.T) {
	var s SharedCalibration
	calls := 0
	measure := func(sha string) func() (*pb.Calibration, error) {
		return func() (*pb.Calibration, error) {
			calls++
			return &pb.Calibration{ModelSha256: sha}, nil
		}
	}
	for range 3 {
		if c, err := s.get("a", measure("a")); err != nil || c.GetModelSha256() != "a" {
			t.Fatalf("get a: %v, %v", c, err)
		}
	}
	if calls != 1 {
		t.Fatalf("3 shards of one model measured %d times, want 1", calls)
	}
	if c, _ := s.get("b", measure("b")); c.GetModelSha256() != "b" || calls != 2 {
		t.Fatalf("another model: got %v after %d measurements, want b after 2", c, calls)
	}
	if _, err := s.get("c", func() (*pb.Calibration, error) { return nil, errors.New("boom") }); err == nil {
		t.Fatal("a failed measurement returned no error")
	}
}

// TestCalibrationSeesACPUQuota: a shard under a CPU quota runs its first
// milliseconds of each period at full speed and then waits out the rest;
// the calibration must report the rate it computes at over the window (the
// pauses included), not the speed of its fastest burst.
func TestCalibrationSeesACPUQuota(t *testing.T) {
	var clock time.Time
	now := func() time.Time { return clock }
	calls := 0
	run := func() error { // 1 ms of work; every 25th call meets the quota: +25 ms held back
		calls++
		clock = clock.Add(time.Millisecond)
		if calls%25 == 0 {
			clock = clock.Add(25 * time.Millisecond)
		}
		return nil
	}
	d, err := meanOver(context.Background(), 300*time.Millisecond, now, run)
	if err != nil {
		t.Fatal(err)
	}
	if d < 1900*time.Microsecond || d > 2100*time.Microsecond {
		t.Fatalf("held back half the time, measured %v per run over %d runs, want about 2ms", d, calls)
	}
	// A window shorter than one run still runs once.
	calls = 0
	if d, err := meanOver(context.Background(), 0, now, run); err != nil || calls != 1 || d != time.Millisecond {
		t.Fatalf("zero window: %v after %d runs (%v), want one run of 1ms", d, calls, err)
	}
}
