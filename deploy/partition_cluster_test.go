package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// partitionCluster is the compose cluster test-partition.sh started: the
// coordinator's API and each shard's container, cluster address and probe
// address (where the host reads its /metrics).
type partitionCluster struct {
	api            string
	network, probe string
	shards         []partitionShard
	http           *http.Client
	bound          time.Duration // each load request's bound: requestBound
}

type partitionShard struct {
	service, container string
	ip                 string // on the cluster network: what the coordinator knows it by
	probeIP            string
}

func newPartitionCluster(api, network, probe, shards string) (*partitionCluster, error) {
	if network == "" || probe == "" || shards == "" {
		return nil, errors.New("STRATA_PARTITION_NETWORK, _PROBE and _SHARDS must be set with STRATA_PARTITION_API")
	}
	c := &partitionCluster{api: strings.TrimRight(api, "/"), network: network, probe: probe,
		http: &http.Client{Timeout: 5 * time.Second}, bound: requestBound}
	for _, pair := range strings.Fields(shards) {
		service, container, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, fmt.Errorf("STRATA_PARTITION_SHARDS: %q is not service=container", pair)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ip, err := dockerOut(ctx, "inspect", "-f", `{{(index .NetworkSettings.Networks "`+network+`").IPAddress}}`, container)
		var pip string
		if err == nil {
			pip, err = dockerOut(ctx, "inspect", "-f", `{{(index .NetworkSettings.Networks "`+probe+`").IPAddress}}`, container)
		}
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", service, err)
		}
		c.shards = append(c.shards, partitionShard{service: service, container: container, ip: ip, probeIP: pip})
	}
	return c, nil
}

// dockerOut runs docker with args and returns its trimmed output.
func dockerOut(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

func (c *partitionCluster) shard(container string) partitionShard {
	for _, s := range c.shards {
		if s.container == container {
			return s
		}
	}
	return partitionShard{}
}

// containerOf finds the container of a shard of the coordinator's view by
// its gRPC address on the cluster network.
func (c *partitionCluster) containerOf(s clusterShard) string {
	host, _, _ := strings.Cut(s.Addr, ":")
	for _, p := range c.shards {
		if p.ip == host {
			return p.container
		}
	}
	return ""
}

// disconnect cuts the container off the cluster network: the coordinator
// and the other shards lose every packet to and from it.
func (c *partitionCluster) disconnect(ctx context.Context, container string) error {
	_, err := dockerOut(ctx, "network", "disconnect", c.network, container)
	return err
}

// reconnect heals a disconnect: the container comes back with its old
// address and its service name, as a partition heals.
func (c *partitionCluster) reconnect(ctx context.Context, container string) error {
	s := c.shard(container)
	_, err := dockerOut(ctx, "network", "connect", "--ip", s.ip, "--alias", s.service, c.network, container)
	return err
}

func (c *partitionCluster) pause(ctx context.Context, container string) error {
	_, err := dockerOut(ctx, "pause", container)
	return err
}

func (c *partitionCluster) unpause(ctx context.Context, container string) error {
	_, err := dockerOut(ctx, "unpause", container)
	return err
}

// clusterView is what the tests read of GET /v1/cluster
// (coordinator.ClusterView).
type clusterView struct {
	Placement      uint64         `json:"placement_version"`
	Ready          bool           `json:"ready"`
	NotReadyReason string         `json:"not_ready_reason"`
	LiveSequences  int            `json:"live_sequences"`
	Shards         []clusterShard `json:"shards"`
}

type clusterShard struct {
	ShardID     string `json:"shard_id"`
	Incarnation uint64 `json:"incarnation"`
	Addr        string `json:"addr"`
	Stage       int    `json:"stage"`
	First       int    `json:"first_layer"`
	End         int    `json:"end_layer"`
	State       string `json:"state"`
	Connected   bool   `json:"connected"`
	// LastHeartbeat is on the coordinator's clock, which on one Docker
	// host is the test's.
	LastHeartbeat time.Time `json:"last_heartbeat"`
}

// stages returns the shards of the active placement in stage order.
func (v clusterView) stages() []clusterShard {
	var out []clusterShard
	for _, s := range v.Shards {
		if s.Stage >= 0 {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b clusterShard) int { return a.Stage - b.Stage })
	return out
}

func (v clusterView) shard(id string) (clusterShard, bool) {
	for _, s := range v.Shards {
		if s.ShardID == id {
			return s, true
		}
	}
	return clusterShard{}, false
}

func (c *partitionCluster) view(ctx context.Context) (clusterView, error) {
	var v clusterView
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.api+"/v1/cluster", nil)
	if err != nil {
		return v, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("GET /v1/cluster: %s", resp.Status)
	}
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

// waitHealthy polls until the pipeline is ready, every shard is connected
// and none is loading, lost or failed.
func (c *partitionCluster) waitHealthy(ctx context.Context, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	var last string
	for {
		v, err := c.view(ctx)
		if err == nil {
			healthy := v.Ready && len(v.Shards) >= len(c.shards)
			for _, s := range v.Shards {
				if s.State == "lost" || s.State == "failed" {
					continue // an old incarnation stays listed as lost
				}
				healthy = healthy && s.Connected && (s.State == "ready" || s.State == "idle")
			}
			if healthy {
				return nil
			}
			b, _ := json.Marshal(v)
			last = string(b)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not healthy after %s: %s", bound, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollEvery):
		}
	}
}

// shardMetrics is what the watcher reads of a shard's /metrics.
type shardMetrics struct {
	shardID          string // the "shard" label
	blocksUsed, seqs float64
	invariantOK      float64
	version, ready   float64
	freed            map[string]float64 // strata_sequences_freed_total by reason
}

// metrics scrapes a shard's /metrics on the probe network.
func (c *partitionCluster) metrics(ctx context.Context, s partitionShard) (shardMetrics, error) {
	m := shardMetrics{freed: map[string]float64{}}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.probeIP+":9090/metrics", nil)
	if err != nil {
		return m, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	seen := 0
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 4<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, value, ok := parseSample(line)
		if !ok {
			continue
		}
		if id := labels["shard"]; id != "" {
			m.shardID = id
		}
		switch name {
		case "strata_kv_blocks_used":
			m.blocksUsed, seen = value, seen+1
		case "strata_kv_sequences":
			m.seqs, seen = value, seen+1
		case "strata_kv_invariant_ok":
			m.invariantOK, seen = value, seen+1
		case "strata_shard_placement_version":
			m.version, seen = value, seen+1
		case "strata_shard_ready":
			m.ready, seen = value, seen+1
		case "strata_sequences_freed_total":
			m.freed[labels["reason"]] = value
		}
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	if seen < 5 {
		return m, fmt.Errorf("%s /metrics: %d of the 5 gauges read", s.service, seen)
	}
	return m, nil
}

// coordinatorKV is what the watcher reads of the coordinator's /metrics:
// the allocator's used blocks and live sequences, the requests running,
// and the backstop tombstones not yet acked, summed over shards.
type coordinatorKV struct {
	used, seqs, running, unacked float64
}

func (c *partitionCluster) coordinatorKV(ctx context.Context) (coordinatorKV, error) {
	var k coordinatorKV
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.api+"/metrics", nil)
	if err != nil {
		return k, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return k, err
	}
	defer resp.Body.Close()
	seen := 0
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, value, ok := parseSample(line)
		if !ok {
			continue
		}
		switch {
		case name == "strata_kv_allocator_blocks" && labels["state"] == "used":
			k.used, seen = value, seen+1
		case name == "strata_kv_allocator_sequences":
			k.seqs, seen = value, seen+1
		case name == "strata_requests_running":
			k.running, seen = value, seen+1
		case name == "strata_tombstones_unacked":
			k.unacked += value
		}
	}
	if err := sc.Err(); err != nil {
		return k, err
	}
	if seen < 3 {
		return k, fmt.Errorf("coordinator /metrics: %d of the 3 gauges read", seen)
	}
	return k, nil
}

// parseSample parses one line of the Prometheus text format:
// name{label="value",...} value.
func parseSample(line string) (name string, labels map[string]string, value float64, ok bool) {
	labels = map[string]string{}
	rest := line
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", nil, 0, false
		}
		name, rest = line[:i], line[j+1:]
		for _, kv := range strings.Split(line[i+1:j], ",") {
			k, v, found := strings.Cut(kv, "=")
			if found {
				labels[strings.TrimSpace(k)] = strings.Trim(v, `"`)
			}
		}
	} else {
		var found bool
		name, rest, found = strings.Cut(line, " ")
		if !found {
			return "", nil, 0, false
		}
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return "", nil, 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return name, labels, v, err == nil
}

// watcher polls the coordinator's view and every shard's metrics until
// stopped, checks each poll for double owners, and keeps what the report
// needs.
type watcher struct {
	c      *partitionCluster
	victim string
	cancel context.CancelFunc
	done   chan struct{}

	mu         sync.Mutex
	ranges     map[uint64]map[string][2]int // version → shard → [first, end) as the coordinator assigned it
	viols      []string
	victimAt   []victimSample
	victimKV   []victimKV // the victim's own metrics, when they could be read
	kvAt       []kvSample
	versions   []uint64
	freed      map[string]map[string]float64 // shard → reason → count, latest
	freed0     map[string]map[string]float64 // the same, first read
	startVer   uint64
	startStage bool
}

// victimSample is the victim as one poll of the coordinator's view saw it.
type victimSample struct {
	at time.Time
	// gone: the pipeline is not ready, or the victim is not a connected,
	// ready stage of the placement it was in when the watch began.
	gone bool
	// down: the victim is not connected or is lost, failed or
	// disconnected. good: none of that, and its last heartbeat is newer
	// than goodAfter's argument (see backAt).
	down     bool
	lastBeat time.Time
}

type victimKV struct {
	at           time.Time
	blocks, seqs float64
}

type kvSample struct {
	at time.Time
	// zero: every shard read, all at zero blocks and sequences, and the
	// coordinator read, its allocator at zero used blocks and sequences,
	// no request running, every backstop tombstone acked.
	zero   bool
	detail string
}

func (c *partitionCluster) watch(ctx context.Context, victim string) *watcher {
	ctx, cancel := context.WithCancel(ctx)
	w := &watcher{c: c, victim: victim, cancel: cancel, done: make(chan struct{}),
		ranges: map[uint64]map[string][2]int{}, freed: map[string]map[string]float64{},
		freed0: map[string]map[string]float64{}}
	if v, err := c.view(ctx); err == nil {
		w.startVer = v.Placement
	}
	// Two pollers, so that a shard whose /metrics does not answer (a
	// paused container holds each scrape for its timeout) does not thin
	// out the coordinator's views.
	var wg sync.WaitGroup
	every := func(poll func(context.Context)) {
		wg.Go(func() {
			for {
				poll(ctx)
				select {
				case <-ctx.Done():
					return
				case <-time.After(pollEvery):
				}
			}
		})
	}
	every(w.pollView)
	every(w.pollMetrics)
	go func() {
		wg.Wait()
		close(w.done)
	}()
	return w
}

func (w *watcher) stop() {
	w.cancel()
	<-w.done
}

// pollView takes one sample of the coordinator's view.
func (w *watcher) pollView(ctx context.Context) {
	now := time.Now()
	v, err := w.c.view(ctx)
	if err != nil || ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.viewSample(v, now)
}

// pollMetrics takes one sample of every shard's metrics and of the
// coordinator's.
func (w *watcher) pollMetrics(ctx context.Context) {
	now := time.Now()
	ms := make([]shardMetrics, len(w.c.shards))
	errs := make([]error, len(w.c.shards))
	var ck coordinatorKV
	var cerr error
	var wg sync.WaitGroup
	for i, s := range w.c.shards {
		wg.Go(func() { ms[i], errs[i] = w.c.metrics(ctx, s) })
	}
	wg.Go(func() { ck, cerr = w.c.coordinatorKV(ctx) })
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// The shards' own claims: among shards that say they serve a loaded
	// range, those of one placement version must hold disjoint layers.
	byVersion := map[uint64][]string{}
	zero, detail := true, []string{}
	for i, m := range ms {
		if errs[i] != nil {
			zero = false
			detail = append(detail, fmt.Sprintf("%s: %v", w.c.shards[i].service, errs[i]))
			continue
		}
		w.freed[m.shardID] = m.freed
		if w.freed0[m.shardID] == nil {
			w.freed0[m.shardID] = m.freed
		}
		if m.ready == 1 {
			byVersion[uint64(m.version)] = append(byVersion[uint64(m.version)], m.shardID)
		}
		if m.blocksUsed != 0 || m.seqs != 0 {
			zero = false
		}
		if m.shardID == w.victim {
			w.victimKV = append(w.victimKV, victimKV{at: now, blocks: m.blocksUsed, seqs: m.seqs})
		}
		if m.invariantOK != 1 {
			w.viols = append(w.viols, fmt.Sprintf("%s: %s reports strata_kv_invariant_ok %v", now.Format(time.StampMilli), m.shardID, m.invariantOK))
		}
		detail = append(detail, fmt.Sprintf("%s=%s blocks %v seqs %v version %v ready %v",
			w.c.shards[i].service, m.shardID, m.blocksUsed, m.seqs, m.version, m.ready))
	}
	switch {
	case cerr != nil:
		zero = false
		detail = append(detail, "coordinator: "+cerr.Error())
	default:
		if ck != (coordinatorKV{}) {
			zero = false
		}
		detail = append(detail, fmt.Sprintf("coordinator: allocator used %v sequences %v, requests running %v, tombstones unacked %v",
			ck.used, ck.seqs, ck.running, ck.unacked))
	}
	w.kvAt = append(w.kvAt, kvSample{at: now, zero: zero, detail: strings.Join(detail, "; ")})
	w.claims(byVersion, now)
}

// claims checks what the shards say they serve, by placement version:
// shards that report themselves ready for one version must hold disjoint
// layers of it, as the coordinator assigned them (recorded from its views).
func (w *watcher) claims(byVersion map[uint64][]string, now time.Time) {
	for version, ids := range byVersion {
		rs := w.ranges[version]
		for i := range ids {
			for j := i + 1; j < len(ids); j++ {
				a, aok := rs[ids[i]]
				b, bok := rs[ids[j]]
				if aok && bok && a[0] < b[1] && b[0] < a[1] {
					w.viols = append(w.viols, fmt.Sprintf("%s: shards %s %v and %s %v both serve version %d",
						now.Format(time.StampMilli), ids[i], a, ids[j], b, version))
				}
			}
		}
	}
}

// viewSample records one coordinator view: its stages' ranges (which must
// not overlap), whether the victim is seen gone or back.
func (w *watcher) viewSample(v clusterView, now time.Time) {
	if !slices.Contains(w.versions, v.Placement) {
		w.versions = append(w.versions, v.Placement)
	}
	rs := w.ranges[v.Placement]
	if rs == nil {
		rs = map[string][2]int{}
		w.ranges[v.Placement] = rs
	}
	st := v.stages()
	for i, s := range st {
		rs[s.ShardID] = [2]int{s.First, s.End}
		if s.First >= s.End {
			w.viols = append(w.viols, fmt.Sprintf("%s: version %d stage %d (%s) holds an empty range [%d,%d)",
				now.Format(time.StampMilli), v.Placement, s.Stage, s.ShardID, s.First, s.End))
		}
		for _, o := range st[i+1:] {
			if s.First < o.End && o.First < s.End {
				w.viols = append(w.viols, fmt.Sprintf("%s: version %d stages %s [%d,%d) and %s [%d,%d) overlap",
					now.Format(time.StampMilli), v.Placement, s.ShardID, s.First, s.End, o.ShardID, o.First, o.End))
			}
		}
	}
	s, ok := v.shard(w.victim)
	if !ok {
		return
	}
	w.victimAt = append(w.victimAt, victimSample{
		at:       now,
		gone:     !v.Ready || !s.Connected || s.State != "ready" || v.Placement != w.startVer,
		down:     !s.Connected || s.State == "lost" || s.State == "failed" || s.State == "disconnected",
		lastBeat: s.LastHeartbeat,
	})
}

func (w *watcher) violations() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.viols)
}

// detectedAt returns the first poll after the fault where the
// coordinator's view showed it: the pipeline not ready, the victim
// disconnected or not ready, or the placement changed.
func (w *watcher) detectedAt(fault time.Time) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.victimAt {
		if s.gone && s.at.After(fault) {
			return s.at, true
		}
	}
	return time.Time{}, false
}

// backAt returns when the victim was back after the heal: the first poll,
// after the heal and after the last poll that saw it down, where it is
// connected and has sent a heartbeat since the heal (a paused shard's
// stream looks connected until the coordinator gives up on it).
func (w *watcher) backAt(heal time.Time) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	from := heal
	for _, s := range w.victimAt {
		if s.down && s.at.After(from) {
			from = s.at
		}
	}
	for _, s := range w.victimAt {
		if s.at.After(from) && !s.down && s.lastBeat.After(heal) {
			return s.at, true
		}
	}
	return time.Time{}, false
}

func (w *watcher) backAfter(heal time.Time) bool {
	_, ok := w.backAt(heal)
	return ok
}

// drainedAfter reports whether a poll taken after t saw every shard at
// zero KV blocks and sequences and the coordinator with nothing live and
// nothing unacked (kvSample.zero).
func (w *watcher) drainedAfter(t time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.kvAt {
		if s.at.After(t) && s.zero {
			return true
		}
	}
	return false
}

func (w *watcher) lastKV() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.kvAt) == 0 {
		return "none"
	}
	return w.kvAt[len(w.kvAt)-1].detail
}

// victimEmptyBetween returns the first poll in [from, to] where the
// victim's own metrics showed zero KV blocks and sequences, after one that
// showed some in the same window (so a victim that held nothing does not
// count as having freed it).
func (w *watcher) victimEmptyBetween(from, to time.Time) (at time.Time, held, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.victimKV {
		if s.at.Before(from) || s.at.After(to) {
			continue
		}
		if s.blocks != 0 || s.seqs != 0 {
			held = true
		} else if held {
			return s.at, true, true
		}
	}
	return time.Time{}, held, false
}

func (w *watcher) versionsSeen() []uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.versions)
}

// freedBy formats what a shard's strata_sequences_freed_total grew by
// while watched, by reason.
func (w *watcher) freedBy(shard string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for r, n := range w.freed[shard] {
		if d := n - w.freed0[shard][r]; d != 0 {
			out = append(out, fmt.Sprintf("%s=%v", r, d))
		}
	}
	slices.Sort(out)
	if len(out) == 0 {
		return "nothing on its own"
	}
	return strings.Join(out, ",")
}
