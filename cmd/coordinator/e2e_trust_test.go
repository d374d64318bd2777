package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
	"github.com/strata-llm/strata/transport/trust"
)

// The tests in this file prove the trust model on real processes: who may
// join a secure cluster, and that a certificate binds what its holder may
// claim.

// flagValue returns the value after name in args ("" when absent).
func flagValue(args []string, name string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == name {
			return args[i+1]
		}
	}
	return ""
}

// runShard runs `shard join` with args to its end (within 30 s) and
// returns its exit code and output.
func runShard(t *testing.T, shardBin string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard(30*time.Second))
	defer cancel()
	out, err := exec.CommandContext(ctx, shardBin, append([]string{"join"}, args...)...).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("shard join %v did not exit within %v:\n%s", args, guard(30*time.Second), tail(string(out), 2000))
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	return code, string(out)
}

// clusterShards is the number of registered shards on /v1/cluster.
func clusterShards(t *testing.T, api string) int {
	t.Helper()
	resp, err := http.Get("http://" + api + "/v1/cluster")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Shards []json.RawMessage `json:"shards"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return len(v.Shards)
}

// TestE2EJoinRefused: against a secure coordinator, a shard without a
// token, with a wrong secret, with a wrong CA fingerprint or with a
// revoked token exits at once with a one-line reason; a shard that runs
// --insecure finds the gossip closed (no key, no label) and never
// registers. A token made by `coordinator token create` while the
// coordinator runs admits a shard, which then serves; and a secure shard
// meeting an insecure coordinator says so in one line.
func TestE2EJoinRefused(t *testing.T) {
	coordBin, shardBin := binaries(t)
	c := &e2eCluster{t: t, model: stories, api: freeAddr(t), gossip: freeAddr(t), shardBin: shardBin, dataDir: t.TempDir()}
	c.coord = start(t, "coordinator", coordBin, "serve", "--model", stories, "--listen", c.api,
		"--gossip", c.gossip, "--grpc", freeAddr(t), "--min-shards", "1", "--data-dir", c.dataDir,
		"--threads", "1", "--kv-memory", "8MiB")
	join := joinArgs(t, c.coord)
	tok, err := trust.ParseToken(flagValue(join, "--token"))
	if err != nil {
		t.Fatalf("the printed join line %v: %v", join, err)
	}
	base := []string{"--coordinator", flagValue(join, "--coordinator"), "--coordinator-grpc", flagValue(join, "--coordinator-grpc"),
		"--model", stories, "--threads", "1"}
	shardArgs := func(extra ...string) []string {
		return append(append(append([]string(nil), base...), "--gossip", freeAddr(t), "--grpc", freeAddr(t), "--data-dir", t.TempDir()), extra...)
	}

	otherSecret := trust.Token{Fingerprint: tok.Fingerprint, Secret: strings.Repeat("A", 43)}
	otherCA := trust.Token{Fingerprint: strings.Repeat("a", 64), Secret: tok.Secret}
	for _, tc := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"no token", nil, "has not joined a cluster"},
		{"wrong secret", []string{"--token", otherSecret.String()}, "join token refused"},
		{"wrong fingerprint", []string{"--token", otherCA.String()}, "not the one the token names"},
		{"malformed token", []string{"--token", "strata-nonsense"}, "malformed join token"},
	} {
		code, out := runShard(t, shardBin, shardArgs(tc.extra...)...)
		if last := lastLine(out); code == 0 || !strings.HasPrefix(last, "shard: ") || !strings.Contains(last, tc.want) {
			t.Errorf("%s: exit %d, output:\n%s\nwant a last line naming %q", tc.name, code, tail(out, 1500), tc.want)
		}
	}

	// An --insecure shard: memberlist without the key and label cannot
	// join the cluster's gossip, so it never reaches Register.
	intruder := start(t, "insecure-shard", shardBin, append(append([]string{"join"}, shardArgs()...), "--insecure")...)

	// A token made beside the running coordinator admits a shard at once.
	out, err := exec.Command(coordBin, "token", "create", "--data-dir", c.dataDir, "--ttl", "1h").Output()
	if err != nil {
		t.Fatalf("coordinator token create: %v", err)
	}
	fresh := strings.TrimSpace(string(out))
	if _, err := trust.ParseToken(fresh); err != nil {
		t.Fatalf("token create printed %q: %v", fresh, err)
	}
	good := start(t, "shard", shardBin, append(append([]string{"join"}, shardArgs()...), "--token", fresh)...)
	waitReady(t, "http://"+c.api+"/readyz", 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), guard(time.Minute))
	defer cancel()
	if text, _, err := c.complete(ctx, "Once upon a time", 64, false); err != nil || text != onceUponATime {
		t.Fatalf("through the shard joined with a created token: %q, %v", text, err)
	}
	if !strings.Contains(intruder.out.String(), "join gossip cluster") || intruder.exited() {
		t.Errorf("the insecure shard: exited %v, output:\n%s\nwant it running and refused by gossip", intruder.exited(), tail(intruder.out.String(), 1500))
	}
	if n := clusterShards(t, c.api); n != 1 {
		t.Errorf("/v1/cluster lists %d shards, want 1 (the insecure one must not register)", n)
	}
	waitMetric(t, c.api, "strata_wire_refused_total", `reason="unauthenticated"`, 1)

	// Revoked: the created token no longer admits anyone.
	list, err := exec.Command(coordBin, "token", "list", "--data-dir", c.dataDir).Output()
	if err != nil {
		t.Fatalf("token list: %v", err)
	}
	var id string
	for line := range strings.Lines(string(list)) {
		if f := strings.Fields(line); len(f) >= 3 && f[0] != "ID" && !strings.Contains(line, "default") {
			id = f[0]
		}
	}
	if id == "" {
		t.Fatalf("token list shows no created token:\n%s", list)
	}
	if out, err := exec.Command(coordBin, "token", "revoke", "--data-dir", c.dataDir, id).CombinedOutput(); err != nil {
		t.Fatalf("token revoke %s: %v\n%s", id, err, out)
	}
	if code, out := runShard(t, shardBin, shardArgs("--token", fresh)...); code == 0 || !strings.Contains(lastLine(out), "join token refused") {
		t.Errorf("a revoked token: exit %d, output:\n%s", code, tail(out, 1500))
	}
	// The joined shard keeps its certificate: restarted on its data dir
	// without a token (and the token revoked), it serves again.
	good.kill()
	var again []string
	for i := 2; i < len(good.cmd.Args); i++ {
		if good.cmd.Args[i] == "--token" {
			i++
			continue
		}
		again = append(again, good.cmd.Args[i])
	}
	start(t, "shard-restarted", shardBin, append([]string{"join"}, again...)...)
	waitReady(t, "http://"+c.api+"/readyz", 60*time.Second)
	if text, _, err := c.complete(ctx, "Once upon a time", 64, false); err != nil || text != onceUponATime {
		t.Fatalf("through the shard restarted without a token: %q, %v", text, err)
	}
}

// waitMetric waits until the samples of name with label on api's /metrics
// sum to at least want: the cluster view behind them is published by the
// coordinator's loop, a moment after a handler counted.
func waitMetric(t *testing.T, api, name, label string, want float64) {
	t.Helper()
	deadline := time.Now().Add(guard(10 * time.Second))
	for {
		v, _ := metricWith(t, api, name, label)
		if v >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s{%s} = %v, want >= %v", name, label, v, want)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// memberCreds returns dial credentials of shard 0 of c: a valid member's
// certificate, for tests of what a member gone bad can do.
func memberCreds(t *testing.T, c *e2eCluster) grpc.DialOption {
	t.Helper()
	id, err := trust.LoadIdentity(filepath.Join(flagValue(c.shards[0].cmd.Args, "--data-dir"), "trust"))
	if err != nil {
		t.Fatalf("shard 0's identity: %v", err)
	}
	return transport.DialCreds(id, "")
}

// upstreamCreds returns dial credentials of the hop placement v names
// upstream of stage: the coordinator's role (a certificate minted from the
// CA in c's data dir, as a coordinator that lost its key would have) for
// stage 0, the certificate of the shard process at stage-1 for the others.
func upstreamCreds(t *testing.T, c *e2eCluster, v wireView, stage int) grpc.DialOption {
	t.Helper()
	if stage > 0 {
		return shardCreds(t, c, v, stage-1)
	}
	a, _, err := trust.OpenAuthority(filepath.Join(c.dataDir, "trust"), "unused", time.Now())
	if err != nil {
		t.Fatalf("the coordinator's CA: %v", err)
	}
	return transport.DialCreds(a.Self, "")
}

// shardCreds returns dial credentials of the shard process placement v
// puts at stage: the certificate in its data dir.
func shardCreds(t *testing.T, c *e2eCluster, v wireView, stage int) grpc.DialOption {
	t.Helper()
	id, _ := shardAt(t, c, v, stage)
	return transport.DialCreds(id, "")
}

// shardAt returns the identity and index in c.shards of the shard process
// placement v puts at stage: the one whose certificate names the node v
// lists there.
func shardAt(t *testing.T, c *e2eCluster, v wireView, stage int) (*trust.Identity, int) {
	t.Helper()
	node := ""
	for _, s := range v.Shards {
		if s.Stage == stage {
			node = s.NodeID
		}
	}
	for i, p := range c.shards {
		id, err := trust.LoadIdentity(filepath.Join(flagValue(p.cmd.Args, "--data-dir"), "trust"))
		if err == nil && node != "" && id.ID == node {
			return id, i
		}
	}
	t.Fatalf("no shard process holds the certificate of stage %d's node %q", stage, node)
	return nil, -1
}

// lastLine is the last non-empty line of out.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

// TestE2EIdentityBound: a valid certificate binds its holder. A client
// holding shard A's certificate that registers as another node, or opens
// a control or results stream for another shard, is refused
// (PermissionDenied, counted as wrong_identity); a client without a
// certificate is refused every call but Join (Unauthenticated), and a
// shard's stage endpoint refuses a TLS client without a cluster
// certificate. The cluster serves on, unchanged.
func TestE2EIdentityBound(t *testing.T) {
	c := startE2E(t, 1)
	join := joinArgs(t, c.coord)
	coordGRPC := flagValue(join, "--coordinator-grpc")
	shardDir := flagValue(c.shards[0].cmd.Args, "--data-dir")
	id, err := trust.LoadIdentity(filepath.Join(shardDir, "trust"))
	if err != nil {
		t.Fatalf("the joined shard's identity: %v", err)
	}
	dial := func(opt grpc.DialOption) pb.CoordinatorClient {
		cc, err := transport.Dial(coordGRPC, opt)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return pb.NewCoordinatorClient(cc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), guard(time.Minute))
	defer cancel()

	asA := dial(transport.DialCreds(id, trust.RoleCoordinator))
	req := &pb.RegisterRequest{NodeId: "someone-else", Incarnation: 1, GrpcAddr: "127.0.0.1:1", ProtocolVersion: transport.ProtocolVersion,
		Devices: &pb.Devices{CpuCores: 1, MemoryBytes: 1 << 30, Device: "cpu"}}
	if _, err := asA.Register(ctx, req); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Register as another node with A's certificate: %v, want PermissionDenied", err)
	}
	// A control stream claiming another shard ID of A's own node ID, and
	// one claiming another node.
	for _, h := range []*pb.StreamHello{
		{ShardId: id.ID + "-00000000000000ff", NodeId: id.ID, Incarnation: 1, Epoch: 1},
		{ShardId: "other-0000000000000001", NodeId: "other", Incarnation: 1, Epoch: 1},
	} {
		st, err := asA.Control(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&pb.ShardToCoordinator{Msg: &pb.ShardToCoordinator_Hello{Hello: h}}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); status.Code(err) != codes.PermissionDenied {
			t.Errorf("Control hello %v with A's certificate: %v, want PermissionDenied", h, err)
		}
		rs, err := asA.Results(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = rs.Send(&pb.ResultMessage{Msg: &pb.ResultMessage_Hello{Hello: h}})
		if _, err := rs.CloseAndRecv(); status.Code(err) != codes.PermissionDenied {
			t.Errorf("Results hello %v with A's certificate: %v, want PermissionDenied", h, err)
		}
	}
	waitMetric(t, c.api, "strata_wire_refused_total", `reason="wrong_identity"`, 5)

	// TLS with the CA pinned but no certificate: Join is open, nothing else.
	anon := dial(transport.JoinDialCreds(id.Fingerprint()))
	if _, err := anon.Register(ctx, req); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Register without a certificate: %v, want Unauthenticated", err)
	}
	w, err := anon.Weights(ctx, &pb.WeightsRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("Weights without a certificate: %v, want Unauthenticated", err)
	}
	// Plaintext is not spoken at all.
	if _, err := dial(grpc.EmptyDialOption{}).Register(ctx, req); status.Code(err) != codes.Unavailable {
		t.Errorf("Register over plaintext: %v, want Unavailable (no TLS, no call)", err)
	}
	// A shard's stage endpoint: TLS without a client certificate fails.
	stageAddr := flagValue(c.shards[0].cmd.Args, "--grpc")
	cc, err := transport.Dial(stageAddr, grpc.WithTransportCredentials(credentials.NewTLS(trust.JoinClientTLS(id.Fingerprint()))))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if ss, err := pb.NewStageClient(cc).Stream(ctx); err == nil {
		if _, err = ss.Recv(); err == nil {
			t.Error("the stage endpoint answered a client without a certificate")
		}
	}
	// With A's own certificate (a shard's), a batch of the current
	// placement into stage 0, whose upstream is the coordinator.
	var v wireView
	if resp, err := http.Get("http://" + c.api + "/v1/cluster"); err == nil {
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
	}
	asShard, err := transport.Dial(stageAddr, transport.DialCreds(id, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer asShard.Close()
	ss, err := pb.NewStageClient(asShard).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := transport.SendBatch(ss, &pb.BatchHeader{Epoch: v.Epoch, PlacementVersion: v.Placement, BatchId: 1 << 40}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ss.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a shard's batch into stage 0: %v, want PermissionDenied (the coordinator is its upstream)", err)
	}
	if n, _ := metricWith(t, c.shardMets[0], "strata_wire_refused_total", `reason="wrong_identity"`); n != 1 {
		t.Errorf(`shard 0: strata_wire_refused_total{reason="wrong_identity"} = %v, want 1`, n)
	}

	if text, _, err := c.complete(ctx, "Once upon a time", 64, false); err != nil || text != onceUponATime {
		t.Fatalf("after the refused calls: %q, %v", text, err)
	}
}

// TestE2EInsecureCluster: `--insecure` on both sides serves the same
// greedy text as the secure clusters of the other tests (llama.cpp's),
// warns at start on both, and writes no trust material.
func TestE2EInsecureCluster(t *testing.T) {
	coordBin, shardBin := binaries(t)
	c := &e2eCluster{t: t, model: stories, api: freeAddr(t), gossip: freeAddr(t), shardBin: shardBin, dataDir: t.TempDir()}
	grpcAddr := freeAddr(t)
	c.coord = start(t, "coordinator", coordBin, "serve", "--insecure", "--model", stories, "--listen", c.api,
		"--gossip", c.gossip, "--grpc", grpcAddr, "--min-shards", "2", "--data-dir", c.dataDir,
		"--threads", "1", "--kv-memory", "8MiB")
	var shards []*proc
	for i := range 2 {
		shards = append(shards, start(t, fmt.Sprintf("shard-%d", i), shardBin, "join", "--insecure", "--coordinator", c.gossip,
			"--model", stories, "--gossip", freeAddr(t), "--grpc", freeAddr(t), "--data-dir", t.TempDir(), "--threads", "1"))
	}
	waitReady(t, "http://"+c.api+"/readyz", 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), guard(time.Minute))
	defer cancel()
	for _, stream := range []bool{false, true} {
		if text, _, err := c.complete(ctx, "Once upon a time", 64, stream); err != nil || text != onceUponATime {
			t.Fatalf("insecure cluster, stream %v: %q, %v", stream, text, err)
		}
	}
	for _, p := range append(shards, c.coord) {
		if !strings.Contains(p.out.String(), "WARNING: --insecure") {
			t.Errorf("%s did not warn about --insecure", p.name)
		}
	}
	if _, err := os.Stat(filepath.Join(c.dataDir, "trust")); !os.IsNotExist(err) {
		t.Errorf("an insecure coordinator made %s/trust: %v", c.dataDir, err)
	}
	// A secure shard meeting it fails in one line instead of waiting.
	code, out := runShard(t, shardBin, "--coordinator", c.gossip, "--coordinator-grpc", grpcAddr,
		"--token", "strata-"+strings.Repeat("a", 64)+"."+strings.Repeat("A", 43),
		"--gossip", freeAddr(t), "--grpc", freeAddr(t), "--data-dir", t.TempDir(), "--threads", "1")
	if code == 0 || !strings.Contains(lastLine(out), "runs --insecure") {
		t.Errorf("a secure shard against an insecure coordinator: exit %d, output:\n%s", code, tail(out, 1500))
	}
}
