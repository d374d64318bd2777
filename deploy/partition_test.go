package deploy

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestPartition runs test-partition.sh: the compose cluster of
// compose.yaml and partition.yaml (a coordinator and three shards) under a
// bounded streaming load, with a shard cut off the network for 5 s and for
// 30 s and a shard's container paused for 10 s; see TestPartitionFaults.
// It needs Docker and takes minutes, so it runs only with
// STRATA_DOCKER_TESTS=1.
func TestPartition(t *testing.T) {
	runDockerScript(t, "test-partition.sh", 25*time.Minute)
}

// Bounds of the fault tests. Each is a deadline, not a wait: the tests poll
// until the condition holds and fail when the bound passes.
const (
	// requestBound is the longest any request of the load may take. A
	// loss is confirmed within the coordinator's LossConfirm (10 s) or the
	// gRPC keepalive (10 s + 5 s), and its sequences are recomputed; a
	// request still open after this has hung.
	requestBound = 120 * time.Second
	// restoreBound: from the heal to a completed request and the victim
	// back on its control stream.
	restoreBound = 120 * time.Second
	// drainBound: from the end of the load to zero KV blocks on every
	// shard. A shard frees a sequence whose lease lapsed after 10 s.
	drainBound = 60 * time.Second
	// pollEvery is the watcher's period: how finely a double owner, the
	// detection and the return are seen.
	pollEvery = 200 * time.Millisecond
)

// TestPartitionFaults is the body of the partition tests. test-partition.sh
// runs it against the cluster it started, naming it in the environment:
//
//	STRATA_PARTITION_API      the coordinator's HTTP API (http://127.0.0.1:PORT)
//	STRATA_PARTITION_NETWORK  the cluster network (the coordinator's)
//	STRATA_PARTITION_PROBE    the network the host reads shard metrics on
//	STRATA_PARTITION_SHARDS   service=container pairs, space-separated
//
// Three faults, one after the other, each under a bounded streaming load:
// a stage shard cut off the coordinator's network for 5 s, one for 30 s
// (docker network disconnect, then connect with its old address), and a
// stage shard's container paused for 10 s. For each it asserts that every
// request ended within requestBound with text (the fault-free greedy text)
// or an OpenAI-shaped error, that service came back (a request started
// after the heal completed, and the victim is on its control stream again),
// that no two live stages of one placement version held overlapping layers
// at any poll, and that afterwards every shard's KV drained to zero blocks
// and the coordinator's allocator to nothing live, every backstop tombstone
// acked. For the 30 s cut, longer than the coordinator's LossConfirm
// (10 s) and the shard's lease (15 s), also that the coordinator re-placed
// the victim's layers and that the victim freed its KV on its own before
// the heal.
// It logs the time to detect, the time to service restored, the largest
// inter-token gap of the streams that completed and their longest silence
// (the wait for the first token included: a stream that started just
// before the fault waits there).
func TestPartitionFaults(t *testing.T) {
	api := os.Getenv("STRATA_PARTITION_API")
	if api == "" {
		t.Skip("run by deploy/test-partition.sh (STRATA_PARTITION_API unset)")
	}
	c, err := newPartitionCluster(api, os.Getenv("STRATA_PARTITION_NETWORK"),
		os.Getenv("STRATA_PARTITION_PROBE"), os.Getenv("STRATA_PARTITION_SHARDS"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if err := c.waitHealthy(ctx, restoreBound); err != nil {
		t.Fatalf("before the faults: %v", err)
	}
	want, err := c.baseline(ctx)
	if err != nil {
		t.Fatalf("fault-free texts: %v", err)
	}
	faults := []struct {
		name string
		hold time.Duration
		// pick chooses the victim among the stages of the active
		// placement (ordered by stage).
		pick func(stages []clusterShard) clusterShard
		cut  func(ctx context.Context, container string) error
		heal func(ctx context.Context, container string) error
		// confirmed: the fault outlasts the coordinator's LossConfirm
		// (10 s) and the shard's lease (15 s) by far, so the
		// coordinator must have re-placed the victim's layers and the
		// victim must have freed its KV on its own before the heal.
		confirmed bool
	}{
		{name: "disconnect-5s", hold: 5 * time.Second,
			pick: func(s []clusterShard) clusterShard { return s[0] }, cut: c.disconnect, heal: c.reconnect},
		{name: "disconnect-30s", hold: 30 * time.Second, confirmed: true,
			pick: func(s []clusterShard) clusterShard { return s[len(s)-1] }, cut: c.disconnect, heal: c.reconnect},
		{name: "pause-10s", hold: 10 * time.Second,
			pick: func(s []clusterShard) clusterShard { return s[0] }, cut: c.pause, heal: c.unpause},
	}
	var reports []string
	for _, f := range faults {
		ok := t.Run(f.name, func(t *testing.T) {
			if err := c.waitHealthy(ctx, restoreBound); err != nil {
				t.Fatalf("before the fault: %v", err)
			}
			v, err := c.view(ctx)
			if err != nil {
				t.Fatal(err)
			}
			stages := v.stages()
			if len(stages) == 0 {
				t.Fatalf("no stages in the active placement: %+v", v)
			}
			victim := f.pick(stages)
			container := c.containerOf(victim)
			if container == "" {
				t.Fatalf("no container serves shard %s (addr %s)", victim.ShardID, victim.Addr)
			}
			r := c.runFault(ctx, t, faultRun{
				victim: victim, container: container, hold: f.hold,
				cut: f.cut, heal: f.heal, want: want, confirmed: f.confirmed,
			})
			reports = append(reports, fmt.Sprintf("%-15s %s", f.name, r))
		})
		if !ok {
			// The next fault starts from a cluster this one may have
			// left broken: its result would say nothing.
			break
		}
	}
	t.Logf("summary (%d faults):\n%s", len(reports), strings.Join(reports, "\n"))
}

// faultRun is one fault: the victim, how to cut and heal it, how long it
// stays cut, and the fault-free text of each prompt.
type faultRun struct {
	victim    clusterShard
	container string
	hold      time.Duration
	cut, heal func(ctx context.Context, container string) error
	want      map[string]string
	confirmed bool
}

// faultReport is what one fault measured.
type faultReport struct {
	victim                string
	requests, ok, errored int
	errKinds              map[string]int
	detect                time.Duration // fault → the coordinator's view shows it; <0: never
	restored              time.Duration // fault → first request started after it completed
	back                  time.Duration // heal → victim connected again
	drained               time.Duration // load's end → zero KV blocks everywhere
	maxGap                time.Duration // largest inter-token gap of completed streams
	victimEmpty           string        // when the victim's own KV went to zero while cut
	longest               time.Duration // longest request
	spanGap               time.Duration // largest gap of completed streams that spanned the fault
	silence               time.Duration // longest wait of a completed stream for a token: its first, or the next
	spanning              int           // completed streams that spanned the fault
	cutTook               time.Duration // how long docker took to make the fault
	victimFreed           string        // what the victim's own counters say it freed
	versions              []uint64
}

func (r faultReport) String() string {
	det := "not seen"
	if r.detect >= 0 {
		det = r.detect.Round(10 * time.Millisecond).String()
	}
	kinds := make([]string, 0, len(r.errKinds))
	for k, n := range r.errKinds {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
	}
	slices.Sort(kinds)
	return fmt.Sprintf("victim %s: %d requests (%d text, %d errors %v), detect %s, service restored %s after the fault, "+
		"victim back %s after the heal, KV drained %s after the load, largest inter-token gap %s "+
		"(%s over the %d streams that spanned the fault), longest silence %s (the first token included), "+
		"longest request %s, placement versions %v, "+
		"victim freed on its own %s (%s), docker took %s to make the fault",
		r.victim, r.requests, r.ok, r.errored, kinds, det, r.restored.Round(10*time.Millisecond),
		r.back.Round(10*time.Millisecond), r.drained.Round(10*time.Millisecond), r.maxGap.Round(time.Millisecond),
		r.spanGap.Round(time.Millisecond), r.spanning, r.silence.Round(time.Millisecond),
		r.longest.Round(10*time.Millisecond), r.versions,
		r.victimFreed, r.victimEmpty, r.cutTook.Round(10*time.Millisecond))
}

// runFault starts the watcher and the load, waits until tokens flow, cuts
// the victim, holds, heals it, waits for service and the victim's return,
// stops the load, waits for the KV to drain, and checks everything the
// watcher and the load recorded.
func (c *partitionCluster) runFault(ctx context.Context, t *testing.T, f faultRun) faultReport {
	t.Helper()
	rep := faultReport{victim: f.victim.ShardID, detect: -1}
	w := c.watch(ctx, f.victim.ShardID)
	ld := c.startLoad(ctx, f.want)
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			ld.stop()
			w.stop()
		}
	}
	defer stop()
	if err := ld.waitFlowing(ctx, 60*time.Second); err != nil {
		t.Fatalf("before the fault: %v", err)
	}
	t.Logf("cutting %s (%s, stage %d, layers [%d,%d)) for %s",
		f.victim.ShardID, f.victim.Addr, f.victim.Stage, f.victim.First, f.victim.End, f.hold)
	// The fault counts from when docker has made it (the command
	// returned), not from when it was asked: on a loaded machine docker
	// pause alone takes most of a second.
	tAsk := time.Now()
	if err := f.cut(ctx, f.container); err != nil {
		t.Fatalf("cut: %v", err)
	}
	tFault := time.Now()
	rep.cutTook = tFault.Sub(tAsk)
	healed := false
	defer func() {
		if !healed { // never leave the cluster cut for the next test
			hctx, hcancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer hcancel()
			_ = f.heal(hctx, f.container)
		}
	}()
	select {
	case <-time.After(f.hold): // the fault's length, not a wait for a condition
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if err := f.heal(ctx, f.container); err != nil {
		t.Fatalf("heal: %v", err)
	}
	tHeal := time.Now()
	healed = true
	t.Logf("healed %s after %s", f.victim.ShardID, tHeal.Sub(tFault).Round(time.Millisecond))

	// Service restored: a request started after the heal completes with
	// the fault-free text, and the victim is on its control stream again.
	restoreBy := time.Now().Add(restoreBound)
	for !(ld.okStartedAfter(tHeal) && w.backAfter(tHeal)) {
		if time.Now().After(restoreBy) {
			t.Errorf("service not restored %s after the heal: a request since completed %v, victim back %v",
				restoreBound, ld.okStartedAfter(tHeal), w.backAfter(tHeal))
			break
		}
		time.Sleep(pollEvery)
	}
	ld.stop()
	tLoadEnd := time.Now()

	// KV freed: every shard, the victim included, back to zero blocks.
	drainBy := tLoadEnd.Add(drainBound)
	for !w.drainedAfter(tLoadEnd) {
		if time.Now().After(drainBy) {
			t.Errorf("KV not drained %s after the load ended: last shard samples %s", drainBound, w.lastKV())
			break
		}
		time.Sleep(pollEvery)
	}
	rep.drained = time.Since(tLoadEnd)
	// The victim may have been seen back before the coordinator gave up
	// on it (a paused shard's stream stays open until LossConfirm): it must
	// be back after its last loss too.
	for !w.backAfter(tHeal) {
		if time.Now().After(restoreBy) {
			t.Errorf("victim not back on its control stream %s after the heal", restoreBound)
			break
		}
		time.Sleep(pollEvery)
	}
	stop()

	results := ld.results()
	rep.requests = len(results)
	rep.errKinds = map[string]int{}
	for _, r := range results {
		rep.longest = max(rep.longest, r.end.Sub(r.start))
		switch {
		case r.problem != "":
			t.Errorf("request %d (%q, started %s after the fault): %s", r.id, r.prompt,
				r.start.Sub(tFault).Round(time.Millisecond), r.problem)
		case r.errType != "":
			rep.errored++
			rep.errKinds[fmt.Sprintf("%d/%s", r.status, r.errCode)]++
			t.Logf("request %d ended with an error %s after the fault: %d %s %s: %s", r.id,
				r.end.Sub(tFault).Round(time.Millisecond), r.status, r.errType, r.errCode, r.errMsg)
		default:
			rep.ok++
			rep.maxGap = max(rep.maxGap, r.maxGap)
			rep.silence = max(rep.silence, r.maxGap, r.first.Sub(r.start))
			if r.start.Before(tFault) && r.end.After(tFault) {
				rep.spanning++
				rep.spanGap = max(rep.spanGap, r.maxGap)
			}
		}
	}
	if rep.ok == 0 {
		t.Errorf("no request of the run completed with text")
	}
	if first, ok := ld.firstOKStartedAfter(tFault); ok {
		rep.restored = first.Sub(tFault)
	} else {
		rep.restored = -1
	}
	for _, v := range w.violations() {
		t.Errorf("double owner: %s", v)
	}
	if at, ok := w.detectedAt(tFault); ok {
		rep.detect = at.Sub(tFault)
	}
	if at, ok := w.backAt(tHeal); ok {
		rep.back = at.Sub(tHeal)
	}
	rep.versions = w.versionsSeen()
	at, held, emptied := w.victimEmptyBetween(tFault, tHeal)
	switch {
	case emptied:
		rep.victimEmpty = fmt.Sprintf("its KV at zero %s after the fault", at.Sub(tFault).Round(10*time.Millisecond))
	case held:
		rep.victimEmpty = "its KV not at zero before the heal"
	default:
		rep.victimEmpty = "no KV seen on it while cut"
	}
	if f.confirmed {
		if rep.detect < 0 {
			t.Errorf("a %s cut of a stage never showed in the coordinator's view", f.hold)
		}
		if len(rep.versions) < 2 {
			t.Errorf("a %s cut of a stage did not re-place its layers: placement versions %v", f.hold, rep.versions)
		}
		if held && !emptied {
			t.Errorf("the victim held KV through a %s cut: its lease should have freed it", f.hold)
		}
	}
	rep.victimFreed = w.freedBy(f.victim.ShardID)
	t.Logf("%s", rep)
	return rep
}
