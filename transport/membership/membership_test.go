package membership

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// testTransport makes a memberlist.MockTransport behave like UDP and TCP
// on a LAN. MockTransport's channels are unbuffered and its sends never
// time out, so two members acking each other's pings at the same moment
// deadlock, and a member that shut down wedges everyone who writes to it.
// Here a pump drains the mock's inbox at once into buffered channels
// (dropping packets when full, like UDP), and after Shutdown it keeps
// draining as a dead host: packets vanish, connections are cut.
type testTransport struct {
	*memberlist.MockTransport
	packets chan *memberlist.Packet
	streams chan net.Conn
	down    atomic.Bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

// testQueue is how many packets or connections wait for memberlist before
// more are dropped: far more than three test members ever have in flight.
const testQueue = 256

func (t *testTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }
func (t *testTransport) StreamCh() <-chan net.Conn           { return t.streams }
func (t *testTransport) Shutdown() error {
	t.down.Store(true)
	return nil
}

func (t *testTransport) pump() {
	for {
		select {
		case p := <-t.MockTransport.PacketCh():
			if t.down.Load() {
				continue
			}
			select {
			case t.packets <- p:
			default:
			}
		case c := <-t.MockTransport.StreamCh():
			if t.down.Load() {
				_ = c.Close()
				continue
			}
			select {
			case t.streams <- c:
			default:
				_ = c.Close()
			}
		case <-t.stop:
			return
		}
	}
}

// testNet is an in-memory network. MockNetwork is not safe for use while
// members run, so every transport — spares that join later included — is
// made before the first member starts.
type testNet struct {
	net memberlist.MockNetwork
	ts  map[string]*testTransport
}

func newTestNet(t *testing.T, names ...string) *testNet {
	n := &testNet{ts: make(map[string]*testTransport)}
	for _, name := range names {
		tr := &testTransport{
			MockTransport: n.net.NewTransport(name),
			packets:       make(chan *memberlist.Packet, testQueue),
			streams:       make(chan net.Conn, testQueue),
			stop:          make(chan struct{}),
		}
		tr.wg.Go(tr.pump)
		n.ts[name] = tr
	}
	// Registered first, so it runs after every node's Shutdown cleanup.
	t.Cleanup(func() {
		for _, tr := range n.ts {
			close(tr.stop)
			tr.wg.Wait()
		}
	})
	return n
}

// addr is the gossip address of the named member.
func (n *testNet) addr(name string) string {
	ip, port, _ := n.ts[name].FinalAdvertiseAddr("", 0)
	return net.JoinHostPort(ip.String(), fmt.Sprint(port))
}

// fastConfig makes a silent member dead within about 1–4 s (suspicion
// lasts 3 × 200 ms, up to 6× that without confirmations), with margin for
// the race detector on a loaded machine: a live member wrongly declared
// dead would make tests flaky.
func fastConfig(name string, role Role) Config {
	cfg := DefaultConfig()
	cfg.Name = name
	cfg.Meta = Meta{Role: role, NodeID: name, Incarnation: uint64(len(name)) << 32, GRPCAddr: "127.0.0.1:70" + fmt.Sprint(len(name)), Protocol: 1}
	cfg.ProbeInterval = 200 * time.Millisecond
	cfg.ProbeTimeout = 150 * time.Millisecond
	cfg.SuspicionMult = 3
	cfg.GossipInterval = 20 * time.Millisecond
	cfg.PushPullInterval = 500 * time.Millisecond
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", name)
	}
	return cfg
}

func (n *testNet) start(t *testing.T, name string, role Role) *Node {
	t.Helper()
	cfg := fastConfig(name, role)
	cfg.Transport = n.ts[name]
	return startNode(t, cfg)
}

func startNode(t *testing.T, cfg Config) *Node {
	t.Helper()
	nd, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nd.Shutdown() })
	return nd
}

// waitFor bounds every wait; the expected time is far shorter.
const waitFor = 15 * time.Second

// history remembers every event each node has delivered, so a wait for one
// event never loses another that arrived first.
var history = map[*Node][]Event{}

// waitEvent returns the first event of kind about member name that n has
// delivered, waiting up to waitFor for it. Tests call it from their own
// goroutine only.
func waitEvent(t *testing.T, n *Node, kind EventKind, name string) Event {
	t.Helper()
	t.Cleanup(func() { delete(history, n) })
	deadline := time.After(waitFor)
	for i := 0; ; i++ {
		for ; i < len(history[n]); i++ {
			if e := history[n][i]; e.Kind == kind && e.Member.Name == name {
				return e
			}
		}
		select {
		case e := <-n.Events():
			history[n] = append(history[n], e)
		case <-deadline:
			var seen []string
			for _, e := range history[n] {
				seen = append(seen, e.Kind.String()+" "+e.Member.Name)
			}
			t.Fatalf("%s: no %s event for %s within %v; saw %v", n.Local().Name, kind, name, waitFor, seen)
		}
		i--
	}
}

// waitMembers polls until n sees exactly the named members.
func waitMembers(t *testing.T, n *Node, names ...string) {
	t.Helper()
	slices.Sort(names)
	deadline := time.Now().Add(waitFor)
	for {
		var got []string
		for _, m := range n.Members() {
			got = append(got, m.Name)
		}
		slices.Sort(got)
		if slices.Equal(got, names) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s sees %v, want %v", n.Local().Name, got, names)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestJoinAnyOrder(t *testing.T) {
	for _, order := range [][]string{
		{"coord", "shard-a", "shard-b"},
		{"shard-b", "shard-a", "coord"},
		{"shard-a", "coord", "shard-b"},
	} {
		t.Run(strings.Join(order, ","), func(t *testing.T) {
			tn := newTestNet(t, "coord", "shard-a", "shard-b")
			nodes := map[string]*Node{}
			for i, name := range order {
				role := RoleShard
				if name == "coord" {
					role = RoleCoordinator
				}
				nodes[name] = tn.start(t, name, role)
				waitEvent(t, nodes[name], EventJoin, name) // its own join comes first
				if i > 0 {
					// Join whoever started just before: the cluster forms
					// whatever the order.
					if k, err := nodes[name].Join([]string{tn.addr(order[i-1])}); err != nil || k != 1 {
						t.Fatalf("%s join: %d, %v", name, k, err)
					}
				}
			}
			for _, nd := range nodes {
				waitMembers(t, nd, order...)
			}
			c := nodes["coord"]
			for _, name := range []string{"shard-a", "shard-b"} {
				e := waitEvent(t, c, EventJoin, name)
				want := fastConfig(name, RoleShard).Meta
				if e.Member.MetaErr != nil || e.Member.Meta != want {
					t.Fatalf("join of %s: meta %+v (%v), want %+v", name, e.Member.Meta, e.Member.MetaErr, want)
				}
				if e.Member.Addr != tn.addr(name) {
					t.Fatalf("join of %s: addr %s, want %s", name, e.Member.Addr, tn.addr(name))
				}
			}
			if l := c.Local(); l.Meta.Role != RoleCoordinator || l.Name != "coord" {
				t.Fatalf("Local() = %+v", l)
			}
		})
	}
}

// TestLeaveDeadSpare: a graceful leave is a Leave, a crash is a Dead, and a
// spare that joins afterwards is seen with its metadata.
func TestLeaveDeadSpare(t *testing.T) {
	tn := newTestNet(t, "coord", "shard-a", "shard-b", "spare")
	c := tn.start(t, "coord", RoleCoordinator)
	a := tn.start(t, "shard-a", RoleShard)
	b := tn.start(t, "shard-b", RoleShard)
	for _, n := range []*Node{a, b} {
		if _, err := n.Join([]string{tn.addr("coord")}); err != nil {
			t.Fatal(err)
		}
	}
	waitMembers(t, c, "coord", "shard-a", "shard-b")
	waitMembers(t, b, "coord", "shard-a", "shard-b")

	if err := a.Leave(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := a.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if e := waitEvent(t, c, EventLeave, "shard-a"); e.Member.Meta.NodeID != "shard-a" {
		t.Fatalf("leave event meta %+v", e.Member.Meta)
	}
	waitEvent(t, b, EventLeave, "shard-a")

	if err := b.Shutdown(); err != nil { // a crash: no leave
		t.Fatal(err)
	}
	waitEvent(t, c, EventDead, "shard-b")
	waitMembers(t, c, "coord")

	spare := tn.start(t, "spare", RoleShard)
	if _, err := spare.Join([]string{tn.addr("coord")}); err != nil {
		t.Fatal(err)
	}
	e := waitEvent(t, c, EventJoin, "spare")
	if want := fastConfig("spare", RoleShard).Meta; e.Member.Meta != want {
		t.Fatalf("spare meta %+v, want %+v", e.Member.Meta, want)
	}
	waitMembers(t, c, "coord", "spare")
	waitMembers(t, spare, "coord", "spare")
	if d := c.Dropped(); d != 0 {
		t.Fatalf("%d events dropped", d)
	}
}

func TestSetMeta(t *testing.T) {
	tn := newTestNet(t, "coord", "shard-a")
	c := tn.start(t, "coord", RoleCoordinator)
	a := tn.start(t, "shard-a", RoleShard)
	if _, err := a.Join([]string{tn.addr("coord")}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, c, EventJoin, "shard-a")
	m := a.Local().Meta
	m.GRPCAddr = "127.0.0.1:9999"
	if err := a.SetMeta(m, time.Second); err != nil {
		t.Fatal(err)
	}
	if e := waitEvent(t, c, EventUpdate, "shard-a"); e.Member.Meta != m {
		t.Fatalf("update meta %+v, want %+v", e.Member.Meta, m)
	}
	if err := a.SetMeta(Meta{Role: RoleShard}, time.Second); err == nil {
		t.Fatal("SetMeta accepted an empty node ID")
	}
}

// TestLoopbackSockets runs two members over real UDP and TCP on 127.0.0.1
// with ports picked by the kernel.
func TestLoopbackSockets(t *testing.T) {
	start := func(name string, role Role) *Node {
		cfg := fastConfig(name, role)
		cfg.BindAddr, cfg.BindPort = "127.0.0.1", 0
		return startNode(t, cfg)
	}
	c := start("coord", RoleCoordinator)
	a := start("shard-a", RoleShard)
	if !strings.HasPrefix(c.Local().Addr, "127.0.0.1:") || c.Local().Addr == "127.0.0.1:0" {
		t.Fatalf("coordinator gossip address %s", c.Local().Addr)
	}
	if _, err := a.Join([]string{c.Local().Addr}); err != nil {
		t.Fatal(err)
	}
	e := waitEvent(t, c, EventJoin, "shard-a")
	if e.Member.Addr != a.Local().Addr || e.Member.Meta != fastConfig("shard-a", RoleShard).Meta {
		t.Fatalf("join event %+v", e)
	}
	waitMembers(t, a, "coord", "shard-a")
	if err := a.Leave(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := a.Shutdown(); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, c, EventLeave, "shard-a")
	waitMembers(t, c, "coord")
}

func TestJoinNobody(t *testing.T) {
	tn := newTestNet(t, "coord")
	c := tn.start(t, "coord", RoleCoordinator)
	if k, err := c.Join([]string{"127.0.0.1:999"}); err == nil || k != 0 {
		t.Fatalf("join of an empty address: %d, %v", k, err)
	}
}

// TestEventsNeverBlock fills the channel through memberlist's callback: the
// callback returns at once and the overflow is counted.
func TestEventsNeverBlock(t *testing.T) {
	tn := newTestNet(t, "coord")
	c := tn.start(t, "coord", RoleCoordinator) // its own join is queued
	meta, _ := Meta{Role: RoleShard, NodeID: "s"}.Encode()
	d := eventDelegate{c}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range EventBuffer + 9 {
			d.NotifyJoin(&memberlist.Node{Name: fmt.Sprint("s", i), Addr: net.IPv4(127, 0, 0, 1), Port: 1, Meta: meta})
		}
	}()
	select {
	case <-done:
	case <-time.After(waitFor):
		t.Fatal("event delegate blocked")
	}
	if got := c.Dropped(); got != 10 {
		t.Fatalf("Dropped() = %d, want 10", got)
	}
	if e := <-c.Events(); e.Kind != EventJoin || e.Member.Name != "coord" {
		t.Fatalf("first event %+v", e)
	}
	// A member whose metadata is not strata's is still reported.
	<-c.Events()
	d.NotifyUpdate(&memberlist.Node{Name: "alien", Addr: net.IPv4(127, 0, 0, 1), Meta: []byte("hello")})
	for e := range c.Events() {
		if e.Member.Name == "alien" {
			if e.Kind != EventUpdate || e.Member.MetaErr == nil {
				t.Fatalf("alien event %+v", e)
			}
			break
		}
	}
}

func TestNotifyLeaveKinds(t *testing.T) {
	tn := newTestNet(t, "coord")
	c := tn.start(t, "coord", RoleCoordinator)
	<-c.Events() // own join
	meta, _ := Meta{Role: RoleShard, NodeID: "s"}.Encode()
	d := eventDelegate{c}
	leaving, _ := Meta{Role: RoleShard, NodeID: "s"}.encode(flagLeaving)
	for _, tc := range []struct {
		nd   memberlist.Node
		want EventKind
	}{
		{memberlist.Node{Name: "announced", Meta: leaving}, EventLeave},
		{memberlist.Node{Name: "left", Meta: meta, State: memberlist.StateLeft}, EventLeave},
		{memberlist.Node{Name: "dead", Meta: meta, State: memberlist.StateDead}, EventDead},
		{memberlist.Node{Name: "silent", Meta: meta}, EventDead},
	} {
		d.NotifyLeave(&tc.nd)
		if e := <-c.Events(); e.Kind != tc.want || e.Member.Name != tc.nd.Name {
			t.Fatalf("%s: got %v %s, want %v", tc.nd.Name, e.Kind, e.Member.Name, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	good := fastConfig("n", RoleShard)
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		field  string
		mutate func(*Config)
	}{
		{"Meta", func(c *Config) { c.Meta.NodeID = strings.Repeat("x", MaxMetaBytes) }},
		{"Meta", func(c *Config) { c.Meta.Role = 0 }},
		{"BindPort", func(c *Config) { c.BindPort = 70000 }},
		{"AdvertisePort", func(c *Config) { c.AdvertisePort = -1 }},
		{"ProbeInterval", func(c *Config) { c.ProbeInterval = 0 }},
		{"ProbeTimeout", func(c *Config) { c.ProbeTimeout = 2 * c.ProbeInterval }},
		{"SuspicionMult", func(c *Config) { c.SuspicionMult = 0 }},
		{"GossipInterval", func(c *Config) { c.GossipInterval = -1 }},
		{"PushPullInterval", func(c *Config) { c.PushPullInterval = 0 }},
	} {
		c := good
		tc.mutate(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: got %v, want an error naming the field", tc.field, err)
		}
		if _, err := New(c); err == nil {
			t.Errorf("%s: New accepted the config", tc.field)
		}
	}
}

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	c.Meta = Meta{Role: RoleShard, NodeID: "n"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.BindPort != 7946 || c.ProbeInterval != time.Second {
		t.Fatalf("DefaultConfig() = %+v, want memberlist's LAN defaults", c)
	}
}

func TestDefaultName(t *testing.T) {
	cfg := fastConfig("", RoleShard)
	cfg.Meta.NodeID, cfg.Meta.Incarnation = "node", 0xab
	cfg.BindAddr, cfg.BindPort = "127.0.0.1", 0
	n := startNode(t, cfg)
	if got, want := n.Local().Name, "node-00000000000000ab"; got != want {
		t.Fatalf("name %q, want %q", got, want)
	}
}

func TestLogWriter(t *testing.T) {
	var buf bytes.Buffer
	w := logWriter{slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))}
	for _, line := range []string{
		"[DEBUG] memberlist: Stream connection from=127.0.0.1:1\n",
		"[WARN] memberlist: Was able to connect to x over TCP but UDP probes failed\n",
		"[ERR] memberlist: Failed fallback ping: EOF\n",
		"[INFO] memberlist: Suspect x has failed\n",
		"no prefix\n",
	} {
		if n, err := w.Write([]byte(line)); err != nil || n != len(line) {
			t.Fatalf("Write: %d, %v", n, err)
		}
	}
	want := `level=DEBUG msg="Stream connection from=127.0.0.1:1"
level=WARN msg="Was able to connect to x over TCP but UDP probes failed"
level=WARN msg="Failed fallback ping: EOF"
level=INFO msg="Suspect x has failed"
level=INFO msg="no prefix"
`
	if buf.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", buf.String(), want)
	}
}
