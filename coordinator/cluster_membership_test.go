package coordinator

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/membership"
)

// gossipTransport wraps memberlist's MockTransport the way
// transport/membership's tests do: a pump drains the mock's unbuffered
// inbox into buffered channels (dropping when full, like UDP), and after
// Shutdown the member behaves as a dead host.
type gossipTransport struct {
	*memberlist.MockTransport
	packets chan *memberlist.Packet
	streams chan net.Conn
	down    atomic.Bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

func (t *gossipTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }
func (t *gossipTransport) StreamCh() <-chan net.Conn           { return t.streams }
func (t *gossipTransport) Shutdown() error                     { t.down.Store(true); return nil }

func (t *gossipTransport) pump() {
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
				c.Close()
				continue
			}
			select {
			case t.streams <- c:
			default:
				c.Close()
			}
		case <-t.stop:
			return
		}
	}
}

// gossipNet makes every transport before any member starts (MockNetwork
// is not safe to grow while members run).
func gossipNet(t *testing.T, names ...string) map[string]*gossipTransport {
	var mn memberlist.MockNetwork
	ts := map[string]*gossipTransport{}
	for _, name := range names {
		tr := &gossipTransport{MockTransport: mn.NewTransport(name), packets: make(chan *memberlist.Packet, 256),
			streams: make(chan net.Conn, 256), stop: make(chan struct{})}
		tr.wg.Go(tr.pump)
		ts[name] = tr
	}
	t.Cleanup(func() {
		for _, tr := range ts {
			close(tr.stop)
			tr.wg.Wait()
		}
	})
	return ts
}

func fastGossip(name string, tr memberlist.Transport) membership.Config {
	cfg := membership.DefaultConfig()
	cfg.Name = name
	cfg.Transport = tr
	cfg.ProbeInterval = 200 * time.Millisecond
	cfg.ProbeTimeout = 150 * time.Millisecond
	cfg.SuspicionMult = 3
	cfg.GossipInterval = 20 * time.Millisecond
	cfg.PushPullInterval = 500 * time.Millisecond
	return cfg
}

// TestClusterGossipImpostorLeaves: a gossip member that claims a healthy
// shard's node ID and incarnation and then leaves takes nothing away: the
// shard's control stream is alive, and the stream is the truth. The real
// shard's silent death (streams and gossip gone) is its loss at once, by
// the broken stream, and the model is re-placed onto the survivor below
// --min-shards.
func TestClusterGossipImpostorLeaves(t *testing.T) {
	ts := gossipNet(t, "coord", "node-b", "impostor")
	gc := fastGossip("coord", ts["coord"])
	c := startCluster(t, t.TempDir(), 2, func(cfg *ClusterConfig) {
		cfg.Gossip = &gc
		cfg.LossConfirm = time.Minute // the fake shards send no heartbeats: their streams' opening counts
	})
	ip, port, _ := ts["coord"].FinalAdvertiseAddr("", 0)
	seed := []string{net.JoinHostPort(ip.String(), itoa(port))}
	member := func(name string) *membership.Node {
		t.Helper()
		mc := fastGossip(name, ts[name])
		mc.Meta = membership.Meta{Role: membership.RoleShard, NodeID: "node-b", Incarnation: 2, GRPCAddr: "127.0.0.1:1", Protocol: transport.ProtocolVersion}
		n, err := membership.New(mc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Shutdown() })
		if _, err := n.Join(seed); err != nil {
			t.Fatal(err)
		}
		return n
	}
	bn := member("node-b")
	// The shard finds the coordinator's gRPC address in its metadata.
	waitUntil(t, "the coordinator's metadata", func() bool {
		for _, m := range bn.Members() {
			if m.Meta.Role == membership.RoleCoordinator && m.Meta.GRPCAddr != "" {
				_, p, _ := net.SplitHostPort(m.Meta.GRPCAddr)
				_, want, _ := net.SplitHostPort(c.GRPCAddr())
				return p == want
			}
		}
		return false
	})

	a := newFakeShard(t, c.GRPCAddr(), "node-a", 1, 1<<20)
	b := newFakeShard(t, c.GRPCAddr(), "node-b", 2, 1<<20)
	a.join()
	b.join()
	waitReady(t, c.Cluster)

	imp := member("impostor")
	waitUntil(t, "the impostor in the coordinator's view", func() bool {
		for _, m := range c.node.Members() {
			if m.Name == "impostor" {
				return true
			}
		}
		return false
	})
	if err := imp.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	imp.Shutdown()
	waitUntil(t, "the impostor's leave overruled", func() bool { return c.View().MembershipOverruled > 0 })
	v := c.View()
	for _, s := range v.Shards {
		if s.State != "ready" {
			t.Fatalf("after the impostor left, shard %s is %q, want ready", s.NodeID, s.State)
		}
	}
	if err := c.Ready(); err != nil || v.Placement != 1 {
		t.Fatalf("after the impostor left: placement %d, Ready %v; want 1, nil", v.Placement, err)
	}

	// b dies silently: its stream breaks and gossip stops answering.
	b.closeControl()
	bn.Shutdown()
	waitUntil(t, "placement 2 on the survivor", func() bool { return c.View().Placement == 2 && c.Ready() == nil })
	for _, s := range c.View().Shards {
		if want := map[string]string{"node-a": "ready", "node-b": "lost"}[s.NodeID]; s.State != want {
			t.Fatalf("shard %s is %q, want %q", s.NodeID, s.State, want)
		}
	}
}

func itoa(p int) string { return strconv.Itoa(p) }
