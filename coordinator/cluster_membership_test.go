package coordinator

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
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

func TestClusterMembershipDeathConfirmsLoss(t *testing.T) {
	ts := gossipNet(t, "coord", "node-b")
	gc := fastGossip("coord", ts["coord"])
	c := startCluster(t, t.TempDir(), 2, func(cfg *ClusterConfig) {
		cfg.Gossip = &gc
		cfg.LossConfirm = time.Minute // only membership can confirm within the test
	})
	bc := fastGossip("node-b", ts["node-b"])
	bc.Meta = membership.Meta{Role: membership.RoleShard, NodeID: "node-b", Incarnation: 2, GRPCAddr: "127.0.0.1:1", Protocol: 1}
	bn, err := membership.New(bc)
	if err != nil {
		t.Fatal(err)
	}
	defer bn.Shutdown()
	ip, port, _ := ts["coord"].FinalAdvertiseAddr("", 0)
	if _, err := bn.Join([]string{net.JoinHostPort(ip.String(), itoa(port))}); err != nil {
		t.Fatal(err)
	}
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
	// b dies silently: its streams break and gossip stops answering.
	b.closeControl()
	bn.Shutdown()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var state string
		for _, s := range c.View().Shards {
			if s.NodeID == "node-b" {
				state = s.State
			}
		}
		if state == "lost" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-b is %q 15s after its death, want lost (confirmed by membership)", state)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c.Ready() == nil {
		t.Fatal("ready with one of --min-shards 2")
	}
}

func itoa(p int) string { return strconv.Itoa(p) }
